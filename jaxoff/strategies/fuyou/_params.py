"""Fuyou with the stacked block parameters paged too (ZeRO-Infinity's parameter offload).

With ``page_params=True`` (`fuyou_init`, `make_fuyou_step`) the stacked block parameters are
not part of the training state: each layer's slice of each block leaf is an entry of the
optimizer's page store (``param.<leaf>@<layer>``, at the parameters' dtype), read one layer
ahead in the forward scan and again, in reverse, in the backward scan (split-phase
``page_prefetch`` / ``page_take``: the next layer's reads run while this layer computes), and
written back (write-behind) by the layer's update. Resident memory then holds the embeddings,
final norm and head, each block's input, and a window of two layers' parameters; the store
holds the rest. The parameter entries are versioned with the optimizer state: one commit per
step makes both the next version (``slots=2``), or both are updated in place (``slots=1``).

This module holds the parameter entries' layout and their per-layer reads and writes; the
step is `jaxoff.strategies.fuyou.make_fuyou_step`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxoff._errors import ConfigError
from jaxoff.aio import new_token, page_out, page_prefetch, page_take

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
      fids: int32 ``[L, 2, n]``: file id of chunk ``i`` of layer ``j`` in slot A (0) / B (1).
      offs: uint32 ``[L, n, 2]``: encoded byte offsets.
    """

    leaf: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[tuple[int, int], ...]
    fids: np.ndarray
    offs: np.ndarray


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


def prefetch_layer(table, entries, crcs, slot, j, token) -> list[list[jax.Array]]:
    """Tickets of layer ``j``'s parameter chunks, per entry (``crcs[k]``: uint32 ``[L, n]``)."""
    tickets = []
    for e, crc in zip(entries, crcs, strict=True):
        fid = jnp.asarray(e.fids)[j, slot]
        off = jnp.asarray(e.offs)[j]
        c = crc[j]
        tickets.append(
            [
                page_prefetch(table, fid[i], off[i], c[i], token, shape=(n,), dtype=e.dtype)
                for i, (_, n) in enumerate(e.chunks)
            ]
        )
    return tickets


def take_layer(table, entries, tickets, token) -> tuple[list[jax.Array], jax.Array]:
    """The layer the tickets of `prefetch_layer` read (verified), per entry."""
    out = []
    for e, ts in zip(entries, tickets, strict=True):
        parts = []
        for t, (_, n) in zip(ts, e.chunks, strict=True):
            x, token = page_take(table, t, token, shape=(n,), dtype=e.dtype)
            parts.append(x)
        flat = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
        out.append(flat.reshape(e.shape))
    return out, token


def write_layer(table, entries, layer, slot, j, token) -> tuple[list[jax.Array], jax.Array]:
    """Writes layer ``j``'s new parameters (write-behind) to ``slot``; per entry, the crcs."""
    crcs, tokens = [], []
    for e, x in zip(entries, layer, strict=True):
        flat = x.astype(e.dtype).reshape(-1)
        fid = jnp.asarray(e.fids)[j, slot]
        off = jnp.asarray(e.offs)[j]
        cs = []
        for i, (start, n) in enumerate(e.chunks):
            c, t = page_out(
                table,
                fid[i],
                off[i],
                jax.lax.slice(flat, (start,), (start + n,)),
                token,
                write_behind=True,
            )
            cs.append(c)
            tokens.append(t)
        crcs.append(jnp.stack(cs))
    return crcs, sum(tokens, token)


def forward(lay, pcrcs, read_slot, block, x0):
    """The forward layer scan with the parameters read from the store, one layer ahead.

    Returns ``(h, saved, top)``: the last block's output, every block's input (``[L, ...]``)
    and the top layer's parameters (the backward scan differentiates that layer first).
    """
    table, entries, last = lay.table, lay.params, lay.num_layers - 1
    tok = new_token()  # the reads follow no write of this step
    ticket = prefetch_layer(table, entries, pcrcs, read_slot, 0, tok)

    def body(carry, j):
        h, ticket = carry
        layer, _ = take_layer(table, entries, ticket, tok)
        ahead = prefetch_layer(table, entries, pcrcs, read_slot, j + 1, tok)
        return (block(layer, h), ahead), h

    (h, ticket), saved = lax.scan(body, (x0, ticket), jnp.arange(last))
    top, _ = take_layer(table, entries, ticket, tok)
    saved = jnp.concatenate([saved, h[None]])
    return block(top, h), saved, top


