"""Where reports go: rich at the terminal's width, or full width for a file or a pipe (a log).

A rich table printed to a file or pipe is cut to 80 columns (plan names become ``preset
offlo…``); a console made here is as wide as its content needs there instead.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

# columns of a console that writes to a file or pipe: wide enough that no table is cut
LOG_WIDTH = 10_000


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def console(stderr: bool = False):
    """A ``rich.console.Console`` on stdout (or stderr): the terminal's width there, else
    :data:`LOG_WIDTH` columns, so tables in logs keep every name whole.

    >>> import contextlib, io
    >>> with contextlib.redirect_stdout(io.StringIO()):
    ...     width = console().width
    >>> width
    10000
    """
    from rich.console import Console

    if is_terminal(sys.stderr if stderr else sys.stdout):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=LOG_WIDTH)


class on_termination:  # noqa: N801 - used as a context manager, like contextlib's
    """While active, a SIGTERM first calls ``callback(signum)`` (restore the terminal, say
    where things stand), then ends the process by that signal as before.

    A thread waits for the signal (``signal.set_wakeup_fd``), so that the callback runs at
    once even while the main thread is blocked in a long XLA computation, where Python
    handlers wait for it to return. Outside the main thread it does nothing.
    """

    def __init__(self, callback, signals=(signal.SIGTERM,)):
        self._callback, self._signals = callback, tuple(signals)
        self._once = threading.Lock()
        self._saved: dict = {}
        self._fds: tuple[int, int] | None = None
        self._old_wakeup = -1

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._fds = (r, w)
        for s in self._signals:
            self._saved[s] = signal.signal(s, self._handler)
        self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        threading.Thread(
            target=self._wait, args=(r,), name="jaxoff-on-sigterm", daemon=True
        ).start()
        return self

    def __exit__(self, *exc):
        if self._fds is None:
            return
        signal.set_wakeup_fd(self._old_wakeup)
        for s, handler in self._saved.items():
            signal.signal(s, handler)
        r, w = self._fds
        self._fds = None
        os.close(w)  # the thread's read returns b"" and it ends; it closes r

    def _wait(self, r: int) -> None:
        try:
            while True:
                data = os.read(r, 64)
                if not data:
                    return
                for signum in data:
                    if signum in self._signals:
                        self._end(signum, main=False)
        finally:
            os.close(r)

    def _handler(self, signum, frame) -> None:
        self._end(signum, main=True)

    def _end(self, signum: int, main: bool) -> None:
        if not self._once.acquire(blocking=False):
            return  # the other path is ending the process
        try:
            self._callback(signum)
        finally:
            sys.stderr.flush()
            sys.stdout.flush()
            _die_by(signum, main)


def _die_by(signum: int, main: bool) -> None:
    """Ends the process by ``signum`` with its default action (from any thread)."""
    if main:
        signal.signal(signum, signal.SIG_DFL)
    else:  # only the main thread may call signal.signal: reset it in C
        import ctypes

        try:
            ctypes.CDLL(None).signal(signum, ctypes.c_void_p(0))  # SIG_DFL
        except (OSError, AttributeError):
            os._exit(128 + signum)
    os.kill(os.getpid(), signum)
