"""Optimizer update throughput (params/s): paged AdamW vs jitted optax AdamW, same run.

    python bench/investigations/update_throughput.py --params 50_000_000 --steps 5

fp32 parameters (the params are the master); the paged state is read from and written to the
page store with O_DIRECT, so this measures the disk-bound update. Medians of --steps steps.
"""

import argparse
import shutil
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import optax

from jaxoff.optim import DEFAULT_ENGINE, paged, update_and_apply


def timed(fn, args, steps):
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        args = fn(*args)
        jax.block_until_ready(args)
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:] if len(times) > 2 else times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=50_000_000)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--chunk-mib", type=int, default=16)
    ap.add_argument(
        "--no-split",
        action="store_true",
        help="page_in/page_out pipeline (staging too small for split-phase paging)",
    )
    a = ap.parse_args()
    n = a.params // 4
    params = {f"w{i}": jnp.full((n,), 0.1 * (i + 1), jnp.float32) for i in range(4)}
    grads = {k: jnp.full((n,), 1e-3, jnp.float32) for k in params}
    ref = optax.adamw(1e-3)

    @jax.jit
    def plain(p, s):
        u, s = ref.update(grads, s, p)
        return optax.apply_updates(p, u), s

    t_plain = timed(plain, (params, ref.init(params)), a.steps)
    root = tempfile.mkdtemp(dir="/tmp")
    try:
        engine = DEFAULT_ENGINE if a.no_split else None
        tx = paged(optax.adamw(1e-3), root + "/s", chunk_bytes=a.chunk_mib << 20, engine=engine)
        state = tx.init(params)
        step = jax.jit(lambda p, s: update_and_apply(tx, grads, s, p))
        t_paged = timed(step, (params, state), a.steps)
        tx.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = 4 * n
    print(
        f"params {total:,}  plain optax adamw {t_plain:.3f} s ({total / t_plain / 1e6:.0f} M/s)"
        f"  paged adamw {t_paged:.3f} s ({total / t_paged / 1e6:.0f} M/s)"
        f"  paged/plain {t_paged / t_plain:.2f}x  disk {16 * total / t_paged / 2**30:.2f} GiB/s"
    )


if __name__ == "__main__":
    main()
