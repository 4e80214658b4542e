"""Spellings of a policy (preset, compact string, TOML file, JAX name) -> Policy / JAX policy,
over a model's residual names; and a model config with its stack set by a policy."""

from __future__ import annotations

import functools
import logging
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

import jax

from .._errors import ConfigError, OptionError
from ..nn import check_model, model_name, with_stack
from ._policy import Policy, Segments, Untagged, as_names
from ._presets import PRESETS, preset

JAX_POLICIES: tuple[str, ...] = tuple(
    name
    for name in dir(jax.checkpoint_policies)
    if not name.startswith("_") and name.endswith(("saveable", "saveable_only"))
)
"""Argument-free ``jax.checkpoint_policies`` names, accepted by :func:`resolve_policy`."""

Spec = str | Policy | None
"""A policy spelling: a preset name, ``name=action,...``, a ``.toml`` path, a
:class:`Policy`, or ``None`` (no remat)."""


def get_policy(spec: Spec, names: Sequence[str] | None = None) -> Policy:
    """A :class:`Policy` over ``names`` from a preset name, ``name=action,...`` or a ``.toml``
    path.

    Args:
        spec: the spelling; ``None`` is the ``none`` preset; a :class:`Policy` is returned
            over ``names`` (see :meth:`Policy.for_names`).
        names: the model's residual names (its config's ``residual_names``); default: the
            GPT's.

    Raises:
        ConfigError: naming the presets and the residual names (of ``names``) that are valid.

    Example:
        >>> from jaxoff.policy import get_policy
        >>> get_policy("selective", names=("attn_q", "attn_probs")).describe()
        'attn_probs=remat,*=device'
    """
    if isinstance(spec, Policy):
        return spec.for_names(names)
    spec = "none" if spec is None else spec.strip()
    if spec in PRESETS:
        return preset(spec, names)
    if spec.endswith(".toml"):
        return load_policy_file(spec, names)
    if "=" in spec or "," in spec:
        return _parse(spec, names)
    raise OptionError(_unknown_spec(spec, as_names(names)))


def _parse(spec: str, names: Sequence[str] | None) -> Policy:
    """``name=action,...``, with an optional leading preset name as the base."""
    head, _, rest = spec.partition(",")
    head = head.strip()
    if "=" in head or not head:
        return Policy.parse(spec, names=names)
    if head not in PRESETS:
        raise ConfigError(
            f"policy {spec!r}: {head!r} is neither a preset nor name=action; "
            f"presets are {', '.join(PRESETS)}"
        )
    valid = as_names(names)
    return Policy.parse(rest, names=valid, base=preset(head, valid))


def resolve_policy(spec: Spec, names: Sequence[str] | None = None):
    """What a :class:`jaxoff.nn.Stack`'s ``policy`` takes: ``None`` (no remat) or a JAX policy.

    Accepts everything :func:`get_policy` does (over ``names``, default the GPT's), plus the
    argument-free ``jax.checkpoint_policies`` names. A ``sqrt`` policy resolves to
    ``nothing_saveable``; use :func:`apply_policy` to also set its segments.

    Example:
        >>> from jaxoff.policy import resolve_policy
        >>> resolve_policy("none") is None, callable(resolve_policy("selective"))
        (True, True)
    """
    if _is_jax_name(spec):
        return getattr(jax.checkpoint_policies, spec.strip())
    return get_policy(spec, names).to_jax()


def apply_policy(model_cfg: Any, spec: Spec) -> Any:
    """``model_cfg`` (any :class:`jaxoff.nn.LayeredModel` config) with its stack's ``policy``
    and ``remat_every`` set by ``spec``, resolved over the config's ``residual_names``.

    A model that tags no names takes the policies that do not act through names: ``none``,
    ``full``, ``sqrt``, ``dots_saveable`` and the other argument-free
    ``jax.checkpoint_policies`` names. ``sqrt`` sets ``remat_every`` to Chen's
    ``round(sqrt(num_layers))``; ``sqrt_bytes`` sets ``remat_every="auto"``: the segment
    size is chosen when the stack is traced, from the block's bytes at the traced batch and
    sequence (``jaxoff.nn.SegmentPlan``); ``jaxoff.nn.recorded_segments`` tells which.

    Raises:
        ConfigError: ``model_cfg`` is not a model config; ``spec`` names a residual the model
            does not tag (listing the model's names); ``spec`` acts through names and the
            model has none.

    Example:
        >>> from jaxoff.policy import apply_policy
        >>> from jaxoff.models.gpt import CONFIGS
        >>> apply_policy(CONFIGS["small"], "sqrt").stack.remat_every  # 12 layers
        3
        >>> apply_policy(CONFIGS["small"], "sqrt_bytes").stack.remat_every
        'auto'
    """

    if _is_jax_name(spec):
        check_model(model_cfg)
        return with_stack(model_cfg, policy=resolve_policy(spec), remat_every=1)
    names = tuple(getattr(model_cfg, "residual_names", ()) or ())
    # a policy that acts through names would act on nothing: say so rather than run plain remat
    check_model(model_cfg, needs=["policy"] if not names and _needs_names(spec) else [])
    try:
        policy = get_policy(spec, names)
    except ConfigError as e:
        raise ConfigError(f"model {model_name(model_cfg)!r}: {e}") from None
    if isinstance(spec, str) and spec.strip() in PRESETS and names:
        _note_missed_names(spec.strip(), model_name(model_cfg), names)
    try:
        size = policy.segment_size(model_cfg.num_layers)
        return with_stack(model_cfg, policy=policy.to_jax(), remat_every=size)
    except ValueError as e:  # the stack's own checks (e.g. segments with streaming)
        raise ConfigError(f"policy {spec!r} on model {model_name(model_cfg)!r}: {e}") from None


