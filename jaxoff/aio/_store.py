"""PageStore: named tensors in chunked, checksummed, double-buffered page files on disk."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import crc32c
import numpy as np

from jaxoff import _faults
from jaxoff.aio import _error_from, _manifest
from jaxoff.aio._layout import (
    SLOTS,
    Layout,
    check_slot,
    layout_differences,
    plan_layout,
)
from jaxoff.aio._lock import StoreLock
from jaxoff.aio._pageio import _io_read, _io_write, fsync_dir
from jaxoff.aio._store_errors import (
    RESTORE_HINT,
    PageStoreCorruptError,
    PageStoreError,
    PageStoreLayoutError,
    PageStoreNotFoundError,
    PageStoreTornError,
)
from jaxoff.aio._store_open import (
    IN_PLACE_MARK,
    create_locked,
    make_root,
    open_locked,
    refuse_strangers,
)
from jaxoff.aio._store_state import StoreState


class PageStore(StoreState):
    """A directory of named tensors, each cut into aligned chunks, with two slots (A and B).

    Version ``V`` of every entry lives in slot ``"A" if V % 2 == 0 else "B"`` (the active
    slot). New data goes to the other (inactive) slot; `commit` fsyncs it, records its crc32c
    checksums and atomically makes it version ``V + 1``, so a crash at any moment leaves the
    last committed version readable. The store is locked for one user while it is open.

    A single-slot store (``slots=1``) keeps one file per entry: both slot names address it, so
    new versions are written in place over the committed one. It needs half the disk, but a
    crash during an update leaves a mix of two versions that no commit describes. Such a
    store is marked ``IN_PLACE_OPEN`` while open; opening a store that still carries the mark
    (its process died) checks every chunk against the last commit and raises
    `PageStoreTornError` if any was overwritten: the optimizer state must then come from a
    checkpoint. Reads verify checksums in any case.

    Construct with `create`, `open` or `open_or_create`, never directly.

    >>> import tempfile, numpy as np
    >>> root = tempfile.mkdtemp() + "/store"
    >>> entries = {"opt.mu.w": ((3, 5), "float32")}
    >>> with PageStore.create(root, entries, chunk_bytes=4096) as store:
    ...     store.write("opt.mu.w", np.ones((3, 5), np.float32))
    ...     store.commit()
    1
    >>> with PageStore.open(root) as store:
    ...     print(store.version, store.active_slot, store.read("opt.mu.w").sum())
    1 B 15.0
    """

    # ----------------------------------------------------------------- construction

    @classmethod
    def create(
        cls,
        root: str | os.PathLike,
        layout_or_entries: Layout | Mapping[str, Any],
        *,
        chunk_bytes: int | None = None,
        dirs: list[str] | None = None,
        exist_ok: bool = False,
        slots: int = 2,
    ) -> PageStore:
        """Creates an empty store (version 0, nothing written) and returns it open.

        Args:
          root: the store directory; created if missing.
          layout_or_entries: a `Layout` or ``{name: ShapeDtypeStruct | (shape, dtype)}``.
          chunk_bytes: bytes per chunk, a multiple of 4096 (required with entries).
          dirs: data directories (absolute or relative to ``root``), striped round robin.
          exist_ok: if a store already exists at ``root``, re-initialise it (its data is
            discarded; page files with the same names are reused) instead of raising.
          slots: 2 (atomic commits) or 1 (in-place updates, half the disk; see the class doc).

        Raises:
          PageStoreLayoutError: bad arguments. PageStoreFullError: not enough disk space.
          PageStoreLockedError: the store is in use. PageStoreError: ``root`` holds a store
            (and ``exist_ok`` is false) or unrelated files.
        """
        layout = plan_layout(layout_or_entries, chunk_bytes, dirs, slots)
        refuse_strangers(root, layout)
        root = make_root(root)
        lock = StoreLock(root)
        try:
            return create_locked(cls, root, layout, lock, exist_ok)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def open(cls, root: str | os.PathLike) -> PageStore:
        """Opens an existing store at its last committed version.

        Raises:
          PageStoreNotFoundError: no store at ``root``. PageStoreFormatError: bad manifest.
          PageStoreCorruptError: a page file of the committed version is missing or short.
          PageStoreTornError: a single-slot store was left mid-update by a crash.
          PageStoreLockedError: the store is in use.
        """
        root = os.path.abspath(os.fspath(root))
        if os.path.exists(root) and not os.path.isdir(root):
            raise PageStoreNotFoundError(
                f"page store {root} is a file, not a store directory; pass the directory "
                "jaxoff created for the store, or create one with PageStore.create"
            )
        if not os.path.isdir(root):
            _manifest.read(root)  # raises the "does not exist" error
        lock = StoreLock(root)
        try:
            return open_locked(cls, root, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def open_or_create(
        cls,
        root: str | os.PathLike,
        layout_or_entries: Layout | Mapping[str, Any],
        *,
        chunk_bytes: int | None = None,
        dirs: list[str] | None = None,
        slots: int = 2,
    ) -> PageStore:
        """Opens the store at ``root`` if it has this layout (``slots`` included), else
        creates it.

        Raises:
          PageStoreLayoutError: a store exists with a different layout (the message lists
            the differences).
        """
        layout = plan_layout(layout_or_entries, chunk_bytes, dirs, slots)
        refuse_strangers(root, layout)  # before anything is written there (LOCK included)
        root = make_root(root)
        lock = StoreLock(root)  # before looking, so two racing callers cannot both create
        try:
            if not os.path.exists(os.path.join(root, _manifest.MANIFEST)):
                return create_locked(cls, root, layout, lock, exist_ok=True)
            store = open_locked(cls, root, lock)
        except BaseException:
            lock.release()
            raise
        diffs = layout_differences(store.layout, layout)
        if diffs:
            store.close()
            raise PageStoreLayoutError(
                f"page store {root} has a different layout than requested:\n  - "
                + "\n  - ".join(diffs)
                + "\nIt holds the state of another model or configuration: use another "
                "store directory, or delete this one to start afresh"
            )
        return store

    # ----------------------------------------------------------------- numpy I/O

    def read(self, name: str, slot: str | None = None) -> np.ndarray:
        """Reads an entry (default: the committed version) and verifies its checksums."""
        self._check_open()
        self._settle()
        ei = self._layout.index(name)
        e = self._layout.entries[ei]
        out = np.empty(e.size, e.dtype)
        raw = out.view(np.uint8)
        for c in e.chunks:
            start = c.elem_start * e.dtype.itemsize
            self._read_verified(ei, c.index, slot, raw[start : start + c.nbytes])
        return out.reshape(e.shape)

    def read_chunk(self, name: str, chunk_index: int, slot: str | None = None) -> np.ndarray:
        """Reads one chunk as a 1-D array of ``elem_count`` elements, verified."""
        self._check_open()
        self._settle()
        ei = self._layout.index(name)
        e, c = self._layout.entries[ei], self._chunk(ei, chunk_index)
        out = np.empty(c.elem_count, e.dtype)
        self._read_verified(ei, c.index, slot, out.view(np.uint8))
        return out

    def write(self, name: str, array: Any) -> None:
        """Writes a whole entry into the inactive slot; it becomes current at `commit`."""
        self._check_open()
        self.wait_committed()
        ei = self._layout.index(name)
        e = self._layout.entries[ei]
        arr = self._as_array(e, array, e.shape, f"entry {name!r}")
        raw = arr.reshape(-1).view(np.uint8)
        for c in e.chunks:
            start = c.elem_start * e.dtype.itemsize
            self._write_raw(ei, c.index, raw[start : start + c.nbytes])

    def write_chunk(self, name: str, chunk_index: int, data: Any) -> None:
        """Writes one chunk (``elem_count`` elements of the entry's dtype) to the inactive slot."""
        self._check_open()
        self.wait_committed()
        ei = self._layout.index(name)
        e, c = self._layout.entries[ei], self._chunk(ei, chunk_index)
        arr = self._as_array(e, data, None, f"chunk {chunk_index} of {name!r}")
        if arr.size != c.elem_count:
            raise PageStoreLayoutError(
                f"chunk {chunk_index} of {name!r} holds {c.elem_count} elements, got {arr.size}"
            )
        self._write_raw(ei, c.index, arr.reshape(-1).view(np.uint8))

    def commit(
        self,
        crcs: Mapping[str, Any] | None = None,
        *,
        background: bool = False,
        durable: bool = False,
        version: int | None = None,
    ) -> int:
        """Makes everything written to the inactive slot durable and current; returns the version.

        Args:
          crcs: ``{name: [crc32c per chunk]}`` for chunks written by someone else (the FFI
            page-out calls); ``None`` items keep what `write`/`write_chunk` recorded.
          background: return as soon as the new version is decided, and make it durable (fsync
            the slot, write the manifest) on a thread while the caller goes on: a paged step
            commits this way, so the disk's cache flush runs behind the next step's forward
            pass instead of ending this one. Until it is done this process already reads the
            new version (`version` reports it), every write to the store and the next commit
            first wait for it (`wait_committed`; writes must not overwrite the slot of the
            last durable version), and a crash leaves the previous version current, as a
            crash before a commit does. If it fails, the store goes back to the previous
            version and the next `wait_committed` (hence the next write, commit, `abort`,
            `verify` or `close`) raises its error.

        Every chunk of every entry must have been written for the new version: an unwritten
        chunk would silently expose data two versions old.

        Raises:
          PageStoreError: chunks not written (nothing is committed). PageStoreFullError: no
            space for the manifest (the previous version stays current).
        """
        try:
            with self._locked():  # a close() or commit() in another thread waits for this one
                self.wait_committed()
                return self._commit(crcs, background, durable, version)
        except PageStoreError as e:
            self.last_error = _error_from.record(e)
            raise

    def wait_committed(self) -> None:
        """Waits for a background `commit` to be durable (and, where a pager commits the store
        behind the steps, for those steps); raises its error if it failed (once: the store is
        then back at the previous version)."""
        with self._locked():
            thread, self._finishing = self._finishing, None
            if thread is not None:
                thread.join()
            failed, self._finish_error = self._finish_error, None
        if failed is not None:
            error, self._version, self._crcs = failed
            self.last_error = _error_from.record(error)
            raise error

    def commit_failed(self) -> PageStoreError | None:
        """The error of a background `commit` that has already failed (not waiting for one
        still running); None if there is none."""
        failed = self._finish_error
        return None if failed is None else failed[0]

    def _commit(
        self,
        crcs: Mapping[str, Any] | None,
        background: bool = False,
        durable: bool = False,
        number: int | None = None,
    ) -> int:
        self._check_open()
        if number is not None and (
            number < 1 or (self._layout.slots == 2 and number % 2 == self._version % 2)
        ):
            raise PageStoreError(
                f"cannot commit version {number} of {self._root}: the slot being written "
                f"holds versions of parity {(self._version + 1) % 2} (the store is at version "
                f"{self._version})"
            )
        pending = {n: list(v) for n, v in self._pending.items()}
        for name, values in (crcs or {}).items():
            e = self._layout.entry(name)
            for i, v in enumerate(_manifest.check_crc_list(values, len(e.chunks), name)):
                if v is not None:
                    pending[name][i] = v
        missing = {n: [i for i, v in enumerate(vs) if v is None] for n, vs in pending.items()}
        missing = {n: ix for n, ix in missing.items() if ix}
        if missing:
            shown = "; ".join(f"{n!r} chunks {ix[:8]}" for n, ix in list(missing.items())[:5])
            raise PageStoreError(
                f"cannot commit version {self._version + 1} of {self._root}: "
                f"{sum(map(len, missing.values()))} chunks of {len(missing)} entries were not "
                f"written ({shown}). Write every chunk (unchanged entries too) or pass their "
                "crcs, or call abort()"
            )
        version = self._version + 1 if number is None else int(number)
        # the slot of the new version's parity: the inactive one, except when a single-slot
        # store (one file for both) is given back a version of its current parity by a restore
        slot = "A" if version % 2 == 0 else "B"
        new_crcs = {s: dict(self._crcs[s]) for s in SLOTS}
        new_crcs[slot] = pending
        old = (self._version, self._crcs)
        if not background:
            self._make_durable(slot, version, new_crcs, synced=durable)
        self._version, self._crcs = version, new_crcs
        self._pending = self._no_crcs()
        if background:

            def finish():
                try:
                    self._make_durable(slot, version, new_crcs, synced=durable)
                except BaseException as e:  # raised by wait_committed, in the caller's thread
                    err = (
                        e
                        if isinstance(e, PageStoreError)
                        else PageStoreError(
                            f"background commit of version {version} of {self._root} failed: "
                            f"{e!r}; the previous version is still current"
                        )
                    )
                    self._finish_error = (err, *old)

            self._finishing = threading.Thread(
                target=finish, name=f"jaxoff-commit:{self._root}", daemon=False
            )
            self._finishing.start()
        return version

    def _make_durable(
        self, slot: str, version: int, crcs: _manifest.Crcs, synced: bool = False
    ) -> None:
        if not synced:
            self._files.fsync_slot(slot)
        _faults.point("store.commit")  # data durable, the old manifest still current
        _manifest.write(self._root, self._layout, version, crcs)

    def abort(self) -> None:
        """Forgets uncommitted writes; the inactive slot's contents are then meaningless."""
        self.wait_committed()
        self._pending = self._no_crcs()

    def verify(self) -> int:
        """Checks every chunk of the committed version; returns how many were checked.

        Raises:
          PageStoreCorruptError: listing the first bad chunks.
        """
        self._check_open()
        self.wait_committed()
        errors, checked = [], 0
        for ei, e in enumerate(self._layout.entries):
            if self._version == 0:
                break  # nothing committed yet
            for c in e.chunks:
                try:
                    self._read_verified(ei, c.index, None, np.empty(c.nbytes, np.uint8))
                    checked += 1
                except PageStoreCorruptError as err:
                    errors.append(str(err))
        if errors:
            raise PageStoreCorruptError(
                f"{len(errors)} chunks of {self._root} version {self._version} are damaged; "
                f"first: {errors[0]}" + ("".join(f"\n  also: {m}" for m in errors[1:4]))
            )
        return checked

    def disk_bytes(self) -> int:
        """Bytes allocated on disk by the page files and the manifest."""
        manifest = os.stat(os.path.join(self._root, _manifest.MANIFEST))
        return self._files.disk_bytes() + manifest.st_blocks * 512

    def close(self) -> None:
        """Releases the lock; uncommitted writes are discarded. Idempotent.

        A single-slot store keeps its ``IN_PLACE_OPEN`` mark when writes of this process were
        not committed (the committed version was partly overwritten): the next open checks it.
        """
        with self._locked():  # not under a commit running in another thread
            try:
                self.wait_committed()  # raised after the lock is released (nothing is lost)
            except PageStoreError:
                self._release(torn=True)  # a single-slot store was overwritten, not committed
                raise
            self._release()

    def _release(self, torn: bool = False) -> None:
        if not self.closed and self._layout.slots == 1 and not torn:
            if not any(v is not None for vs in self._pending.values() for v in vs):
                mark = os.path.join(self._root, IN_PLACE_MARK)
                if os.path.exists(mark):
                    os.remove(mark)
                    fsync_dir(self._root)
        self._pending = self._no_crcs()
        self._lock.release()

    def __enter__(self) -> PageStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:  # a store dropped without close() must not keep its directory locked
            self._lock.release()
        except Exception:
            pass

    # ----------------------------------------------------------------- internals

    def _mark_in_place(self) -> None:
        """Single slot: marks the store open (durably) until a clean `close`."""
        if self._layout.slots == 1:
            path = os.path.join(self._root, IN_PLACE_MARK)
            with open(path, "w") as f:
                f.write(f"{os.getpid()}\n")
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(self._root)

    def _check_not_torn(self) -> None:
        """A single-slot store whose last user did not close it: every committed chunk must
        still be what the last commit recorded."""
        try:
            self.verify()
        except PageStoreCorruptError as e:  # (the caller releases the lock; the mark stays)
            raise PageStoreTornError(
                f"page store {self._root} is single-slot (slots=1, updated in place) and its "
                f"last user stopped during an update: parts of version {self._version} were "
                f"already overwritten ({str(e).split('; first: ')[0]}). A single-slot store "
                "cannot roll back: " + RESTORE_HINT + ". Use slots=2 for stores that survive "
                "a crash mid-update"
            ) from None

    def _write_raw(self, ei: int, index: int, raw: np.ndarray) -> None:
        e = self._layout.entries[ei]
        c = e.chunks[index]
        path = self._files.path(ei, self.inactive_slot, c.stripe)
        self._pending[e.name][index] = None  # a failed write leaves the chunk unwritten
        _io_write(path, c.offset, raw)
        # the stubs type ``data`` as Buffer; numpy's stubs lack __buffer__ before 3.12
        self._pending[e.name][index] = crc32c.crc32c(raw)  # pyright: ignore[reportArgumentType]

    def _read_verified(self, ei: int, index: int, slot: str | None, out: np.ndarray) -> None:
        e = self._layout.entries[ei]
        c = e.chunks[index]
        slot = self.active_slot if slot is None else check_slot(slot)
        want = self._crcs[slot][e.name][index]
        if self._pending[e.name][index] is not None:
            if slot == self.inactive_slot:
                want = self._pending[e.name][index]  # read back what this process just wrote
            elif self._layout.slots == 1:
                raise PageStoreError(
                    f"chunk {index} of {e.name!r} of version {self._version} was overwritten "
                    "in place by an uncommitted write (single-slot store): read it before "
                    "writing, or use slots=2"
                )
        if want is None:
            raise PageStoreError(
                f"chunk {index} of {e.name!r} in slot {slot} holds no data: "
                + (
                    "nothing is committed yet (version 0); write every entry and commit() first"
                    if self._version == 0
                    else "it was never written"
                    if slot != self.active_slot
                    else f"the manifest records no checksum for it although version "
                    f"{self._version} is committed in that slot: the manifest does not match "
                    "its pages; " + RESTORE_HINT
                )
            )
        path = self._files.path(ei, slot, c.stripe)
        _io_read(path, c.offset, c.nbytes, out)
        got = crc32c.crc32c(out)  # pyright: ignore[reportArgumentType]  # ndarray is a Buffer
        if got != want:
            raise PageStoreCorruptError(
                f"checksum mismatch in page file {path} at offset {c.offset} ({c.nbytes} bytes: "
                f"chunk {index} of {e.name!r}, slot {slot}, version {self._version}): expected "
                f"crc32c 0x{want:08x}, got 0x{got:08x}. The data on disk was damaged; "
                + RESTORE_HINT
            )
