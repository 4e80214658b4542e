"""The stall watchdog: a step that runs far longer than the median step gets one line saying
what it is waiting on, read from the paging counters (the pager's and its engine's).

A thread checks the running step every ``poll_s`` seconds; past ``max(min_s, factor x
median)`` it reports once (the reads and writes in flight now, the waits and bytes so far in
this step), and when such a step ends, one more line with its totals. Steps of a run whose
optimizer is not paged have no counters: the line says the step is not waiting on paged I/O.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

from .._output import duration as duration
from ..aio import WAIT_COUNTERS

# counter -> what a caller blocked on it was waiting for
_WAITS = {
    "take_wait_ns": "take",
    "put_wait_ns": "write slots",
    "begin_wait_ns": "last commit",
}
assert set(_WAITS) == set(WAIT_COUNTERS)


def waiting_on(before: dict | None, now: dict | None) -> str:
    """What a step is waiting on, from the paging counters at its start and now.

    >>> waiting_on(None, None)
    'not paged I/O (the optimizer is not paged): compute or the host'
    >>> c = dict(reads_in_flight=0, writes_in_flight=0, read_bytes=0, write_bytes=0,
    ...          take_wait_ns=0, put_wait_ns=0, begin_wait_ns=0)
    >>> waiting_on(c, {**c, "reads_in_flight": 3, "take_wait_ns": 12 * 10**9,
    ...                 "read_bytes": 2**30})
    'paged reads (3 reads, 0 writes in flight; this step so far: take 12s, write slots 0.0s, \
last commit 0.0s waited, 1074 MB read, 0 MB written)'
    """
    if before is None or now is None:
        return "not paged I/O (the optimizer is not paged): compute or the host"
    reads, writes = now["reads_in_flight"], now["writes_in_flight"]
    waits = {name: (now[k] - before[k]) / 1e9 for k, name in _WAITS.items()}
    read_mb = (now["read_bytes"] - before["read_bytes"]) / 1e6
    write_mb = (now["write_bytes"] - before["write_bytes"]) / 1e6
    if reads:
        what = "paged reads"
    elif writes:
        what = "paged writes"
    elif any(w > 0 for w in waits.values()):
        what = f"paged I/O (most: {max(waits, key=lambda k: waits[k])})"
    else:
        what = "not paged I/O (nothing in flight): compute or the host"
    detail = ", ".join(f"{name} {duration(w)}" for name, w in waits.items())
    return (
        f"{what} ({reads} reads, {writes} writes in flight; this step so far: {detail} "
        f"waited, {read_mb:.0f} MB read, {write_mb:.0f} MB written)"
    )


class StallWatchdog:
    """Watches steps: :meth:`started` / :meth:`finished` around each, :meth:`check` from a
    thread (:meth:`start`) or by hand (a test with its own ``clock``).

    Args:
        report: called with each line.
        counters: the paged I/O engine's counters now (None: not paged).
        factor, min_s: a step is stalled past ``max(min_s, factor x median)`` seconds.
        min_steps: steps timed before any is judged (the median needs a few).
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        report: Callable[[str], None],
        counters: Callable[[], dict | None] = lambda: None,
        factor: float = 5.0,
        min_s: float = 30.0,
        min_steps: int = 3,
        window: int = 100,
        poll_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._report, self._counters, self._clock = report, counters, clock
        self.factor, self.min_s, self.min_steps, self.poll_s = factor, min_s, min_steps, poll_s
        self._times: deque[float] = deque(maxlen=window)
        self._lock = threading.Lock()
        self._step: int | None = None
        self._t0 = 0.0
        self._before: dict | None = None
        self._reported = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def threshold(self) -> float | None:
        """Seconds past which the running step counts as stalled (None: too few steps)."""
        if len(self._times) < self.min_steps:
            return None
        return max(self.min_s, self.factor * statistics.median(self._times))

    def started(self, step: int) -> None:
        before = self._counters()
        with self._lock:
            self._step, self._t0, self._before, self._reported = step, self._clock(), before, False

    def finished(self) -> None:
        with self._lock:
            if self._step is None:
                return
            dt = self._clock() - self._t0
            limit = self.threshold()
            step, before, reported = self._step, self._before, self._reported
            self._step = None
            self._times.append(dt)
        if reported or (limit is not None and dt > limit):
            median = statistics.median(list(self._times)[:-1])
            self._report(
                f"step {step} took {duration(dt)}, {dt / median:.0f}x the median step "
                f"({duration(median)}); it waited on {waiting_on(before, self._counters())}"
            )

    def check(self) -> None:
        """Reports the running step once if it is past the threshold."""
        with self._lock:
            limit = self.threshold()
            if self._step is None or self._reported or limit is None:
                return
            ran = self._clock() - self._t0
            if ran <= limit:
                return
            self._reported = True
            step, before = self._step, self._before
            median = statistics.median(self._times)
        self._report(
            f"step {step} has run {duration(ran)}, {ran / median:.0f}x the median step "
            f"({duration(median)}); waiting on {waiting_on(before, self._counters())}"
        )

    def start(self) -> StallWatchdog:
        """Checks from a daemon thread every ``poll_s`` seconds until :meth:`stop`."""

        def run():
            while not self._stop.wait(self.poll_s):
                self.check()

        self._thread = threading.Thread(target=run, name="jaxoff-stall-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