@functools.cache
def _note_missed_names(name: str, model: str, names: tuple[str, ...]) -> None:
    """A preset whose groups name none of the model's residuals treats every name alike:
    said once per preset and model, with the model's names (a ``jaxoff: note:`` line from
    the ``jaxoff`` command, a warning on the ``jaxoff.policy`` logger in a library)."""
    p = PRESETS[name]
    if not p.misses(names):
        return
    logging.getLogger("jaxoff.policy").warning(
        "jaxoff: note: policy preset %r acts on %s, none of which model %r tags, so every "
        "residual of it gets %s; the model's residual names are %s: name them with "
        "`policy='name=action,...'`",
        name,
        ", ".join(p.group_names),
        model,
        p.rest.value,
        ", ".join(names),
    )


def _needs_names(spec: Spec) -> bool:
    """Whether ``spec`` acts through residual names (a model tagging none cannot take it)."""
    if spec is None:
        return False
    if isinstance(spec, Policy):
        return spec.needs_names
    spec = spec.strip()
    return PRESETS[spec].needs_names if spec in PRESETS else True


def _is_jax_name(spec: Spec) -> TypeGuard[str]:
    return isinstance(spec, str) and spec.strip() in JAX_POLICIES and spec.strip() not in PRESETS


_OPTIONS = {"preset", "untagged", "segments", "remat"}


def load_policy_file(path: str | Path, names: Sequence[str] | None = None) -> Policy:
    """Reads a policy from TOML: a ``[policy]`` table (or the top level) of
    ``name = "action"`` entries (``"*"`` for the rest) and optionally ``preset`` (the
    base), ``untagged`` (recompute | dots_saveable | dots_with_no_batch_dims_saveable),
    ``segments`` (layer | sqrt; sqrt recomputes every name). The policy is over ``names``
    (the model's residual names; default: the GPT's).

    Example file::

        [policy]
        preset = "selective"
        mlp_act = "offload"
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"policy file {path}: no such file")
    try:
        table = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"policy file {path}: not valid TOML ({e})") from None
    table = dict(table.get("policy", table))
    options = {k: table.pop(k) for k in list(table) if k in _OPTIONS}
    base = None
    if "preset" in options:
        if options["preset"] not in PRESETS:
            raise ConfigError(
                f"policy file {path}: preset {options['preset']!r} is not one of "
                f"{', '.join(PRESETS)}"
            )
        base = preset(options["preset"], names)
    kw = {}
    enums = {"untagged": Untagged, "segments": Segments}
    for key, kind in enums.items():
        if key in options:
            try:
                kw[key] = kind(options[key])
            except ValueError:
                raise ConfigError(
                    f"policy file {path}: {key} = {options[key]!r} is not one of "
                    f"{', '.join(v.value for v in kind)}"
                ) from None
    if "remat" in options:
        kw["remat"] = bool(options["remat"])
    bad = [k for k, v in table.items() if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"policy file {path}: values of {bad} must be action strings")
    try:
        return Policy.from_mapping(table, names=names, base=base, **kw)
    except ConfigError as e:
        raise ConfigError(f"policy file {path}: {e}") from None


def _unknown_spec(spec: str, names: Sequence[str]) -> str:
    return (
        f"policy {spec!r} is not a known policy; choose a preset "
        f"({', '.join(PRESETS)}), a jax.checkpoint_policies name "
        f"({', '.join(n for n in JAX_POLICIES if n not in PRESETS)}), a .toml file, or "
        f"name=action pairs such as 'attn_probs=remat,mlp_act=offload,*=device' with names "
        f"{', '.join(names) or 'none (the model tags no residual names)'} and actions "
        f"device, offload, remat"
    )
