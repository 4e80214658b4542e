"""Fuyou with the stacked block parameters paged too (ZeRO-Infinity's parameter offload).

With ``page_params=True`` (`fuyou_init`, `make_fuyou_step`) the stacked block parameters are
not part of the training state: each layer's slice of each block leaf is an entry of the
optimizer's page store (``param.<leaf>@<layer>``, at the parameters' dtype), taken in the
forward scan and again, in reverse, in the backward scan (the pager reads the next layer
while this one computes), and put back (written behind) by the layer's update. Resident
memory then holds the embeddings, final norm and head, each block's input, and the layers
being computed; the store holds the rest. The parameter entries are versioned with the
optimizer state: one commit per step makes both the next version (``slots=2``), or both are
updated in place (``slots=1``).

This module holds the parameter entries' layout and their per-layer takes and puts; the step
is `jaxoff.strategies.fuyou.make_fuyou_step`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxoff._errors import ConfigError

PARAM_PREFIX = "param."


@dataclasses.dataclass(frozen=True)
class ParamEntry:
    """The store entries of one stacked block leaf's parameters, one per layer.

    Attributes:
      leaf: the leaf's index in the optimizer's plan.
      name: entry name of layer ``j``: ``f"{name}@{j}"``.
      shape: one layer's shape.
      dtype: the parameters' dtype (stored as it is).
      chunks: ``(first element, element count)`` of each chunk of one layer (flattened).
    """

    leaf: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[tuple[int, int], ...]


def entry_name(leaf_name: str) -> str:
    return PARAM_PREFIX + leaf_name


def layer_nbytes(leaf) -> int:
    """Bytes of one layer of a stacked plan leaf at its own dtype."""
    return int(np.prod(leaf.shape[1:], dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def layer_chunks(shape, dtype, chunk_bytes: int) -> tuple[tuple[int, int], ...]:
    """How the store cuts one layer of ``shape``/``dtype`` (``jaxoff.aio`` ``plan_entry``)."""
    size = int(np.prod(shape, dtype=np.int64))
    per = chunk_bytes // np.dtype(dtype).itemsize
    return tuple((s, min(per, size - s)) for s in range(0, size, per))


def placeholder(x) -> jax.Array:
    """What stands for a paged block leaf in ``TrainState.params``: an empty array."""
    return jnp.zeros((0,), x.dtype)


def check_placeholders(leaves, bidx) -> None:
    big = [i for i in bidx if np.size(leaves[i]) != 0]
    if big:
        raise ConfigError(
            "make_fuyou_step(page_params=True) keeps the block parameters in the page store, "
            f"but state.params holds {len(big)} non-empty block leaves: pass "
            "fuyou_resident(params) as the state's parameters (after fuyou_init wrote them)"
        )


def take_layer(rec, entries, layer_of) -> list[jax.Array]:
    """The parameters of layer ``layer_of(env)`` (per entry, verified), taken in the step
    ``rec``; ``env`` gives the values of the scans the call runs in."""
    out = []
    for e in entries:
        parts = []
        for i, (_, n) in enumerate(e.chunks):
            address = lambda env, e=e, i=i: (f"{e.name}@{layer_of(env)}", i)  # noqa: E731
            parts.append(rec.take(address, (n,), e.dtype))
        flat = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
        out.append(flat.reshape(e.shape))
    return out


def put_layer(rec, entries, layer, layer_of) -> None:
    """Puts the new parameters of layer ``layer_of(env)`` (written behind the step)."""
    for e, x in zip(entries, layer, strict=True):
        flat = x.astype(e.dtype).reshape(-1)
        for i, (start, n) in enumerate(e.chunks):
            address = lambda env, e=e, i=i: (f"{e.name}@{layer_of(env)}", i)  # noqa: E731
            rec.put(address, lax.slice(flat, (start,), (start + n,)))


def forward(rec, lay, block, x0):
    """The forward layer scan with the parameters taken from the store (the pager reads the
    next layer while this one computes).

    Returns ``(h, saved, top)``: the last block's output, every block's input (``[L, ...]``)
    and the top layer's parameters (the backward scan differentiates that layer first).
    """
    entries, last = lay.params, lay.num_layers - 1

    def body(h, j, loop):
        layer = take_layer(rec, entries, lambda env: env[loop])
        return block(layer, h), h

    h, saved = rec.scan(body, x0, jnp.arange(last), values=range(last))
    top = take_layer(rec, entries, lambda env: last)
    saved = jnp.concatenate([saved, h[None]])
    return block(top, h), saved, top


class LayerStep(Protocol):
    """What the backward scan over paged parameters needs of the step it runs in (Fuyou's
    ``StepContext`` is one): its recorder, its layout, and a layer's gradients and update."""

    rec: Any  # the step's StepRecorder
    lay: Any  # the store layout (``lay.params``: the parameter entries, ``lay.num_layers``)

    def vjp_layer(self, layer, h_in, gh) -> tuple[list, jax.Array]:
        """``(g_layer, gh)``: the flat gradients of a layer's parameters and of its input."""
        ...

    def update_layer(self, g_layer, layer, layer_of) -> tuple[list, jax.Array]:
        """``(new_layer, squares)``: layer ``layer_of(env)``'s paged update."""
        ...


