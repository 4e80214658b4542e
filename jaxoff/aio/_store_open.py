"""Creating and opening a :class:`~jaxoff.aio.PageStore`'s directory: the store's own
folder (no files of others), its marker of owned files, and the in-place mark."""

from __future__ import annotations

import os
from typing import Any, Protocol, TypeVar

from jaxoff.aio import _manifest
from jaxoff.aio._layout import SLOTS, Layout
from jaxoff.aio._lock import StoreLock
from jaxoff.aio._store_errors import PageStoreError
from jaxoff.aio._store_files import owned_files, read_marker, strangers, write_marker


class _Store(Protocol):
    """What a store opened here is (`jaxoff.aio.PageStore`, which builds on this module)."""

    _files: Any

    @property
    def active_slot(self) -> str: ...

    def __init__(self, root: str, layout: Layout, version: int, crcs, lock: StoreLock) -> None: ...

    def _mark_in_place(self) -> None: ...

    def _check_not_torn(self, *args: Any, **kw: Any) -> Any: ...


S = TypeVar("S", bound=_Store)

IN_PLACE_MARK = "IN_PLACE_OPEN"
"""File present while a single-slot store is open (or after its user died)."""


def create_locked(cls: type[S], root: str, layout: Layout, lock: StoreLock, exist_ok: bool) -> S:
    """Makes an empty store (version 0) in ``root``, whose ``lock`` is held."""
    old_layout = None
    if os.path.exists(os.path.join(root, _manifest.MANIFEST)):
        if not exist_ok:
            raise PageStoreError(
                f"a page store already exists at {root}; open it with PageStore.open "
                "(or open_or_create), or pass exist_ok=True to re-initialise it"
            )
        try:
            old_layout = _manifest.read(root)[0]
        except PageStoreError:
            pass  # unreadable: nothing to clean up that we could name
    else:
        refuse_strangers(root, layout)  # again, under the lock
    crcs: _manifest.Crcs = {
        s: {e.name: [None] * len(e.chunks) for e in layout.entries} for s in SLOTS
    }
    store = cls(root, layout, 0, crcs, lock)
    # the marker first, naming every file this store may leave (the old layout's too)
    old_files = owned_files(root, old_layout) or []
    store_id = write_marker(root, store._files.paths + old_files)
    store._files.allocate_all()
    if old_layout is not None:
        store._files.remove_stale(root, old_layout)
    write_marker(root, store._files.paths, store_id)
    _manifest.write(root, layout, 0, crcs)
    store._mark_in_place()
    return store


def open_locked(cls: type[S], root: str, lock: StoreLock) -> S:
    """Opens the store in ``root``, whose ``lock`` is held, at its committed version."""
    layout, version, crcs = _manifest.read(root)
    store = cls(root, layout, version, crcs, lock)
    if read_marker(root) is None:  # a store made before markers: its layout names its files
        write_marker(root, store._files.paths)
    store._files.check(crcs, store.active_slot, version)
    if layout.slots == 1 and os.path.exists(os.path.join(root, IN_PLACE_MARK)):
        store._check_not_torn()
    store._mark_in_place()
    return store


def refuse_strangers(root: str | os.PathLike, layout: Layout) -> None:
    """Refuses a folder that holds files and is not a page store: a store is given a folder
    of its own, and jaxoff never deletes (or writes among) files it did not write."""
    root = os.path.abspath(os.fspath(root))
    ours = {d.split(os.sep)[0] for d in layout.dirs if not os.path.isabs(d)}
    found = [n for n in strangers(root) if n not in ours]
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise PageStoreError(
            f"{root} is not empty and holds no page store (it has {shown}); give the store "
            f"an empty or new directory of its own (jaxoff writes and deletes only its own "
            f"files there)"
        )


def make_root(root: str | os.PathLike) -> str:
    """The store directory as an absolute path, created if missing."""
    root = os.path.abspath(os.fspath(root))
    if os.path.exists(root) and not os.path.isdir(root):
        raise PageStoreError(
            f"cannot create a page store at {root}: it is a file, not a directory; remove it "
            "or choose another store directory"
        )
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise PageStoreError(
            f"cannot create the page store directory {root}: {e.strerror}; choose a directory "
            "you can write to (every parent must be a directory)"
        ) from None
    return root
