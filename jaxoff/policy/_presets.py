"""Named policies, each with where it comes from. Add one by adding a registry entry."""

from __future__ import annotations

import dataclasses

from ._policy import Action, Policy, Segments, Untagged


@dataclasses.dataclass(frozen=True)
class Preset:
    """A registered policy: the policy, one line of what it does, and its source."""

    policy: Policy
    doc: str
    source: str


def _names(mapping: dict[str, Action], rest: Action) -> Policy:
    return Policy.from_mapping({"*": rest, **mapping})


def _build() -> dict[str, Preset]:
    keep, off, remat = Action.DEVICE, Action.OFFLOAD, Action.REMAT
    projections = ("attn_q", "attn_k", "attn_v", "attn_out", "mlp_up", "mlp_down")
    return {
        "none": Preset(
            Policy.uniform(keep, remat=False),
            "no remat: every residual stays on device, nothing is recomputed",
            "plain autodiff (the scan body is not wrapped in remat)",
        ),
        "full": Preset(
            Policy.uniform(remat),
            "recompute everything: only each block's input is kept",
            "jax.checkpoint_policies.nothing_saveable",
        ),
        "dots_saveable": Preset(
            Policy.uniform(remat, untagged=Untagged.DOTS),
            "keep every matmul output, recompute the rest",
            "jax.checkpoint_policies.dots_saveable",
        ),
        "dots_with_no_batch_dims_saveable": Preset(
            Policy.uniform(remat, untagged=Untagged.DOTS_NO_BATCH),
            "keep weight-matmul outputs (no batch dims), recompute attention scores",
            "jax.checkpoint_policies.dots_with_no_batch_dims_saveable",
        ),
        "selective": Preset(
            _names({n: remat for n in ("attn_logits", "attn_probs", "attn_context")}, keep),
            "recompute the attention core (scores, softmax, context), keep the rest",
            "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large "
            "Transformer Models' (Megatron-LM selective activation recomputation)",
        ),
        "offload_all": Preset(
            Policy.uniform(off),
            "every named residual to host memory, nothing recomputed but untagged ops",
            "Rhu et al. 2016, 'vDNN: Virtualized Deep Neural Networks' (offload all)",
        ),
        "offload_dots": Preset(
            _names(dict.fromkeys(projections, off), remat),
            "weight-matmul outputs (q, k, v, out, up, down) to host, recompute the rest",
            "MaxText remat_policy='minimal_offloaded' (save_and_offload_only_these_names)",
        ),
        "sqrt": Preset(
            Policy.uniform(remat, segments=Segments.SQRT),
            "keep only every ~sqrt(L)-th layer boundary; recompute a segment in backward",
            "Chen et al. 2016, 'Training Deep Nets with Sublinear Memory Cost'",
        ),
    }


PRESETS: dict[str, Preset] = _build()
"""Name -> :class:`Preset`. ``jaxoff compare --policies`` and ``--policy`` accept these."""
