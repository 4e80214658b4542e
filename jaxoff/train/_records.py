"""Reading a run's ``metrics.jsonl`` (a leaf module: the summary and the progress display
both read records, and neither imports the other for it)."""

from __future__ import annotations

import json
from pathlib import Path

from .._errors import JaxoffError


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
