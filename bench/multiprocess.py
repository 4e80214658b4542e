"""The paged FSDP step from one process to two on this machine, and each process's disk traffic.

Same model, global batch, mesh size (``--devices`` XLA CPU devices) and optimizer paged to
disk (``--store auto``), measured in one run, interleaved ``--rounds`` times:

* **1 process** × ``devices`` devices: ``jaxoff train --fsdp devices``, one page store;
* **2 processes** × ``devices / 2`` devices: ``jaxoff launch --processes 2 -- train ...``,
  one page store per process, each paging its half of every sharded tensor.

Per variant: the median step time (the first two steps excluded: compilation, warm-up), and
per process the disk bytes read and written per step (``/proc/self/io``, which the trainer
logs per step: the paging of its own store; checkpoints are off), and the step's phases
(gradient program, blocks out, paged update, blocks back in). Prints the ratio of the
two-process step to the one-process step, and the share of the one-process traffic each
process moves. ``--json`` writes every figure.

    python bench/multiprocess.py --json bench/results/multiprocess/NAME.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the result writer
from _common.results import write_result  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    model: str = "tiny"
    batch_size: int = 8
    seq_len: int = 128
    steps: int = 12
    devices: int = 2
    rounds: int = 3
    json: Path | None = None


def _train_args(a: Args, out: Path) -> list[str]:
    return [
        "train", "--model", a.model, "--batch-size", str(a.batch_size), "--seq-len",
        str(a.seq_len), "--steps", str(a.steps), "--fsdp", str(a.devices), "--store", "auto",
        "--eval-every", "0", "--ckpt-every", "0", "--no-progress", "--out-dir", str(out),
    ]  # fmt: skip


def _run(a: Args, processes: int, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    env.pop("JAX_NUM_PROCESSES", None)
    if processes == 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={a.devices}"
        cmd = [sys.executable, "-m", "jaxoff", *_train_args(a, out)]
    else:
        per = a.devices // processes
        cmd = [sys.executable, "-m", "jaxoff", "launch", "--processes", str(processes),
               "--devices-per-process", str(per), "--", *_train_args(a, out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    per_process = []
    for p in range(processes):
        name = "metrics.jsonl" if p == 0 else f"metrics.process-{p}.jsonl"
        rows = [json.loads(line) for line in (out / name).read_text().splitlines()][2:]
        per_process.append(
            {
                "step_s": statistics.median(r["step_time_s"] for r in rows),
                "read_mb_per_step": statistics.median(
                    r["disk_read_mbps"] * r["step_time_s"] for r in rows
                ),
                "write_mb_per_step": statistics.median(
                    r["disk_write_mbps"] * r["step_time_s"] for r in rows
                ),
                "losses": [r["loss"] for r in rows],
                "phases_s": {
                    k: statistics.median(r[k] for r in rows)
                    for k in ("grads_s", "blocks_out_s", "local_update_s", "blocks_in_s")
                },
            }
        )
    return {"step_s": per_process[0]["step_s"], "processes": per_process}


def main(a: Args) -> dict:
    if a.devices % 2:
        raise SystemExit("--devices must be even (split over two processes)")
    times: dict[int, list[float]] = {1: [], 2: []}
    last: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for n in (1, 2):
                res = _run(a, n, Path(tmp) / f"run{n}")
                times[n].append(res["step_s"])
                last[n] = res
                print(f"round {r + 1}/{a.rounds}: {n} process(es): {res['step_s']:.3f} s/step",
                      flush=True)  # fmt: skip
    one, two = statistics.median(times[1]), statistics.median(times[2])
    traffic_one = (
        last[1]["processes"][0]["read_mb_per_step"] + last[1]["processes"][0]["write_mb_per_step"]
    )
    result = {
        "step_s": {"1_process": times[1], "2_processes": times[2]},
        "median_step_s": {"1_process": one, "2_processes": two},
        "ratio_2_over_1": two / one,
        "phases_s": {  # medians, last round, process 0 (see ShardedPagedStep)
            "1_process": last[1]["processes"][0]["phases_s"],
            "2_processes": last[2]["processes"][0]["phases_s"],
        },
        "disk_mb_per_step": {
            "1_process": [
                {k: p[k] for k in ("read_mb_per_step", "write_mb_per_step")}
                for p in last[1]["processes"]
            ],
            "2_processes": [
                {k: p[k] for k in ("read_mb_per_step", "write_mb_per_step")}
                for p in last[2]["processes"]
            ],
        },
    }
    print(f"median step: 1 process {one:.3f} s, 2 processes {two:.3f} s: ratio {two / one:.3f}")
    for n in (1, 2):
        phases = last[n]["processes"][0]["phases_s"]
        print(f"{n} process(es), phases: " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
    for p, row in enumerate(last[2]["processes"]):
        share = (row["read_mb_per_step"] + row["write_mb_per_step"]) / traffic_one
        print(
            f"process {p} of 2: read {row['read_mb_per_step']:.1f} MB, write "
            f"{row['write_mb_per_step']:.1f} MB per step ({share:.2f} of one process's)"
        )
    if a.json:
        write_result("multiprocess", args=vars(a), path=a.json, **result)
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
