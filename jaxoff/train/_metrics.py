"""Run metrics: process memory, a JSONL log, and progress (a rich bar, or plain lines)."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .._errors import JaxoffError
from .._output import is_terminal

GIB = 2**30


def rss_bytes() -> int:
    """Current resident set size of this process."""
    return psutil.Process().memory_info().rss


def disk_io_bytes() -> tuple[int, int]:
    """Bytes this process has read from and written to storage (O_DIRECT included)."""
    io = psutil.Process().io_counters()
    return io.read_bytes, io.write_bytes


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MetricsLog:
    """Appends one JSON object per line, each flushed to disk before the step's checkpoint:
    a step that counts as saved always has its line."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a")  # noqa: SIM115 - closed in close()

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path | str) -> list[dict]:
    """The records of a ``metrics.jsonl``; a last line torn by a kill mid-write is dropped."""
    with open(path) as f:
        lines = f.read().split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:  # no newline after it: the write was cut short
                break
            raise JaxoffError(
                f"{path}: line {i + 1} is not JSON ({line[:40]!r}...); the metrics log was "
                f"edited or damaged: delete that line"
            ) from None
    return records


def trim_metrics(path: Path, last_step: int) -> None:
    """On resume, keeps the log lines of steps up to the checkpoint (later ones are re-run)
    and drops a torn last line, atomically."""
    if path.exists():
        kept = [r for r in read_metrics(path) if r.get("step", 0) <= last_step]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        tmp.replace(path)


def progress_display(total: int, start: int, enabled: bool):
    """The rich bar where stderr is a terminal; plain lines every few steps where it is not
    (a log file, ``tee``, a batch job); nothing when disabled."""
    if enabled and not is_terminal(sys.stderr):
        return PlainProgress(total, start)
    return ProgressBar(total, start, enabled)


class ProgressBar:
    """A rich progress bar showing loss, tokens/s and memory; silent when disabled."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not enabled,
            refresh_per_second=4,
        )
        self._task = self._progress.add_task("train", total=total, completed=start, stats="")

    def __enter__(self):
        self._progress.start()
        return self

    def __exit__(self, *exc):
        self._progress.stop()

    def update(self, step: int, stats: dict) -> None:
        text = "  ".join(f"{k} {v}" for k, v in stats.items())
        self._progress.update(self._task, completed=step, stats=text)


class PlainProgress:
    """``step 20/300 loss 3.412 ... elapsed 12s`` on stderr: about 30 lines a run, and at
    least one every ``max_quiet_s`` seconds when steps are slow, plus the first and last."""

    def __init__(self, total: int, start: int, lines: int = 30, max_quiet_s: float = 10.0):
        self.total = total
        self.every = max(1, (total - start) // lines)
        self.max_quiet_s = max_quiet_s
        self._start = start
        self._t0 = self._last = time.monotonic()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def update(self, step: int, stats: dict) -> None:
        now = time.monotonic()
        due = (step - self._start) % self.every == 0 or step in (self._start + 1, self.total)
        if not due and now - self._last < self.max_quiet_s:
            return
        self._last = now
        text = " ".join(f"{k} {v}" for k, v in stats.items())
        print(
            f"step {step}/{self.total} {text} elapsed {now - self._t0:.0f}s",
            file=sys.stderr,
            flush=True,
        )
