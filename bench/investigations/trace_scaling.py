"""How the paged optimizer's start-up grows with the number of parameter leaves.

A model of ``L`` unstacked layers (6 leaves each: two 64 x 64 matrices, four vectors) is paged
with AdamW (4 KiB chunks); each size runs in a child process of its own, with and without the
element-wise probe, and reports ``tx.init`` (the probe, the chunk inits, the first store
write), the jitted step's trace and lowering, and XLA's compile, with each size's ratio to the
first (the leaf count's ratio is linear growth). Each chunk update is traced once per leaf and
chunk shape on a tree that holds that leaf alone (the other leaves are ``optax.MaskedNode``).

    python bench/investigations/trace_scaling.py --layers 4,8,16,32 \
      --json bench/results/trace_scaling/NAME.json

``--label`` names the code measured in the JSON (e.g. a commit, to compare two versions run
one after the other on the same machine).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the result writer
from _common.results import write_result  # noqa: E402


def _child(layers: int, probe: bool) -> None:
    import jax
    import jax.numpy as jnp
    import optax

    from jaxoff.optim import paged, update_and_apply

    def layer():  # six distinct buffers (the step donates them)
        mats = {k: jnp.full((64, 64), 0.01) for k in ("w1", "w2")}
        vecs = {k: jnp.full((64,), float(k == "ln")) for k in ("b1", "b2", "ln", "lnb")}
        return mats | vecs

    params = {f"layer{i}": layer() for i in range(layers)}
    with tempfile.TemporaryDirectory() as d:
        tx = paged(optax.adamw(1e-3), d + "/store", chunk_bytes=4096, probe=probe)
        t = time.perf_counter()
        opt = tx.init(params)
        init_s = time.perf_counter() - t

        def loss(p, x):
            for i in range(layers):
                q = p[f"layer{i}"]
                x = jnp.tanh(x @ q["w1"] + q["b1"]) @ q["w2"] + q["b2"]
                x = x * q["ln"] + q["lnb"]
            return jnp.mean(x**2)

        def step(p, o, x):
            return update_and_apply(tx, jax.grad(loss)(p, x), o, p)

        x = jnp.ones((8, 64))
        t = time.perf_counter()
        lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt, x)
        trace_s = time.perf_counter() - t
        t = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - t
        p2, o2 = compiled(params, opt, x)
        jax.block_until_ready(p2)
        tx.pager.close()
    leaves = len(jax.tree.leaves(params))
    rec = {"layers": layers, "leaves": leaves, "probe": probe, "init_s": init_s}
    rec.update(trace_lower_s=trace_s, compile_s=compile_s)
    print(json.dumps(rec))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="4,8,16", help="comma-separated layer counts")
    ap.add_argument("--json", default=None)
    ap.add_argument("--label", default=None, help="names the code measured, in the JSON")
    ap.add_argument("--child", nargs=2, metavar=("LAYERS", "PROBE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(int(a.child[0]), a.child[1] == "1")
        return
    recs = []
    for layers in map(int, a.layers.split(",")):
        for probe in (True, False):
            cmd = [sys.executable, __file__, "--child", str(layers), "1" if probe else "0"]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rec = json.loads(out.splitlines()[-1])
            recs.append(rec)
            print(
                f"{rec['leaves']:4d} leaves, probe {'on ' if probe else 'off'}: init "
                f"{rec['init_s']:6.2f} s, trace {rec['trace_lower_s']:6.2f} s, "
                f"compile {rec['compile_s']:6.2f} s",
                flush=True,
            )
    first = {r["probe"]: r for r in recs[:2]}
    for r in recs[2:]:
        base = first[r["probe"]]
        x = r["leaves"] / base["leaves"]
        r["leaves_ratio"] = x
        r["init_ratio"] = r["init_s"] / base["init_s"]
        r["trace_ratio"] = r["trace_lower_s"] / base["trace_lower_s"]
        print(
            f"{r['leaves']} / {base['leaves']} leaves ({x:.0f}x), probe "
            f"{'on' if r['probe'] else 'off'}: init {r['init_ratio']:.1f}x, trace "
            f"{r['trace_ratio']:.1f}x (linear {x:.0f}x, quadratic {x * x:.0f}x)"
        )
    if a.json:
        out = write_result("trace_scaling", args=vars(a), records=recs, path=a.json, label=a.label)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
