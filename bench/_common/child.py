"""One measurement in a child process of its own, watched for memory.

A probe that may run out of memory runs in a child (`run_child`): it has its own peak RSS
(the child's ``VmHWM``, `peak_rss_bytes`; ``ru_maxrss`` from ``os.wait4`` also holds the
parent's high-water mark, which the child's address space had until its ``exec``), and an
OOM never takes down the parent's search. In the child a psutil watchdog thread polls RSS
every 20 ms and stops the child (exit status 3, the verdict written to its result file) when
RSS passes the limit or the machine has less than ``min_available_gib`` left, so it never
gets to the kernel's OOM killer. The child calls a function named ``"module:function"``
(imported with ``bench/`` on ``sys.path``) with the JSON keyword arguments given, and writes
the dict it returns.

    rec = run_child("_capacity.probe:run_train_probe", kwargs, work=Path(tmp),
                    mem_limit_gib=3, min_available_gib=0.75, timeout_s=600)
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

GIB = 1 << 30
BENCH = Path(__file__).resolve().parents[1]  # bench/
_PHASE = ["start"]  # what the child is doing, for the watchdog's verdict


def peak_rss_bytes() -> int:
    """This process's own peak RSS, ``VmHWM`` (as jaxoff train measures its own): unlike
    ``ru_maxrss`` it starts afresh at ``exec``, without the parent's high-water mark."""
    with open("/proc/self/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("/proc/self/status has no VmHWM line")


def set_phase(name: str) -> None:
    """Names what the child does from now on (a killed child's ``why`` says it)."""
    _PHASE[0] = name


def phase() -> str:
    return _PHASE[0]


def du(path: str | Path | None) -> int:
    """Bytes allocated on disk under ``path`` (blocks, not apparent sizes)."""
    total = 0
    for root, _, files in os.walk(path or "."):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _watchdog(
    limit: int, min_available: int, result_path: Path, peak: list[int], by_phase: dict[str, float]
) -> None:
    """Polls RSS every 20 ms; over the limit (or the machine nearly out of memory) it writes
    the verdict to ``result_path`` and ends the process with exit status 3."""
    import psutil

    proc = psutil.Process()
    while True:
        rss = proc.memory_info().rss
        peak[0] = max(peak[0], rss)
        by_phase[_PHASE[0]] = max(by_phase.get(_PHASE[0], 0.0), round(rss / GIB, 3))
        avail = psutil.virtual_memory().available
        why = None
        if rss > limit:
            why = f"over-limit (RSS {rss / GIB:.2f} GiB > {limit / GIB:.2f} GiB, in {_PHASE[0]})"
        elif avail < min_available:
            why = (
                f"machine out of memory ({avail / GIB:.2f} GiB available, RSS "
                f"{rss / GIB:.2f} GiB, in {_PHASE[0]})"
            )
        if why:
            try:
                verdict = {"status": "killed", "why": why, "watchdog_peak_rss": peak[0]}
                verdict["vm_hwm"] = peak_rss_bytes()
                result_path.write_text(json.dumps(verdict | {"peak_rss_gib_in": by_phase}))
            finally:
                os._exit(3)
        time.sleep(0.02)


def child_main(spec_path: str) -> None:
    """The child's side: the watchdog, then the target function, its record written."""
    spec = json.loads(Path(spec_path).read_text())
    result_path = Path(spec["result"])
    peak, by_phase = [0], {}
    limits = (int(spec["mem_limit_gib"] * GIB), int(spec["min_available_gib"] * GIB))
    threading.Thread(
        target=_watchdog, daemon=True, args=(*limits, result_path, peak, by_phase)
    ).start()
    try:
        module, name = spec["target"].split(":")
        rec = getattr(importlib.import_module(module), name)(**spec["kwargs"])
        rec["status"] = "ok"
    except BaseException as e:  # report any crash as the probe's outcome
        rec = {"status": "error", "why": f"{type(e).__name__}: {str(e)[:300]}"}
    rec["watchdog_peak_rss"] = peak[0]
    rec["vm_hwm"] = peak_rss_bytes()
    rec["peak_rss_gib_in"] = by_phase
    result_path.write_text(json.dumps(rec))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of a large JAX state


def run_child(
    target: str,
    kwargs: dict,
    *,
    work: Path,
    mem_limit_gib: float,
    min_available_gib: float,
    timeout_s: float,
) -> dict:
    """Runs ``target(**kwargs)`` in a child process, its files under ``work`` (its log,
    ``child.log``, and its result); returns its record with ``wall_s``, ``returncode``,
    ``peak_rss`` (the larger of the child's ``VmHWM`` and the watchdog's) and ``status``:
    ``ok``, ``killed`` (by the watchdog, a timeout or a signal; ``why`` says which) or ``error``
    (``why`` holds the exception, or the log's tail)."""
    result, spec = work / "result.json", work / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "target": target,
                "kwargs": kwargs,
                "result": str(result),
                "mem_limit_gib": mem_limit_gib,
                "min_available_gib": min_available_gib,
            }
        )
    )
    # bench/ goes last on the child's path: its modules (multiprocess.py, gpu.py, ...) must
    # not shadow installed packages of the same names
    code = (
        f"import sys; sys.path.append({str(BENCH)!r}); "
        "from _common.child import child_main; child_main(sys.argv[1])"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH.parent), env.get("PYTHONPATH")) if p)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    t0 = time.perf_counter()
    with open(work / "child.log", "w") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(spec)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                child.kill()
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.2)
    rec: dict = {"wall_s": time.perf_counter() - t0}
    rec["returncode"] = os.waitstatus_to_exitcode(status)
    got = json.loads(result.read_text()) if result.exists() else {}
    rec.update(got)
    # the child's own high-water mark; a child that could not say it (killed by a signal):
    # ru_maxrss, which may hold the parent's too (an over-estimate, never an under-)
    own = got.get("vm_hwm", usage.ru_maxrss * 1024)  # KiB
    rec["peak_rss"] = max(own, got.get("watchdog_peak_rss", 0))
    if rec["returncode"] < 0 and not got:
        rec["status"] = "killed"
        rec["why"] = (
            "timeout"
            if rec["wall_s"] >= timeout_s
            else f"killed by signal {-rec['returncode']} (OOM killer?)"
        )
    elif not got:
        log = (work / "child.log").read_text()[-400:]
        rec.update(status="error", why=f"exit {rec['returncode']}: {log}")
    return rec
