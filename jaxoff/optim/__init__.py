"""Paged optimizers: optax state and fp32 master weights in a page store, updated chunk by chunk;
and `fused_adamw`, optax.adamw as one fused C++ pass."""

from ._checkpoint import load_state as load_state
from ._checkpoint import restore_paged as restore_paged
from ._checkpoint import save_paged as save_paged
from ._checks import NotElementwiseError as NotElementwiseError
from ._fused import FusedAdamW as FusedAdamW
from ._fused import FusedAdamWState as FusedAdamWState
from ._fused import fused_adamw as fused_adamw
from ._orbax import PagedCheckpointHandler as PagedCheckpointHandler
from ._orbax import PagedRestore as PagedRestore
from ._orbax import PagedSave as PagedSave
from ._paged import DEFAULT_CHUNK_BYTES as DEFAULT_CHUNK_BYTES
from ._paged import PagedState as PagedState
from ._paged import PagedTransformation as PagedTransformation
from ._paged import paged as paged
from ._paged import update_and_apply as update_and_apply
from ._state import PagedTensors as PagedTensors

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "FusedAdamW",
    "FusedAdamWState",
    "NotElementwiseError",
    "PagedCheckpointHandler",
    "PagedRestore",
    "PagedSave",
    "PagedState",
    "PagedTensors",
    "PagedTransformation",
    "fused_adamw",
    "load_state",
    "paged",
    "restore_paged",
    "save_paged",
    "update_and_apply",
]
