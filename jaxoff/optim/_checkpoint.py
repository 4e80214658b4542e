"""Paged optimizer state in checkpoints: streamed chunk by chunk, never whole in RAM.

`save_paged` copies the committed version of the store into a checkpoint directory (one file
per entry, with its crc32c per chunk, written to a temporary directory and renamed into place);
`restore_paged` copies it back into a store (the same or another directory) as a new committed
version and returns the matching `PagedState`; `load_state` rebuilds the state (and parameters
that have a master copy) from the store's last committed version, e.g. after a crash.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from typing import Any

import crc32c
import jax
import jax.numpy as jnp
import numpy as np

from jaxoff import _faults
from jaxoff._errors import describe_os_error
from jaxoff.aio import (
    FULL_ERRNOS,
    PageStore,
    PageStoreCorruptError,
    PageStoreError,
    PageStoreFullError,
    fsync_dir,
    parse_dtype,
)
from jaxoff.optim._codec import ram_from_bytes
from jaxoff.optim._paged import PagedState, PagedTransformation, canonical
from jaxoff.optim._plan import RAM_ENTRY
from jaxoff.optim._state import make_state
from jaxoff.optim._transaction import PageTransaction

FORMAT = "jaxoff.paged-checkpoint/1"
MANIFEST = "paged.json"


def _pager(tx):
    if not isinstance(tx, PagedTransformation):
        raise TypeError(f"expected the transformation returned by jaxoff.paged, got {type(tx)}")
    return tx.pager


def save_paged(
    tx: PagedTransformation,
    opt_state: PagedState,
    directory: str | os.PathLike,
    *,
    in_store: bool = False,
) -> int:
    """Copies the store version that ``opt_state`` describes into ``directory``; returns bytes.

    The copy is atomic: written to ``directory.tmp`` and renamed; an existing ``directory`` is
    replaced. Chunks are verified against their checksums on the way. ``in_store``: record
    the version instead of copying it (see `copy_out`); returns 0.
    """
    txn = _open(tx)
    jax.block_until_ready(opt_state)
    txn.settle()  # the step's commit is durable
    try:
        txn.check_version(jax.device_get(opt_state.version))
    except PageStoreError as e:
        raise PageStoreError(f"save_paged: {e}; save the state returned by the last step") from None
    return copy_out(txn.store, directory, in_store=in_store)


def copy_out(
    store: PageStore,
    directory: str | os.PathLike,
    *,
    in_store: bool = False,
    extra: dict | None = None,
) -> int:
    """Streams the committed version of ``store`` into ``directory`` (atomic); returns bytes.

    Everything is written into ``directory.tmp`` (its ``paged.json`` last) and renamed into
    place, so ``directory`` is complete whenever it exists. A failed copy removes
    ``directory.tmp``; a full disk or the file size limit raises `PageStoreFullError`.
    A background commit of that version is waited for first (and its error raised): a
    checkpoint names a version the store has made durable.

    ``in_store``: write only the manifest, naming the store, its version and the checksums
    of every chunk; the pages stay in the store (no second copy on disk; returns 0).
    `copy_in` restores such a checkpoint only into that store, and only while it still holds
    that version: the store's next commit (with two slots, the one after) overwrites it, and
    the checkpoint then reads as gone (`PageStoreCorruptError`: restore an older one).

    ``extra``: JSON values recorded in the manifest for the writer's own use (`manifest_extra`
    reads them back).
    """
    store.wait_committed()
    directory = os.path.abspath(os.fspath(directory))
    tmp = directory + ".tmp"
    needed = 0 if in_store else sum(e.nbytes for e in store.entries.values())
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        version = store.version
        os.makedirs(tmp)
        if in_store:  # the pages stay in the store: their checksums name the version
            entries, total = {n: _entry(e, store.crcs(n)) for n, e in store.entries.items()}, 0
        else:
            entries, total = _copy_pages(store, tmp)
        meta = {
            "format": FORMAT,
            "store_version": version,
            "chunk_bytes": store.chunk_bytes,
            "entries": entries,
            **({"in_store": os.path.realpath(store.root)} if in_store else {}),
            **({"extra": dict(extra)} if extra else {}),
        }
        _write_manifest(tmp, meta)
        if os.path.exists(directory):
            shutil.rmtree(directory)
        os.rename(tmp, directory)
        fsync_dir(os.path.dirname(directory))
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written may look saved
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            raise _full(e, directory, needed) from None
        if isinstance(e, OSError) and not isinstance(e, PageStoreError):
            raise PageStoreError(
                f"cannot write the paged checkpoint {directory}: {describe_os_error(e)}; "
                "nothing was saved for this step"
            ) from e
        raise
    return total


def _entry(e, crcs: list, **more) -> dict:
    """A manifest's record of store entry ``e``: its shape, dtype and chunk checksums."""
    return {"shape": list(e.shape), "dtype": str(e.dtype), **more, "crcs": crcs}


