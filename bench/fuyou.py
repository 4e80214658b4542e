"""Step time of fuyou (paged update pipelined with the backward scan) against its bound.

Same model (default ``mini``, nothing_saveable), same AdamW, same batch, measured in one run
with the variants interleaved (``--rounds`` rounds of ``--steps`` steps each, after warm-up;
medians over all steps):

* **compute-only**: the same step with the optimizer state in RAM (no paging);
* **sequential paged**: ``jaxoff.paged``, the whole update after backward;
* **fuyou**: layer j + 1's paged update inside the backward scan step of layer j;
* **fuyou_nvme**: fuyou with the block parameters in the page store too
  (``page_params=True``: taken in forward and backward, put by the update);
* **pure I/O**: fuyou's store read from its committed slot and written to the other one,
  chunk by chunk through the paged optimizer's engine configuration, no compute
  (``bench/paged_step.py``'s replay).

Each variant's CPU time a step is measured too (``time.process_time``: every thread of the
process, XLA's, the pager's and the engine's). Overlap hides I/O behind compute only where a
core is free to do the I/O's CPU work (kernel copies, checksums): the **CPU bound**
``max(compute-only, pure I/O, (compute-only CPU + pure I/O CPU) / cores)`` is the shortest a
step can take on this machine's cores if every CPU second of both is kept; fuyou / CPU bound is
printed beside fuyou / max(compute-only, pure I/O).

Prints fuyou_nvme / fuyou (what paging the parameters costs), fuyou / sequential,
fuyou / max(compute-only, pure I/O) and two fractions of the I/O hidden:

* seen from outside, ``1 - (fuyou - compute-only) / pure I/O`` (clamped to [0, 1]): every
  cost of paging beyond compute-only (staging copies, checksums, the chunked update, the
  commit) is counted as unhidden I/O;
* seen by the pager, per paged variant, ``1 - waits / busy`` from its table's counters
  (`jaxoff.aio.io_stats`): ``busy`` the wall time the engine had reads or writes in flight,
  ``waits`` the time the step's paging calls were blocked on them (takes waiting for their
  reads, puts for a write slot, a begin for the last commit), the same split ``jaxoff train``
  prints as ``io_hidden``.

``--optimizer`` picks the AdamW of every variant: ``adamw`` (optax's) or ``fused``
(`jaxoff.optim.fused_adamw`, one C++ pass per chunk).

    python bench/fuyou.py --model mini --batch 4 --seq 128 --json bench/results/fuyou_mini.json
"""

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from paged_step import replay_io

from jaxoff.aio import WAIT_COUNTERS, io_stats
from jaxoff.models.gpt import CONFIGS
from jaxoff.nn import with_stack
from jaxoff.optim import fused_adamw, paged
from jaxoff.step import TrainState, make_train_step
from jaxoff.strategies.fuyou import fuyou_init, fuyou_resident, fuyou_table, make_fuyou_step

