"""The layer-stack primitive and the model protocol: jaxoff's offload machinery for any layered
Flax NNX model.

A model stacks its blocks (:func:`stacked`), runs them with :func:`run_stack` under the
:class:`Stack` its config carries, and tags residuals with ``checkpoint_name``; jaxoff's
commands then set the stack (policy, segments, split, streaming) and placements on it. See
``jaxoff.nn._protocol`` for the protocol a model config implements.
"""

from ._layerwise import LayerLeaf as LayerLeaf
from ._layerwise import layerwise_params as layerwise_params
from ._protocol import BLOCKS as BLOCKS
from ._protocol import LayeredModel as LayeredModel
from ._protocol import check_model as check_model
from ._protocol import count_params as count_params
from ._protocol import model_name as model_name
from ._protocol import with_stack as with_stack
from ._segments import AUTO as AUTO
from ._segments import SegmentPlan as SegmentPlan
from ._segments import chen_blocks as chen_blocks
from ._segments import plan_segments as plan_segments
from ._segments import recorded_segments as recorded_segments
from ._segments import sqrt_segment_size as sqrt_segment_size
from ._stack import PolicySpec as PolicySpec
from ._stack import Stack as Stack
from ._stack import model_state as model_state
from ._stack import num_layers_of as num_layers_of
from ._stack import recomputes_everything as recomputes_everything
from ._stack import refuse_model_state as refuse_model_state
from ._stack import resolve_jax_policy as resolve_jax_policy
from ._stack import run_stack as run_stack
from ._stack import scan_blocks as scan_blocks
from ._stack import split_blocks as split_blocks
from ._stack import stacked as stacked
from ._stack import stream_blocks as stream_blocks

__all__ = [
    "AUTO",
    "BLOCKS",
    "LayerLeaf",
    "LayeredModel",
    "PolicySpec",
    "SegmentPlan",
    "Stack",
    "check_model",
    "chen_blocks",
    "count_params",
    "layerwise_params",
    "model_name",
    "model_state",
    "num_layers_of",
    "plan_segments",
    "recomputes_everything",
    "recorded_segments",
    "refuse_model_state",
    "resolve_jax_policy",
    "run_stack",
    "scan_blocks",
    "split_blocks",
    "sqrt_segment_size",
    "stacked",
    "stream_blocks",
    "with_stack",
]
