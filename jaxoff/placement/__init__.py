"""Where parameters, gradients and optimizer states live, and layer streaming.

A placement is data (:class:`Placement`, presets in :data:`PRESETS`); it becomes
shardings with a ``memory_kind`` (:func:`state_shardings`, FSDP-sharded on a mesh) for
the jitted step's in/out shardings, and two helpers the step composes:
:func:`fetch_params` (host parameters to the device before the forward pass, unless
the layers stream) and :func:`make_update` (the optimizer update where the placement
says). Layer streaming itself lives in the layer-stack primitive (``jaxoff.nn.stream_blocks``),
switched on by :func:`streamed_model`. :func:`jit_step` compiles with
``jaxoff.compiler_options``; within :func:`xla_default_options` with XLA's defaults.
"""

from .._xla import xla_default_options as xla_default_options
from ._apply import fetch_params as fetch_params
from ._apply import global_norm as global_norm
from ._apply import make_update as make_update
from ._apply import move as move
from ._apply import streamed_model as streamed_model
from ._check import check_placement as check_placement
from ._export import analyze as analyze_export
from ._jit import abstract_with as abstract_with
from ._jit import compile_placed as compile_placed
from ._jit import jit_step as jit_step
from ._placement import PRESETS as PRESETS
from ._placement import Placement as Placement
from ._placement import get_placement as get_placement
from ._placement import with_paged_optimizer as with_paged_optimizer
from ._shardings import FSDP_AXIS as FSDP_AXIS
from ._shardings import batch_sharding as batch_sharding
from ._shardings import bytes_by_kind as bytes_by_kind
from ._shardings import from_host as from_host
from ._shardings import make_mesh as make_mesh
from ._shardings import state_shardings as state_shardings
from ._shardings import tree_shardings as tree_shardings

__all__ = [
    "FSDP_AXIS",
    "PRESETS",
    "Placement",
    "abstract_with",
    "analyze_export",
    "batch_sharding",
    "bytes_by_kind",
    "check_placement",
    "compile_placed",
    "fetch_params",
    "from_host",
    "get_placement",
    "global_norm",
    "jit_step",
    "make_mesh",
    "make_update",
    "move",
    "state_shardings",
    "streamed_model",
    "tree_shardings",
    "with_paged_optimizer",
    "xla_default_options",
]
