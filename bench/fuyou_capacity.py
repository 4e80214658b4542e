"""Fuyou's step against its bound at the capacity model (GPT at ``--d-model``, single-slot store).

At the capacity model the step with the optimizer state in RAM (compute-only) cannot run: its
state is several times RAM. So the bound ``max(compute-only, pure I/O)`` is taken as:

* **pure I/O**, measured at the capacity depth: after the Fuyou probe's steps its store is
  replayed without compute, every chunk read and written back in place through the paged
  optimizer's engine configuration (``bench/paged_step.py``'s ``replay_io``), ``--io-reps``
  times (median);
* **compute-only**, measured at ``--compute-depths`` (the same width, sequence and batch;
  ``_common/step_loop.py``'s ``plain-bf16`` mode: bf16 parameters and gradients, fp32 masters
  and moments, optax AdamW, all in RAM) and extrapolated to the capacity depth by a least-squares
  line in the number of layers (a scan of identical blocks: each layer adds the same work).
  The fit's largest relative residual is printed and stored.

Every probe also records its process CPU time a step (all threads: XLA's and the engine's),
the compute-only one extrapolated by its own line, so a second bound is given: ``max(compute-only,
pure I/O, (compute-only CPU + pure I/O CPU) / cores)``, the shortest a step can take on this
machine's cores if every CPU second of both is kept (as ``bench/fuyou.py`` gives it).

The Fuyou probes record the engine's counters of every step (``take_wait_s``: the time its
takes waited for their reads; ``io_busy_s``: the time with I/O in flight; bytes read and
written) and sample each step second by second (``timelines``: process CPU time and the
counters). Fuyou pages the optimizer state during the backward pass only (ahead of it, no
more than the read-ahead is staged), so each step is also set against a third bound that
uses its own measured I/O time: ``max(compute-only, opening + io_busy_s)``, the opening being
the time to the step's first take (its forward pass and top layer's backward, within the
1 s sample period; meaningful for steps of many seconds). ``--plot`` draws the capacity
probe's steps after the first: cores busy, takes waiting, GB/s read.

At the largest compute depth Fuyou and pure I/O are measured too, so one ratio there needs no
extrapolation; ``--baseline-read-ahead-mib`` adds Fuyou probes there with other read-ahead
budgets (``fuyou_init(..., read_ahead_bytes=...)``; ``--read-ahead-mib`` sets the measured
one, default the library's). Step times are the medians of the steps after the first.

Every probe is a child process of its own (``_common/child.py``: its own peak RSS, a memory
watchdog) running the instrumented loop of ``_common/step_loop.py`` over the library's Fuyou
step (``make_fuyou_step``), not ``jaxoff train``: the compute-only baseline is no trainer
configuration, and the trainer neither samples its steps nor replays its store.

    python bench/fuyou_capacity.py --layers 120 --json bench/results/fuyou_bound_capacity.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: _capacity, _common
from _capacity.sizes import GIB, disk_cap_layers, model_config, num_params, store_bytes  # noqa: E402
from _common.child import run_child  # noqa: E402


def loop_probe(mode: str, num_layers: int, d_model: int, seq_len: int, **kw) -> dict:
    """The child's side of `probe`: ``_common/step_loop.py``'s ``run_probe`` of the capacity
    model at ``num_layers`` layers."""
    from _common.step_loop import run_probe

    return run_probe(mode, model_config(num_layers, d_model, seq_len, mode), seq_len, **kw)


def probe(
    mode: str,
    num_layers: int,
    *,
    d_model: int,
    seq_len: int,
    store_dir: str,
    timeout_s: float,
    mem_limit_gib: float | None = None,
    min_available_gib: float = 0.75,
    **kw,
) -> dict:
    """One probe of the instrumented loop in a child process: its record, with ``status``
    (``ok``, ``killed`` or ``error``, ``why`` saying why not) and the child's peak RSS. ``kw``:
    `loop_probe`'s (``batch_size``, ``steps``, ``slots``, ``pure_io_reps``, ...). The store
    and the child's files are removed afterwards."""
    import psutil

    if mem_limit_gib is None:
        mem_limit_gib = psutil.virtual_memory().total / GIB - 1.0
    rec = {
        "mode": mode,
        "num_layers": num_layers,
        "params": num_params(num_layers, d_model, seq_len),
    }
    Path(store_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fuyou-capacity-probe-", dir=store_dir))
    args = dict(mode=mode, num_layers=num_layers, d_model=d_model, seq_len=seq_len, **kw)
    try:
        got = run_child(
            "fuyou_capacity:loop_probe",
            args | {"store_dir": str(work / "store")},
            work=work,
            mem_limit_gib=mem_limit_gib,
            min_available_gib=min_available_gib,
            timeout_s=timeout_s,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rec.update(got)
    rec.setdefault("why", "ran")
    return rec


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


def first_update_s(timeline: list[dict]) -> float:
    """When a sampled step's first optimizer-state take had happened (the first sample that
    counts one; an upper bound within a sample period): the opening of the step (its forward
    pass and its top layer's backward) in which no paging I/O runs but the read-ahead."""
    return next(r["t"] for r in timeline if r["takes"] > 0)


def window_bounds(rec: dict, compute_s: float) -> dict:
    """Each step after the first against ``max(compute-only, opening + the step's own I/O
    time)``: Fuyou reads and writes the optimizer state during the backward pass only (it is
    staged in RAM no further than the read-ahead), so a step whose I/O outlasts its backward
    pass takes its opening plus the time the disk was busy (the engine's ``io_busy_s``, time
    with I/O in flight, measured in that step: the disk's speed varies from minute to
    minute here, and a pure I/O replay run minutes later does not see the same disk)."""
    openings = [first_update_s(t) for t in rec["timelines"][1:]]
    busy = [e["io_busy_s"] for e in rec["engine"][1:]]
    bounds = [max(compute_s, o + b) for o, b in zip(openings, busy, strict=True)]
    over = [s / b for s, b in zip(rec["step_s"][1:], bounds, strict=True)]
    return {
        "opening_s": openings,
        "io_busy_s": busy,
        "take_wait_s": [e["take_wait_s"] for e in rec["engine"][1:]],
        "window_bound_s": bounds,
        "step_over_window_bound": over,
        "median_step_over_window_bound": statistics.median(over),
    }


def timeline_rates(timeline: list[dict]) -> dict[str, list[float]]:
    """A sampled step as rates between samples: cores busy, read and write GB/s, and the
    fraction of the time the step's takes waited for their reads."""
    out: dict[str, list[float]] = {k: [] for k in ("t", "cores", "read_gbs", "write_gbs", "wait")}
    for a, b in itertools.pairwise(timeline):
        dt = b["t"] - a["t"]
        if dt <= 0:
            continue
        out["t"].append(b["t"])
        out["cores"].append((b["cpu_s"] - a["cpu_s"]) / dt)
        out["read_gbs"].append((b["read_bytes"] - a["read_bytes"]) / dt / 1e9)
        out["write_gbs"].append((b["write_bytes"] - a["write_bytes"]) / dt / 1e9)
        out["wait"].append((b["take_wait_s"] - a["take_wait_s"]) / dt)
    return out


def plot_timeline(rec: dict, path: str) -> None:
    """The capacity probe's steps after the first, second by second: cores busy, the time
    the step's takes waited for their reads, and the disk's read GB/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(8, 7))
    for i, tl in enumerate(rec["timelines"][1:], start=2):
        r = timeline_rates(tl)
        label = f"step {i}: {rec['step_s'][i - 1]:.0f} s"
        for ax, key in zip(axes, ("cores", "wait", "read_gbs"), strict=True):
            ax.plot(r["t"], r[key], label=label, linewidth=1)
    axes[0].set_ylabel("cores busy")
    axes[1].set_ylabel("takes waiting\n(s / s)")
    axes[2].set_ylabel("read GB/s")
    axes[2].set_xlabel("seconds into the step")
    for ax in axes:
        ax.set_ylim(0, None)
    axes[0].legend(loc="lower right", fontsize=8)
    axes[0].set_title(
        f"Fuyou at {rec['num_layers']} layers ({rec['params'] / 1e9:.2f}B): the paging runs from "
        "the first update (after the forward pass) to the step's end",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    ap.add_argument(
        "--plot", default=None, help="PNG of the capacity probe's steps after the first"
    )
    a = ap.parse_args()
    root = a.store_dir or tempfile.gettempdir()
    Path(root).mkdir(parents=True, exist_ok=True)
    # the loop writes no checkpoint: the store alone
    cap = disk_cap_layers(root, "fuyou", 1, a.d_model, a.seq_len, a.disk_reserve_gib, None)
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
            # what the step waited on (medians of the steps after the first, seconds a step)
            "window": window_bounds(rec, compute_s),
            "engine_s": {
                k: statistics.median(e[k] for e in rec["engine"][1:])
                for k in rec["engine"][0]
                if k.endswith("_s")
            },
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
        print(
            "          engine, s a step: "
            + ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in s["engine_s"].items())
        )
        w = s["window"]
        print(
            f"          openings (no paging but read-ahead) {[round(x, 1) for x in w['opening_s']]}"
            " s; steps / "
            f"max(compute-only, opening + the step's I/O busy time): "
            f"{[round(x, 3) for x in w['step_over_window_bound']]} (median "
            f"{w['median_step_over_window_bound']:.3f})"
        )
    for mib in baselines:
        print(
            f"   small: fuyou / fuyou reading {mib} MiB ahead = "
            f"{summary['small'][f'fuyou_over_read_ahead_{mib}_mib']:.3f}"
        )
    if a.plot:
        plot_timeline(big_rec, a.plot)
        print(f"wrote {a.plot}")
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
