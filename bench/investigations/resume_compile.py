"""What a resumed `jaxoff train` run spends compiling its paged step, with the step's host
calls as jaxoff's FFI call (named functions: the compiled step can be cached) and as
``io_callback`` (a pointer in the program: JAX never caches it), measured in the same run.

Per round and per mode, with a fresh JAX persistent compilation cache
(``JAX_COMPILATION_CACHE_DIR``): a first process trains until it is killed after step
``--kill-at`` (fault point ``train.metrics``), then a second process resumes the same run
directory to the end, and a third process trains the same model with the same options in
another run directory (same cache). Reported per process: its wall time and the XLA compile
time of ``jit(train_step)`` (from ``JAX_LOG_COMPILES``); medians over ``--rounds`` rounds,
modes alternating.

    python bench/investigations/resume_compile.py --rounds 3 \\
        --json bench/results/resume_compile/NAME.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the result writer
from _common.results import write_result  # noqa: E402

MODES = ("ffi", "io_callback")
_COMPILE = re.compile(r"Finished XLA compilation of jit\(train_step\) in ([0-9.]+) sec")


def _run(args: list[str], env: dict) -> tuple[float, float | None, int, str]:
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "jaxoff.cli", "train", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - t
    found = _COMPILE.findall(p.stderr)
    return wall, (float(found[-1]) if found else None), p.returncode, p.stderr


def one_round(mode: str, opts: list[str], kill_at: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ)
        env.update(
            JAXOFF_HOST_CALL=mode,
            JAX_COMPILATION_CACHE_DIR=f"{d}/cache",
            JAX_LOG_COMPILES="1",
            JAX_PLATFORMS="cpu",
        )
        run = ["--out-dir", f"{d}/run", *opts]
        first = _run(run, {**env, "JAXOFF_FAULT": f"train.metrics:{kill_at}"})
        if first[2] != -9:
            raise SystemExit(
                f"{mode}: the first process was not killed (exit {first[2]}):\n{first[3][-3000:]}"
            )
        second = _run([*run, "--resume"], env)
        if second[2] != 0:
            raise SystemExit(f"{mode}: the resumed process failed:\n{second[3][-3000:]}")
        other = _run(["--out-dir", f"{d}/other", *opts], env)
        if other[2] != 0:
            raise SystemExit(f"{mode}: the run in another directory failed:\n{other[3][-3000:]}")
        metrics = [json.loads(x) for x in Path(f"{d}/run/metrics.jsonl").read_text().splitlines()]
        losses = [m["loss"] for m in metrics if "loss" in m and "step" in m]
        other_metrics = Path(f"{d}/other/metrics.jsonl").read_text().splitlines()
        other_losses = [m["loss"] for m in map(json.loads, other_metrics) if "loss" in m]
        return {
            "mode": mode,
            "first_wall_s": first[0],
            "first_compile_s": first[1],
            "resume_wall_s": second[0],
            "resume_compile_s": second[1],
            "final_loss": losses[-1] if losses else None,
            "other_dir_wall_s": other[0],
            "other_dir_compile_s": other[1],
            "other_dir_final_loss": other_losses[-1] if other_losses else None,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--kill-at", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    opts = [
        "--model",
        a.model,
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--steps",
        str(a.steps),
        "--ckpt-every",
        "2",
        "--store",
        "auto",
        "--no-progress",
    ]
    records = []
    for r in range(a.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            rec = one_round(mode, opts, a.kill_at)
            records.append(rec)
            print(json.dumps(rec), flush=True)
    summary = {}
    for mode in MODES:
        mine = [x for x in records if x["mode"] == mode]
        summary[mode] = {
            k: statistics.median(x[k] for x in mine)
            for k in (
                "first_wall_s",
                "first_compile_s",
                "resume_wall_s",
                "resume_compile_s",
                "other_dir_wall_s",
                "other_dir_compile_s",
            )
        }
    f, c = summary["ffi"], summary["io_callback"]
    ratios = {
        "resume_compile_ffi_over_io_callback": f["resume_compile_s"] / c["resume_compile_s"],
        "resume_wall_ffi_over_io_callback": f["resume_wall_s"] / c["resume_wall_s"],
        "first_wall_ffi_over_io_callback": f["first_wall_s"] / c["first_wall_s"],
        "other_dir_compile_ffi_over_io_callback": f["other_dir_compile_s"]
        / c["other_dir_compile_s"],
        "other_dir_wall_ffi_over_io_callback": f["other_dir_wall_s"] / c["other_dir_wall_s"],
    }
    same_loss = len({x[k] for x in records for k in ("final_loss", "other_dir_final_loss")}) == 1
    print(json.dumps({"median": summary, "ratios": ratios, "same_final_loss": same_loss}, indent=1))
    if a.json:
        write_result(
            "resume_compile",
            args=vars(a),
            summary=summary,
            records=records,
            path=a.json,
            ratios=ratios,
            final_loss_identical_across_modes_and_rounds=same_loss,
        )


if __name__ == "__main__":
    main()
