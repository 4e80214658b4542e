"""Run metrics: process memory, a JSONL log and the live progress bar."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

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
    """Appends one JSON object per line; the file survives crashes line by line."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path | str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


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
