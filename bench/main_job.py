"""The README's main job, timed: ``jaxoff train`` with its defaults, run as a user runs it.

Each run is a child process in a fresh temporary output folder (``--out-dir``, nothing written
into the working tree); its wall time and CPU time (user + system, from ``wait4``) are taken
around the process, its compile time, losses and peak RSS from the run's ``metrics.jsonl``.
The machine's 1-minute load average before and after each run says how busy it was.

    python bench/main_job.py --runs 3 --json bench/results/main_job/NAME.json

Extra arguments after ``--`` go to ``jaxoff train`` (e.g. ``-- --steps 20`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the result writer
from _common.results import write_result  # noqa: E402


def one_run(extra: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix="jaxoff_main_job_"))
    try:
        cmd = ["jaxoff", "train", "--out-dir", str(out / "run"), "--no-progress", *extra]
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read() if proc.stderr else ""
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            sys.exit(f"main_job: {' '.join(cmd)} exited {code}: {err.strip()[-500:]}")
        recs = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        losses = [r for r in recs if "loss" in r]
        vals = [r["val_loss"] for r in recs if "val_loss" in r]
        return {
            "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_gib": usage.ru_maxrss * 1024 / 2**30,
            "compile_s": next((r["compile_s"] for r in recs if "compile_s" in r), None),
            "first_loss": losses[0]["loss"],
            "last_loss": losses[-1]["loss"],
            "last_val_loss": vals[-1] if vals else None,
            "steps": len(losses),
            "load_average_1min_before": load_before,
            "load_average_1min_after": os.getloadavg()[0],
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None, help="default: bench/results/main_job/DATE-COMMIT.json")
    ap.add_argument("train_args", nargs="*", help="after --: extra jaxoff train arguments")
    a = ap.parse_args()
    if shutil.which("jaxoff") is None:
        sys.exit("main_job: no jaxoff command on PATH; install first (pip install .)")
    runs = []
    for i in range(a.runs):
        runs.append(one_run(a.train_args))
        r = runs[-1]
        print(
            f"run {i}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, loss "
            f"{r['first_loss']:.3f} -> {r['last_loss']:.3f} (val {r['last_val_loss']}), "
            f"load {r['load_average_1min_before']:.2f} -> {r['load_average_1min_after']:.2f}",
            flush=True,
        )
    walls = [r["wall_s"] for r in runs]
    summary = {
        "median_wall_s": statistics.median(walls),
        "min_wall_s": min(walls),
        "max_wall_s": max(walls),
        "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "last_loss": runs[-1]["last_loss"],
        "last_val_loss": runs[-1]["last_val_loss"],
        "same_losses_every_run": len({(r["first_loss"], r["last_loss"]) for r in runs}) == 1,
    }
    out = write_result("main_job", args=vars(a), summary=summary, records=runs, path=a.json)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
