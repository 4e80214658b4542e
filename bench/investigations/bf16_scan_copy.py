"""What ``jaxoff.compiler_options`` saves on CPU: XLA's float32 copy of a bf16 layer stack.

XLA's CPU backend converts a stacked bfloat16 leaf to float32 to slice it in the layer scan,
and hoists that conversion out of the loop: a float32 copy of the stacked blocks for the whole
step. ``jaxoff.compiler_options`` disables the hoisting pass (``jaxoff/_xla.py``). For the
capacity bench's GPT (``bench/capacity.py``'s ``model_config``, bf16, nothing_saveable) at each
``--layers``, this compiles two steps with and without the options, in one process:

* **grad**: ``jax.value_and_grad`` of the loss (the model's own forward and backward);
* **paged**: that plus ``jaxoff.paged(optax.adamw)``'s update (``update_and_apply``), the
  state donated, as the capacity bench's ``paged`` mode runs it;

and prints, per step and depth, the compiled temporaries (``memory_analysis``) and the median
step time over ``--reps`` interleaved runs, as ratios with / without, and whether the results
are bitwise equal (grad: the loss and every gradient; paged: every step's loss and the
parameters after the last).

    python bench/investigations/bf16_scan_copy.py --layers 4 8 --d-model 2048 --json out.json
"""

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

from jaxoff import compiler_options
from jaxoff.optim import paged, update_and_apply
from jaxoff.step import make_loss_fn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: capacity, the result writer
from _capacity.sizes import model_config  # noqa: E402
from _common.results import write_result  # noqa: E402

GIB = 1 << 30


def _bits(tree) -> list[bytes]:
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def measure(kind: str, layers: int, d_model: int, reps: int, root: str) -> dict:
    cfg = model_config(layers, d_model, 128, "paged")
    tokens = jax.random.randint(jax.random.key(1), (1, 129), 0, 256)
    x, y = tokens[:, :-1], tokens[:, 1:]
    runs = {}
    for name in ("xla_default", "jaxoff"):
        graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
        options = compiler_options(params) if name == "jaxoff" else {}
        loss_fn = make_loss_fn(graphdef)  # the capacity bench's loss: mean cross-entropy
        tx = None
        if kind == "grad":
            state, donate = params, ()

            def step(p, x, y, loss_fn=loss_fn):
                return jax.value_and_grad(loss_fn)(p, x, y)
        else:
            tx = paged(optax.adamw(1e-4), f"{root}/{layers}-{name}", slots=1)
            state, donate = (params, tx.init(params)), 0

            def step(state, x, y, tx=tx, loss_fn=loss_fn):
                p, s = state
                loss, g = jax.value_and_grad(loss_fn)(p, x, y)
                return update_and_apply(tx, g, s, p), loss

        compiled = jax.jit(step, donate_argnums=donate).lower(state, x, y).compile(options or None)
        runs[name] = {
            "fn": compiled,
            "state": state,
            "tx": tx,
            "options": options,
            "temp_gib": compiled.memory_analysis().temp_size_in_bytes / GIB,
            "times": [],
            "out": None,
            "losses": [],
        }
    for _ in range(reps + 1):  # the first round warms up
        for r in runs.values():
            t = time.perf_counter()
            if kind == "grad":
                r["out"] = jax.block_until_ready(r["fn"](r["state"], x, y))
                r["losses"].append(float(r["out"][0]))
            else:
                r["state"], loss = r["fn"](r["state"], x, y)
                r["losses"].append(float(jax.block_until_ready(loss)))
            r["times"].append(time.perf_counter() - t)
    a, b = runs["xla_default"], runs["jaxoff"]
    if kind == "grad":
        same = _bits(a["out"]) == _bits(b["out"])
    else:
        same = a["losses"] == b["losses"] and _bits(a["state"][0]) == _bits(b["state"][0])
    for r in runs.values():
        if r["tx"] is not None:
            r["tx"].close()
    out = {"kind": kind, "layers": layers, "d_model": d_model, "bitwise_equal": same}
    for name, r in runs.items():
        out[name] = {
            "temp_gib": r["temp_gib"],
            "step_s": statistics.median(r["times"][1:]),
            "times": r["times"][1:],
            "options": r["options"],
        }
    out["temp_ratio"] = b["temp_gib"] / a["temp_gib"]
    out["time_ratio"] = out["jaxoff"]["step_s"] / out["xla_default"]["step_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kinds", nargs="+", choices=["grad", "paged"], default=["grad", "paged"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bf16_scan_copy_")
    results = []
    try:
        for kind in a.kinds:
            for layers in a.layers:
                r = measure(kind, layers, a.d_model, a.reps, root)
                results.append(r)
                d, j = r["xla_default"], r["jaxoff"]
                print(
                    f"{kind:>5} {layers:>3} layers: temporaries {d['temp_gib']:.3f} -> "
                    f"{j['temp_gib']:.3f} GiB ({r['temp_ratio']:.3f}x), step "
                    f"{d['step_s']:.2f} -> {j['step_s']:.2f} s ({r['time_ratio']:.3f}x), "
                    f"bitwise equal: {r['bitwise_equal']}",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.json:
        out = write_result("bf16_scan_copy", args=vars(a), records=results, path=a.json)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
