"""Async I/O: the page store (crash-consistent page files) and, over the C++ engine, paging calls."""

from ._layout import ChunkInfo as ChunkInfo
from ._layout import EntryLayout as EntryLayout
from ._layout import Layout as Layout
from ._layout import plan_layout as plan_layout
from ._store import PageStore as PageStore
from ._store_errors import PageStoreCorruptError as PageStoreCorruptError
from ._store_errors import PageStoreError as PageStoreError
from ._store_errors import PageStoreFormatError as PageStoreFormatError
from ._store_errors import PageStoreFullError as PageStoreFullError
from ._store_errors import PageStoreLayoutError as PageStoreLayoutError
from ._store_errors import PageStoreLockedError as PageStoreLockedError
from ._store_errors import PageStoreNotFoundError as PageStoreNotFoundError

__all__ = [
    "ChunkInfo",
    "EntryLayout",
    "Layout",
    "PageStore",
    "PageStoreCorruptError",
    "PageStoreError",
    "PageStoreFormatError",
    "PageStoreFullError",
    "PageStoreLayoutError",
    "PageStoreLockedError",
    "PageStoreNotFoundError",
    "plan_layout",
]
