"""One result schema for every bench: where a figure came from, and the figure.

A bench calls :func:`write_result` once, at its end; the file holds

    {schema, bench, command, commit, tree_clean, machine: {cpu, cores, ram_gib, disk, gpu, driver},
     versions: {python, jax, jaxlib, flax, optax, orbax}, date, args, summary, records, ...}

so that any figure quoted from it can be traced to the command, the code (the commit, and whether
the working tree had changes beside it), the machine and the library versions that produced it.
Results live under ``bench/results/<bench>/``; ``bench/report.py`` renders the docs from them.

A bench script imports this module through its own directory:

    sys.path.insert(0, str(Path(__file__).resolve().parent))          # bench/
    from _common.results import write_result
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

SCHEMA = "jaxoff-bench-result/1"
BENCH = Path(__file__).resolve().parents[1]  # bench/
ROOT = BENCH.parent
RESULTS = BENCH / "results"
UNRECORDED = "unrecorded"

__all__ = ["SCHEMA", "RESULTS", "UNRECORDED", "machine", "provenance", "versions", "write_result"]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    return None


def _disk(path: Path) -> str:
    """The block device behind ``path``: its model where the kernel names one, else its name."""
    try:
        st = os.stat(path)
        dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve()
    except OSError:
        return UNRECORDED
    for d in (dev, dev.parent):
        model = d / "device" / "model"
        if model.exists():
            return f"{d.name}: {model.read_text().strip()}"
    return dev.name if dev.exists() else UNRECORDED


def _gpu() -> tuple[str | None, str | None]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    rows = [r.split(",") for r in out.stdout.strip().splitlines() if r.strip()]
    if out.returncode or not rows:
        return None, None
    names = sorted({r[0].strip() for r in rows})
    return f"{len(rows)} x {' / '.join(names)}", rows[0][1].strip()


def machine(disk_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """CPU model, cores, RAM, the disk behind ``disk_path`` (default: the results folder), GPU."""
    gpu, driver = _gpu()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "disk": _disk(Path(disk_path) if disk_path else ROOT),
        "gpu": gpu,
        "driver": driver,
    }


def versions() -> dict[str, str | None]:
    """The Python and the installed JAX stack's versions (None where a package is absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for key, dist in [
        ("jax", "jax"),
        ("jaxlib", "jaxlib"),
        ("flax", "flax"),
        ("optax", "optax"),
        ("orbax", "orbax-checkpoint"),
    ]:
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    return out


def _jsonable_args(args: Any) -> Any:
    if args is None:
        return None
    if not isinstance(args, dict):
        args = vars(args) if hasattr(args, "__dict__") else {"value": args}
    return json.loads(json.dumps(args, default=str))


def provenance(
    bench: str,
    args: Any = None,
    *,
    command: str | None = None,
    disk_path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Everything of the schema but the figures: bench, command, code, machine, versions, date."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "schema": SCHEMA,
        "bench": bench,
        "command": command or shlex.join(["python", *sys.argv]),
        "commit": _git("rev-parse", "HEAD") or UNRECORDED,
        "tree_clean": None if status is None else status == "",
        "machine": machine(disk_path),
        "versions": versions(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "args": _jsonable_args(args),
    }


def default_path(bench: str, prov: dict[str, Any]) -> Path:
    """``bench/results/<bench>/<date>-<short commit>.json``."""
    short = prov["commit"][:7] if prov["commit"] != UNRECORDED else "nocommit"
    return RESULTS / bench / f"{prov['date'][:10]}-{short}.json"


def write_result(
    bench: str,
    *,
    args: Any = None,
    summary: Any = None,
    records: Any = None,
    path: str | os.PathLike | None = None,
    command: str | None = None,
    disk_path: str | os.PathLike | None = None,
    **extra: Any,
) -> Path:
    """Write one result in the schema above and return its path.

    ``path`` defaults to :func:`default_path`; ``extra`` keys (a bench's own figures beside
    ``summary`` and ``records``) are kept as they are, after the provenance.
    """
    prov = provenance(bench, args, command=command, disk_path=disk_path)
    doc = {**prov, "summary": summary, "records": records, **extra}
    out = Path(path) if path else default_path(bench, prov)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return out