def _copy_pages(store: PageStore, tmp: str) -> tuple[dict, int]:
    """Every entry of the store's committed version into a page file of ``tmp``, verified
    on the way: ``({entry: its manifest record}, bytes written)``."""
    entries, total = {}, 0
    for name, e in store.entries.items():
        fname = f"{e.stem}.page"
        crcs = []
        with _naming(os.path.join(tmp, fname)) as path, open(path, "wb") as f:
            for c in e.chunks:
                x = store.read_chunk(name, c.index)  # verified
                raw = x.view(np.uint8).reshape(-1)
                # numpy's stubs give ndarray no __buffer__ before Python 3.12; it is a buffer
                f.write(memoryview(raw))  # pyright: ignore[reportArgumentType]
                crcs.append(crc32c.crc32c(raw))  # pyright: ignore[reportArgumentType]
                total += raw.nbytes
                _faults.point("checkpoint.paged")
            f.flush()
            os.fsync(f.fileno())
        entries[name] = _entry(e, crcs, file=fname)
    return entries, total


def manifest_extra(directory: str | os.PathLike) -> dict:
    """What `copy_out`'s ``extra`` recorded in the checkpoint ``directory`` (``{}``: nothing,
    or no readable manifest there, which `copy_in` then reports)."""
    try:
        with open(os.path.join(os.fspath(directory), MANIFEST)) as f:
            return dict(json.load(f).get("extra", {}))
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _write_manifest(tmp: str, meta: dict) -> None:
    """Written last: a directory with paged.json holds every entry."""
    with _naming(os.path.join(tmp, MANIFEST)) as path, open(path, "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)


@contextlib.contextmanager
def _naming(path: str):
    """Gives an OSError raised while writing ``path`` its file name (``f.write`` sets none)."""
    try:
        yield path
    except OSError as e:
        if e.filename is None and not isinstance(e, PageStoreError):
            raise OSError(e.errno, e.strerror, path) from None
        raise


def _full(e: OSError, directory: str, needed: int) -> PageStoreFullError:
    assert e.errno is not None  # the caller checked it is one of FULL_ERRNOS
    path = e.filename or directory
    what = (
        "the file size limit was reached (`ulimit -f`, or the filesystem's largest file)"
        if e.errno == errno.EFBIG
        else "the disk is full"
    )
    return PageStoreFullError(
        f"cannot write the paged checkpoint {directory}: {what} while writing {path} "
        f"({os.strerror(e.errno)}; the checkpoint needs about {needed} bytes). The partial "
        "checkpoint was removed and the previous checkpoints are intact. Free space there "
        "(or raise the limit), or write checkpoints to another directory (`out_dir`)",
        path=path,
        needed_bytes=needed,
        errno=e.errno,
    )


def restore_paged(tx: PagedTransformation, directory: str | os.PathLike, params: Any) -> PagedState:
    """Writes a checkpoint made by `save_paged` into ``tx``'s store as its next version.

    Args:
      tx: the `paged` transformation (its store may be another directory than the saved one).
      directory: what `save_paged` wrote.
      params: the parameters (or their shapes), to plan the store.

    Returns:
      The `PagedState` of the restored version, to use instead of ``tx.init(params)``.
    """
    pager = _pager(tx)
    plan = pager.plan(canonical(params))
    txn = pager.transaction(plan, discard_torn=True)  # every chunk is rewritten below
    copy_in(txn, plan, directory)
    return _state(plan, txn.store)


def copy_in(
    txn: PageTransaction, plan, directory: str | os.PathLike, want: dict | None = None
) -> int:
    """Writes what `copy_out` wrote into the store of ``txn`` as its committed version, under
    the version number the checkpoint recorded (after the steps in flight:
    `PageTransaction.settle`; a failed step's error stays that step's, the restore rewrites
    every chunk), and gives it to the pager.

    ``want``: ``{entry: (shape, dtype)}`` the checkpoint must hold (default: ``plan``'s
    entries; the Fuyou step's store has its own layout).

    Returns:
      the store version recorded in the checkpoint.
    """
    with contextlib.suppress(PageStoreError):
        txn.settle()  # steps still in flight commit first, not over the restored version
    store = txn.store
    directory = os.path.abspath(os.fspath(directory))
    path = os.path.join(directory, MANIFEST)
    _refuse_incomplete(directory, path)
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as err:
        raise PageStoreError(
            f"restore_paged: cannot read {path} ({err}); is {directory} a "
            "checkpoint written by save_paged?"
        ) from None
    if meta.get("format") != FORMAT:
        raise PageStoreError(f"restore_paged: {path} is not a {FORMAT} manifest")
    want = plan.store_entries() if want is None else want
    saved = meta["entries"]
    diffs = sorted(set(want) ^ set(saved)) + [
        n
        for n in want
        if n in saved
        and (
            tuple(saved[n]["shape"]) != tuple(want[n][0])
            or parse_dtype(saved[n]["dtype"]) != want[n][1]
        )
    ]
    if diffs:
        raise PageStoreError(
            f"restore_paged: checkpoint {directory} holds another optimizer "
            f"state than this model needs (differences: {diffs[:5]})"
        )
    if "in_store" in meta:
        _adopt(store, directory, meta)
        return int(meta["store_version"])
    _check_page_files(store, saved, directory)  # all there before anything is written
    # The restored version keeps its number, so that the state saved with the checkpoint (in
    # any form: a user's own orbax tree too) describes the store again. Its slot is the one of
    # that number's parity: written once more first when that is the committed one.
    saved_version = int(meta["store_version"])
    rounds = 2 if store.layout.slots == 2 and saved_version % 2 == store.version % 2 else 1
    for r in range(rounds):
        crcs = {}
        for name, e in store.entries.items():
            info = saved[name]
            with open(os.path.join(directory, info["file"]), "rb") as f:
                for c in e.chunks:
                    f.seek(c.elem_start * e.dtype.itemsize)
                    raw = np.frombuffer(f.read(c.nbytes), np.uint8)
                    if raw.nbytes != c.nbytes or crc32c.crc32c(raw) != info["crcs"][c.index]:  # pyright: ignore[reportArgumentType]  # ndarray is a Buffer
                        raise PageStoreCorruptError(
                            f"restore_paged: chunk {c.index} of {name!r} in {directory} is "
                            "damaged (short or checksum mismatch); use an older checkpoint"
                        )
                    store.write_chunk(name, c.index, raw.view(e.dtype))
            crcs[name] = info["crcs"]
        store.commit(crcs, version=saved_version if r == rounds - 1 else None)
    txn.adopt()
    return saved_version


def _adopt(store: PageStore, directory: str, meta: dict) -> None:
    """Checks an in-store checkpoint (`copy_out` ``in_store=True``): the store is the one it
    names and still holds the version it recorded, chunk for chunk; nothing is written."""
    root, version = os.path.realpath(store.root), int(meta["store_version"])
    if meta["in_store"] != root:
        raise PageStoreError(
            f"restore_paged: checkpoint {directory} is an in-store checkpoint: its optimizer "
            f"state is version {version} of the page store {meta['in_store']}, not a copy; "
            f"restore it with that store (`store='{meta['in_store']}'`), not {root}"
        )
    crcs = {name: meta["entries"][name]["crcs"] for name in store.entries}
    if store.version != version or any(store.crcs(n) != list(c) for n, c in crcs.items()):
        raise PageStoreCorruptError(
            f"restore_paged: checkpoint {directory} is an in-store checkpoint (its optimizer "
            f"state is version {version} of page store {root}, not a copy), and the store no "
            f"longer holds that version: it holds version {store.version}, written after the "
            "checkpoint (or the store was re-created); restore an older checkpoint"
        )


def _check_page_files(store: PageStore, saved: dict, directory: str) -> None:
    """Every page file of the checkpoint is there and long enough, or the checkpoint is
    damaged (`PageStoreCorruptError`, naming the file): found before the store is touched."""
    for name, e in store.entries.items():
        path = os.path.join(directory, str(saved[name]["file"]))
        need = max((c.elem_start * e.dtype.itemsize + c.nbytes for c in e.chunks), default=0)
        try:
            size = os.stat(path).st_size
        except OSError as err:
            raise PageStoreCorruptError(
                f"restore_paged: page file {path} of the checkpoint is unreadable "
                f"({err.strerror}: deleted or moved); use an older checkpoint"
            ) from None
        if size < need:
            raise PageStoreCorruptError(
                f"restore_paged: page file {path} of the checkpoint is {need - size} bytes "
                f"short (truncated); use an older checkpoint"
            )


def _refuse_incomplete(directory: str, manifest: str) -> None:
    """A paged checkpoint is complete when its ``paged.json`` (written last) exists."""
    if directory.endswith(".tmp") or (os.path.isdir(directory) and not os.path.exists(manifest)):
        raise PageStoreError(
            f"restore_paged: {directory} is an incomplete paged checkpoint (its writing was "
            f"interrupted or failed: it has no {MANIFEST}, which is written last); restore an "
            "earlier checkpoint, and delete this directory"
        )
    if not os.path.isdir(directory):
        raise PageStoreError(
            f"restore_paged: {directory} does not exist"
            + (
                f" (only {directory}.tmp, an incomplete copy whose writing was interrupted)"
                if os.path.isdir(directory + ".tmp")
                else ""
            )
            + "; restore an earlier checkpoint, or check the path"
        )


def load_state(tx: PagedTransformation, params: Any) -> tuple[Any, PagedState]:
    """The store's last committed version as ``(params, PagedState)``, e.g. after a crash.

    Parameters that have a master copy in the store are rebuilt from it
    (``master.astype(param.dtype)``); the others are returned as given.
    """
    pager = _pager(tx)
    params = canonical(params)
    plan = pager.plan(params)
    store = pager.transaction(plan).store
    if store.version == 0:
        raise PageStoreError(f"page store {store.root} holds no committed state; call tx.init")
    leaves = plan.params_def.flatten_up_to(params)
    out = []
    for leaf, p in zip(plan.leaves, leaves, strict=True):
        if leaf.master:
            master = plan.entries[leaf.entries[0]]
            out.append(jnp.asarray(store.read(master.name).astype(leaf.dtype)))
        else:
            out.append(p)
    return jax.tree.unflatten(plan.params_def, out), _state(plan, store)


def _state(plan, store: PageStore) -> PagedState:
    """The `PagedState` of the store's committed version."""
    ram = ram_from_bytes(plan, store.read(RAM_ENTRY))
    return make_state(
        plan, store.root, jnp.asarray(store.version, jnp.int32), [jnp.asarray(x) for x in ram]
    )


def _open(tx) -> PageTransaction:
    txn = _pager(tx).txn
    if txn is None or txn.closed:
        raise PageStoreError(
            "save_paged: the paged optimizer's store is not open; call "
            "tx.init(params) (or restore) first"
        )
    return txn
