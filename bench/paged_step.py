"""Step time of ``jaxoff train`` with the optimizer paged to disk versus kept in RAM, and
the bound a paged step is measured against.

Same model, batches and optimizer, measured in the same run, interleaved ``--reps`` times;
medians of the per-step times (first step excluded):

* **compute-only**: the same step with the optimizer state in RAM (``--store none``);
* **pure I/O**: the paged step's reads and writes without compute: every chunk of the
  store read from its committed slot and written to the other one, through an engine
  configured as the paged optimizer's, ``--io-window`` requests in flight (the store is
  left as it was: nothing is committed);
* **paged step**, and what ``jaxoff train`` reports for it from the engine's counters
  (``io_s``: time with I/O in flight, ``io_wait_s``: time the step was blocked on it).

Prints paged / compute-only, paged / max(compute-only, pure I/O) (1.0: the I/O is fully
hidden, or the step is I/O-bound and nothing else is added) and the fraction of the pure
I/O time hidden, ``1 - (paged - compute-only) / pure I/O`` (clamped to [0, 1]), beside
``jaxoff train``'s own ``io_hidden``. ``--json`` writes every figure.

    python bench/paged_step.py [--model mini --batch-size 16 --seq-len 128 --steps 20]
    python bench/paged_step.py --json bench/results/paged_step/NAME.json
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tyro

from jaxoff.aio import Engine, PageStore
from jaxoff.optim import DEFAULT_ENGINE
from jaxoff.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the result writer
from _common.results import write_result  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    model: str = "mini"
    batch_size: int = 16
    seq_len: int = 128
    steps: int = 20
    reps: int = 3
    chunk_mib: int = 16
    policy: str = "none"
    dtype: str = "float32"
    param_dtype: str = "float32"
    store_dir: str | None = None  # where page files go (default: a temporary directory)
    io_window: int = 4  # pure-I/O replay: chunk requests in flight
    io_reps: int = 3  # pure-I/O replays per paged run (median)
    json: str | None = None  # write every figure here
    host_mem: str = "0"  # also a paged run with this RAM tier (--host-mem), e.g. 2GiB


def replay_io(root: str, window: int) -> dict:
    """Reads every chunk of the store at ``root`` from its committed slot and writes it to
    the other slot (no commit; a single-slot store: back in place), ``window`` chunks in
    flight, through an engine configured as the paged optimizer's (O_DIRECT). Returns
    seconds, the CPU seconds of all this process's threads (the engine's included) and
    bytes. Memory: ``2 * window + 2`` chunk buffers, reused (a chunk's buffer is taken
    again only after its write has completed), so a store larger than RAM replays too."""
    store = PageStore.open(root)
    try:
        paths = store.file_table()
        src, dst = store.chunk_table(store.active_slot), store.chunk_table(store.inactive_slot)
        engine = Engine(DEFAULT_ENGINE)
        n = len(src["offset"])
        # chunk nxt's read is issued once nxt < i + window, when at most window + 1 writes
        # (of chunks >= i - window - 1) are in flight: the buffer of chunk nxt - ring is free
        ring = min(n, 2 * window + 2)
        size = int(max(src["padded_nbytes"], default=0))
        bufs = [np.empty(size, np.uint8) for _ in range(ring)]
        for b in bufs:  # touched before timing: a step's staging is faulted in long before
            b.fill(0)

        def buf(i):
            return bufs[i % ring][: int(src["padded_nbytes"][i])]

        t0, c0 = time.perf_counter(), time.process_time()
        reads = {}
        writes = []
        nxt = 0
        for i in range(n):
            while nxt < n and nxt < i + window:
                path = paths[int(src["file_id"][nxt])]
                reads[nxt] = engine.read_into(path, int(src["offset"][nxt]), buf(nxt))
                nxt += 1
            reads.pop(i).result()
            writes.append(
                engine.write(paths[int(dst["file_id"][i])], int(dst["offset"][i]), buf(i))
            )
            while len(writes) > window:
                writes.pop(0).result()
        for w in writes:
            w.result()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        nbytes = int(sum(src["padded_nbytes"]))
    finally:
        store.close()
    return {"io_s": seconds, "cpu_s": cpu, "read_gb": nbytes / 1e9, "write_gb": nbytes / 1e9}


def run(cfg: TrainConfig, args: Args) -> dict:
    with tempfile.TemporaryDirectory(dir=args.store_dir) as d:
        out = Path(d) / "run"
        store = cfg.store if cfg.store == "none" else str(out / "store")
        result = train(dataclasses.replace(cfg, out_dir=out, store=store))
        replays = (
            [replay_io(store, args.io_window) for _ in range(args.io_reps)]
            if cfg.store != "none"
            else []
        )
    recs = result.records[1:]
    res = {
        "step_s": statistics.median(r["step_time_s"] for r in recs),
        "read_gb": statistics.median(r["disk_read_gbps"] * r["step_time_s"] for r in recs),
        "write_gb": statistics.median(r["disk_write_gbps"] * r["step_time_s"] for r in recs),
        "peak_rss_gib": recs[-1]["peak_rss_gib"],
        "losses": [r["loss"] for r in result.records],
    }
    if replays:
        res["pure_io_s"] = statistics.median(r["io_s"] for r in replays)
        res["replay_gb"] = replays[0]["read_gb"]
        for k in ("io_s", "io_wait_s", "compute_s", "io_hidden"):
            res[f"train_{k}"] = statistics.median(r[k] for r in recs)
    return res


def main(args: Args) -> None:
    base = TrainConfig(
        model=args.model,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        steps=args.steps,
        policy=args.policy,
        dtype=args.dtype,
        param_dtype=args.param_dtype,
        chunk_mib=args.chunk_mib,
        eval_every=0,
        ckpt_every=0,
        progress=False,
    ).validate()
    if args.host_mem != "0":  # the RAM tier's files, in a tmpfs folder of this run's own
        shm = tempfile.mkdtemp(prefix="paged_step_", dir="/dev/shm")
        atexit.register(shutil.rmtree, shm, True)
        os.environ["JAXOFF_HOST_MEM_DIR"] = shm
    ram, pag, tier = [], [], []
    for rep in range(args.reps):
        ram.append(run(dataclasses.replace(base, store="none"), args))
        pag.append(run(dataclasses.replace(base, store="auto"), args))
        if args.host_mem != "0":
            tier.append(run(dataclasses.replace(base, store="auto", host_mem=args.host_mem), args))
            print(f"rep {rep}: paged with a {args.host_mem} RAM tier {tier[-1]['step_s']:.3f} s")
        print(
            f"rep {rep}: in-RAM {ram[-1]['step_s']:.3f} s  paged {pag[-1]['step_s']:.3f} s  "
            f"pure I/O {pag[-1]['pure_io_s']:.3f} s"
        )

    def med(rows, key):
        return statistics.median(x[key] for x in rows)

    r, p, io = med(ram, "step_s"), med(pag, "step_s"), med(pag, "pure_io_s")
    hidden = min(1.0, max(0.0, 1.0 - (p - r) / io)) if io > 0 else None
    summary = {
        "compute_only_s": r,
        "paged_s": p,
        "pure_io_s": io,
        "paged_over_compute_only": p / r,
        "paged_over_bound": p / max(r, io),
        "io_hidden": hidden,
        "train_io_s": med(pag, "train_io_s"),
        "train_io_wait_s": med(pag, "train_io_wait_s"),
        "train_io_hidden": med(pag, "train_io_hidden"),
        "read_gb_per_step": med(pag, "read_gb"),
        "write_gb_per_step": med(pag, "write_gb"),
        "store_gb": pag[0]["replay_gb"],
    }
    if tier:
        t = med(tier, "step_s")
        summary.update(
            host_mem=args.host_mem,
            tier_s=t,
            tier_over_compute_only=t / r,
            tier_over_paged=t / p,
        )
        print(f"ratio paged with a {args.host_mem} RAM tier / compute-only: {t / r:.3f}")
    print(
        f"\nmodel {args.model} ({args.dtype} compute, {args.param_dtype} params), "
        f"batch {args.batch_size}x{args.seq_len}, chunk {args.chunk_mib} MiB, "
        f"{args.reps} interleaved reps, medians"
    )
    print(
        f"compute-only (in-RAM optimizer): {r:.3f} s/step, "
        f"peak RSS {ram[-1]['peak_rss_gib']:.2f} GiB"
    )
    print(
        f"paged optimizer               : {p:.3f} s/step, "
        f"peak RSS {pag[-1]['peak_rss_gib']:.2f} GiB, "
        f"disk {summary['read_gb_per_step']:.3f} GB read + {summary['write_gb_per_step']:.3f} GB "
        "written per step (OS counters)"
    )
    print(
        f"pure I/O (same chunks, no compute): {io:.3f} s for "
        f"{summary['store_gb']:.3f} GB read + written"
    )
    print(f"ratio paged / compute-only       : {p / r:.3f}")
    print(f"ratio paged / max(compute, I/O)  : {p / max(r, io):.3f}")
    print(f"I/O hidden (bench)               : {100 * hidden:.0f}%" if hidden is not None else "")
    print(
        f"jaxoff train's split (medians)   : io {summary['train_io_s']:.3f} s, blocked "
        f"{summary['train_io_wait_s']:.3f} s, hidden {100 * summary['train_io_hidden']:.0f}%"
    )
    if args.json:
        out = write_result(
            "paged_step",
            args=dataclasses.asdict(args),
            summary=summary,
            path=args.json,
            in_ram_runs=ram,
            paged_runs=pag,
            tier_runs=tier,
        )
        print(f"wrote {out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
