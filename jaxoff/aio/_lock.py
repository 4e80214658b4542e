"""The page store's lock: one writer per store directory, across and within processes."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import threading
import time

from jaxoff.aio._store_errors import PageStoreLockedError

# flock refuses a second lock from this process too (locks belong to open file descriptions),
# but the registry lets the message say "this process" rather than naming our own pid.
_HELD: dict[str, int] = {}  # realpath of root -> fd holding the lock
_HELD_LOCK = threading.Lock()


def _forget_in_child() -> None:
    global _HELD_LOCK
    _HELD_LOCK = threading.Lock()  # another thread may have held it at the fork
    # A forked child (e.g. a data-loader worker) shares the lock's open file description; if it
    # kept the fd, the store would stay locked after the parent exits. Closing (not unlocking,
    # which would release the parent's lock too) drops only the child's reference.
    for fd in _HELD.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)


class StoreLock:
    """An exclusive ``flock`` on ``<root>/LOCK``, held until `release`.

    The file holds the holder's pid and host for the error message of the next comer. The file
    is never deleted: unlinking a lock file races with a process that is about to lock it.
    """

    def __init__(self, root: str):
        self.path = os.path.join(root, "LOCK")
        self._key = os.path.realpath(root)
        with _HELD_LOCK:
            if self._key in _HELD:
                raise PageStoreLockedError(
                    f"page store {root} is already open in this process (pid {os.getpid()}); "
                    "close the other PageStore (store.close() or a `with` block) before opening "
                    "it again"
                )
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_holder(fd)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise PageStoreLockedError(
                    f"page store {root} is locked by another process ({holder}); a store has "
                    "one user at a time. Wait for that process to finish or stop it, or give "
                    "this run a different store directory (each process of a multi-process job "
                    "needs its own)"
                ) from None
            _HELD[self._key] = fd
        self._fd: int | None = fd
        info = f"pid {os.getpid()} on host {socket.gethostname()} since {time.ctime()}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with _HELD_LOCK:
            if _HELD.get(self._key) != fd:
                return  # forked child: the fd was already closed, the lock is the parent's
            del _HELD[self._key]
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
