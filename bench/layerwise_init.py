"""Peak RSS of initialising a model whose block parameters go to the page store
(``fuyou_init(..., page_params=True)``): built whole, then written (what ``jaxoff train --fuyou``
does without ``--page-params``), against built layer by layer by ``jaxoff.nn.layerwise_params``
(what ``jaxoff train --fuyou --page-params`` does), each in a child process of its own; and the
whole trainer (``jaxoff train --fuyou --page-params``, a few steps) for its peak over the run.

    python bench/layerwise_init.py --model xl --store-dir /tmp/lwi \\
        --json bench/results/layerwise_init/NAME.json

Peak RSS is the child's ``ru_maxrss`` (``os.wait4``). The ratios are against the whole
build's peak and against the model's parameter bytes, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the result writer
from _common.results import write_result  # noqa: E402


def _init(model: str, store: str, how: str) -> None:
    """Child: builds ``model`` (``how``: whole or layerwise) and writes it to a fuyou store."""
    import jax
    import numpy as np
    import optax
    from flax import nnx

    import jaxoff
    from jaxoff.models import load_model
    from jaxoff.nn import LayerLeaf, layerwise_params
    from jaxoff.strategies.fuyou import fuyou_init

    cfg = load_model(model)
    tx = jaxoff.paged(optax.adamw(1e-4), store, slots=1)
    t0 = time.perf_counter()

    def build():
        return cfg.build(nnx.Rngs(0))

    if how == "layerwise":
        _, params = layerwise_params(build)
    else:
        _, params = nnx.split(build(), nnx.Param)
    built = time.perf_counter() - t0
    fuyou_init(cfg, tx, params, page_params=True)
    tx.close()
    # the parameters in hand (arrays, or LayerLeaf shapes): no second trace of the model
    leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, LayerLeaf))
    rec = {
        "params": sum(int(np.prod(x.shape)) for x in leaves),
        "param_bytes": sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves),
        "build_s": built,
        "init_s": time.perf_counter() - t0,
    }
    print(json.dumps(rec))


def _child(cmd: list[str], record: bool = True) -> dict:
    """Runs ``cmd``; its peak RSS and wall time, and with ``record`` its last stdout line
    (a JSON record)."""
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE if record else None, text=True)
    out = child.stdout.read() if record else ""
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"layerwise_init: {' '.join(cmd)} failed (status {status})")
    rec = json.loads(out.splitlines()[-1]) if record else {}
    rec["peak_rss"] = usage.ru_maxrss * 1024  # KiB on Linux
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="xl", help="a jaxoff train --model name")
    ap.add_argument("--store-dir", required=True, help="scratch directory for the stores")
    ap.add_argument(
        "--train-steps", type=int, default=2, help="steps of the trainer run (0: no trainer run)"
    )
    ap.add_argument("--json", help="write the records here")
    args = ap.parse_args(argv)
    recs = {}
    for how in ("whole", "layerwise"):
        store = os.path.join(args.store_dir, how)
        shutil.rmtree(store, ignore_errors=True)
        me = [sys.executable, __file__, "--child", how, args.model, store]
        recs[how] = _child(me)
        shutil.rmtree(store, ignore_errors=True)
        print(f"{how:>9}: peak RSS {recs[how]['peak_rss'] / 2**30:.2f} GiB", flush=True)
    if args.train_steps:
        run = os.path.join(args.store_dir, "train")
        shutil.rmtree(run, ignore_errors=True)
        train = [
            *[sys.executable, "-m", "jaxoff", "train", "--model", args.model],
            *["--fuyou", "--page-params", "--clip-norm", "0", "--batch-size", "1"],
            *["--steps", str(args.train_steps), "--eval-every", "0", "--ckpt-every", "0"],
            *["--store", os.path.join(run, "store"), "--store-slots", "1"],
            *["--out-dir", os.path.join(run, "out"), "--warmup-steps", "1"],
        ]
        recs["train"] = _child(train, record=False)
        with open(os.path.join(run, "out", "metrics.jsonl")) as f:
            recs["train"]["losses"] = [
                r["loss"] for r in map(json.loads, f) if r.get("loss") is not None
            ]
        shutil.rmtree(run, ignore_errors=True)
        print(f"    train: peak RSS {recs['train']['peak_rss'] / 2**30:.2f} GiB", flush=True)
    param_bytes = recs["whole"]["param_bytes"]
    summary = {
        "param_bytes": param_bytes,
        "layerwise_over_whole": recs["layerwise"]["peak_rss"] / recs["whole"]["peak_rss"],
        "layerwise_over_param_bytes": recs["layerwise"]["peak_rss"] / param_bytes,
        "whole_over_param_bytes": recs["whole"]["peak_rss"] / param_bytes,
    }
    if args.train_steps:
        summary["train_over_param_bytes"] = recs["train"]["peak_rss"] / param_bytes
    for k, v in summary.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    if args.json:
        write_result(
            "layerwise_init", args=vars(args), summary=summary, records=recs, path=args.json
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _init(sys.argv[3], sys.argv[4], sys.argv[2])
    else:
        main()
