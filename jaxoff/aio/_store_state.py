"""What a :class:`~jaxoff.aio.PageStore` knows without touching its pages: its layout,
version, checksums and file tables (the base class of ``PageStore``)."""

from __future__ import annotations

import contextlib
import threading
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxoff.aio import _manifest
from jaxoff.aio._layout import EntryLayout, Layout, check_slot
from jaxoff.aio._lock import StoreLock
from jaxoff.aio._store_errors import PageStoreError, PageStoreLayoutError
from jaxoff.aio._store_files import FileTable


class StoreState:
    """A page store's bookkeeping: the committed version and its checksums, the checksums
    written since (``_pending``), the page files, the lock and a background commit's state.
    :class:`~jaxoff.aio.PageStore` adds the I/O, commits and opening."""

    def __init__(
        self, root: str, layout: Layout, version: int, crcs: _manifest.Crcs, lock: StoreLock
    ):
        self._root = root
        self._layout = layout
        self._version = version
        self._crcs = crcs
        self._lock = lock
        self._pending = self._no_crcs()
        self._files = FileTable(root, layout)
        self.last_error: PageStoreError | None = None
        """The last error a `commit` raised (also when it was raised inside a JAX callback,
        where JAX wraps it: see `jaxoff.aio.store_error_from`)."""
        self._finishing: threading.Thread | None = None  # a background commit's thread
        self._finish_error: tuple | None = None  # (error, version, crcs) it failed with
        self._finish_lock = threading.RLock()  # commit() and close() from two threads
        # Set by the owner of a pager that commits this store behind the steps (see
        # `jaxoff.optim.chunks.PageTransaction`): waits for the steps in flight and their
        # commits, so that what this process reads of the store is what its steps made. A
        # `weakref.WeakMethod` does not keep its owner alive.
        self.settle_hook: Callable[[], Any] | None = None
        self._held = threading.local()  # this thread holds _finish_lock (see `_locked`)

    # ----------------------------------------------------------------- properties

    @property
    def root(self) -> str:
        return self._root

    def _settle(self) -> None:
        """Runs the `settle_hook`, except under `_locked` (the pager's commit needs the lock:
        waiting for it there would never end; callers settle before they lock)."""
        hook = self.settle_hook
        if hook is not None and not getattr(self._held, "depth", 0):
            if isinstance(hook, weakref.WeakMethod):
                hook = hook()  # None once its owner is gone
            if hook is not None:
                hook()

    @contextlib.contextmanager
    def _locked(self):
        """``_finish_lock``, held by this thread (a commit or close after the steps settled)."""
        self._settle()
        with self._finish_lock:
            self._held.depth = getattr(self._held, "depth", 0) + 1
            try:
                yield
            finally:
                self._held.depth -= 1

    @property
    def version(self) -> int:
        """The last committed version (0 right after `create`: nothing written yet)."""
        self._settle()
        return self._version

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def entries(self) -> Mapping[str, EntryLayout]:
        """``{name: EntryLayout}`` in entry-index order (read-only)."""
        return types.MappingProxyType({e.name: e for e in self._layout.entries})

    @property
    def chunk_bytes(self) -> int:
        return self._layout.chunk_bytes

    @property
    def active_slot(self) -> str:
        """The slot holding the committed version: ``"A"`` for even versions, else ``"B"``."""
        return "A" if self._version % 2 == 0 else "B"

    @property
    def inactive_slot(self) -> str:
        """The slot that writes for version ``version + 1`` go to."""
        return "B" if self._version % 2 == 0 else "A"

    def crcs(self, name: str, slot: str | None = None) -> list[int | None]:
        """The crc32c of each chunk of entry ``name`` in ``slot`` (default: the committed
        version's slot), as the manifest records them."""
        if name not in self.entries:
            raise KeyError(
                f"page store {self._root} has no entry {name!r}; it holds {', '.join(self.entries)}"
            )
        self._settle()
        return list(self._crcs[slot or self.active_slot][name])

    @property
    def closed(self) -> bool:
        return not self._lock.held

    # ----------------------------------------------------------------- tables for the FFI

    def file_table(self) -> list[str]:
        """Absolute paths of all page files: entry by entry, slot A then B, stripe by stripe."""
        return list(self._files.paths)

    def file_id(self, name: str, slot: str, chunk_index: int) -> int:
        """Index into `file_table` of the file holding chunk ``chunk_index`` of ``name``."""
        ei = self._layout.index(name)
        chunk = self._chunk(ei, chunk_index)
        return self._files.ids[(ei, check_slot(slot), chunk.stripe)]

    def chunk_table(self, slot: str) -> dict[str, np.ndarray]:
        """Per global chunk (entries in order, chunks in order), int64 arrays of.

        ``file_id`` (into `file_table`, for ``slot``), ``offset``, ``nbytes`` (unpadded, what
        the crc covers), ``padded_nbytes``, ``entry`` (entry index), ``chunk`` (index within
        the entry), ``elem_start`` and ``elem_count``. Reads use the active slot, writes the
        inactive one.
        """
        return self._files.chunk_table(slot)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"version {self._version}"
        return f"PageStore({self._root!r}, {len(self._layout.entries)} entries, {state})"

    # ----------------------------------------------------------------- internals

    def _no_crcs(self) -> dict[str, list[int | None]]:
        return {e.name: [None] * len(e.chunks) for e in self._layout.entries}

    def _check_open(self) -> None:
        if self.closed:
            raise PageStoreError(f"page store {self._root} is closed; open it again")

    def _chunk(self, ei: int, chunk_index: int):
        e = self._layout.entries[ei]
        if not (isinstance(chunk_index, int | np.integer) and 0 <= chunk_index < len(e.chunks)):
            raise PageStoreLayoutError(
                f"entry {e.name!r} has {len(e.chunks)} chunks; chunk index {chunk_index!r} is "
                "out of range"
            )
        return e.chunks[int(chunk_index)]

    @staticmethod
    def _as_array(e: EntryLayout, data: Any, shape, what: str) -> np.ndarray:
        arr = np.asarray(data)
        if arr.dtype != e.dtype:  # no silent casts: a wrong dtype is a bug upstream
            raise PageStoreLayoutError(f"{what} has dtype {e.dtype}, got {arr.dtype}")
        if shape is not None and arr.shape != shape:
            raise PageStoreLayoutError(f"{what} has shape {shape}, got {arr.shape}")
        return np.ascontiguousarray(arr)
