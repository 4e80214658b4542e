"""The policy dataclass, its one translation to ``jax.checkpoint_policies``, and parsing.

A :class:`Policy` gives every residual name of a model (its config's ``residual_names``, the
names its blocks tag with ``checkpoint_name``) one :class:`Action`; a policy is defined over one
model's names, given as ``names=`` wherever a policy is made (default: the GPT's,
``jaxoff.models.gpt.RESIDUAL_NAMES``). Intermediates that carry no name are recomputed under a
names-based policy unless ``untagged`` says JAX's dot policies keep them. So ``device`` for
every name is close to, but not the same as, no remat: the untagged values between named ones
(e.g. the LayerNorm statistics, the GELU's inner terms) are recomputed in the backward pass.
``remat=False`` (the ``none`` preset) is no remat at all: the blocks do not run under remat.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax

from .._errors import ConfigError
from ..nn import AUTO, sqrt_segment_size


class Action(enum.Enum):
    """What happens to one named residual between the forward and the backward pass."""

    DEVICE = "device"  # kept in device memory
    OFFLOAD = "offload"  # copied to host memory (pinned_host), copied back for backward
    REMAT = "remat"  # dropped, recomputed in the backward pass


class Untagged(enum.Enum):
    """What a policy does with intermediates that carry no ``checkpoint_name``."""

    RECOMPUTE = "recompute"
    DOTS = "dots_saveable"  # every dot_general output is kept (JAX's dots_saveable)
    DOTS_NO_BATCH = "dots_with_no_batch_dims_saveable"  # dots without batch dims kept


class Segments(enum.Enum):
    """The unit of remat: one block; Chen et al.'s (2016) segments of ``round(sqrt(L))``
    blocks (``SQRT``, ``jaxoff.nn._segments.sqrt_segment_size``); or segments sized when the
    stack is traced from the block's bytes (``BYTES``, ``jaxoff.nn.SegmentPlan``: ~sqrt(L)
    blocks when a block's interior is the size of its input, fewer when it is larger, often
    1)."""

    LAYER = "layer"
    SQRT = "sqrt"
    BYTES = "bytes"


# Table, not a ladder: the JAX policy each Untagged value adds to the names policy.
_UNTAGGED_POLICY: dict[Untagged, Callable | None] = {
    Untagged.RECOMPUTE: None,
    Untagged.DOTS: jax.checkpoint_policies.dots_saveable,
    Untagged.DOTS_NO_BATCH: jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

OFFLOAD_SRC, OFFLOAD_DST = "device", "pinned_host"


def default_names() -> tuple[str, ...]:
    """The names policies are over when none are given: the GPT's
    (``jaxoff.models.gpt.RESIDUAL_NAMES``), imported here so that importing jaxoff imports no
    model."""
    from jaxoff.models.gpt import RESIDUAL_NAMES  # deferred: importing a policy builds no model

    return RESIDUAL_NAMES


def as_names(names: Iterable[str] | None) -> tuple[str, ...]:
    """``names`` as a tuple (``None``: :func:`default_names`); a duplicate is an error."""
    if names is None:
        return default_names()
    if isinstance(names, str):
        raise ConfigError(f"residual names must be a sequence of names, got the string {names!r}")
    names = tuple(names)
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigError(f"residual names {names} name {duplicated} more than once")
    return names


@dataclasses.dataclass(frozen=True)
class Policy:
    """Where every named residual of a block lives between forward and backward.

    A policy is over one model's residual names: the names of ``actions``, in the model's
    order (see :attr:`names`). Make one with :meth:`parse`, :meth:`from_mapping`,
    :meth:`uniform` or :func:`jaxoff.policy.preset`, giving the model's names as ``names=``.

    Attributes:
        actions: ``(name, Action)`` for every residual name, in the model's order.
        untagged: what happens to intermediates without a name.
        remat: ``False`` means no remat at all (``actions`` is then ignored).
        segments: remat each block, or Chen segments (which keep only segment inputs, so
            every name is recomputed and ``untagged`` is ``recompute``).

    Example:
        >>> from jaxoff.policy import Policy
        >>> p = Policy.parse("attn_probs=remat,mlp_act=offload,*=device")
        >>> p.action("mlp_act").value, p.offloaded()
        ('offload', ('mlp_act',))
        >>> toy = Policy.parse("h=offload", names=("x", "h"))  # a model tagging x and h
        >>> toy.names, toy.action("x").value
        (('x', 'h'), 'remat')
    """

    actions: tuple[tuple[str, Action], ...]
    untagged: Untagged = Untagged.RECOMPUTE
    remat: bool = True
    segments: Segments = Segments.LAYER

    def __post_init__(self):
        names = [n for n, _ in self.actions]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ConfigError(
                f"a policy gives every residual name exactly one action; {duplicated} "
                f"are given more than one"
            )
        bad = [n for n, a in self.actions if not isinstance(n, str) or not isinstance(a, Action)]
        if bad:
            raise ConfigError(f"policy actions must be (name, jaxoff.policy.Action) pairs: {bad}")
        kept = [n for n, a in self.actions if a is not Action.REMAT]
        segmented = self.remat and self.segments is not Segments.LAYER
        if segmented and (kept or self.untagged is not Untagged.RECOMPUTE):
            raise ConfigError(
                f"segments = {self.segments.value!r} keeps only each segment's input and "
                f"recomputes everything inside it, so it cannot also keep or offload "
                f"{', '.join(kept) if kept else f'untagged values ({self.untagged.value})'}: "
                f"drop those (every name remat, untagged = 'recompute'), or use "
                f"segments = 'layer' to keep them"
            )

    @property
    def names(self) -> tuple[str, ...]:
        """The residual names this policy is over, in the model's order."""
        return tuple(n for n, _ in self.actions)

    @classmethod
    def uniform(cls, action: Action, *, names: Sequence[str] | None = None, **kw) -> Policy:
        """Every one of ``names`` (default: the GPT's) gets ``action``."""
        return cls(tuple((n, action) for n in as_names(names)), **kw)

    @classmethod
    def from_mapping(
        cls,
        mapping: Mapping[str, str | Action],
        *,
        names: Sequence[str] | None = None,
        base: Policy | None = None,
        **kw,
    ) -> Policy:
        """``{name: action}`` with ``"*"`` for every name not listed, over ``names``.

        ``names`` are the model's residual names (default: ``base``'s when given, else the
        GPT's). Names not listed and not covered by ``"*"`` keep ``base``'s action, or are
        recomputed when there is no base (as in JAX's names-based policies).

        Raises:
            ConfigError: a name that is not one of ``names``, listing the valid ones.

        Example:
            >>> from jaxoff.policy import Policy
            >>> Policy.from_mapping({"h": "device"}, names=("x", "h", "y")).describe()
            'h=device,*=remat'
        """
        if names is None and base is not None:
            names = base.names
        valid = as_names(names)
        parsed = {key: _action(value, key) for key, value in mapping.items()}
        unknown = [n for n in parsed if n != "*" and n not in valid]
        if unknown:
            raise ConfigError(_unknown_names_message(unknown, valid))
        default = parsed.pop("*", None)
        if base is not None:
            base = base.for_names(valid)
            start = dict(base.actions)
            kw = {"untagged": base.untagged, "segments": base.segments, **kw}
        else:
            start = dict.fromkeys(valid, Action.REMAT)
        if default is not None:
            start = dict.fromkeys(valid, default)
        start.update(parsed)
        return cls(tuple((n, start[n]) for n in valid), **kw)

    @classmethod
    def parse(
        cls, text: str, *, names: Sequence[str] | None = None, base: Policy | None = None
    ) -> Policy:
        """Parses ``"name=action,...,*=action"`` over ``names`` (default: the GPT's), on top
        of ``base`` (names it does not list keep ``base``'s action).

        A preset as the base (``"selective,mlp_act=offload"``) is spelled through
        :func:`jaxoff.policy.get_policy`, which resolves the preset's name.

        Raises:
            ConfigError: a name that is not one of ``names`` (listing them), an unknown
                action, an item that is not ``name=action``, a name given twice.
        """
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items and base is None:
            raise ConfigError("empty policy; write e.g. 'attn_probs=remat,*=device'")
        mapping: dict[str, str] = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(
                    f"policy {text!r}: {item!r} is not name=action "
                    f"(actions: {', '.join(a.value for a in Action)})"
                )
            if key.strip() in mapping:
                raise ConfigError(f"policy {text!r}: {key.strip()!r} is given twice")
            mapping[key.strip()] = value.strip()
        return cls.from_mapping(mapping, names=as_names(names), base=base)

    def for_names(self, names: Sequence[str] | None = None) -> Policy:
        """This policy over ``names`` (default: the GPT's), e.g. a model's ``residual_names``.

        Over the same names (in any order) it is this policy in the order of ``names``. A
        policy that treats every name alike (every name the same action, or no remat) carries
        over to any names. Otherwise the names must match.

        Raises:
            ConfigError: the policy names residuals the model lacks, or lacks some the model
                has; it says which, and how to make the policy over the model's names.
        """
        names = as_names(names)
        mine = dict(self.actions)
        if set(mine) == set(names):
            ordered = tuple((n, mine[n]) for n in names)
            return self if ordered == self.actions else dataclasses.replace(self, actions=ordered)
        uniform = {a for _, a in self.actions} if self.remat else {Action.DEVICE}
        if len(uniform) <= 1:
            action = next(iter(uniform), Action.REMAT)  # over no names: unlisted means remat
            return dataclasses.replace(self, actions=tuple((n, action) for n in names))
        unknown = [n for n in mine if n not in names]
        missing = [n for n in names if n not in mine]
        raise ConfigError(
            f"policy {self.describe()!r} is over other residual names than the model's "
            f"({', '.join(names) or 'none'}): "
            + "; ".join(
                part
                for part in (
                    f"the model has no {', '.join(map(repr, unknown))}" if unknown else "",
                    f"it gives no action to {', '.join(map(repr, missing))}" if missing else "",
                )
                if part
            )
            + "; make it over the model's names, e.g. "
            "jaxoff.policy.get_policy(spec, names=cfg.residual_names)"
        )

    @property
    def needs_names(self) -> bool:
        """Whether the policy acts through residual names: some name is kept or offloaded.

        A policy that recomputes every name (``full``, ``sqrt``, ``dots_saveable``) or does no
        remat (``none``) works on a model that tags no names.
        """
        return self.remat and any(a is not Action.REMAT for _, a in self.actions)

    def action(self, name: str) -> Action:
        return dict(self.actions)[name]

    def names_with(self, action: Action) -> tuple[str, ...]:
        return tuple(n for n, a in self.actions if a is action)

    def offloaded(self) -> tuple[str, ...]:
        """Names copied to host memory (empty when ``remat`` is off)."""
        return self.names_with(Action.OFFLOAD) if self.remat else ()

    def to_jax(self) -> Callable | None:
        """The ``jax.checkpoint_policies`` policy of this Policy (``None``: no remat)."""
        return to_jax_policy(self)

    def segment_size(self, num_layers: int | None = None) -> int | str:
        """``jaxoff.nn.Stack.remat_every`` of this policy over a stack of ``num_layers``
        blocks: ``1`` (per-block remat, or no remat), ``round(sqrt(num_layers))`` for Chen's
        segments (``SQRT``), or ``"auto"`` for segments sized when the stack is traced
        (``BYTES``)."""
        # the stack's own spellings (jaxoff.nn imports flax: on use)

        if not self.remat or self.segments is Segments.LAYER:
            return 1
        if self.segments is Segments.BYTES:
            return AUTO
        if num_layers is None:
            raise ValueError("sqrt segments are sized from the stack's depth: pass num_layers")
        return sqrt_segment_size(num_layers)

    def describe(self) -> str:
        """Compact spelling that :meth:`parse` reads back (segments/untagged aside)."""
        if not self.remat:
            return "no remat"
        by = {a: self.names_with(a) for a in Action}
        common = max(Action, key=lambda a: len(by[a]))
        parts = [f"{n}={a.value}" for n, a in self.actions if a is not common]
        return ",".join(parts + [f"*={common.value}"])


