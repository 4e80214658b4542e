"""Named policies, each a rule evaluated over a model's residual names, with where it comes
from. Add one by adding a registry entry.

A preset does not list a model's names: it says what happens to groups of names (the attention
core, the weight-matmul outputs) and to every other name, so it evaluates over any model. A
group's names that a model does not tag are skipped; a model that tags none of them gets the
preset's action for every other name (``offload_dots`` on a model without projection names
recomputes everything), and ``jaxoff.policy.apply_policy`` says so once, listing the model's
names (:meth:`Preset.misses`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

from .._errors import ConfigError
from ._policy import Action, Policy, Segments, Untagged, as_names

ATTENTION_CORE: tuple[str, ...] = ("attn_logits", "attn_probs", "attn_context")
"""Names of the attention core: scores, softmax and context (cheap to recompute, large)."""

ATTENTION_SCORES: tuple[str, ...] = ("attn_logits", "attn_probs")
"""The attention core's ``[B, H, T, T]`` tensors: the scores and the softmax. They are the
activation memory that grows with the square of the sequence length."""

PROJECTIONS: tuple[str, ...] = (
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_out",
    "mlp_gate",
    "mlp_up",
    "mlp_down",
)
"""Names of weight-matmul outputs (``mlp_gate``: the gate of a gated MLP, as in Llama)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Preset:
    """A registered policy rule: what it does to groups of names and to the rest.

    Attributes:
        doc: one line of what the preset does.
        source: where it comes from (paper, library, JAX policy).
        rest: the action of every name not in ``groups``.
        groups: ``(names, action)`` pairs; the names a model tags get ``action``.
        untagged: what happens to intermediates without a name.
        remat: ``False`` means no remat at all.
        segments: remat each block, or segments of ~sqrt(L) blocks.

    Example:
        >>> from jaxoff.policy import PRESETS
        >>> sel = PRESETS["selective"].for_names(("layer_input", "attn_probs", "mlp_gate"))
        >>> sel.describe()
        'attn_probs=remat,*=device'
    """

    doc: str
    source: str
    rest: Action = Action.REMAT
    groups: tuple[tuple[tuple[str, ...], Action], ...] = ()
    untagged: Untagged = Untagged.RECOMPUTE
    remat: bool = True
    segments: Segments = Segments.LAYER

    def for_names(self, names: Sequence[str] | None = None) -> Policy:
        """The preset's :class:`Policy` over ``names`` (default: the GPT's names)."""
        return _evaluate(self, as_names(names))

    @property
    def policy(self) -> Policy:
        """The preset over the GPT's names (``jaxoff.models.gpt.RESIDUAL_NAMES``)."""
        return self.for_names(None)

    @property
    def group_names(self) -> tuple[str, ...]:
        """The names the preset's groups act on (empty for a preset without groups)."""
        return tuple(n for group, _ in self.groups for n in group)

    def misses(self, names: Sequence[str]) -> bool:
        """Whether the preset has groups and ``names`` (a model's) include none of their
        names: over that model it is its rest action for every name.

        >>> from jaxoff.policy import PRESETS
        >>> PRESETS["selective"].misses(("layer_input", "ff_act")), PRESETS["full"].misses(())
        (True, False)
        """
        return bool(self.groups) and not set(self.group_names) & set(names)

    @property
    def needs_names(self) -> bool:
        """Whether the preset acts through residual names (see :attr:`Policy.needs_names`):
        ``False`` for the presets that work on a model tagging no names."""
        actions = [self.rest, *(a for _, a in self.groups)]
        return self.remat and any(a is not Action.REMAT for a in actions)


@functools.cache
def _evaluate(preset: Preset, names: tuple[str, ...]) -> Policy:
    mapping: dict[str, Action] = {"*": preset.rest}
    for group, action in preset.groups:
        mapping.update((n, action) for n in group if n in names)
    return Policy.from_mapping(
        mapping,
        names=names,
        untagged=preset.untagged,
        remat=preset.remat,
        segments=preset.segments,
    )


_KEEP, _OFFLOAD, _REMAT = Action.DEVICE, Action.OFFLOAD, Action.REMAT

