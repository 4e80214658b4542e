"""How equal is jaxoff.paged to plain optax? The noise floor, and paged training within it.

Plain optax is not bitwise stable under a change of program: the same update compiled for a
whole tree or leaf by leaf, or with the gradient and the update in one jit or in two, rounds
the last bit differently (XLA contracts multiply-adds to FMA per fused program), and Adam's
``m / sqrt(v)`` amplifies those bits over training. This measures that floor on a small MLP
trained for ``--steps`` steps, then the distance of paged training from the user's own
jitted whole-tree step, as ratios to the floor:

  plain        the user's step: grad + optax update + apply_updates in one jit (the baseline)
  plain-split  plain optax, gradient and update in two jits           (noise floor)
  plain-leaf   plain optax, one jitted update per leaf (the reference of the bitwise tests)
  paged        jaxoff.paged, update_and_apply in the user's step
  paged-optax  jaxoff.paged through tx.update + optax.apply_updates

Distances to ``plain``: max |p - p_plain|, relative L2 ||p - p_plain|| / ||p_plain||, and the
largest relative difference of the loss curves. Writes
bench/results/equivalence/DATE-COMMIT.json (or --out).

    python bench/equivalence.py [--steps 300]

``distributed``: how far two processes' training (``jaxoff train --fsdp 4``, 4 XLA CPU
devices) is from one process's and from optax in RAM, the figures behind the tolerances of
``tests/test_distributed.py`` (``_equivalence/distributed.py``); writes
bench/results/distributed_equivalence/ (with --json)::

    python bench/equivalence.py distributed --json bench/results/distributed_equivalence/NAME.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxoff.optim import paged, update_and_apply

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the result writer
from _common.results import write_result  # noqa: E402

SIZES = (64, 256, 256, 10)


def init_params(seed=0):
    keys = jax.random.split(jax.random.key(seed), len(SIZES))
    return {
        f"l{i}": {"w": jax.random.normal(keys[i], (a, b)) / np.sqrt(a), "b": jnp.zeros(b)}
        for i, (a, b) in enumerate(zip(SIZES, SIZES[1:], strict=False))
    }


def loss_fn(params, x, y):
    h = x
    for i in range(len(SIZES) - 1):
        h = h @ params[f"l{i}"]["w"] + params[f"l{i}"]["b"]
        if i < len(SIZES) - 2:
            h = jnp.tanh(h)
    return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()


def batches(steps, n=64):
    # A fixed random teacher: the labels are learnable, the loss falls over the run.
    teacher = jax.random.normal(jax.random.key(7), (SIZES[0], SIZES[-1]))
    out = []
    for t in range(steps):
        x = jax.random.normal(jax.random.key(1000 + t), (n, SIZES[0]))
        out.append((x, jnp.argmax(x @ teacher, -1)))
    return out


def make_tx(steps):
    lr = optax.warmup_cosine_decay_schedule(0.0, 3e-3, steps // 10, steps, end_value=3e-4)
    return optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1)
    )


def run_plain(tx, data):
    @jax.jit
    def step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    return _loop(step, init_params(), tx.init(init_params()), data)


def run_split(tx, data):
    grad = jax.jit(jax.value_and_grad(loss_fn))

    @jax.jit
    def update(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    def step(p, s, x, y):
        loss, g = grad(p, x, y)
        return (*update(p, s, g), loss)

    return _loop(step, init_params(), tx.init(init_params()), data)


def run_leaf(clip, inner, data):
    """Global clipping on the whole tree, then one jitted optax update per leaf."""
    p = init_params()
    leaves, treedef = jax.tree.flatten(p)
    states = [inner.init({"x": x}) for x in leaves]
    clip_state = clip.init(p)

    @jax.jit
    def grad(p, x, y, cs):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        g, cs = clip.update(g, cs, p)
        return loss, g, cs

    @jax.jit
    def leaf_step(g, s, x):
        u, s = inner.update({"x": g}, s, {"x": x})
        return optax.apply_updates({"x": x}, u)["x"], s

    losses = []
    for x, y in data:
        loss, g, clip_state = grad(jax.tree.unflatten(treedef, leaves), x, y, clip_state)
        for i, gi in enumerate(jax.tree.leaves(g)):
            leaves[i], states[i] = leaf_step(gi, states[i], leaves[i])
        losses.append(loss)
    return jax.tree.unflatten(treedef, leaves), np.asarray(losses, np.float64)


def run_paged(tx, data, fused):
    @jax.jit
    def step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        if fused:
            p, s = update_and_apply(tx, g, s, p)
        else:
            u, s = tx.update(g, s, p)
            p = optax.apply_updates(p, u)
        return p, s, loss

    out = _loop(step, init_params(), tx.init(init_params()), data)
    tx.close()
    return out


def _loop(step, p, s, data):
    losses = []
    for x, y in data:
        p, s, loss = step(p, s, x, y)
        losses.append(loss)
    return p, np.asarray(losses, np.float64)


def distances(run, base) -> dict:
    (p, lp), (q, lq) = run, base
    a = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(p)])
    b = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(q)])
    return {
        "param_max_abs": float(np.max(np.abs(a - b))),
        "param_rel_l2": float(np.linalg.norm(a - b) / np.linalg.norm(b)),
        "loss_max_rel": float(np.max(np.abs(lp - lq) / np.abs(lq))),
        "params_bitwise_equal": bool(a.tobytes() == b.tobytes()),
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["distributed"]:
        from _equivalence import distributed

        distributed.cli(argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument(
        "--out", default=None, help="default: bench/results/equivalence/DATE-COMMIT.json"
    )
    args = ap.parse_args(argv)
    data = batches(args.steps)
    t0 = time.perf_counter()
    runs = {
        "plain": run_plain(make_tx(args.steps), data),
        "plain-split": run_split(make_tx(args.steps), data),
    }
    clip = optax.clip_by_global_norm(1.0)
    inner = optax.adamw(
        optax.warmup_cosine_decay_schedule(0.0, 3e-3, args.steps // 10, args.steps, end_value=3e-4),
        b1=0.9,
        b2=0.95,
        weight_decay=0.1,
    )
    runs["plain-leaf"] = run_leaf(clip, inner, data)
    with tempfile.TemporaryDirectory() as d:
        for name, fused in (("paged", True), ("paged-optax", False)):
            tx = paged(make_tx(args.steps), os.path.join(d, name), chunk_bytes=64 << 10)
            runs[name] = run_paged(tx, data, fused)
    base = runs["plain"]
    dist = {k: distances(v, base) for k, v in runs.items() if k != "plain"}
    floor = {
        m: max(dist["plain-split"][m], dist["plain-leaf"][m])
        for m in ("param_max_abs", "param_rel_l2", "loss_max_rel")
    }
    ratios = {
        k: {m: (dist[k][m] / floor[m] if floor[m] else None) for m in floor}
        for k in ("paged", "paged-optax")
    }
    result = {
        "model": f"MLP {SIZES}, {sum(x.size for x in jax.tree.leaves(init_params()))} "
        "parameters, float32",
        "optimizer": "chain(clip_by_global_norm(1.0), adamw(warmup-cosine 3e-3, b2=0.95, wd=0.1))",
        "steps": args.steps,
        "baseline": "plain: the user's step (grad + update + apply_updates in one jit)",
        "distances_to_plain": dist,
        "noise_floor": floor,
        "ratio_to_floor": ratios,
        "paged_bitwise_equal_to_plain_leaf": distances(runs["paged"], runs["plain-leaf"])[
            "params_bitwise_equal"
        ],
        "final_loss": {k: float(v[1][-1]) for k, v in runs.items()},
        "first_loss": float(base[1][0]),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    out = write_result("equivalence", args=vars(args), path=args.out, **result)
    print(
        f"{args.steps} steps, loss {result['first_loss']:.4f} -> "
        f"{result['final_loss']['plain']:.4f} (plain)"
    )
    print(f"{'run':<12} {'max|dp|':>10} {'rel L2':>10} {'loss rel':>10}  ratio to floor")
    for k, d in dist.items():
        r = ratios.get(k)
        rs = (
            "  " + " / ".join(f"{x:.2f}" if x is not None else "-" for x in r.values())
            if r
            else "  (floor)"
        )
        print(
            f"{k:<12} {d['param_max_abs']:10.3g} {d['param_rel_l2']:10.3g} "
            f"{d['loss_max_rel']:10.3g}{rs}"
        )
    print(f"paged bitwise equal to plain-leaf: {result['paged_bitwise_equal_to_plain_leaf']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
