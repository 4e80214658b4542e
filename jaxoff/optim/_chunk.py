"""The optimizer applied to one chunk of one parameter leaf.

The inner optax transformation is called with trees shaped like the user's parameters (so
masks and per-leaf hyper-parameters keep working) in which leaf ``j`` is the chunk, reshaped to
keep the leaf's rank, and every other leaf is ``optax.MaskedNode()``: tracing a chunk update
costs one leaf, whatever the model's size. A per-parameter state subtree keeps its
``optax.MaskedNode`` leaves (``optax.masked``, ``optax.multi_transform``): the chunk functions
pass and return chunks only for the state tensors that leaf ``j`` has.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import numpy as np
import optax
from jax import lax

from jaxoff.optim._plan import Plan

log = logging.getLogger("jaxoff.optim")


def _zeros(shape: tuple[int, ...], dtype) -> jax.Array:
    """``jnp.zeros(shape, dtype)``: the same equation in a trace, cheaper to trace; these
    trees are built for every leaf in every traced chunk update."""
    return lax.broadcast_in_dim(np.zeros((), dtype), shape, ())


def _tree_with(plan: Plan, j: int, x: Any, dtypes) -> Any:
    if j >= 0 and plan.one_leaf:
        return _tree_of_one(plan, j, None if dtypes[j] is None else x)
    # Other leaves are one-element arrays rather than empty ones: XLA deletes arithmetic on
    # empty arrays, and then simplifies the step-count scalars (bias corrections) differently
    # than in a plain optax update of a many-leaf tree, changing the last bit of the result.
    shape = (lambda leaf: leaf.empty_shape()) if j < 0 else (lambda leaf: leaf.one_shape())
    leaves = [
        optax.MaskedNode() if dtypes[i] is None else x if i == j else _zeros(shape(leaf), dtypes[i])
        for i, leaf in enumerate(plan.leaves)
    ]
    return jax.tree.unflatten(plan.params_def, leaves)


def _tree_of_one(plan: Plan, j: int, x: Any) -> Any:
    """The parameters' tree with ``x`` at leaf ``j`` and ``optax.MaskedNode()`` elsewhere: masks
    and labels (prefix trees or callables) still meet leaf ``j`` where the user put it, and the
    other leaves hold no arithmetic, so tracing a chunk update costs one leaf, not the model
    (with arrays there, every leaf's chunk update traced every leaf: the step's trace grew
    with the square of the leaf count)."""
    leaves = [optax.MaskedNode()] * len(plan.leaves)
    if x is not None:
        leaves[j] = x
    return jax.tree.unflatten(plan.params_def, leaves)


def inner_state(plan: Plan, ram_inner, j: int, chunks) -> Any:
    """The inner optimizer state whose per-parameter tensors are chunks of leaf ``j``.

    ``chunks``: one per paged subtree that leaf ``j`` has (not masked out), in order.
    """
    nodes, it = [], iter(chunks if j >= 0 else ())
    for kind, k in plan.nodes:
        if kind == "ram":
            nodes.append(ram_inner[k])
        else:
            dts = plan.node_dtypes[k]
            x = next(it) if j >= 0 and dts[j] is not None else None
            nodes.append(_tree_with(plan, j, x, dts))
    return jax.tree.unflatten(plan.state_def, nodes)


def split_state(plan: Plan, state: Any, j: int) -> tuple[list, list]:
    """``(RAM leaves, chunks of leaf j per paged subtree)`` of an inner state."""
    ram, chunks = [], []
    for (kind, k), node in zip(plan.nodes, plan.state_def.flatten_up_to(state), strict=True):
        if kind == "ram":
            ram.append(node)
        elif j >= 0 and plan.node_dtypes[k][j] is not None:
            chunks.append(plan.params_def.flatten_up_to(node)[j])
    return ram, chunks


def _inner_dtypes(plan: Plan, master_dtype) -> list:
    return [np.dtype(master_dtype) if leaf.master else leaf.dtype for leaf in plan.leaves]


def chunk_update(
    plan: Plan, inner, master_dtype, j: int, g, p, chunks, ram_inner, *, extra: dict
) -> tuple[jax.Array, list]:
    """Runs the inner update on chunk ``g``/``p`` (flat) of leaf ``j``.

    Args:
      chunks: per paged state subtree, the chunk (flat, in the state's dtype).
    Returns:
      ``(updates chunk (flat), new state chunks (flat))``.
    """
    leaf = plan.leaves[j]
    shape = leaf.chunk_shape(g.shape[0] if g.ndim else 1)
    dts = _inner_dtypes(plan, master_dtype)
    gt = _tree_with(plan, j, g.astype(dts[j]).reshape(shape), dts)
    pt = _tree_with(plan, j, p.reshape(shape), dts)
    st = inner_state(plan, ram_inner, j, [c.reshape(shape) for c in chunks])
    u, new_state = inner.update(gt, st, pt, **extra)
    u = plan.params_def.flatten_up_to(u)[j].reshape(-1)
    _, new_chunks = split_state(plan, new_state, j)
    return u, [c.reshape(-1) for c in new_chunks]


def traced_once(plan: Plan, inner, master_dtype, j: int):
    """`chunk_update` of leaf ``j`` (no extra arguments) as a ``jax.jit``: called inside a
    traced step, chunks of the same shape reuse one trace, and XLA inlines it (the step's
    program is unchanged)."""
    return jax.jit(
        lambda g, p, states, ram: chunk_update(
            plan, inner, master_dtype, j, g, p, states, ram, extra={}
        )
    )


def ram_update(plan: Plan, inner, master_dtype, ram_inner, extra: dict) -> list:
    """The inner state's new RAM leaves (step counts, ...), from an update on empty leaves."""
    dts = _inner_dtypes(plan, master_dtype)
    empty = _tree_with(plan, -1, None, dts)
    _, new_state = inner.update(empty, inner_state(plan, ram_inner, -1, None), empty, **extra)
    return split_state(plan, new_state, -1)[0]


def chunk_init(plan: Plan, inner, master_dtype, j: int, p) -> list:
    """Initial state chunks (flat) of leaf ``j`` for the master/parameter chunk ``p`` (flat)."""
    leaf = plan.leaves[j]
    dts = _inner_dtypes(plan, master_dtype)
    state = inner.init(_tree_with(plan, j, p.reshape(leaf.chunk_shape(p.shape[0])), dts))
    return [c.reshape(-1) for c in split_state(plan, state, j)[1]]


def ram_init(plan: Plan, inner, master_dtype) -> list:
    dts = _inner_dtypes(plan, master_dtype)
    return split_state(plan, inner.init(_tree_with(plan, -1, None, dts)), -1)[0]


def one_leaf_plan(plan: Plan, inner, master_dtype) -> Plan:
    """``plan``, or a copy whose chunk updates put one-element arrays at the other leaves
    (``one_leaf=False``) where ``inner`` cannot take trees holding one leaf: a mask or label
    function that reads every leaf's value (``v.ndim`` over a flattened dict, not through
    ``jax.tree.map``) meets ``optax.MaskedNode()`` there. Checked once, abstractly, on the
    first leaf's init and update; the step's trace then grows with the square of the leaf
    count, which is logged with the way out."""
    if not plan.one_leaf or not plan.leaves:
        return plan
    wide = dataclasses.replace(plan, one_leaf=False)
    error = _first_leaf_error(plan, inner, master_dtype)
    if error is None or _first_leaf_error(wide, inner, master_dtype) is not None:
        return plan  # fine, or fails either way (the real call reports it, with its arguments)
    log.warning(
        "jaxoff.paged: the optimizer cannot be traced on a tree holding one parameter leaf "
        "(the others optax.MaskedNode()): %s: %s. Its chunk updates are traced on trees as "
        "wide as the parameters instead, so the step's trace grows with the square of the "
        "number of leaves (%d). Write mask and label functions with jax.tree.map (or "
        "jax.tree_util.tree_map_with_path) to trace one leaf at a time",
        type(error).__name__,
        error,
        len(plan.leaves),
    )
    return wide


def _first_leaf_error(plan: Plan, inner, master_dtype) -> Exception | None:
    dts = _inner_dtypes(plan, master_dtype)
    chunks = [
        jax.ShapeDtypeStruct((1,), plan.node_dtypes[k][0])
        for kind, k in plan.nodes
        if kind == "paged" and plan.node_dtypes[k][0] is not None
    ]
    x = jax.ShapeDtypeStruct((1,), dts[0])
    ram = list(plan.ram_avals[plan.num_pre :])
    try:
        jax.eval_shape(lambda p: chunk_init(plan, inner, master_dtype, 0, p), x)
        jax.eval_shape(
            lambda g, p, c, r: chunk_update(plan, inner, master_dtype, 0, g, p, c, r, extra={}),
            x,
            x,
            chunks,
            ram,
        )
    except Exception as e:  # whatever the user's function raises
        return e
    return None
