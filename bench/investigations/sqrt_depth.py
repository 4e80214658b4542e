"""Where does ``sqrt`` (Chen et al.'s segments) beat ``full``? Memory and FLOPs over depth.

A narrow GPT (d_model 32, 2 heads, d_ff 128, batch 4, sequence 32, float32) at depths from 8
to 2048 layers, its loss gradient compiled (nothing runs) under three policies:

  none   no remat
  full   per-block remat (nothing_saveable): every block's input kept, each block recomputed
  sqrt   Chen segments, the size chosen from the block's bytes when traced
         (jaxoff.nn.SegmentPlan: the k minimising ceil(L / k) b + k i)

Per depth and policy: the compiled ``temp_size_in_bytes`` (activations and XLA's scratch;
parameters are arguments and their gradients outputs, so they are not in it), the traced
FLOPs of the gradient (scans times their trip counts; ``compiled.cost_analysis`` counts a
loop body once), the extra FLOPs over ``none`` in block forwards, and sqrt's plan (k, b, i,
the modelled bytes). Also the fitted exponent of memory in depth over the depths where
k >= 2. Writes bench/results/sqrt_depth/DATE-COMMIT.json (or --out).

    python bench/investigations/sqrt_depth.py [--depths 8,16,...] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxoff.models.gpt import GPTConfig
from jaxoff.nn import Stack, recorded_segments, with_stack
from jaxoff.plan import jaxpr_flops
from jaxoff.step import make_loss_fn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the result writer
from _common.results import write_result  # noqa: E402

B, T, D, H = 4, 32, 32, 2
DEPTHS = (8, 16, 32, 64, 87, 88, 96, 128, 256, 512, 1024, 2048)
STACKS = {
    "none": Stack(),
    "full": Stack(policy="nothing_saveable"),
    "sqrt": Stack(policy="nothing_saveable", remat_every="auto"),  # apply_policy(cfg, "sqrt")
}


def block_forward_flops() -> float:
    model = nnx.eval_shape(lambda: GPTConfig(1, D, H, 4 * D, max_seq_len=T).build(nnx.Rngs(0)))
    graphdef, state = nnx.split(model.blocks)
    layer = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), state)
    h = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
    return jaxpr_flops(jax.make_jaxpr(lambda s, h: nnx.merge(graphdef, s)(h))(layer, h))


def measure(layers: int, name: str) -> dict:
    cfg = with_stack(GPTConfig(layers, D, H, 4 * D, max_seq_len=T), **vars_of(STACKS[name]))
    model = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
    graphdef, params = nnx.split(model, nnx.Param)
    tok = jax.ShapeDtypeStruct((B, T), jnp.int32)
    grad = jax.value_and_grad(make_loss_fn(graphdef))
    t0 = time.perf_counter()
    with recorded_segments() as plans:
        compiled = jax.jit(grad).lower(params, tok, tok).compile()
    compile_s = time.perf_counter() - t0
    row = {
        "layers": layers,
        "policy": name,
        "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
        "flops": jaxpr_flops(jax.make_jaxpr(grad)(params, tok, tok)),
        "compile_s": round(compile_s, 2),
    }
    if plans:
        p = plans[0]
        row["plan"] = {
            "size": p.size,
            "lengths": list(p.lengths),
            "boundary_bytes": p.boundary_bytes,
            "interior_bytes": p.interior_bytes,
            "modelled_bytes": p.memory(),
            "modelled_bytes_per_block_remat": p.memory(1),
            "recomputed_layers": p.recomputed_layers,
            "pays_from_layers": p.pays_from(),
        }
    return row


def vars_of(stack: Stack) -> dict:
    return {"policy": stack.policy, "remat_every": stack.remat_every}


def exponent(rows: list[dict], name: str, depths: list[int]) -> float:
    mem = [
        next(r["temp_bytes"] for r in rows if r["policy"] == name and r["layers"] == n)
        for n in depths
    ]
    return float(np.polyfit(np.log(depths), np.log(mem), 1)[0])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    p.add_argument("--out", default=None, help="default: bench/results/sqrt_depth/DATE-COMMIT.json")
    a = p.parse_args(argv)
    depths = [int(n) for n in a.depths.split(",")]
    fwd = block_forward_flops()
    rows = []
    for layers in depths:
        by = {name: measure(layers, name) for name in STACKS}
        for r in by.values():
            r["extra_block_forwards"] = (r["flops"] - by["none"]["flops"]) / fwd
            r["temp_vs_full"] = r["temp_bytes"] / by["full"]["temp_bytes"]
            rows.append(r)
        s, mib = by["sqrt"], {n: r["temp_bytes"] / 2**20 for n, r in by.items()}
        print(
            f"L={layers:5d}  k={s['plan']['size']}  temp MiB: none {mib['none']:8.2f}"
            f"  full {mib['full']:6.2f}  sqrt {mib['sqrt']:6.2f} ({s['temp_vs_full']:.2f} of full)"
            f"  extra block forwards: full {by['full']['extra_block_forwards']:.1f}"
            f"  sqrt {s['extra_block_forwards']:.1f} ({s['plan']['recomputed_layers']} recomputed)",
            flush=True,
        )
    segmented = [r["layers"] for r in rows if r["policy"] == "sqrt" and r["plan"]["size"] >= 2]
    beats = [r["layers"] for r in rows if r["policy"] == "sqrt" and r["temp_vs_full"] < 1]
    summary = {
        "block_forward_flops": fwd,
        "pays_from_layers": rows[-1]["plan"]["pays_from_layers"] if rows[-1].get("plan") else None,
        "first_depth_with_segments": min(segmented, default=None),
        "first_depth_sqrt_below_full": min(beats, default=None),
        "exponent_depths": segmented,
    }
    if len(segmented) >= 2:
        summary["sqrt_exponent"] = exponent(rows, "sqrt", segmented)
        summary["full_exponent"] = exponent(rows, "full", segmented)
        summary["none_exponent"] = exponent(rows, "none", segmented)
    meta = {
        "command": "python bench/investigations/sqrt_depth.py"
        + (f" --depths {a.depths}" if argv else ""),
        "model": {"d_model": D, "num_heads": H, "d_ff": 4 * D, "batch": B, "seq": T},
        "measures": "loss gradient of the whole GPT (embeddings, blocks, head), compiled only",
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "machine": platform.machine(),
    }
    out = write_result(
        "sqrt_depth", args=vars(a), summary=summary, records=rows, path=a.out, meta=meta
    )
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
