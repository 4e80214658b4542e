"""Step time of ``jaxoff train`` with the optimizer paged to disk versus kept in RAM.

Same model, batches and optimizer, measured in the same run, interleaved ``--reps`` times;
prints medians of the per-step times (first step excluded) and the ratio paged / in-RAM
(target <= 1.10 on a model whose disk time is below its compute time), plus the disk
traffic per step and its share of the step.

    python bench/paged_step.py [--model mini --batch-size 16 --seq-len 128 --steps 20]
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path

import tyro

from jaxoff.train import TrainConfig, train


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


def run(cfg: TrainConfig) -> dict:
    with tempfile.TemporaryDirectory(dir=None) as d:
        out = Path(d) / "run"
        store = cfg.store if cfg.store == "none" else str(out / "store")
        result = train(dataclasses.replace(cfg, out_dir=out, store=store))
    recs = result.records[1:]
    return {
        "step_s": statistics.median(r["step_time_s"] for r in recs),
        "read_gb": statistics.median(r["disk_read_gbps"] * r["step_time_s"] for r in recs),
        "write_gb": statistics.median(r["disk_write_gbps"] * r["step_time_s"] for r in recs),
        "peak_rss_gib": recs[-1]["peak_rss_gib"],
    }


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
    ram, paged = [], []
    for rep in range(args.reps):
        ram.append(run(dataclasses.replace(base, store="none")))
        paged.append(run(dataclasses.replace(base, store="auto")))
        print(f"rep {rep}: in-RAM {ram[-1]['step_s']:.3f} s  paged {paged[-1]['step_s']:.3f} s")
    r = statistics.median(x["step_s"] for x in ram)
    p = statistics.median(x["step_s"] for x in paged)
    rd = statistics.median(x["read_gb"] for x in paged)
    wr = statistics.median(x["write_gb"] for x in paged)
    print(
        f"\nmodel {args.model} ({args.dtype} compute, {args.param_dtype} params), "
        f"batch {args.batch_size}x{args.seq_len}, chunk {args.chunk_mib} MiB, "
        f"{args.reps} interleaved reps, medians"
    )
    print(f"in-RAM optimizer : {r:.3f} s/step, peak RSS {ram[-1]['peak_rss_gib']:.2f} GiB")
    print(
        f"paged optimizer  : {p:.3f} s/step, peak RSS {paged[-1]['peak_rss_gib']:.2f} GiB, "
        f"disk {rd:.3f} GB read + {wr:.3f} GB written per step"
    )
    print(f"ratio paged / in-RAM step time: {p / r:.3f}")


if __name__ == "__main__":
    main(tyro.cli(Args))
