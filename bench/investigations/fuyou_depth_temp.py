"""XLA's temporaries of Fuyou's ``--page-params`` step against the depth, at the Llama-2-7B
widths: whether the step's memory grows with the number of layers.

For each ``--layers`` L, a synthetic checkpoint of L layers (``bench/hf_load.py``'s) is
loaded into a page store as ``jaxoff train --init-from DIR --strategy fuyou --page-params``
does (``build_step(cfg).init()``), the step is compiled as the trainer compiles it, and
``memory_analysis()`` gives its temporaries, arguments and outputs. The block parameters
are paged, so a step that holds a window of layers has the same temporaries at every depth
once its two layer scans loop (XLA removes a scan of one trip and may unroll a short one:
depths 1 to 3 hold more layers' buffers at once than deeper ones).

    python bench/investigations/fuyou_depth_temp.py --layers 1 2 3 4 6
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # the result writer, hf_load's checkpoint
from _common.results import write_result  # noqa: E402
from hf_load import write_checkpoint  # noqa: E402


def temps(layers: int, scratch: Path, optimizer: str) -> dict:
    from jaxoff.strategies import build_step
    from jaxoff.train import TrainConfig

    ckpt, run = scratch / f"ckpt{layers}", scratch / f"run{layers}"
    write_checkpoint(ckpt, layers)
    run.mkdir()
    np.save(run / "tokens.npy", np.zeros(4096, np.uint16))
    cfg = TrainConfig(
        init_from=ckpt,
        strategy="fuyou",
        page_params=True,
        clip_norm=0.0,
        optimizer=optimizer,
        seq_len=16,
        batch_size=1,
        store_slots=1,
        data=run / "tokens.npy",
        out_dir=run,
    ).validate()
    step = build_step(cfg)
    try:
        state = step.init()
        x = jnp.zeros((1, 16), jnp.int32)
        step.compile(state, x, x)
        m = step._step.memory_analysis()  # the compiled step the trainer runs
        return {
            "temp_bytes": int(m.temp_size_in_bytes),
            "argument_bytes": int(m.argument_size_in_bytes),
            "output_bytes": int(m.output_size_in_bytes),
        }
    finally:
        step.close()
        shutil.rmtree(ckpt, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    ap.add_argument("--optimizer", default="lion", choices=("adamw", "lion", "sgd"))
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--json", help="the result file (default: bench/results/fuyou_depth_temp/)")
    args = ap.parse_args(argv)
    records = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for layers in args.layers:
            records[str(layers)] = temps(layers, Path(tmp), args.optimizer)
            r = records[str(layers)]
            print(f"{layers:3d} layers: temporaries {r['temp_bytes'] / 2**30:.2f} GiB", flush=True)
    deepest = records[str(max(args.layers))]["temp_bytes"]
    summary = {
        "temp_gib": {k: v["temp_bytes"] / 2**30 for k, v in records.items()},
        "temp_over_deepest": {k: v["temp_bytes"] / deepest for k, v in records.items()},
    }
    path = write_result(
        "fuyou_depth_temp", args=vars(args), summary=summary, records=records, path=args.json
    )
    print(f"result: {path}")


if __name__ == "__main__":
    main()
