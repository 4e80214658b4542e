"""The run directory's lock: one ``jaxoff train`` per run directory at a time.

The page store has its own lock, but it lives inside ``<out_dir>/store``, which
``--overwrite`` deletes; the run's lock is ``<out_dir>/run.lock``, which nothing deletes
(unlinking a lock file races with a process about to lock it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from .._errors import ConfigError

LOCK_NAME = "run.lock"


def check_free(out_dir: Path | str) -> None:
    """Refuses, as `RunLock` would, a run directory whose lock a running process holds;
    writes nothing (a missing lock file is not created, a free one is left as it is)."""
    path = Path(out_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file: nobody holds it (RunLock reports what else is wrong)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "holder unknown"
        raise ConfigError(
            f"--out-dir {out_dir} is in use by a running `jaxoff train` ({holder}); wait "
            f"for it to finish or stop it, or choose another --out-dir"
        ) from None
    finally:
        os.close(fd)  # closing releases a lock taken here


class RunLock:
    """An exclusive ``flock`` on ``<out_dir>/run.lock``, held until :meth:`release`.

    The file records the holder's pid and host for the message of the next comer. Locks
    belong to open files, so a second lock from this same process is refused too.
    """

    def __init__(self, out_dir: Path | str):
        out_dir = Path(out_dir)
        self.path = out_dir / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "holder unknown"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise ConfigError(
                f"--out-dir {out_dir} is in use by a running `jaxoff train` ({holder}); wait "
                f"for it to finish or stop it, or choose another --out-dir"
            ) from None
        self._before = _read_all(fd)  # what a refused run puts back (see refused)
        info = f"pid {os.getpid()} on host {socket.gethostname()} since {time.ctime()}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        self._fd: int | None = fd

    def refused(self) -> None:
        """Puts back the file's bytes from before this lock: the run was refused (e.g. a
        damaged checkpoint without --resume-fallback) and leaves the lock file as it was."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, self._before, 0)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