def backward(
    lay,
    pcrcs,
    read_slot,
    write_slot,
    tables,
    saved,
    top,
    gh,
    vjp_layer,
    update,
    heads_of,
    top_heads,
    tok,
):
    """The backward layer scan with the parameters read from the store, one layer ahead,
    software-pipelined as the in-memory one (layer ``j``'s gradients beside layer
    ``j + 1``'s update), each update writing its layer's new parameters to ``write_slot``.

    ``tables``: per block leaf, the optimizer entries' ``(crcs, fids, offs)`` (``[L, ...]``);
    ``vjp_layer(layer, h_in, gh) -> (g_layer, gh)``; ``update(g, layer, heads, crcs, fids,
    offs, tok) -> (new_layer, crcs, squares, tok)``; ``heads_of(crcs, fids, offs)`` (one
    layer's tables) prefetches the leading chunks of that layer's optimizer state, issued in
    the scan step before its update; ``top_heads``: those of the top layer, issued before;
    ``tok``: what the first write follows.

    Returns ``(crcs, squares, param_crcs, gh, token)``, per layer stacked in layer order.
    """
    table, entries, last = lay.table, lay.params, lay.num_layers - 1
    rtok = new_token()
    g_layer, gh = vjp_layer(top, saved[last], gh)
    layer = top

    def step(j, layer_j, h_in, gh, g_up, p_up, heads_up, up_tables, tok):
        """Layer j's gradients, and layer j + 1's update and parameter writes."""
        g_j, gh = vjp_layer(layer_j, h_in, gh)
        new_up, crcs_up, sq_up, tok = update(g_up, p_up, heads_up, *up_tables, tok)
        pc_up, tok = write_layer(table, entries, new_up, write_slot, j + 1, tok)
        return gh, g_j, (crcs_up, sq_up, pc_up), tok

    def body(carry, xs):
        gh, tok, g_up, p_up, heads_up, ticket = carry
        j, h_in, up_tables, tables_j = xs  # layer j + 1's tables, layer j's
        heads_j = heads_of(*tables_j)  # for the next step's update of layer j
        layer_j, _ = take_layer(table, entries, ticket, rtok)
        ahead = prefetch_layer(table, entries, pcrcs, read_slot, j - 1, rtok)
        gh, g_j, out, tok = step(j, layer_j, h_in, gh, g_up, p_up, heads_up, up_tables, tok)
        return (gh, tok, g_j, layer_j, heads_j, ahead), out

    outs = []
    heads = top_heads
    if last >= 1:
        ticket = prefetch_layer(table, entries, pcrcs, read_slot, last - 1, rtok)
        xs = (
            jnp.arange(1, last),
            saved[1:last],
            jax.tree.map(lambda t: t[2:], tables),
            jax.tree.map(lambda t: t[1:last], tables),
        )
        carry = (gh, tok, g_layer, layer, heads, ticket)
        (gh, tok, g_layer, layer, heads, ticket), scanned = lax.scan(body, carry, xs, reverse=True)
        heads_0 = heads_of(*jax.tree.map(lambda t: t[0], tables))
        layer_0, _ = take_layer(table, entries, ticket, rtok)
        up_tables = jax.tree.map(lambda t: t[1], tables)
        gh, g_0, out_1, tok = step(0, layer_0, saved[0], gh, g_layer, layer, heads, up_tables, tok)
        outs = [jax.tree.map(lambda x: x[None], out_1), scanned]
        g_layer, layer, heads = g_0, layer_0, heads_0
    first = jax.tree.map(lambda t: t[0], tables)
    new_0, crcs_0, sq_0, tok = update(g_layer, layer, heads, *first, tok)
    pc_0, tok = write_layer(table, entries, new_0, write_slot, 0, tok)
    outs = [jax.tree.map(lambda x: x[None], (crcs_0, sq_0, pc_0)), *outs]
    crcs, sq, pcrcs_new = jax.tree.map(lambda *a: jnp.concatenate(a), *outs)
    return crcs, sq, pcrcs_new, gh, tok
