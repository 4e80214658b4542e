"""The page files of a store: their fixed order, ids, chunk table, and keeping them whole."""

from __future__ import annotations

import json
import os
import uuid

import numpy as np

from jaxoff.aio._layout import SLOTS, Layout, check_slot
from jaxoff.aio._manifest import Crcs
from jaxoff.aio._pageio import (
    allocate_file,
    file_size,
    fsync_dir,
    fsync_file,
    sync_filesystems,
)
from jaxoff.aio._store_errors import RESTORE_HINT, PageStoreCorruptError, PageStoreError

TABLE_KEYS = (
    "file_id",
    "offset",
    "nbytes",
    "padded_nbytes",
    "entry",
    "chunk",
    "elem_start",
    "elem_count",
)


class FileTable:
    """All page files of a layout in a fixed order: entry by entry, slot A then B, stripe
    (a single-slot layout has only the A files)."""

    def __init__(self, root: str, layout: Layout):
        self.layout = layout
        self.paths: list[str] = []
        self.ids: dict[tuple[int, str, int], int] = {}  # (entry index, slot, stripe) -> id
        self.sizes: list[int] = []
        seen: dict[str, int] = {}
        for ei, e in enumerate(layout.entries):
            for s in SLOTS:
                for k, size in enumerate(e.file_sizes):
                    # A single-slot layout names one file for both slots: one id for both.
                    path = os.path.normpath(os.path.join(root, layout.relpath(e.name, s, k)))
                    if path not in seen:
                        seen[path] = len(self.paths)
                        self.paths.append(path)
                        self.sizes.append(size)
                    self.ids[(ei, s, k)] = seen[path]
        self._tables: dict[str, dict[str, np.ndarray]] = {}

    def path(self, ei: int, slot: str, stripe: int) -> str:
        return self.paths[self.ids[(ei, slot, stripe)]]

    def chunk_table(self, slot: str) -> dict[str, np.ndarray]:
        check_slot(slot)
        if slot not in self._tables:
            rows = [
                (
                    self.ids[(ei, slot, c.stripe)],
                    c.offset,
                    c.nbytes,
                    c.padded_nbytes,
                    ei,
                    c.index,
                    c.elem_start,
                    c.elem_count,
                )
                for ei, e in enumerate(self.layout.entries)
                for c in e.chunks
            ]
            cols = np.array(rows, np.int64).reshape(len(rows), len(TABLE_KEYS))
            self._tables[slot] = {k: cols[:, i].copy() for i, k in enumerate(TABLE_KEYS)}
        return {k: v.copy() for k, v in self._tables[slot].items()}

    def allocate_all(self) -> None:
        """Creates every file at its size, blocks reserved; existing contents are kept."""
        dirs = sorted({os.path.dirname(p) for p in self.paths})
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        for path, size in zip(self.paths, self.sizes, strict=True):
            allocate_file(path, size)
        for d in dirs:
            fsync_dir(d)

    def check(self, crcs: Crcs, active_slot: str, version: int) -> None:
        """Raises if a file holding committed data is missing or short; re-creates the others.

        Files of the inactive slot (or never written) hold nothing that is needed, so a missing
        or short one is simply re-created at its size.
        """
        done = set()
        # The active slot first: in a single-slot layout its file is also the other slot's.
        for (ei, s, _), fid in sorted(self.ids.items(), key=lambda kv: kv[0][1] != active_slot):
            if fid in done:
                continue
            done.add(fid)
            e = self.layout.entries[ei]
            path, want = self.paths[fid], self.sizes[fid]
            size = file_size(path)
            if size == want:
                continue
            if s == active_slot and any(c is not None for c in crcs[s][e.name]):
                if size is None:
                    raise PageStoreCorruptError(
                        f"page file {path} of version {version} is missing: " + RESTORE_HINT
                    )
                if size < want:
                    raise PageStoreCorruptError(
                        f"page file {path} is {want - size} bytes short (expected {want} bytes, "
                        f"found {size}): the store was damaged, e.g. by a crashed run or a "
                        "full disk; " + RESTORE_HINT
                    )
                continue  # longer than needed: harmless
            allocate_file(path, want)

    def slot_paths(self, slot: str) -> list[str]:
        """The page files of ``slot``, in table order."""
        return [self.paths[fid] for (_, s, _), fid in self.ids.items() if s == slot]

    def fsync_slot(self, slot: str) -> None:
        """Makes the slot's page files durable: one syncfs per filesystem where it is trusted
        (`jaxoff.aio._pageio.sync_filesystems`), else `fsync_each`."""
        paths = self.slot_paths(slot)
        try:
            if sync_filesystems(paths):
                return
        except OSError as e:
            raise PageStoreError(
                f"making the page files of {os.path.dirname(paths[0])} durable failed: {e}; "
                "the previous version is still current"
            ) from e
        self.fsync_each(slot)

    def fsync_each(self, slot: str) -> None:
        """Makes the slot's page files durable with an fsync of each."""
        for path in self.slot_paths(slot):
            try:
                fsync_file(path)
            except OSError as e:
                raise PageStoreError(
                    f"fsync of page file {path} failed: {e}; the previous version is still current"
                ) from e

    def remove_stale(self, root: str, old: Layout) -> None:
        """Deletes the files of an old layout that this one does not use.

        Re-initialising a store with another layout must not leave the old entries' files
        behind, or disk usage would grow with every change of model.
        """
        keep = set(self.paths)
        for old_file in FileTable(root, old).paths:
            if old_file not in keep and os.path.exists(old_file):
                os.remove(old_file)
        if old.ram_dir is not None and old.ram_dir != self.layout.ram_dir:
            try:
                os.rmdir(old.ram_dir)  # only when empty: another file there is not ours
            except OSError:
                pass

    def disk_bytes(self) -> int:
        return sum(os.stat(p).st_blocks * 512 for p in self.paths if os.path.exists(p))


