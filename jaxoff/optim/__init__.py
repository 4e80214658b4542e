"""Paged optimizers: optax state and fp32 master weights in a page store, updated chunk by chunk;
and `fused_adamw`, optax.adamw as one fused C++ pass; the chunk-update API (`chunk_updater`)
for strategies that page the update themselves."""

from ._checkpoint import copy_in as copy_in
from ._checkpoint import copy_out as copy_out
from ._checkpoint import load_state as load_state
from ._checkpoint import restore_paged as restore_paged
from ._checkpoint import save_paged as save_paged
from ._checks import NotElementwiseError as NotElementwiseError
from ._chunks_api import RAM_ENTRY as RAM_ENTRY
from ._chunks_api import ChunkUpdater as ChunkUpdater
from ._chunks_api import EntryIO as EntryIO
from ._chunks_api import LeafPlan as LeafPlan
from ._chunks_api import Plan as Plan
from ._chunks_api import chunk_updater as chunk_updater
from ._chunks_api import commit_gate as commit_gate
from ._chunks_api import crc_shapes as crc_shapes
from ._chunks_api import ends_with_paged as ends_with_paged
from ._chunks_api import entry_ios as entry_ios
from ._chunks_api import pack_crcs as pack_crcs
from ._chunks_api import path_name as path_name
from ._chunks_api import ram_bytes as ram_bytes
from ._chunks_api import ram_bytes_np as ram_bytes_np
from ._chunks_api import unpack_crcs as unpack_crcs
from ._chunks_api import write_chunk as write_chunk
from ._commit import StepCommit as StepCommit
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
from ._paged import ram_from_bytes as ram_from_bytes
from ._paged import update_and_apply as update_and_apply
from ._pipeline import as_bits as as_bits
from ._state import PagedTensors as PagedTensors
from ._stepplan import ChunkIO as ChunkIO
from ._stepplan import StepPlan as StepPlan

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_ENGINE",
    "RAM_ENTRY",
    "ChunkUpdater",
    "EntryIO",
    "LeafPlan",
    "Plan",
    "StepCommit",
    "StepPlan",
    "ChunkIO",
    "as_bits",
    "chunk_updater",
    "commit_gate",
    "crc_shapes",
    "ends_with_paged",
    "entry_ios",
    "pack_crcs",
    "path_name",
    "ram_bytes",
    "ram_bytes_np",
    "unpack_crcs",
    "ram_from_bytes",
    "write_chunk",
    "FusedAdamW",
    "FusedAdamWState",
    "NotElementwiseError",
    "PagedCheckpointHandler",
    "PagedRestore",
    "PagedSave",
    "PagedState",
    "PagedTensors",
    "PagedTransformation",
    "copy_in",
    "copy_out",
    "fused_adamw",
    "load_state",
    "paged",
    "restore_paged",
    "save_paged",
    "update_and_apply",
]
