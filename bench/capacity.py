"""Largest GPT that ``jaxoff train`` trains on this machine, by mode: plain optax AdamW in RAM
against the paged optimizer and Fuyou.

Every probe is a ``jaxoff train`` run (``jaxoff.train.train``) in a child process of its own
(``_common/child.py``), so each has its own peak RSS and an OOM kill never takes down the
search: the trainer's model init, its step, its data (``--data corpus``, the default:
jaxoff's embedded byte corpus, so the loss can fall; ``--data random``: uniform random bytes,
so it cannot), its learning-rate warm-up (``--warmup-steps``, linear from 0 to ``--lr``) and
its final checkpoint, whose disk counts toward the disk cap. Full remat
(``nothing_saveable``), layers scanned, no gradient clipping.

Modes, each a trainer configuration (``_capacity/probe.py``'s ``train_options``):
  plain       ``--store none``: fp32 parameters, ``optax.adamw`` state in RAM (16 B/param).
  paged       ``--store DIR``: bf16 parameters and gradients in RAM, fp32 masters and moments
              in the page store (``--slots`` x 12 B/param on disk).
  fuyou       ``--strategy fuyou``: the same paged AdamW, run inside the backward layer scan
              (layer j's update as soon as its gradients exist), the stacked blocks kept as
              their bits and updated in place: ~2 B/param in RAM.
  fuyou-nvme  ``--strategy fuyou --page-params``: the stacked block parameters in the page
              store too, read a layer ahead in forward and backward (``--slots`` x 14 B/param).

The bench's former mode ``plain-bf16`` (bf16 parameters with fp32 masters and moments, all in
RAM) is not a ``jaxoff train`` configuration (``--store none`` with a bf16 model keeps bf16
moments and no masters), so it is not a mode here; it remains the compute-only baseline of
``bench/fuyou_capacity.py`` and of the GPU probes, in their instrumented loop
(``_common/step_loop.py``).

A probe fits when the run finishes its ``--steps`` steps with finite losses, its peak RSS
(the child's ``VmHWM``, or the watchdog's) stays below ``--mem-limit-gib`` and, with
``--steps`` >= 10, its loss falls: the validation loss (one held-out batch) at the end is
below the one at half the steps, and the steps' mean loss of the second half is below that of
the first. The watchdog thread in the child stops it when RSS passes the limit or the machine
has under ``--min-available-gib`` left, so it never gets to the kernel's OOM killer.

Sizes: GPT-2 shapes at a fixed width ``--d-model`` (default 2048, as in the 1.21B baseline of
shared/JAX-ON-CPU.md); a size is its number of layers (``_capacity/sizes.py``). The search per
mode starts at ``--start`` (a parameter count, rounded to layers; paged modes: the disk cap),
walks up or down by ``--grow`` until it has a fitting and a failing size, then bisects on
layers (``_capacity/search.py``). Paged sizes whose store and last checkpoint would not fit
the free disk of ``--store-dir`` (minus ``--disk-reserve-gib``) are not run: they are
"disk-bound". Results are written in ``_common/results.py``'s schema, every probe kept;
``bench/report.py`` computes the ratios from them.

    python bench/capacity.py --modes plain paged --out capacity.json
    python bench/capacity.py --modes paged --d-model 128 --steps 2 --start 1 --max-probes 1 \\
        --mem-limit-gib 3 --store-dir /tmp/capacity --out /tmp/capacity.json  # quick validation
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCH = str(Path(__file__).resolve().parent)
if BENCH not in sys.path:  # imported, not run (tests): bench/ last, shadowing no package
    sys.path.append(BENCH)  # _capacity, _common

from _capacity.probe import probe  # noqa: E402
from _capacity.search import search  # noqa: E402
from _capacity.sizes import GIB, MODES, PAGED_MODES, disk_cap_layers, layers_for  # noqa: E402
from _capacity.sizes import model_config as model_config  # noqa: E402 (tests/test_index_range)
from _capacity.summary import fmt_gib, render, summarize  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--modes", nargs="+", choices=MODES, default=["plain", "paged"])
    p.add_argument("--d-model", type=int, default=2048, help="width; sizes vary by layers")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate of AdamW")
    p.add_argument("--warmup-steps", type=int, default=3, help="linear warm-up from 0")
    p.add_argument("--data", choices=("corpus", "random"), default="corpus")
    p.add_argument(
        "--mem-limit-gib",
        type=float,
        default=None,
        help="RSS limit of a probe (default: total RAM - 1 GiB)",
    )
    p.add_argument(
        "--min-available-gib",
        type=float,
        default=0.75,
        help="stop a probe when the machine has less available than this",
    )
    p.add_argument("--store-dir", default=None, help="where paged probes put their store")
    p.add_argument("--disk-reserve-gib", type=float, default=4.0)
    p.add_argument(
        "--slots",
        type=int,
        choices=(1, 2),
        default=2,
        help="page store slots of the paged modes: 2 (crash-safe) or 1 (in place, half the disk)",
    )
    p.add_argument(
        "--paged-checkpoint",
        choices=("copy", "store"),
        default="copy",
        help="what the run's checkpoints hold of the page store (`jaxoff train "
        "--paged-checkpoint`): copy (the disk holds the state twice) or store (its version, "
        "named; no copy)",
    )
    p.add_argument(
        "--read-ahead-mib",
        type=int,
        default=None,
        help="the fuyou modes' `jaxoff train --fuyou-read-ahead-mib` (default: the trainer's)",
    )
    p.add_argument(
        "--start",
        type=float,
        nargs="+",
        default=None,
        help="start size per mode in parameters, e.g. 1.21e9 3e9 (default: "
        "1.21e9 for plain, the disk cap for paged modes)",
    )
    p.add_argument("--grow", type=float, default=1.25, help="ladder factor before bisecting")
    p.add_argument(
        "--max-probes",
        type=int,
        nargs="+",
        default=[4],
        help="probes per mode (one value, or one per mode)",
    )
    p.add_argument("--timeout-s", type=float, default=1200.0, help="per probe")
    p.add_argument("--out", default="capacity.json")
    return p


def main(argv=None) -> None:
    import psutil
    from rich.console import Console

    a = parser().parse_args(argv)
    console = Console(width=max(Console().width, 180))
    if a.mem_limit_gib is None:
        a.mem_limit_gib = psutil.virtual_memory().total / GIB - 1.0
    starts = a.start or [1.21e9 if m not in PAGED_MODES else 1e15 for m in a.modes]
    if len(starts) == 1:
        starts = starts * len(a.modes)
    max_probes = a.max_probes * len(a.modes) if len(a.max_probes) == 1 else a.max_probes
    root = a.store_dir or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)  # the disk cap is read from its file system
    vm = psutil.virtual_memory()
    console.print(
        f"machine: {vm.total / GIB:.1f} GiB RAM, {vm.available / GIB:.1f} GiB "
        f"available; limit per probe {a.mem_limit_gib:.1f} GiB; disk free "
        f"{shutil.disk_usage(root).free / 1e9:.0f} GB"
    )
    records: list[dict] = []
    t_start = time.perf_counter()
    kw = dict(
        d_model=a.d_model,
        seq_len=a.seq_len,
        batch_size=a.batch_size,
        steps=a.steps,
        mem_limit_gib=a.mem_limit_gib,
        min_available_gib=a.min_available_gib,
        store_dir=a.store_dir,
        disk_reserve_gib=a.disk_reserve_gib,
        timeout_s=a.timeout_s,
        slots=a.slots,
        lr=a.lr,
        warmup_steps=a.warmup_steps,
        data=a.data,
        read_ahead_mib=a.read_ahead_mib,
        paged_checkpoint=a.paged_checkpoint,
    )
    with console.status("probing...") as status:
        for mode, start, n_probes in zip(a.modes, starts, max_probes, strict=True):

            def run(layers: int, mode=mode) -> dict:
                r = probe(mode, layers, **kw)
                records.append(r)
                console.print(
                    f"  {r['mode']:10s} {r['num_layers']:3d} layers "
                    f"{r['params'] / 1e9:6.3f}B  peak RSS {fmt_gib(r.get('peak_rss'))}"
                    f" GiB  {r.get('why')}  ({r.get('wall_s', 0):.0f} s)"
                )
                Path(a.out).write_text(json.dumps({"records": records}, indent=1))
                status.update(f"probing {mode}... {time.perf_counter() - t_start:.0f} s")
                return r

            status.update(f"probing {mode}...")
            cap = None
            if mode in PAGED_MODES:  # the disk caps the size: never probe (or bracket) above it
                cap = disk_cap_layers(
                    root, mode, a.slots, a.d_model, a.seq_len, a.disk_reserve_gib,
                    a.paged_checkpoint,
                )  # fmt: skip
            first = layers_for(start, a.d_model, a.seq_len)
            search(run, first, max_probes=n_probes, grow=a.grow, cap_layers=cap)
    render(records, console)
    summary = summarize(records)
    for m, r in summary["largest"].items():
        console.print(
            f"largest {m}: {r['params'] / 1e9:.3f}B params ({r['num_layers']} layers), "
            f"peak RSS {fmt_gib(r['peak_rss'])} GiB, RSS/state {r['rss_over_state']:.3f}"
        )
    for k, v in summary.items():
        if k != "largest":
            console.print(f"{k}: {v:.3f}")
    from _common.results import write_result

    out = write_result(
        "capacity",
        args=vars(a),
        summary=summary,
        records=records,
        path=a.out,
        command="python bench/capacity.py " + " ".join(sys.argv[1:] if argv is None else argv),
        disk_path=root,
        wall_s=time.perf_counter() - t_start,
    )
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
