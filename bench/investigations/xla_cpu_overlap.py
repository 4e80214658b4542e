"""Does XLA's CPU runtime run two independent computations of one program at the same time?

Fuyou's step puts layer j + 1's update beside layer j's backward matmuls with no data path
between them, so that a runtime able to run independent work concurrently overlaps them. This
measures, on this machine's JAX, two independent computations, each alone and both in one
jitted program, in two shapes:

* **flat**: a chain of 6 matmuls + tanh (64 x 512 by 512 x 512) and an element-wise chain of
  6 AdamW-like updates over 2 M float32 elements, side by side;
* **scan**: the same two inside one ``lax.scan`` body over 8 layers, as in Fuyou's backward.

It prints each time (median of ``--reps``), the CPU time of the process over the same calls,
and ``both / (a + b)``: 1.0 means the two ran one after the other, ``max(a, b) / (a + b)``
that they overlapped fully.

    python bench/investigations/xla_cpu_overlap.py --json bench/results/xla_cpu_overlap/NAME.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the result writer
from _common.results import write_result  # noqa: E402

N, LAYERS, ELEMS, CHAIN = 512, 8, 2_000_000, 6


def _matmuls(x, w):
    for _ in range(CHAIN):
        x = jnp.tanh(x @ w)
    return x


def _update(m, g):
    for _ in range(CHAIN):
        m = m * 0.9 + 0.1 * g * g + jnp.sqrt(m + 1e-8)
    return m


def _time(fn, args, reps: int) -> tuple[float, float]:
    jax.block_until_ready(fn(*args))  # compile
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(*args))
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    x = jnp.ones((64, N), jnp.float32)
    w = jnp.full((LAYERS, N, N), 1e-3, jnp.float32)
    m = jnp.ones((LAYERS, ELEMS), jnp.float32)
    g = jnp.full((LAYERS, ELEMS), 0.5, jnp.float32)

    def scan_mm(x, w):
        return jax.lax.scan(lambda c, wl: (_matmuls(c, wl), None), x, w)[0]

    def scan_up(m, g):
        return jax.lax.scan(lambda c, mg: (c, _update(*mg)), 0, (m, g))[1]

    def scan_both(x, w, m, g):
        return jax.lax.scan(lambda c, t: (_matmuls(c, t[0]), _update(t[1], t[2])), x, (w, m, g))

    cases = {
        "flat": (
            (jax.jit(lambda x, w: _matmuls(x, w[0])), (x, w)),
            (jax.jit(lambda m, g: _update(m[0], g[0])), (m, g)),
            (jax.jit(lambda x, w, m, g: (_matmuls(x, w[0]), _update(m[0], g[0]))), (x, w, m, g)),
        ),
        "scan": (
            (jax.jit(scan_mm), (x, w)),
            (jax.jit(scan_up), (m, g)),
            (jax.jit(scan_both), (x, w, m, g)),
        ),
    }
    results = {}
    for name, fns in cases.items():
        (ta, ca), (tb, cb), (tab, cab) = (_time(f, v, a.reps) for f, v in fns)
        results[name] = {
            "matmuls_s": ta, "update_s": tb, "both_s": tab,
            "matmuls_cpu_s": ca, "update_cpu_s": cb, "both_cpu_s": cab,
            "both_over_sum": tab / (ta + tb), "max_over_sum": max(ta, tb) / (ta + tb),
        }  # fmt: skip
        print(
            f"{name}: matmuls {ta * 1e3:.1f} ms ({ca / ta:.2f} cores), update {tb * 1e3:.1f} ms "
            f"({cb / tb:.2f} cores), both {tab * 1e3:.1f} ms ({cab / tab:.2f} cores); "
            f"both / (a + b) = {tab / (ta + tb):.3f} (full overlap: {max(ta, tb) / (ta + tb):.3f})"
        )
    if a.json:
        out = write_result("xla_cpu_overlap", args=vars(a), records=results, path=a.json)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
