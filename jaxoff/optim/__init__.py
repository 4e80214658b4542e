"""The paged optimizer: optax state and fp32 master weights in a page store, updated chunk by
chunk; and `fused_adamw`, optax.adamw as one fused C++ pass.

`paged` wraps an element-wise optax transformation (`PagedTransformation`; its state is a
`PagedState` whose paged tensors show as `PagedTensors`); `update_and_apply` runs its update
and applies it in one pass. A paged state is checkpointed with its pages: `save_paged` /
`restore_paged` (a directory), `PagedSave` / `PagedRestore` (orbax, through
`PagedCheckpointHandler`), and `load_state` reads the store's last committed version after a
crash. `DEFAULT_CHUNK_BYTES` and `DEFAULT_ENGINE` are `paged`'s defaults.

Strategies that page the update themselves build on `jaxoff.optim.chunks`.
"""

from ._checkpoint import load_state as load_state
from ._checkpoint import manifest_extra as paged_checkpoint_extra
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
from ._paged import DEFAULT_ENGINE as DEFAULT_ENGINE
from ._paged import PagedState as PagedState
from ._paged import PagedTransformation as PagedTransformation
from ._paged import paged as paged
from ._paged import update_and_apply as update_and_apply
from ._state import PagedTensors as PagedTensors

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_ENGINE",
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
    "paged_checkpoint_extra",
    "restore_paged",
    "save_paged",
    "update_and_apply",
]

# Names that moved to `jaxoff.optim.chunks`: reading one here raises an AttributeError that
# says where it lives now.
_MOVED_TO_CHUNKS = frozenset(
    {
        "ChunkUpdater",
        "LeafPlan",
        "Plan",
        "StepPlan",
        "as_bits",
        "chunk_updater",
        "ends_with_paged",
        "path_name",
    }
)


def __getattr__(name: str):
    if name in _MOVED_TO_CHUNKS:
        raise AttributeError(
            f"module 'jaxoff.optim' has no attribute {name!r}: it moved to jaxoff.optim.chunks "
            f"(the chunk API for strategy authors); import it from there"
        )
    raise AttributeError(f"module 'jaxoff.optim' has no attribute {name!r}")