def to_jax_policy(policy: Policy) -> Callable | None:
    """The one translation from :class:`Policy` to a JAX checkpoint policy.

    Names to ``device`` are saved, names to ``offload`` are offloaded
    (``save_and_offload_only_these_names`` from ``device`` to ``pinned_host``), every
    other value is recomputed unless ``untagged`` adds JAX's dot policies. When no name
    is kept or offloaded, the JAX policy is returned itself (``nothing_saveable``,
    ``dots_saveable``, ...), so presets are exactly JAX's.
    """
    if not policy.remat:
        return None
    saved, offloaded = policy.names_with(Action.DEVICE), policy.names_with(Action.OFFLOAD)
    base = _UNTAGGED_POLICY[policy.untagged]
    if not saved and not offloaded:
        return base if base is not None else jax.checkpoint_policies.nothing_saveable
    names = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=saved,
        names_which_can_be_offloaded=offloaded,
        offload_src=OFFLOAD_SRC,
        offload_dst=OFFLOAD_DST,
    )
    if base is None:
        return names
    return _names_then(names, base)


def _names_then(names: Callable, base: Callable) -> Callable:
    """Names decide first (save/offload); otherwise ``base`` decides (a bool)."""
    # jax.checkpoint_policies.save_from_both_policies refuses Offloadable results.
    from jax._src.interpreters import partial_eval as pe  # JAX's internals: only here

    def policy(prim, *args, **params):
        out = names(prim, *args, **params)
        return out if out is not pe.Recompute else base(prim, *args, **params)

    return policy


def _action(value: str | Action, name: str) -> Action:
    if isinstance(value, Action):
        return value
    try:
        return Action(str(value).strip().lower())
    except ValueError:
        raise ConfigError(
            f"policy: {name}={value!r} is not an action; choose one of "
            f"{', '.join(a.value for a in Action)}"
        ) from None


def _unknown_names_message(unknown: Iterable[str], valid: Sequence[str]) -> str:
    listed = ", ".join(valid) if valid else "none (the model tags no residual names)"
    return (
        f"policy: {', '.join(map(repr, unknown))} is not a residual name the model produces; "
        f"valid names are {listed} (and '*' for every name not listed)"
    )
