"""Where reports go: rich at the terminal's width, or full width for a file or a pipe (a log).

A rich table printed to a file or pipe is cut to 80 columns (plan names become ``preset
offlo…``); a console made here is as wide as its content needs there instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

from rich.console import Console

# columns of a console that writes to a file or pipe: wide enough that no table is cut
LOG_WIDTH = 10_000
# seconds of a log's silence before a long part (a compile + run) says it is still running
HEARTBEAT_S = 30.0


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

    if is_terminal(sys.stderr if stderr else sys.stdout):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=LOG_WIDTH)


def duration(seconds: float) -> str:
    """``4.2s``, ``42s``, ``3m05s``, ``2h07m``.

    >>> duration(4.2), duration(42), duration(185), duration(7620)
    ('4.2s', '42s', '3m05s', '2h07m')
    """
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class LogProgress:
    """What ``jaxoff compare`` uses of ``rich.progress.Progress`` (``add_task``, ``update``,
    ``advance``), for a log, where a rich bar shows nothing until it ends: a line as each
    part begins, with its number, how many come after it and the time so far. While the
    context is entered, a part that runs longer than ``every`` seconds (one compile + run can
    take minutes) gets a ``still running`` line every ``every`` seconds, so a log never goes
    quiet for long.

    >>> from rich.console import Console
    >>> with LogProgress("compare", Console(width=200)) as p:
    ...     task = p.add_task("compare", total=2)
    ...     p.update(task, description="compile + run full")  # doctest: +ELLIPSIS
    ...     p.advance(task)
    ...     p.update(task, description="baseline FLOPs")  # doctest: +ELLIPSIS
    jaxoff compare [1/2] compile + run full (1 more after it; 0.0s so far)
    jaxoff compare [2/2] baseline FLOPs (0 more after it; 0.0s so far)
    """

    def __init__(self, name: str, console, every: float = HEARTBEAT_S):
        self.name, self.console = name, console
        self.total, self.completed = 0, 0
        self.every = every
        self._t0 = time.monotonic()
        self._said: str | None = None
        self._part: tuple[str, int, int, float] | None = None  # what, number, total, began
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self):
        if self.every > 0 and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._beat, name="jaxoff-log-heartbeat", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc):
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def add_task(self, description: str, total: float | None = None, **fields) -> int:
        self.total, self.completed = int(total or 0), 0
        return 0

    def update(self, task: int, description: str | None = None, **fields) -> None:
        if description is None or description in (self._said, "done"):
            return
        self._said = description
        self.line(description, self.completed + 1, self.total)

    def advance(self, task: int, advance: float = 1) -> None:
        self.completed += int(advance)

    def line(self, what: str, number: int, total: int) -> None:
        left = max(0, total - number)
        with self._lock:
            self._part = (what, number, total, time.monotonic())
            self._print(
                f"jaxoff {self.name} [{number}/{total}] {what} ({left} more after it; "
                f"{duration(time.monotonic() - self._t0)} so far)"
            )

    def _beat(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(min(self.every, 1.0)):
            now = time.monotonic()
            with self._lock:
                if self._part is None:
                    continue
                what, number, total, began = self._part
                if now - max(began, last) < self.every:
                    continue
                last = now
                self._print(
                    f"jaxoff {self.name} [{number}/{total}] {what}: still running, "
                    f"{duration(now - began)} in this part ({duration(now - self._t0)} so far)"
                )

    def _print(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)


class Steps:
    """The parts of a long command (``jaxoff plan``): ``with steps.step("profiling ..."):``
    shows a spinner with ``[i/N]`` at a terminal, and prints a line in a log (see
    :class:`LogProgress`)."""

    def __init__(self, name: str, total: int, console):
        self.total, self.console = total, console
        self.done = 0
        self._log = LogProgress(name, console)

    @contextlib.contextmanager
    def step(self, what: str):
        self.done += 1
        self.total = max(self.total, self.done)
        if self.console.is_terminal:
            with self.console.status(f"[{self.done}/{self.total}] {what}"):
                yield
        else:
            with self._log:  # a part that runs long says so every HEARTBEAT_S
                self._log.line(what, self.done, self.total)
                yield


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
        try:
            ctypes.CDLL(None).signal(signum, ctypes.c_void_p(0))  # SIG_DFL
        except (OSError, AttributeError):
            os._exit(128 + signum)
    os.kill(os.getpid(), signum)