def backward(step: LayerStep, saved, top, gh):
    """The backward layer scan with the parameters taken from the store, software-pipelined
    as the in-memory one (layer ``j``'s gradients beside layer ``j + 1``'s update), each
    update putting its layer's new parameters (`_differentiate_and_update`).

    ``saved``: every block's input (`forward`); ``top``: the top layer's parameters;
    ``gh``: the gradient of the blocks' output.

    Returns ``(squares, gh)``, the squares per layer stacked in layer order.
    """
    last = step.lay.num_layers - 1
    g_layer, gh = step.vjp_layer(top, saved[last], gh)
    layer = top
    outs = []
    if last >= 1:
        xs = (jnp.arange(1, last), saved[1:last])
        body = functools.partial(_backward_body, step)
        (gh, g_layer, layer), scanned = step.rec.scan(
            body, (gh, g_layer, layer), xs, values=range(1, last), reverse=True
        )
        layer_0 = take_layer(step.rec, step.lay.params, lambda env: 0)
        gh, g_0, sq_1 = _differentiate_and_update(
            step, layer_0, saved[0], gh, (g_layer, layer, lambda env: 1)
        )
        outs = [sq_1[None], scanned]
        g_layer, layer = g_0, layer_0
    new_0, sq_0 = step.update_layer(g_layer, layer, lambda env: 0)
    put_layer(step.rec, step.lay.params, new_0, lambda env: 0)
    return jnp.concatenate([sq_0[None], *outs]), gh


def _differentiate_and_update(step: LayerStep, layer_j, h_in, gh, above):
    """Layer j's gradients, and the update and parameter puts of the layer above:
    ``above`` is ``(its gradients, its parameters, layer_of)``. Returns ``(gh, g_j,
    squares of the layer above)``."""
    g_up, p_up, up_of = above
    g_j, gh = step.vjp_layer(layer_j, h_in, gh)
    new_up, sq_up = step.update_layer(g_up, p_up, up_of)
    put_layer(step.rec, step.lay.params, new_up, up_of)
    return gh, g_j, sq_up


def _backward_body(step: LayerStep, carry, xs, loop):
    """The backward scan's trip for layer ``j = env[loop]``: takes its parameters,
    differentiates it and updates layer ``j + 1`` (whose gradients the trip before made)."""
    gh, g_up, p_up = carry
    _, h_in = xs
    layer_j = take_layer(step.rec, step.lay.params, lambda env: env[loop])
    above = (g_up, p_up, lambda env: env[loop] + 1)
    gh, g_j, sq = _differentiate_and_update(step, layer_j, h_in, gh, above)
    return (gh, g_j, layer_j), sq
