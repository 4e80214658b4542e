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
from ._layout import plan_layout as plan_layout
from ._pager import WAIT_COUNTERS as WAIT_COUNTERS
from ._pager import Pager as Pager
from ._pager import PagerConfig as PagerConfig
from ._pager import PagerError as PagerError
from ._pager import io_stats as io_stats
from ._pager import page_begin as page_begin
from ._pager import page_commit as page_commit
from ._pager import page_out as page_out
from ._pager import page_take as page_take
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

__all__ = [
    "MAX_CHUNK_BYTES",
    "BackendStatus",
    "backend_status",
    "CudaStatus",
    "cuda_status",
    "Engine",
    "EngineConfig",
    "crc32c",
    "page_begin",
    "page_take",
    "page_out",
    "page_commit",
    "Pager",
    "PagerConfig",
    "PagerError",
    "io_stats",
    "WAIT_COUNTERS",
    "file_table_stats",
    "register_file_table",
    "register_targets",
    "unregister_file_table",
    "ChunkInfo",
    "EntryLayout",
    "Layout",
    "PageStore",
    "PageStoreCorruptError",
    "PageStoreTornError",
    "PageStoreError",
    "PageStoreFormatError",
    "PageStoreFullError",
    "PageStoreLayoutError",
    "PageStoreLockedError",
    "PageStoreManifestError",
    "PageStoreNotFoundError",
    "plan_layout",
    "store_error_from",
]
