"""Which backend the I/O engine's ``auto`` setting gives, and why.

``backend="auto"`` uses io_uring when it initialises and otherwise falls back to a POSIX
thread pool, which is slower on fast disks. The fallback is silent in the engine, so this
module finds the reason (not compiled in, ``io_uring_setup`` refused with an errno, or
``JAXOFF_AIO_BACKEND``) by trying io_uring once, and says it once per process: one warning
on the ``jaxoff.aio.backend`` logger, which the ``jaxoff`` command prints as one line
(``jaxoff: note: ...``). ``JAXOFF_QUIET_BACKEND=1`` turns that warning into a debug record
(acknowledged: the fallback is known and accepted); ``JAXOFF_AIO_BACKEND=posix`` asks for
POSIX outright and gives no notice either.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import os

from jaxoff import _ffi, _notices

log = logging.getLogger(_notices.LOGGERS[0])

_SETUP_HINT = {
    errno.EPERM: "io_uring is disabled for this process: a seccomp profile (Docker's default "
    "blocks io_uring), `sysctl kernel.io_uring_disabled`, or a container runtime",
    errno.ENOSYS: "the kernel has no io_uring (Linux before 5.1, or built without it), or a "
    "seccomp filter hides it",
    errno.EMFILE: "the process has no file descriptor left (`ulimit -n`)",
    errno.ENFILE: "the system has no file descriptor left",
    errno.ENOMEM: "the kernel could not allocate the ring (memory, or RLIMIT_MEMLOCK on old "
    "kernels: raise `ulimit -l`)",
}


@dataclasses.dataclass(frozen=True)
class BackendStatus:
    """What ``EngineConfig(backend="auto")`` resolves to in this process, and why.

    Attributes:
      backend: ``"io_uring"`` or ``"posix"``.
      reason: one line saying why (for ``posix``: why not io_uring, and what to do).
      compiled_in: whether this build of jaxoff has the io_uring backend.
      errno: the errno of the failed ``io_uring_setup``, or None.
    """

    backend: str
    reason: str
    compiled_in: bool
    errno: int | None = None

    def __str__(self) -> str:
        return f"{self.backend} ({self.reason})"


def backend_status() -> BackendStatus:
    """Which backend ``backend="auto"`` gives here, and why (tried once, then cached).

    >>> status = backend_status()
    >>> status.backend in ("io_uring", "posix") and bool(status.reason)
    True
    """
    return _status(os.environ.get("JAXOFF_AIO_BACKEND", "").strip().lower())


@functools.cache
def _status(env: str) -> BackendStatus:
    compiled = bool(_ffi.uring_compiled_in())
    if env == "posix":
        return BackendStatus("posix", "JAXOFF_AIO_BACKEND=posix asks for it", compiled)
    if not compiled:
        return BackendStatus(
            "posix",
            "io_uring is not compiled into this build of jaxoff (its build found no liburing "
            "and could not build the vendored one: see the CMake warning in the build log); "
            "install liburing-dev and reinstall jaxoff to use it",
            False,
        )
    try:
        _ffi.Engine(
            block_size=4096,
            queue_depth=1,
            threads=1,
            o_direct=False,
            pool_bytes=4096,
            backend="io_uring",
        )
    except OSError as e:
        # a None errno is no key: the defaults apply
        name = errno.errorcode.get(e.errno, str(e.errno))  # pyright: ignore[reportCallIssue, reportArgumentType]
        hint = _SETUP_HINT.get(e.errno, "the kernel refused it")  # pyright: ignore[reportCallIssue, reportArgumentType]
        return BackendStatus(
            "posix",
            f"io_uring_setup failed with {name} (errno {e.errno}): {hint}",
            True,
            e.errno,
        )
    if env == "io_uring":
        return BackendStatus("io_uring", "JAXOFF_AIO_BACKEND=io_uring asks for it", True)
    return BackendStatus("io_uring", "io_uring initialised", True)


def note_backend(requested: str, used: str) -> str:
    """The reason an engine asked for ``requested`` runs ``used``; logs a fallback once."""
    if requested == "posix":
        return "backend='posix' was requested"
    if requested == "io_uring":
        return "backend='io_uring' was requested"
    status = backend_status()
    reason = status.reason if used == status.backend else f"{used} in use"
    if used == "posix" and (status.errno is not None or not status.compiled_in):
        _notice_once(reason)
    return reason


QUIET_ENV = "JAXOFF_QUIET_BACKEND"
_noticed = False


def _quiet() -> bool:
    return os.environ.get(QUIET_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _notice_once(reason: str) -> None:
    """The fallback to POSIX, said once per process (a warning, or with
    ``JAXOFF_QUIET_BACKEND=1`` a debug record)."""
    global _noticed
    if _noticed:
        return
    _noticed = True
    log.log(
        logging.DEBUG if _quiet() else logging.WARNING,
        "jaxoff: note: the I/O engine is using the POSIX thread-pool backend, not io_uring: "
        "%s (%s=1 hides this note)",
        reason,
        QUIET_ENV,
    )