# ----------------------------------------------------------------- ownership

MARKER = "jaxoff-store.json"
"""The store's marker: written when the store is created, before any page file, it names the
store (a random id) and every file its layout allocates. A folder without it (or without a
``manifest.json``) is not a jaxoff store, and jaxoff deletes nothing in it."""
MARKER_FORMAT = "jaxoff-store-owner/1"
# files of the store's own machinery, beside the page files
_OWN_NAMES = ("manifest.json", "manifest.json.tmp", "IN_PLACE_OPEN", MARKER + ".tmp")
_HOUSEKEEPING = ("LOCK", MARKER, *_OWN_NAMES)


def _rel(root: str, path: str) -> str:
    rel = os.path.relpath(path, root)
    return path if rel.startswith("..") else rel


def write_marker(root: str, paths: list[str], store_id: str | None = None) -> str:
    """Writes ``<root>/jaxoff-store.json`` atomically (fsynced) naming ``paths`` (absolute)
    as the store's files; returns the store id (``store_id``, else the marker's, else new)."""

    if store_id is None:
        old = read_marker(root)
        store_id = old["id"] if old else uuid.uuid4().hex
    doc = {"format": MARKER_FORMAT, "id": store_id, "files": sorted(_rel(root, p) for p in paths)}
    tmp = os.path.join(root, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, MARKER))
    fsync_dir(root)
    return store_id


def read_marker(root: str) -> dict | None:
    """The marker's document, or None when there is none or it is unreadable."""

    try:
        with open(os.path.join(root, MARKER)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(doc, dict)
        and doc.get("format") == MARKER_FORMAT
        and isinstance(doc.get("id"), str)
        and isinstance(doc.get("files"), list)
        and all(isinstance(p, str) for p in doc["files"])
    )
    return doc if ok else None


def is_store(root: str | os.PathLike) -> bool:
    """Whether ``root`` is a jaxoff page store (it has its manifest or its marker)."""
    root = os.fspath(root)
    return any(os.path.isfile(os.path.join(root, n)) for n in ("manifest.json", MARKER))


def strangers(root: str | os.PathLike) -> list[str]:
    """The entries of folder ``root`` that are not a store's own (sorted; [] when ``root``
    is missing, empty, or a store: a store's folder belongs to it)."""
    root = os.fspath(root)
    if not os.path.isdir(root) or is_store(root):
        return []
    return sorted(
        n
        for n in os.listdir(root)
        if n not in _HOUSEKEEPING and not _process_store(os.path.join(root, n))
    )


def _process_store(path: str) -> bool:
    """A store of one process of a multi-process run (``<store>/process-<i>``)."""
    name = os.path.basename(path)
    return name.startswith("process-") and name[8:].isdigit() and is_store(path)


def owned_files(root: str, layout: Layout | None = None) -> list[str] | None:
    """Every file the store at ``root`` can prove it wrote (absolute paths): the files its
    marker names, those of ``layout`` (its manifest's, when readable) and its machinery's
    (manifest, marks); None when it has neither a readable marker nor a layout."""
    marker = read_marker(root)
    if marker is None and layout is None:
        return None
    files = {os.path.join(root, n) for n in _OWN_NAMES}
    if marker is not None:
        files |= {os.path.normpath(os.path.join(root, p)) for p in marker["files"]}
    if layout is not None:
        files |= set(FileTable(root, layout).paths)
    return sorted(files)


def remove_owned(root: str, files: list[str]) -> None:
    """Deletes ``files`` (those `owned_files` named) and the folders of them that are left
    empty, up to ``root`` (kept, with its ``LOCK`` and marker); nothing else."""
    dirs = set()
    for path in files:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        dirs.add(os.path.dirname(path))
    root = os.path.normpath(root)
    for d in sorted(dirs, key=len, reverse=True):
        while os.path.normpath(d) != root and d.startswith(root + os.sep):
            try:
                os.rmdir(d)  # only when empty: another file there is not ours
            except OSError:
                break
            d = os.path.dirname(d)
    for d in dirs:  # a RAM tier's folder (outside the root), once empty
        if not d.startswith(root + os.sep) and os.path.basename(d).startswith("jaxoff-"):
            try:
                os.rmdir(d)
            except OSError:
                pass
    fsync_dir(root)