PRESETS: Mapping[str, Preset] = {
    "none": Preset(
        rest=_KEEP,
        remat=False,
        doc="no remat: every residual stays on device, nothing is recomputed",
        source="plain autodiff (the blocks do not run under remat)",
    ),
    "full": Preset(
        rest=_REMAT,
        doc="recompute everything: only each block's input is kept",
        source="jax.checkpoint_policies.nothing_saveable",
    ),
    "dots_saveable": Preset(
        rest=_REMAT,
        untagged=Untagged.DOTS,
        doc="keep every matmul output, recompute the rest",
        source="jax.checkpoint_policies.dots_saveable",
    ),
    "dots_with_no_batch_dims_saveable": Preset(
        rest=_REMAT,
        untagged=Untagged.DOTS_NO_BATCH,
        doc="keep weight-matmul outputs (no batch dims), recompute attention scores",
        source="jax.checkpoint_policies.dots_with_no_batch_dims_saveable",
    ),
    "selective": Preset(
        rest=_KEEP,
        groups=((ATTENTION_SCORES, _REMAT),),
        doc="recompute the attention scores and softmax, keep the rest (the attention "
        "context included)",
        source="Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large "
        "Transformer Models', Sec. 4.2 (Megatron-LM selective activation recomputation: "
        "the core attention is recomputed from the kept q, k, v; its output, the context, "
        "is kept)",
    ),
    "attention_core": Preset(
        rest=_KEEP,
        groups=((ATTENTION_CORE, _REMAT),),
        doc="recompute the attention core (scores, softmax, context), keep the rest: "
        "selective less one [B, T, D] tensor per layer, for one more batched matmul",
        source="jaxoff: Megatron-LM's selective recomputation, the attention context "
        "recomputed too (jaxoff's 'selective' before it kept the context)",
    ),
    "offload_all": Preset(
        rest=_OFFLOAD,
        doc="every named residual to host memory, nothing recomputed but untagged ops",
        source="Rhu et al. 2016, 'vDNN: Virtualized Deep Neural Networks' (offload all)",
    ),
    "offload_dots": Preset(
        rest=_REMAT,
        groups=((PROJECTIONS, _OFFLOAD),),
        doc="weight-matmul outputs (q, k, v, out, gate, up, down: those the model tags) to "
        "host, recompute the rest",
        source="MaxText remat_policy='minimal_offloaded' (save_and_offload_only_these_names)",
    ),
    "sqrt": Preset(
        rest=_REMAT,
        segments=Segments.SQRT,
        doc="keep only every k-th layer boundary, k = round(sqrt(L)); recompute each "
        "segment's forward once in backward: activation memory grows as sqrt(L)",
        source="Chen et al. 2016, 'Training Deep Nets with Sublinear Memory Cost' (Sec. 4.1, "
        "segments of sqrt(n) layers)",
    ),
    "sqrt_bytes": Preset(
        rest=_REMAT,
        segments=Segments.BYTES,
        doc="sqrt's segments, k from the block's traced bytes: the k that minimises "
        "ceil(L / k) boundaries plus k interiors (k = 1, per-block like full, until depth "
        "makes segments pay)",
        source="jaxoff: Chen et al. 2016's segments sized by jaxoff.nn.SegmentPlan",
    ),
}
"""Name -> :class:`Preset`. ``jaxoff compare --policies`` and ``--policy`` accept these.

``PRESETS[name].policy`` is the preset over the GPT's names; :func:`preset` (or
:meth:`Preset.for_names`) evaluates it over any model's."""


def preset(name: str, names: Sequence[str] | None = None) -> Policy:
    """The preset ``name`` as a :class:`Policy` over ``names`` (default: the GPT's names).

    Raises:
        ConfigError: ``name`` is not a preset (the message lists them).

    Example:
        >>> from jaxoff.policy import preset
        >>> names = ("attn_q", "attn_probs", "mlp_gate", "mlp_up", "mlp_act")
        >>> preset("offload_dots", names).offloaded()
        ('attn_q', 'mlp_gate', 'mlp_up')
    """
    if name not in PRESETS:
        raise ConfigError(f"{name!r} is not a policy preset; presets are {', '.join(PRESETS)}")
    return PRESETS[name].for_names(names)
