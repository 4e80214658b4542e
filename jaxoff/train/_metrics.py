"""Run metrics: process memory, a JSONL log, and progress (a rich bar, or plain lines)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import jax
import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column

from .._memory import peak_rss_bytes as peak_rss_bytes
from .._output import is_terminal, on_termination
from ._records import read_metrics as read_metrics
from ._summary import stopped_line
from ._tensorboard import TB_DIR, TensorBoardWriter
from ._watchdog import StallWatchdog, duration

GIB = 2**30


def rss_bytes() -> int:
    """Current resident set size of this process."""
    return psutil.Process().memory_info().rss


def disk_io_bytes() -> tuple[int, int]:
    """Bytes this process has read from and written to storage (O_DIRECT included)."""
    io = psutil.Process().io_counters()
    return io.read_bytes, io.write_bytes


class MetricsLog:
    """Appends one JSON object per line, each flushed to disk before the step's checkpoint:
    a step that counts as saved always has its line.

    With ``run`` (the run's ``TrainConfig``), each record also gets the step's learning rate
    (``lr``, from the run's schedule) and, in process 0, goes to TensorBoard event files in
    ``<out_dir>/tb`` (see ``jaxoff.train._tensorboard.TAGS`` for the names).
    """

    def __init__(self, path: Path, run=None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._schedule = run.schedule() if run is not None else None
        self._tb = None
        if run is not None and _process_index() == 0:
            self._tb = _tensorboard_for(path, Path(run.out_dir))
        self._file = open(path, "a")  # noqa: SIM115 - closed in close()

    def write(self, record: dict) -> None:
        if self._schedule is not None and "lr" not in record:
            # optax evaluates the schedule at the update count before the step: step - 1
            record["lr"] = float(self._schedule(record["step"] - 1))
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._tb is not None:
            self._tb.write(record)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _process_index() -> int:

    return jax.process_index()


def _tensorboard_for(path: Path, out_dir: Path):
    """The run's TensorBoard writer. A new run (no lines in ``path`` yet) removes the event
    files of a run it replaces; a resumed one has TensorBoard drop what the earlier run
    wrote after the checkpoint (those steps run again)."""

    logdir = out_dir / TB_DIR
    steps = [r["step"] for r in read_metrics(path) if "step" in r] if path.exists() else []
    if not steps:
        for old in logdir.glob("events.out.tfevents.*"):
            old.unlink()
    return TensorBoardWriter(logdir, purge_from=max(steps) + 1 if steps else None)


def trim_metrics(path: Path, last_step: int) -> None:
    """On resume, keeps the log lines of steps up to the checkpoint (later ones are re-run)
    and drops a torn last line, atomically."""
    if path.exists():
        kept = [r for r in read_metrics(path) if r.get("step", 0) <= last_step]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        tmp.replace(path)


def progress_display(total: int, start: int, enabled: bool, run=None, io=None):
    """The rich bar where stderr is a terminal; plain lines every few steps where it is not
    (a log file, ``tee``, a batch job); nothing when disabled.

    With ``run`` (the run's ``TrainConfig``; process 0 only) the display also watches for
    stalled steps (``io``: the paged I/O engine's counters, see
    ``jaxoff.train._watchdog``) and, stopped by SIGINT or SIGTERM, restores the terminal and
    says in one line where the run stands and how to resume it. The loop calls
    :meth:`step_started` and :meth:`step_finished` around each step, :meth:`update` after.
    """
    if enabled and not is_terminal(sys.stderr):
        display = PlainProgress(total, start)
    else:
        display = ProgressBar(total, start, enabled)
    if run is not None and _process_index() == 0:
        display.watch(run, io)
    return display


class _Display:
    """What both displays share: the stall watchdog, and the line when a signal stops the
    run."""

    def __init__(self, total: int, start: int):
        self.total, self.step = total, start
        self._run = self._io = self._watchdog = self._guard = None

    def watch(self, run, io=None) -> None:
        self._run, self._io = run, io

    def __enter__(self):
        self._open()
        if self._run is not None:
            self._watchdog = StallWatchdog(self.say, self._io or (lambda: None)).start()
            self._guard = on_termination(self._terminated).__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._guard is not None:
            self._guard.__exit__(None, None, None)
        if self._watchdog is not None:
            self._watchdog.stop()
        self._close()
        if exc_type is KeyboardInterrupt and self._run is not None:
            self._stopped("SIGINT (Ctrl-C)")

    def _terminated(self, signum: int) -> None:
        self._close()  # the bar stops, the cursor is shown again
        self._stopped(signal.Signals(signum).name)

    def _stopped(self, why: str) -> None:

        print(stopped_line(self._run, self.step, why), file=sys.stderr, flush=True)

    def step_started(self, step: int) -> None:
        if self._watchdog is not None:
            self._watchdog.started(step)

    def step_finished(self) -> None:
        if self._watchdog is not None:
            self._watchdog.finished()

    def update(self, step: int, stats: dict) -> None:
        self.step = step
        self._show(step, stats)

    def say(self, line: str) -> None:
        print(f"jaxoff train: {line}", file=sys.stderr, flush=True)

    def _open(self) -> None:
        pass

    def _close(self) -> None:
        pass

    def _show(self, step: int, stats: dict) -> None:
        pass


class ProgressBar(_Display):
    """A rich progress bar: ``train``, the bar, ``N/M``, statistics (loss, tokens/s, memory,
    ...) and the time remaining; silent when disabled. At any width ``N/M`` and the time
    remaining stay: statistics that do not fit are left out, the last first."""

    def __init__(self, total: int, start: int, enabled: bool, console: Console | None = None):
        super().__init__(total, start)
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self._bar_width = 40 if self.console.width >= 120 else 20
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(bar_width=self._bar_width),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[stats]}", table_column=Column(no_wrap=True)),
            TimeRemainingColumn(table_column=Column(no_wrap=True)),
            console=self.console,
            disable=not enabled,
            refresh_per_second=4,
        )
        self._task = self._progress.add_task("train", total=total, completed=start, stats="")
        self._live = False

    def _open(self) -> None:
        self._progress.start()
        self._live = True

    def _close(self) -> None:
        if self._live:
            self._live = False
            self._progress.stop()

    def _room(self) -> int:
        """Columns left for the statistics: the width less ``train``, the bar, ``N/M``, the
        time remaining (``0:00:00``) and the spaces between the five columns."""
        m_of_n = 2 * len(str(self.total)) + 1
        return self.console.width - (5 + self._bar_width + m_of_n + 7 + 4) - 1

    def _show(self, step: int, stats: dict) -> None:
        text = fit(stats, self._room())
        self._progress.update(self._task, completed=step, stats=text)

    def say(self, line: str) -> None:
        if self.enabled and self._live:  # above the bar
            self._progress.console.print(
                f"jaxoff train: {line}", markup=False, highlight=False, soft_wrap=True
            )
        else:
            super().say(line)


def fit(stats: dict, room: int) -> str:
    """``k v  k v ...`` of the statistics that fit in ``room`` columns, in order.

    >>> fit({"loss": "3.412", "tok/s": "1,024", "rss": "1.20 GiB"}, 24)
    'loss 3.412  tok/s 1,024'
    """
    text = ""
    for k, v in stats.items():
        item = f"{k} {v}"
        joined = f"{text}  {item}" if text else item
        if len(joined) > room:
            break
        text = joined
    return text


class PlainProgress(_Display):
    """``step 20/300 loss 3.412 ... elapsed 12s eta 1m50s`` on stderr: about 30 lines a
    run, and at least one every ``max_quiet_s`` seconds when steps are slow, plus the first
    and last. The time remaining is the steps left at the mean pace of this run's steps
    after its first."""

    def __init__(self, total: int, start: int, lines: int = 30, max_quiet_s: float = 10.0):
        super().__init__(total, start)
        self.every = max(1, (total - start) // lines)
        self.max_quiet_s = max_quiet_s
        self._start = start
        self._t0 = self._last = time.monotonic()
        self._first: float | None = None  # when the first step ended

    def _show(self, step: int, stats: dict) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        due = (step - self._start) % self.every == 0 or step in (self._start + 1, self.total)
        if not due and now - self._last < self.max_quiet_s:
            return
        self._last = now
        text = " ".join(f"{k} {v}" for k, v in stats.items())
        elapsed = now - self._t0
        done = step - self._start
        # the pace of the steps after the first (its time includes one-off warm-up)
        pace = (now - self._first) / (done - 1) if done > 1 else elapsed / max(done, 1)
        eta = pace * (self.total - step)
        parts = [f"step {step}/{self.total}", text, f"elapsed {duration(elapsed)}"]
        print(" ".join(filter(None, parts)), f"eta {duration(eta)}", file=sys.stderr, flush=True)
