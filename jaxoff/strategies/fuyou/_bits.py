"""The stacked block leaves as the scans hold them: a layer sliced out of (or written into)
the stack as bits where XLA's CPU backend would compute 16-bit floats in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jaxoff._xla import is_half_float
from jaxoff.optim.chunks import (
    as_bits,
)

from ._layout import _is_block_path


def _block_fn(blocks: nnx.Module):
    """``block(layer, h)``: one block of the stacked ``blocks`` module applied to ``h``, with
    ``layer`` (the flat leaves of one layer's parameters) as its parameters."""
    bgraph, bstate = nnx.split(blocks)
    bdef = jax.tree.structure(bstate)
    return lambda layer, h: nnx.merge(bgraph, jax.tree.unflatten(bdef, layer))(h)


def _layer(stacked: list[jax.Array], j, dtypes) -> list[jax.Array]:
    """Layer ``j`` of the stacked leaves' bits, as floats (see the scans)."""
    return [
        _unbits(lax.dynamic_index_in_dim(x, j, keepdims=False), d)
        for x, d in zip(stacked, dtypes, strict=True)
    ]


def _put_layer(stacked: list[jax.Array], layer: list[jax.Array], j) -> list[jax.Array]:
    return [
        lax.dynamic_update_index_in_dim(b, x, j, 0) for b, x in zip(stacked, layer, strict=True)
    ]


def _bits_layer_into(stack: jax.Array, x: jax.Array, j) -> jax.Array:
    return lax.dynamic_update_index_in_dim(stack, as_bits(x), j, 0)


put_bits = jax.jit(_bits_layer_into, donate_argnums=0)
"""``put_bits(stack, layer, j)``: ``stack`` (donated: updated in place) with layer ``j``
set to the bits of the floats ``layer``."""


def _bits(x: jax.Array) -> jax.Array:
    """A float array's bits as unsigned integers of its width; other arrays as they are."""
    return as_bits(x) if jnp.issubdtype(x.dtype, jnp.floating) else x


def _unbits(x: jax.Array, dtype) -> jax.Array:
    return x if x.dtype == dtype else lax.bitcast_convert_type(x, dtype)


def _stack_form(x: jax.Array) -> jax.Array:
    """How the scans hold a stacked block leaf: 16-bit floats as their bits (XLA's CPU
    backend computes them in float32, slices and updates included), wider floats as they
    are (converting those would only copy the whole stack, at each end of the step)."""
    return _bits(x) if is_half_float(x.dtype) else x


def _like(layer: list[jax.Array], stacked: list[jax.Array]) -> list[jax.Array]:
    """A layer's leaves in the dtypes of the stack they are written into (`_stack_form`, or
    bits throughout with ``blocks_as_bits``)."""
    return [_unbits(x, s.dtype) for x, s in zip(layer, stacked, strict=True)]


def blocks_to_bits(params):
    """``params`` with every float leaf of the stacked blocks replaced by its bits (uint16
    for bfloat16), converted in place: the arrays given are donated. For
    ``make_fuyou_step(..., blocks_as_bits=True)``."""
    return _map_blocks(params, _bits)


def blocks_from_bits(params, dtype):
    """The inverse of `blocks_to_bits` (the block leaves become ``dtype`` again, in place)."""
    dtype = jnp.dtype(dtype)
    return _map_blocks(
        params,
        lambda x: x if not jnp.issubdtype(x.dtype, jnp.unsignedinteger) else _unbits(x, dtype),
    )


def _map_blocks(params, fn):
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    convert = jax.jit(fn, donate_argnums=0)
    return jax.tree.unflatten(treedef, [convert(x) if _is_block_path(p) else x for p, x in flat])