VARIANTS = ("compute_only", "sequential", "fuyou", "fuyou_nvme")
OPTIMIZERS = {"adamw": lambda: optax.adamw(1e-4), "fused": lambda: fused_adamw(1e-4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mini")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk-mib", type=int, default=4)
    ap.add_argument("--io-reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--optimizer",
        choices=sorted(OPTIMIZERS),
        default="adamw",
        help="the AdamW of every variant: optax's or jaxoff's fused kernel (fused_adamw)",
    )
    a = ap.parse_args()
    variants = VARIANTS
    cfg = with_stack(CONFIGS[a.model], policy="nothing_saveable")
    x = jax.random.randint(jax.random.key(0), (a.batch, a.seq + 1), 0, 256)
    inputs, targets = x[:, :-1], x[:, 1:]
    root = tempfile.mkdtemp(prefix="fuyou_bench_")
    atexit.register(shutil.rmtree, root, True)  # the stores (GBs for larger models), on any exit
    runs, txs = {}, []
    for name in variants:
        graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
        table = None
        if name == "compute_only":
            tx = OPTIMIZERS[a.optimizer]()
            opt, fn = tx.init(params), make_train_step(graphdef, tx)
        else:
            inner = OPTIMIZERS[a.optimizer]()
            tx = paged(inner, f"{root}/{name}", chunk_bytes=a.chunk_mib << 20)
            txs.append(tx)
            if name == "fuyou":
                opt = fuyou_init(cfg, tx, params)
                fn = make_fuyou_step(graphdef, cfg, tx)
            elif name == "fuyou_nvme":
                opt = fuyou_init(cfg, tx, params, page_params=True)
                fn = make_fuyou_step(graphdef, cfg, tx, page_params=True)
                params = fuyou_resident(params)
            else:
                opt, fn = tx.init(params), make_train_step(graphdef, tx)
            table = tx.pager.table if name.startswith("sequential") else fuyou_table(tx)
        step = jax.jit(fn, donate_argnums=0)
        state = TrainState(jnp.zeros((), jnp.int32), params, opt)
        for _ in range(2):  # compile and warm up
            state, m = step(state, inputs, targets)
        jax.block_until_ready(m)
        runs[name] = {
            "step": step, "state": state, "times": [], "cpu": [], "losses": [], "table": table
        }  # fmt: skip
        runs[name]["busy_s"] = runs[name]["wait_s"] = 0.0
    for r in range(a.rounds):
        for name in variants:
            run = runs[name]
            before = io_stats(run["table"]) if run["table"] else None
            for _ in range(a.steps):
                t0, c0 = time.perf_counter(), time.process_time()
                run["state"], m = run["step"](run["state"], inputs, targets)
                jax.block_until_ready((run["state"], m))
                run["times"].append(time.perf_counter() - t0)
                run["cpu"].append(time.process_time() - c0)
                run["losses"].append(float(m["loss"]))
            if before is not None:
                after = io_stats(run["table"])
                run["busy_s"] += (after["io_busy_ns"] - before["io_busy_ns"]) / 1e9
                run["wait_s"] += sum(after[k] - before[k] for k in WAIT_COUNTERS) / 1e9
        print(
            f"round {r}: "
            + "  ".join(
                f"{n} {statistics.median(runs[n]['times'][-a.steps :]) * 1e3:.1f} ms"
                for n in variants
            )
        )
    engine = {}
    for n in variants:
        if runs[n]["table"]:
            busy, wait, count = runs[n]["busy_s"], runs[n]["wait_s"], len(runs[n]["times"])
            engine[n] = {
                "io_busy_s_per_step": busy / count,
                "io_wait_s_per_step": wait / count,
                "io_hidden": max(0.0, 1.0 - wait / busy) if busy > 0 else None,
            }
    for tx in txs:
        tx.close()
    replays = [replay_io(f"{root}/fuyou", 4) for _ in range(a.io_reps)]
    shutil.rmtree(root, ignore_errors=True)
    io = statistics.median(r["io_s"] for r in replays)
    io_cpu = statistics.median(r["cpu_s"] for r in replays)
    med = {n: statistics.median(runs[n]["times"]) for n in variants}
    cpu = {n: statistics.median(runs[n]["cpu"]) for n in variants}
    c, s, f, fn = med["compute_only"], med["sequential"], med["fuyou"], med["fuyou_nvme"]
    hidden = min(1.0, max(0.0, 1.0 - (f - c) / io)) if io > 0 else None
    cores = len(os.sched_getaffinity(0))
    cpu_bound = max(c, io, (cpu["compute_only"] + io_cpu) / cores)
    summary = {
        "compute_only_s": c,
        "sequential_s": s,
        "fuyou_s": f,
        "fuyou_nvme_s": fn,
        "fuyou_nvme_over_fuyou": fn / f,
        "fuyou_nvme_over_compute_only": fn / c,
        "pure_io_s": io,
        "fuyou_over_sequential": f / s,
        "fuyou_over_bound": f / max(c, io),
        "sequential_over_compute_only": s / c,
        "compute_over_io": c / io,
        "io_hidden": hidden,
        "cores": cores,
        "cpu_s_per_step": cpu,
        "pure_io_cpu_s": io_cpu,
        "cpu_bound_s": cpu_bound,
        "fuyou_over_cpu_bound": f / cpu_bound,
        "sequential_over_cpu_bound": s / cpu_bound,
        "engine_io_hidden": {n: e["io_hidden"] for n, e in engine.items()},
    }
    print(f"\nmodel {a.model}, batch {a.batch}x{a.seq}, chunk {a.chunk_mib} MiB, medians")
    for n in variants:
        print(f"{n:>13}: {med[n] * 1e3:.1f} ms/step, {cpu[n] * 1e3:.1f} ms CPU")
    print(
        f"{'pure I/O':>13}: {io * 1e3:.1f} ms, {io_cpu * 1e3:.1f} ms CPU "
        f"(compute-only / pure I/O = {c / io:.2f})"
    )
    print(f"{'CPU bound':>13}: {cpu_bound * 1e3:.1f} ms ({cores} cores)")
    print(f"fuyou / sequential            = {f / s:.3f}")
    print(f"fuyou_nvme / fuyou            = {fn / f:.3f}")
    print(f"fuyou / max(compute, I/O)     = {f / max(c, io):.3f}")
    print(f"fuyou / CPU bound             = {f / cpu_bound:.3f}")
    print(f"sequential / CPU bound        = {s / cpu_bound:.3f}")
    print(f"I/O hidden, from outside      = {100 * hidden:.0f}%")
    for n, e in engine.items():
        print(
            f"I/O hidden, engine ({n:>10}) = {100 * e['io_hidden']:.0f}% "
            f"(busy {e['io_busy_s_per_step'] * 1e3:.1f} ms, "
            f"waited {e['io_wait_s_per_step'] * 1e3:.1f} ms a step)"
        )
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "command": "python bench/fuyou.py " + " ".join(sys.argv[1:]),
            "args": vars(a),
            "summary": summary,
            "engine": engine,
            "runs": {
                n: {
                    "step_s": runs[n]["times"],
                    "cpu_s": runs[n]["cpu"],
                    "losses": runs[n]["losses"],
                }
                for n in variants
            },
        }
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
