"""Raw page-file I/O of the page store, kept in a few small functions.

Everything the store reads or writes goes through `_io_read` / `_io_write`, so they can later be
routed through the C++ engine (``jaxoff.aio._engine``) without touching the store's logic.
For now they are plain ``os.pread`` / ``os.pwrite``.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os

import numpy as np

from jaxoff.aio._store_errors import (
    RESTORE_HINT,
    PageStoreCorruptError,
    PageStoreError,
    PageStoreFullError,
)

# errnos of a write that found no room: a full disk, the file size limit, a quota
FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def _full_error(path: str, offset: int, nbytes: int, err: OSError) -> PageStoreFullError:
    code = err.errno if err.errno is not None else errno.ENOSPC  # one of FULL_ERRNOS
    what = "disk is full" if code != errno.EFBIG else "file size limit reached"
    return PageStoreFullError(
        f"cannot write {nbytes} bytes at offset {offset} of page file {path}: {what} "
        f"({os.strerror(code)}; the file needs {offset + nbytes} bytes). The last "
        "committed version is intact. Free space on that filesystem (or raise `ulimit -f`), "
        "or put the store on a larger disk, then retry",
        path=path,
        needed_bytes=nbytes,
        errno=code,
    )


def _open_page(path: str, flags: int) -> int:
    """Opens an existing page file; a missing one means the store was changed by hand."""
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PageStoreCorruptError(
            f"page file {path} is missing; the store directory was changed by hand: " + RESTORE_HINT
        ) from None


def _io_write(path: str, offset: int, buffer) -> None:
    """Writes all of ``buffer`` (bytes-like) at ``offset`` of an existing page file."""
    view = memoryview(buffer).cast("B")
    fd = _open_page(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)
    except OSError as e:
        if e.errno in FULL_ERRNOS:
            raise _full_error(path, offset, len(view), e) from None
        raise PageStoreError(f"cannot write page file {path} at offset {offset}: {e}") from e
    finally:
        os.close(fd)


def _io_read(path: str, offset: int, nbytes: int, out: np.ndarray | None = None) -> np.ndarray:
    """Reads exactly ``nbytes`` at ``offset``; a short file is an error.

    Reads into ``out`` (a contiguous uint8 array of ``nbytes``) when given, else into a new
    array; returns it.
    """
    out = np.empty(nbytes, np.uint8) if out is None else out
    fd = _open_page(path, os.O_RDONLY)
    try:
        done = 0
        view = out.data  # a memoryview of the array's bytes
        while done < nbytes:
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                size = os.fstat(fd).st_size
                raise PageStoreCorruptError(
                    f"page file {path} is {offset + nbytes - size} bytes short (it has {size} "
                    f"bytes, the chunk at offset {offset} needs {offset + nbytes}): it was "
                    "truncated, e.g. by a crashed run or a full disk; " + RESTORE_HINT
                )
            done += n
    except OSError as e:
        raise PageStoreError(f"cannot read page file {path} at offset {offset}: {e}") from e
    finally:
        os.close(fd)
    return out


@functools.cache
def _syncfs():
    """libc's ``syncfs``, or None where it cannot be trusted with a commit: not Linux, no such
    symbol, or a kernel before 5.8 (whose syncfs does not report writeback errors)."""
    try:
        uname = os.uname()
        release = tuple(int(x) for x in uname.release.split(".")[:2])
        if uname.sysname != "Linux" or release < (5, 8):
            return None
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError, ValueError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def sync_filesystems(paths) -> bool:
    """Makes every file of ``paths`` durable with one ``syncfs(2)`` per filesystem holding them;
    False (nothing done) where syncfs is unavailable (see `_syncfs`): fsync each file instead.

    One call flushes the data, the metadata and the device's cache for all the files at once:
    a commit of a store of a few hundred page files takes a few milliseconds instead of one
    journal flush per file (0.1-0.3 ms each). A writeback error on the filesystem not yet seen
    through another descriptor is reported (Linux >= 5.8), as a fresh ``fsync`` of the file
    would report it; so is one of another file on the same filesystem, which then fails the
    commit too (the previous version stays current).

    Raises:
      OSError: of the syncfs that failed.
    """
    fn = _syncfs()
    if fn is None:
        return False
    devices: dict[int, str] = {}
    for folder in {os.path.dirname(os.path.abspath(p)) for p in paths}:
        devices.setdefault(os.stat(folder).st_dev, folder)
    for folder in devices.values():
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if fn(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"syncfs of the filesystem of {folder}: {os.strerror(err)}")
        finally:
            os.close(fd)
    return True


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def allocate_file(path: str, size: int) -> None:
    """Creates or resizes a page file to ``size`` bytes with all its blocks reserved.

    Reserving the blocks up front (``posix_fallocate``) makes a full disk fail at creation
    rather than in the middle of a training step, and keeps disk usage constant afterwards.
    Existing contents within ``size`` are kept.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
            if size:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as e:
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    os.ftruncate(fd, size)  # filesystem without fallocate: sparse file
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno in FULL_ERRNOS:
            raise PageStoreFullError(
                f"cannot allocate page file {path} ({size} bytes needed): "
                f"{os.strerror(e.errno)}. Free space on that filesystem (or raise "
                "`ulimit -f`), use a smaller model or put the store on a larger disk",
                path=path,
                needed_bytes=size,
                errno=e.errno,
            ) from None
        raise PageStoreError(f"cannot create page file {path}: {e}") from e


def fsync_dir(path: str) -> None:
    """Makes a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
