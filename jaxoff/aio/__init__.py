"""Async I/O: the C++ engine, the page store (crash-consistent page files), the pager and its
four paging calls (``page_begin``, ``page_take``, ``page_out``, ``page_commit``)."""

from ._backend import BackendStatus as BackendStatus
from ._backend import backend_status as backend_status
from ._cuda import CudaStatus as CudaStatus
from ._cuda import cuda_status as cuda_status
from ._engine import Engine as Engine
from ._engine import EngineConfig as EngineConfig
from ._engine import crc32c as crc32c
from ._error_from import store_error_from as store_error_from
from ._ffi_calls import file_table_stats as file_table_stats
from ._ffi_calls import register_file_table as register_file_table
from ._ffi_calls import register_targets as register_targets
from ._ffi_calls import unregister_file_table as unregister_file_table
from ._layout import MAX_CHUNK_BYTES as MAX_CHUNK_BYTES
from ._layout import ChunkInfo as ChunkInfo
from ._layout import EntryLayout as EntryLayout
from ._layout import Layout as Layout
from ._layout import check_chunk_bytes as check_chunk_bytes
from ._layout import check_slots as check_slots
from ._layout import layout_differences as layout_differences
from ._layout import parse_dtype as parse_dtype
from ._layout import plan_layout as plan_layout
from ._layout import ram_tier_differences as ram_tier_differences
from ._manifest import read as read_manifest
from ._pageio import FULL_ERRNOS as FULL_ERRNOS
from ._pageio import fsync_dir as fsync_dir
from ._pager import WAIT_COUNTERS as WAIT_COUNTERS
from ._pager import Pager as Pager
from ._pager import PagerConfig as PagerConfig
from ._pager import PagerError as PagerError
from ._pager import io_stats as io_stats
from ._pager import owner_name as owner_name
from ._pager import page_begin as page_begin
from ._pager import page_commit as page_commit
from ._pager import page_out as page_out
from ._pager import page_take as page_take
from ._pager import wait_for_steps as wait_for_steps
from ._ramtier import check_ram_tier as check_ram_tier
from ._ramtier import ram_tier_dir as ram_tier_dir
from ._store import PageStore as PageStore
from ._store_errors import PageStoreCorruptError as PageStoreCorruptError
from ._store_errors import PageStoreError as PageStoreError
from ._store_errors import PageStoreFormatError as PageStoreFormatError
from ._store_errors import PageStoreFullError as PageStoreFullError
from ._store_errors import PageStoreLayoutError as PageStoreLayoutError
from ._store_errors import PageStoreLockedError as PageStoreLockedError
from ._store_errors import PageStoreManifestError as PageStoreManifestError
from ._store_errors import PageStoreNotFoundError as PageStoreNotFoundError
from ._store_errors import PageStoreTornError as PageStoreTornError
from ._store_files import is_store as is_store
from ._store_files import owned_files as owned_files
from ._store_files import remove_owned as remove_owned
from ._store_files import strangers as strangers

__all__ = [
    "BackendStatus",
    "ChunkInfo",
    "CudaStatus",
    "Engine",
    "EngineConfig",
    "EntryLayout",
    "FULL_ERRNOS",
    "Layout",
    "MAX_CHUNK_BYTES",
    "PageStore",
    "PageStoreCorruptError",
    "PageStoreError",
    "PageStoreFormatError",
    "PageStoreFullError",
    "PageStoreLayoutError",
    "PageStoreLockedError",
    "PageStoreManifestError",
    "PageStoreNotFoundError",
    "PageStoreTornError",
    "Pager",
    "PagerConfig",
    "PagerError",
    "WAIT_COUNTERS",
    "backend_status",
    "check_chunk_bytes",
    "check_ram_tier",
    "check_slots",
    "crc32c",
    "cuda_status",
    "file_table_stats",
    "fsync_dir",
    "io_stats",
    "is_store",
    "layout_differences",
    "owned_files",
    "owner_name",
    "page_begin",
    "page_commit",
    "page_out",
    "page_take",
    "parse_dtype",
    "plan_layout",
    "ram_tier_differences",
    "ram_tier_dir",
    "read_manifest",
    "register_file_table",
    "register_targets",
    "remove_owned",
    "store_error_from",
    "strangers",
    "unregister_file_table",
    "wait_for_steps",
]
