"""The element-wise probe: a whole-tree update must equal a chunked, permuted one.

On a small tree shaped like the parameters (same structure and ranks), two steps of the inner
transformation are run once on whole leaves and once the way the pipeline runs them (each leaf
permuted, cut into two chunks, every chunk updated with the other leaves empty). Gradients are
large so that any clipping triggers. An optimizer that takes norms, means or dot products over
a leaf or over all leaves, or that depends on positions, gives different results.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxoff.optim import _chunk
from jaxoff.optim._checks import NotElementwiseError
from jaxoff.optim._plan import Plan, make_plan

_STEPS = 2


def _small_shape(shape) -> tuple[int, ...]:
    return (2,) * (len(shape) - 1) + (5,) if shape else ()


def probe_elementwise(inner: optax.GradientTransformation, plan: Plan, master_dtype) -> None:
    """Raises `NotElementwiseError` if ``inner`` is not element-wise on this parameter tree."""
    rng = np.random.default_rng(0)
    shapes = [_small_shape(leaf.shape) for leaf in plan.leaves]
    params = [rng.standard_normal(s).astype(master_dtype) for s in shapes]
    grads = [
        [(30 * rng.standard_normal(s)).astype(master_dtype) for s in shapes] for _ in range(_STEPS)
    ]
    perms = [rng.permutation(int(np.prod(s))) for s in shapes]
    tree = jax.tree.unflatten(plan.params_def, params)
    # 3-element chunks; the RAM state is not written to a store here
    small = make_plan(None, inner, tree, 4 * 3, master_dtype, check_ram=False)
    small = dataclasses.replace(small, one_leaf=plan.one_leaf)  # the trees the step traces
    labels = []

    def run(p, g):
        whole, chunked = _run_both(inner, small, master_dtype, p, g, perms)
        labels.extend(w for w, _ in whole)
        return [x for _, x in whole], [x for _, x in chunked]

    # compiled ahead of time and called on concrete arrays: the probe runs, as one program, even
    # when the optimizer's init is itself being traced (under jit or eval_shape)
    whole, chunked = jax.jit(run).lower(params, grads).compile()(params, grads)
    for what, a, b in zip(labels, whole, chunked, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True):
            raise NotElementwiseError(
                "jaxoff.paged cannot page this transformation: it is not element-wise (its "
                f"{what} differs when a small tree is updated whole or one chunk at a time, "
                f"max difference {np.max(np.abs(a - b)) if a.shape == b.shape else 'shape'}), "
                "so it mixes elements of a leaf or of several leaves. Run global operations "
                "such as clip_by_global_norm before jaxoff.paged, or keep this optimizer in RAM"
            )


def _run_both(inner, plan: Plan, master_dtype, params, grads, perms):
    params_def = plan.params_def
    # Whole tree, plain optax.
    p = jax.tree.unflatten(params_def, params)
    state = inner.init(p)
    whole = []
    for g in grads:
        u, state = inner.update(jax.tree.unflatten(params_def, g), state, p)
        p = optax.apply_updates(p, u)
        whole.append(("updates", jnp.concatenate([x.reshape(-1) for x in jax.tree.leaves(u)])))
    ram_w, _ = _chunk.split_state(plan, state, -1)
    whole += [("step counters", x) for x in ram_w]
    for j in range(len(plan.leaves)):
        _, chunks = _chunk.split_state(plan, state, j)
        whole += [(f"state of leaf {j}", c.reshape(-1)) for c in chunks]
    # Permuted leaves, two chunks each, through the pipeline's chunk functions.
    flat = [x.reshape(-1)[perm] for x, perm in zip(params, perms, strict=True)]
    cuts = [(0, (x.shape[0] + 1) // 2, x.shape[0]) for x in flat]
    ram = _chunk.ram_init(plan, inner, master_dtype)
    states = []
    for j, (x, cut) in enumerate(zip(flat, cuts, strict=True)):
        parts = [
            _chunk.chunk_init(plan, inner, master_dtype, j, x[a:b])
            for a, b in zip(cut, cut[1:], strict=False)
            if b > a
        ]
        states.append(
            [jnp.concatenate(cs) for cs in zip(*parts, strict=True)] if parts and parts[0] else []
        )

    updaters = [_chunk.traced_once(plan, inner, master_dtype, j) for j in range(len(flat))]
    chunked = []
    for g in grads:
        new_ram = _chunk.ram_update(plan, inner, master_dtype, ram, {})
        us = []
        for j, (x, cut, perm) in enumerate(zip(flat, cuts, perms, strict=True)):
            gj = g[j].reshape(-1)[perm]
            u_parts, s_parts = [], []
            for a, b in zip(cut, cut[1:], strict=False):
                if b == a:
                    continue
                u, ns = updaters[j](gj[a:b], x[a:b], [s[a:b] for s in states[j]], ram)
                u_parts.append(u)
                s_parts.append(ns)
            u = jnp.concatenate(u_parts)
            flat[j] = optax.apply_updates(x, u)
            states[j] = (
                [jnp.concatenate(cs) for cs in zip(*s_parts, strict=True)] if states[j] else []
            )
            us.append(u[np.argsort(perm)])
        ram = new_ram
        chunked.append(("updates", jnp.concatenate(us)))
    chunked += [("step counters", x) for x in ram]
    for j, perm in enumerate(perms):
        inv = np.argsort(perm)
        chunked += [(f"state of leaf {j}", s[inv]) for s in states[j]]
    return whole, chunked
