"""Gradient accumulation: one optimizer step over ``n`` micro-batches, their gradients
summed in a ``lax.scan`` so that only one micro-batch's activations exist at a time.

Written once for every step that accumulates (the plain step, `make_train_step`, and the
FSDP step with a paged optimizer, ``jaxoff.distributed.ShardedPagedStep``): which rows form
each micro-batch (:func:`micro_batches`) and how their gradients and losses are summed
(:func:`accumulate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from ..placement import FSDP_AXIS, move


def micro_batches(tokens: jax.Array, n: int, mesh=None) -> jax.Array:
    """``tokens`` ``[n * B, S]`` as ``[n, B, S]``: micro-batch ``i`` holds rows ``i, i + n,
    i + 2n, ...`` (``[n * B, S]`` reshaped to ``[B, n, S]``, the two leading axes swapped).

    Row ``r`` goes to micro-batch ``r % n``, so the contiguous block of rows each device of
    an FSDP ``mesh`` holds splits into that device's rows of every micro-batch: the batch
    sharding stays local (no rows move between devices). On a ``mesh`` the result is
    constrained to that sharding (micro-batch axis whole, batch axis over the mesh).

    Example:
        >>> import jax.numpy as jnp
        >>> micro_batches(jnp.arange(6).reshape(6, 1), 3)[:, :, 0].tolist()
        [[0, 3], [1, 4], [2, 5]]
    """
    total = tokens.shape[0]
    if total % n:
        raise ValueError(f"a batch of {total} rows does not split into {n} micro-batches")
    split = tokens.reshape(total // n, n, *tokens.shape[1:]).swapaxes(0, 1)
    if mesh is None:
        return split

    spec = PartitionSpec(None, FSDP_AXIS, *([None] * (split.ndim - 2)))
    return lax.with_sharding_constraint(split, NamedSharding(mesh, spec))


GradFn = Callable[[Any, Any, jax.Array, jax.Array], tuple[tuple[jax.Array, Any], Any]]
"""``grad_fn(params, rest, inputs, targets) -> ((loss, rest), grads)``: one micro-batch's
loss and gradients, ``rest`` the model's state besides ``nnx.Param`` (None without)."""


def grad_fn_of(loss_fn, *, with_rest: bool) -> GradFn:
    """The :data:`GradFn` of ``loss_fn``: ``loss(params, rest, inputs, targets) -> (loss,
    rest)`` of a model with state besides ``nnx.Param`` (``with_rest``), else
    ``loss(params, inputs, targets)``, whose ``rest`` (None) passes through."""
    if with_rest:
        return jax.value_and_grad(loss_fn, has_aux=True)

    def grad_fn(params, rest, inputs, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets)
        return (loss, rest), grads

    return grad_fn


def accumulate(
    grad_fn: GradFn, n: int, params, rest, inputs: jax.Array, targets: jax.Array, mesh=None
):
    """``(loss, grads, rest)`` of one optimizer step over the ``n`` micro-batches of
    ``inputs``/``targets`` (:func:`micro_batches`), in a ``lax.scan``.

    ``grads`` is ``(g_1 + g_2 + ... + g_n) / n``: each micro-batch's gradients, computed
    as one step at that micro-batch computes them and materialised, added in order, in
    float32, to a float32 accumulator that starts at zero, the sum divided by
    ``n`` and cast back to the gradients' dtype (the parameters'). ``loss`` is
    ``(l_1 + ... + l_n) / n`` the same way. ``rest`` is carried from one micro-batch to the
    next (RNG counts advance, batch statistics update) and returned as the last left it.
    Gradients a placement returns in host memory are accumulated on the device.
    """

    xs, ys = micro_batches(inputs, n, mesh), micro_batches(targets, n, mesh)
    shapes = jax.eval_shape(lambda p, r, x, y: grad_fn(p, r, x, y)[1], params, rest, xs[0], ys[0])
    zeros = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), shapes)

    def body(carry, batch):
        loss_sum, acc, rest = carry
        (loss, rest), grads = grad_fn(params, rest, *batch)
        grads = move(grads, "device")  # a no-op for gradients already on the device
        # each micro-batch's gradients materialised before they are added: XLA would
        # otherwise fold ``acc + scatter-add(0, ids, rows)`` (an embedding's gradient) into
        # ``scatter-add(acc, ids, rows)``, adding each row to the accumulator on its own
        # instead of their sum (other bits than g_1 + ... + g_n)
        grads = lax.optimization_barrier(grads)
        acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads)
        return (loss_sum + loss.astype(jnp.float32), acc, rest), None

    start = (jnp.zeros((), jnp.float32), zeros, rest)
    (loss_sum, acc, rest), _ = lax.scan(body, start, (xs, ys))
    grads = jax.tree.map(lambda a, g: (a / n).astype(g.dtype), acc, shapes)
    return loss_sum / n, grads, rest
