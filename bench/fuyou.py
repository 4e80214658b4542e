"""Step time of fuyou (paged update inside the backward scan) vs the sequential paged step.

Same model (default ``mini``, nothing_saveable), same paged AdamW, same batch; medians of
``--reps`` steps after warm-up; prints the ratio fuyou / sequential (< 1: fuyou is faster).

    python bench/fuyou.py --model small --batch 2 --seq 128 --reps 5
"""

import argparse
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxoff.models.gpt import CONFIGS
from jaxoff.nn import with_stack
from jaxoff.optim import paged
from jaxoff.step import TrainState, make_train_step
from jaxoff.strategies._fuyou import fuyou_init, make_fuyou_step


def timed(step, state, inputs, targets, reps):
    for _ in range(2):
        state, m = step(state, inputs, targets)
    jax.block_until_ready(m)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        state, m = step(state, inputs, targets)
        jax.block_until_ready((state, m))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), state


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mini")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunk-mib", type=int, default=4)
    a = ap.parse_args()
    cfg = with_stack(CONFIGS[a.model], policy="nothing_saveable")
    x = jax.random.randint(jax.random.key(0), (a.batch, a.seq + 1), 0, 256)
    inputs, targets = x[:, :-1], x[:, 1:]
    root = tempfile.mkdtemp(prefix="fuyou_bench_")
    out = {}
    for name in ("sequential", "fuyou"):
        graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
        tx = paged(optax.adamw(1e-4), f"{root}/{name}", chunk_bytes=a.chunk_mib << 20)
        if name == "fuyou":
            opt, fn = fuyou_init(cfg, tx, params), make_fuyou_step(graphdef, cfg, tx)
        else:
            opt, fn = tx.init(params), make_train_step(graphdef, tx)
        state = TrainState(jnp.zeros((), jnp.int32), params, opt)
        out[name], state = timed(jax.jit(fn, donate_argnums=0), state, inputs, targets, a.reps)
        tx.close()
        print(f"{name:>10}: median {out[name] * 1e3:.1f} ms/step")
    print(f"fuyou / sequential = {out['fuyou'] / out['sequential']:.3f}")


if __name__ == "__main__":
    main()
