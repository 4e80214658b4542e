"""Spellings of a policy (preset, compact string, TOML file, JAX name) -> Policy / JAX policy."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import jax

from .._errors import ConfigError
from ._policy import Policy, Segments, Untagged, residual_names
from ._presets import PRESETS

JAX_POLICIES: tuple[str, ...] = tuple(
    name
    for name in dir(jax.checkpoint_policies)
    if not name.startswith("_") and name.endswith(("saveable", "saveable_only"))
)
"""Argument-free ``jax.checkpoint_policies`` names, accepted by :func:`resolve_policy`."""


def get_policy(spec: str | Policy | None) -> Policy:
    """A :class:`Policy` from a preset name, ``name=action,...`` or a ``.toml`` path.

    Raises:
        ConfigError: naming the presets and residual names that are valid.
    """
    if isinstance(spec, Policy):
        return spec
    spec = "none" if spec is None else spec.strip()
    if spec in PRESETS:
        return PRESETS[spec].policy
    if spec.endswith(".toml"):
        return load_policy_file(spec)
    if "=" in spec or "," in spec:
        return Policy.parse(spec)
    raise ConfigError(_unknown_spec(spec))


def resolve_policy(spec: str | Policy | None):
    """What ``models.gpt.GPTConfig.policy`` takes: ``None`` (no remat) or a JAX policy.

    Accepts everything :func:`get_policy` does, plus the argument-free
    ``jax.checkpoint_policies`` names. A ``sqrt`` policy resolves to its segment policy;
    use :func:`apply_policy` to also set the segment size.

    Example:
        >>> from jaxoff.policy import resolve_policy
        >>> resolve_policy("none") is None, callable(resolve_policy("selective"))
        (True, True)
    """
    if isinstance(spec, str) and spec.strip() in JAX_POLICIES and spec.strip() not in PRESETS:
        return getattr(jax.checkpoint_policies, spec.strip())
    return get_policy(spec).to_jax()


def apply_policy(model_cfg, spec: str | Policy | None):
    """``model_cfg`` (a ``GPTConfig``) with its ``policy`` and ``remat_every`` set."""
    if isinstance(spec, str) and spec.strip() in JAX_POLICIES and spec.strip() not in PRESETS:
        return dataclasses.replace(model_cfg, policy=resolve_policy(spec), remat_every=1)
    policy = get_policy(spec)
    return dataclasses.replace(
        model_cfg,
        policy=policy.to_jax(),
        remat_every=policy.segment_size(model_cfg.num_layers),
    )


_OPTIONS = {"preset", "untagged", "segments", "remat"}


def load_policy_file(path: str | Path) -> Policy:
    """Reads a policy from TOML: a ``[policy]`` table (or the top level) of
    ``name = "action"`` entries (``"*"`` for the rest) and optionally ``preset`` (the
    base), ``untagged`` (recompute | dots_saveable | dots_with_no_batch_dims_saveable),
    ``segments`` (layer | sqrt).

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
        base = PRESETS[options["preset"]].policy
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
        return Policy.from_mapping(table, base=base, **kw)
    except ConfigError as e:
        raise ConfigError(f"policy file {path}: {e}") from None


def _unknown_spec(spec: str) -> str:
    return (
        f"--policy {spec!r} is not a known policy; choose a preset "
        f"({', '.join(PRESETS)}), a jax.checkpoint_policies name "
        f"({', '.join(n for n in JAX_POLICIES if n not in PRESETS)}), a .toml file, or "
        f"name=action pairs such as 'attn_probs=remat,mlp_act=offload,*=device' with names "
        f"{', '.join(residual_names())} and actions device, offload, remat"
    )
