"""The page store's own error, recovered from the JAX runtime error that wraps it.

A paged step pages through the pager's FFI calls (``jaxoff_pager_begin`` / ``_take`` / ``_out``
/ ``_commit``), and the pager commits the store on its own thread once the step's writes are
durable (`jaxoff.optim.chunks.PageTransaction`): an error there reaches the caller as a
``jax.errors.JaxRuntimeError`` of the step that needs the chunk (a checksum mismatch, a failed
read: ``jaxoff_pager_take: ...``) or of the next step (a failed write or commit:
``jaxoff_pager_begin: ...``), or as the `PageStoreError` that ``PageTransaction.settle()``
raises with the engine's message. `store_error_from` gives the store's error back (a full
disk as a `PageStoreFullError` with its path and errno), so that a training loop can show its
one-line message (what happened, what to do) instead of the runtime's text.
"""

from __future__ import annotations

import collections
import errno as _errno
import os
import re
import threading

from jaxoff._errors import describe_os_error
from jaxoff.aio import _store_errors
from jaxoff.aio._store_errors import (
    RESTORE_HINT,
    PageStoreCorruptError,
    PageStoreError,
    PageStoreFullError,
)

_recent: collections.deque[PageStoreError] = collections.deque(maxlen=16)
_lock = threading.Lock()

# How a Python exception ends a runtime error's text: "...\nPageStoreFullError: <message>"
_PYTHON = re.compile(r"(?:^|\n|\.)(PageStore[A-Za-z]*Error): (.+)\Z", re.S)
# How the C++ engine reports a write or sync that hit a full disk or the file size limit:
# "write <path> at offset <n> (<m> bytes) failed: ... (ENOSPC, errno 28)...", behind a step
# (raised by the next jaxoff_pager_begin, or by PageTransaction.settle() in its message).
_ENGINE = re.compile(
    r"(write|fsync) (/[^\n]+?) at offset (\d+)(?: \((\d+) bytes\))? failed: [^\n]*?"
    r"\((ENOSPC|EFBIG|EDQUOT), errno (\d+)\)"
)


# How the pager reports a chunk that fails its checksum ("jaxoff_pager_take: checksum
# mismatch in <path> at offset <n> (<m> bytes): expected crc32c ...", DATA_LOSS) or a page
# file shorter than a read, and the engine a failed read, write or sync for another reason:
# "read <path> at offset <n> (<m> bytes) failed: ... (EIO, errno 5)".
_CORRUPT = re.compile(
    r"checksum mismatch in (\S+) at offset (\d+)"
    r"|read (/\S+?) at offset (\d+)[^\n]*? failed: read past the end of the file"
)
_IO = re.compile(
    r"(read|write|fsync|open) (/\S+?)(?: at offset (\d+))?(?: \(\d+ bytes\))? failed: "
    r"[^\n]*?\(([A-Z]+), errno (\d+)\)"
)


def record(err: PageStoreError) -> PageStoreError:
    """Remembers ``err`` (raised inside a JAX callback) for `store_error_from`; returns it."""
    with _lock:
        _recent.append(err)
    return err


def store_error_from(exc: BaseException) -> PageStoreError | None:
    """The page store error behind ``exc``, or None if ``exc`` is not about the page store.

    ``exc`` may be the `PageStoreError` itself, an exception chained to one (``__cause__``,
    ``__context__``), or the ``jax.errors.JaxRuntimeError`` of a jitted step in which the
    store failed: in the pager's commit (the exception `PageStore.commit` raised and recorded
    is returned), or in a paging call (a `PageStoreCorruptError` for a chunk that fails its
    checksum or a truncated page file). A page write that hit a full disk or the file size
    limit, reported by the next step's ``jaxoff_pager_begin`` or in the message of the
    `PageStoreError` that ``PageTransaction.settle()`` raises, gives a `PageStoreFullError`
    built from the engine's message, with ``path`` and ``errno``.

    Args:
      exc: the exception caught around the step.

    >>> import jax
    >>> err = PageStoreFullError("no space to write /s/manifest.json.tmp", path="/s/m",
    ...                          needed_bytes=9, errno=28)
    >>> wrapped = jax.errors.JaxRuntimeError(
    ...     "INTERNAL: CpuCallback error calling callback: Traceback ...\\n"
    ...     "PageStoreFullError: no space to write /s/manifest.json.tmp")
    >>> store_error_from(wrapped).errno
    28
    >>> store_error_from(ValueError("unrelated")) is None
    True
    """
    chain, seen = [], set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, PageStoreError):
            if type(e) is PageStoreError:  # settle()'s: the engine's full disk, said so
                return _from_engine_text(str(e)) or e
            return e
        chain.append(e)
        todo += [e.__cause__, e.__context__]
    texts = [str(e) for e in chain]
    with _lock:
        recent = list(_recent)
    for err in reversed(recent):
        message = str(err)
        if message and any(message in t for t in texts):
            return err
    for t in texts:
        found = (
            _from_python_text(t) or _from_engine_text(t) or _from_checksum_text(t) or _from_io(t)
        )
        if found is not None:
            return found
    return None


def _from_checksum_text(text: str) -> PageStoreCorruptError | None:
    m = _CORRUPT.search(text)
    if m is None:
        return None
    path, offset = m[1] or m[3], m[2] or m[4]
    what = "fails its checksum" if m[1] else "is shorter than what was written (truncated)"
    return PageStoreCorruptError(
        f"page file {path} {what} at offset {offset} (it changed on disk since it was "
        f"written): the page store is damaged; " + RESTORE_HINT
    )


def _from_io(text: str) -> PageStoreError | None:

    m = _IO.search(text)
    if m is None:
        return None
    op, path, offset, _, err = m.groups()
    at = f" at offset {offset}" if offset else ""
    why = describe_os_error(OSError(int(err), os.strerror(int(err)), path))
    return PageStoreError(
        f"page store: {op}{at} failed: {why}; the last committed version is intact: once "
        f"fixed, continue with `resume=True`"
    )


def _from_python_text(text: str) -> PageStoreError | None:
    m = _PYTHON.search(text)
    if m is None:
        return None
    cls = getattr(_store_errors, m.group(1), None)
    if not (isinstance(cls, type) and issubclass(cls, PageStoreError)):
        return None
    message = m.group(2).strip()
    if cls is PageStoreFullError:
        err = _errno.EFBIG if "file size limit" in message else _errno.ENOSPC
        return PageStoreFullError(message, path="", needed_bytes=-1, errno=err)
    return cls(message)


def _from_engine_text(text: str) -> PageStoreFullError | None:
    m = _ENGINE.search(text)
    if m is None:
        return None
    op, path, offset, nbytes, _, err = m.groups()
    needed = int(nbytes) if nbytes else -1
    what = "the file size limit was reached" if int(err) == _errno.EFBIG else "the disk is full"
    return PageStoreFullError(
        f"page file {path}: {op} of {needed if needed >= 0 else 'some'} bytes at offset "
        f"{offset} failed, {what} ({_errno.errorcode.get(int(err), err)}). The last committed "
        "version is intact. Free space on that filesystem (or raise `ulimit -f`), or put the "
        "store on a larger disk, then resume from the last checkpoint with `resume=True`",
        path=path,
        needed_bytes=needed,
        errno=int(err),
    )
