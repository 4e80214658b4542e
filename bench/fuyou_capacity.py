"""Fuyou's step against its bound at the capacity model (GPT at ``--d-model``, single-slot store).

At the capacity model the step with the optimizer state in RAM (compute-only) cannot run: its
state is several times RAM. So the bound ``max(compute-only, pure I/O)`` is taken as:

* **pure I/O**, measured at the capacity depth: after the Fuyou probe's steps its store is
  replayed without compute, every chunk read and written back in place through the paged
  optimizer's engine configuration (``bench/paged_step.py``'s ``replay_io``), ``--io-reps``
  times (median);
* **compute-only**, measured at ``--compute-depths`` (the same width, sequence and batch;
  ``bench/capacity.py``'s ``plain-bf16`` mode: bf16 parameters and gradients, fp32 masters and
  moments, optax AdamW, all in RAM) and extrapolated to the capacity depth by a least-squares
  line in the number of layers (a scan of identical blocks: each layer adds the same work).
  The fit's largest relative residual is printed and stored.

Every probe also records its process CPU time a step (all threads: XLA's and the engine's),
the compute-only one extrapolated by its own line, so a second bound is given: ``max(compute-only,
pure I/O, (compute-only CPU + pure I/O CPU) / cores)``, the shortest a step can take on this
machine's cores if every CPU second of both is kept (as ``bench/fuyou.py`` gives it).

At the largest compute depth Fuyou and pure I/O are measured too, so one ratio there needs no
extrapolation; ``--baseline-read-ahead-mib`` adds Fuyou probes there with other read-ahead
budgets (``fuyou_init(..., read_ahead_bytes=...)``; ``--read-ahead-mib`` sets the measured
one, default the library's). Every probe is a child process of ``bench/capacity.py`` (its
own peak RSS); step times are the medians of the steps after the first.

    python bench/fuyou_capacity.py --layers 120 --json bench/results/fuyou_bound_capacity.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capacity import GIB, disk_cap_layers, num_params, probe, store_bytes  # noqa: E402


def _median_after_first(rec: dict, key: str = "step_s") -> float:
    times = rec.get(key) or []
    if rec.get("status") != "ok" or len(times) < 2:
        raise SystemExit(f"probe {rec['mode']} at {rec['num_layers']} layers failed: {rec}")
    return statistics.median(times[1:])


def _line(depths: list[int], values: list[float]) -> tuple[float, float, float]:
    """Least-squares ``slope, intercept`` in layers and the largest relative residual."""
    slope, icpt = np.polyfit(depths, values, 1)
    resid = max(abs(icpt + slope * n - v) / v for n, v in zip(depths, values, strict=True))
    return float(slope), float(icpt), float(resid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=None, help="default: the most the disk holds")
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4, help="steps of the capacity probe")
    ap.add_argument("--small-steps", type=int, default=5, help="steps of the smaller probes")
    ap.add_argument("--io-reps", type=int, default=3)
    ap.add_argument("--compute-depths", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--store-dir", default=None)
    ap.add_argument("--disk-reserve-gib", type=float, default=4.0)
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per probe")
    ap.add_argument(
        "--read-ahead-mib", type=int, default=None, help="Fuyou's (default: the library's)"
    )
    ap.add_argument(
        "--baseline-read-ahead-mib",
        type=int,
        nargs="*",
        default=[],
        help="more Fuyou probes at the largest compute depth, with these read-ahead budgets",
    )
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = a.store_dir or tempfile.gettempdir()
    Path(root).mkdir(parents=True, exist_ok=True)
    cap = disk_cap_layers(root, "fuyou", 1, a.d_model, a.seq_len, a.disk_reserve_gib)
    layers = a.layers or cap
    if layers > cap:
        need = store_bytes(num_params(layers, a.d_model, a.seq_len), "fuyou", 1)
        raise SystemExit(
            f"{layers} layers need a {need / 1e9:.1f} GB store; the disk under {root} holds "
            f"{cap} layers (free space minus "
            f"--disk-reserve-gib {a.disk_reserve_gib:g}): pass --layers {cap} or less"
        )
    depths = sorted(set(a.compute_depths))
    if len(depths) < 2:
        raise SystemExit("--compute-depths needs two depths or more to fit a line")
    kw = dict(
        d_model=a.d_model,
        seq_len=a.seq_len,
        batch_size=a.batch_size,
        store_dir=root,
        disk_reserve_gib=a.disk_reserve_gib,
        timeout_s=a.timeout_s,
        lr=1e-6,
        warmup_steps=5,
    )
    records = []

    def run(mode, n, steps, **extra):
        t0 = time.perf_counter()
        print(f"{mode} at {n} layers ({num_params(n, a.d_model, a.seq_len) / 1e9:.3f}B) ...")
        rec = probe(mode, n, steps=steps, **kw, **extra)
        records.append(rec)
        print(
            f"  {rec.get('why')}: steps {[round(t, 2) for t in rec.get('step_s', [])]} s, "
            f"pure I/O {[round(t, 2) for t in rec.get('pure_io_s', [])]} s, peak RSS "
            f"{rec.get('peak_rss', 0) / GIB:.2f} GiB ({time.perf_counter() - t0:.0f} s)"
        )
        if a.json:  # what has run so far, should a later probe not finish
            Path(a.json).write_text(json.dumps({"records": records}, indent=1) + "\n")
        return rec

    compute_recs = {n: run("plain-bf16", n, a.small_steps) for n in depths}
    compute = {n: _median_after_first(r) for n, r in compute_recs.items()}
    compute_cpu = {n: _median_after_first(r, "cpu_s") for n, r in compute_recs.items()}
    small = depths[-1]
    ra = dict(read_ahead_mib=a.read_ahead_mib)
    small_rec = run("fuyou", small, a.small_steps, slots=1, pure_io_reps=a.io_reps, **ra)
    baselines = {
        mib: _median_after_first(run("fuyou", small, a.small_steps, slots=1, read_ahead_mib=mib))
        for mib in a.baseline_read_ahead_mib
    }
    big_rec = run("fuyou", layers, a.steps, slots=1, pure_io_reps=a.io_reps, **ra)

    slope, intercept, resid = _line(depths, [compute[n] for n in depths])
    compute_big = intercept + slope * layers
    cpu_slope, cpu_intercept, cpu_resid = _line(depths, [compute_cpu[n] for n in depths])
    cores = len(os.sched_getaffinity(0))

    def ratios(rec, compute_s, compute_cpu_s):
        fuyou_s = _median_after_first(rec)
        io = statistics.median(rec["pure_io_s"])
        io_cpu = statistics.median(rec["pure_io_cpu_s"])
        # the shortest a step can take on these cores if every CPU second of both is kept
        cpu_bound = max(compute_s, io, (compute_cpu_s + io_cpu) / cores)
        return {
            "fuyou_s": fuyou_s,
            "compute_only_s": compute_s,
            "pure_io_s": io,
            "compute_over_io": compute_s / io,
            "fuyou_over_bound": fuyou_s / max(compute_s, io),
            "io_hidden": min(1.0, max(0.0, 1.0 - (fuyou_s - compute_s) / io)),
            "fuyou_cpu_s": _median_after_first(rec, "cpu_s"),
            "compute_only_cpu_s": compute_cpu_s,
            "pure_io_cpu_s": io_cpu,
            "cpu_bound_s": cpu_bound,
            "fuyou_over_cpu_bound": fuyou_s / cpu_bound,
            "pure_io_read_gb": rec["pure_io_read_gb"],
            "read_ahead_bytes": rec.get("read_ahead_bytes"),
        }

    summary = {
        "capacity": {
            "layers": layers,
            "params": num_params(layers, a.d_model, a.seq_len),
            "compute_only": "extrapolated",
            **ratios(big_rec, compute_big, cpu_intercept + cpu_slope * layers),
        },
        "small": {
            "layers": small,
            "params": num_params(small, a.d_model, a.seq_len),
            "compute_only": "measured",
            **ratios(small_rec, compute[small], compute_cpu[small]),
        },
        "compute_fit": {
            "depths": depths,
            "compute_only_s": [compute[n] for n in depths],
            "seconds_per_layer": slope,
            "intercept_s": intercept,
            "max_relative_residual": resid,
            "compute_only_cpu_s": [compute_cpu[n] for n in depths],
            "cpu_seconds_per_layer": cpu_slope,
            "cpu_intercept_s": cpu_intercept,
            "cpu_max_relative_residual": cpu_resid,
        },
        "cores": cores,
        "disk_cap_layers": cap,
    }
    for mib, t in baselines.items():
        summary["small"][f"fuyou_over_read_ahead_{mib}_mib"] = summary["small"]["fuyou_s"] / t
        summary["small"][f"fuyou_read_ahead_{mib}_mib_s"] = t
    print(
        f"\ncompute-only: {slope:.3f} s/layer + {intercept:.3f} s (fit over {depths}, largest "
        f"residual {100 * resid:.1f}%)"
    )
    for name in ("small", "capacity"):
        s = summary[name]
        print(
            f"{name:>8} ({s['layers']} layers, {s['params'] / 1e9:.3f}B): fuyou "
            f"{s['fuyou_s']:.2f} s, compute-only {s['compute_only_s']:.2f} s "
            f"({s['compute_only']}), pure I/O "
            f"{s['pure_io_s']:.2f} s ({s['pure_io_read_gb']:.1f} GB each way); fuyou / bound "
            f"{s['fuyou_over_bound']:.3f}, I/O hidden {100 * s['io_hidden']:.0f}%, "
            f"compute / I/O {s['compute_over_io']:.2f}; CPU s a step: fuyou "
            f"{s['fuyou_cpu_s']:.1f}, compute-only {s['compute_only_cpu_s']:.1f}, pure I/O "
            f"{s['pure_io_cpu_s']:.1f}: fuyou / CPU bound {s['fuyou_over_cpu_bound']:.3f} "
            f"({cores} cores)"
        )
    for mib in baselines:
        print(
            f"   small: fuyou / fuyou reading {mib} MiB ahead = "
            f"{summary['small'][f'fuyou_over_read_ahead_{mib}_mib']:.3f}"
        )
    if a.json:
        doc = {
            "command": "python bench/fuyou_capacity.py " + " ".join(sys.argv[1:]),
            "args": vars(a),
            "summary": summary,
            "records": records,
        }
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
