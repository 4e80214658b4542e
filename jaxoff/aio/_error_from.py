"""The page store's own error, recovered from the JAX runtime error that wraps it.

A paged optimizer commits its store inside a JAX callback, and its pages are written by FFI
calls: an error there (a full disk at the commit, say) reaches the caller as a
``jax.errors.JaxRuntimeError`` whose text holds the store's message after a traceback.
`store_error_from` gives the `PageStoreError` back, so that a training loop can show its
one-line message (what happened, what to do) instead of the runtime's traceback.
"""

from __future__ import annotations

import collections
import errno as _errno
import os
import re
import threading

from jaxoff.aio import _store_errors
from jaxoff.aio._store_errors import (
    RESTORE_HINT,
    PageStoreCorruptError,
    PageStoreError,
    PageStoreFullError,
)

_recent: collections.deque[PageStoreError] = collections.deque(maxlen=16)
_lock = threading.Lock()

# How a callback's exception ends the runtime error's text: "...\nPageStoreFullError: <message>"
_PYTHON = re.compile(r"(?:^|\n|\.)(PageStore[A-Za-z]*Error): (.+)\Z", re.S)
# How the C++ engine reports a failed write (jaxoff_page_out / jaxoff_page_flush).
_ENGINE = re.compile(
    r"(write|fsync) (.+?) at offset (\d+)(?: \((\d+) bytes\))? failed: [^\n]*?"
    r"\((ENOSPC|EFBIG|EDQUOT), errno (\d+)\)"
)


# How the FFI calls report a chunk that fails its checksum (DATA_LOSS), and a failed read
# or write for another reason: "read <path> at offset <n> ... failed: ... (EIO, errno 5)".
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
    store failed: inside a commit callback (the original exception object is returned), or
    in a paging FFI call that hit a full disk or the file size limit (a
    `PageStoreFullError` is built from the engine's message, with ``path`` and ``errno``).

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
    from jaxoff._errors import describe_os_error

    m = _IO.search(text)
    if m is None:
        return None
    op, path, offset, _, err = m.groups()
    at = f" at offset {offset}" if offset else ""
    why = describe_os_error(OSError(int(err), os.strerror(int(err)), path))
    return PageStoreError(
        f"page store: {op}{at} failed: {why}; the last committed version is intact: once "
        f"fixed, continue with --resume"
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
        "store on a larger disk, then resume from the last checkpoint with `--resume`",
        path=path,
        needed_bytes=needed,
        errno=int(err),
    )
