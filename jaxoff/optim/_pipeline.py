"""The paging pipeline of one parameter leaf: read chunk i+1, update chunk i, write chunk i-1.

Per leaf, the first chunk, the last one or two and the short tail are staged in Python (their
sizes are static); the uniform middle is one ``lax.scan``.

Split phase (``split_phase=True``; what ``jaxoff.paged`` uses when its staging is large enough):
the body starts the read of chunk i+1 (``page_prefetch``: the
engine's threads read it into staging), takes chunk i (prefetched one iteration earlier; the
new tickets are the take's token, so the order prefetch -> take -> update is a data
dependency), updates it and hands the result to a write-behind ``page_out`` that returns once
the bytes are in staging. The I/O thus overlaps the arithmetic whatever XLA's executor does
(its CPU runtime runs small scan bodies strictly in order, awaiting each async call at once).
The carry holds only the tickets; the caller must ``page_flush`` before committing.

Without split phase (the default of `page_leaf`), the body issues
``page_in`` of chunk i+1, the update of chunk i and ``page_out`` of chunk i-1 with no data
dependency between them, and the carry holds two chunks per paged tensor.

Why per leaf and not one global scan: chunks never straddle two leaves (the page store cuts
each entry separately and the inner optimizer may treat leaves differently, e.g. masked weight
decay), and a leaf's gradients and parameters are sliced in place from their own buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxoff.aio._ffi_calls import page_in, page_out, page_prefetch, page_take


@dataclasses.dataclass(frozen=True)
class EntryIO:
    """Where one paged tensor's chunks live: per slot file ids, byte offsets, storage dtype."""

    file_ids: np.ndarray  # int32 [2, num_chunks]: row 0 slot A, row 1 slot B
    offsets: np.ndarray  # uint32 [num_chunks, 2] (low, high word)
    storage: np.dtype


def as_bits(x: jax.Array) -> jax.Array:
    """A float array's bits, as unsigned integers of its width."""
    return lax.bitcast_convert_type(x, jnp.dtype(f"uint{x.dtype.itemsize * 8}"))


def _bits_out(compute: Callable, dtype) -> Callable:
    """``compute`` with its output chunk cast to ``dtype`` and given as its bits."""

    def bits_compute(i, n, chunks):
        out_chunk, new = compute(i, n, chunks)
        return as_bits(out_chunk.astype(dtype)), new

    return bits_compute


def page_leaf(
    table: str,
    ios: list[EntryIO],
    crcs_in: list[jax.Array],
    read_slot: jax.Array,
    chunk_elems: int,
    n_full: int,
    tail: int,
    out: jax.Array,
    compute: Callable,
    token: jax.Array,
    *,
    split_phase: bool = False,
    head: list[list[jax.Array]] | None = None,
) -> tuple[jax.Array, list[jax.Array], jax.Array]:
    """Pages one leaf through ``compute`` chunk by chunk.

    With ``split_phase``, writes are write-behind: ``page_flush`` the table (after the returned
    token) before anything outside the table relies on them. Staging needs room for two
    chunks of every entry plus the writes in flight (``EngineConfig.pool_bytes``).

    Args:
      crcs_in: per entry, the crc32c of each chunk in the read slot (verified on read).
      read_slot: 0 (A) or 1 (B); writes go to the other slot.
      out: flat output buffer; chunk ``i`` of ``compute``'s first result lands at
        ``i * chunk_elems``.
      compute: ``(i, size, chunks_read) -> (out_chunk, chunks_to_write)``.

      head: split phase only: per chunk ``0 .. len(head) - 1``, the tickets of its entries'
        reads, prefetched by the caller (`prefetch_chunk`) before this call; the pipeline
        takes them instead of reading those chunks itself.

    Returns:
      ``(out, crcs of the chunks written per entry, token after the last write)``.
    """
    num = n_full + (1 if tail else 0)
    write_slot = 1 - read_slot
    fids = [jnp.asarray(io.file_ids) for io in ios]
    offs = [jnp.asarray(io.offsets) for io in ios]
    crcs_out = [jnp.zeros((num,), jnp.uint32) for _ in ios]
    if num == 0:
        return out, crcs_out, token
    dtype = out.dtype
    if dtype.itemsize == 2 and jnp.issubdtype(dtype, jnp.floating):
        # The output buffer is carried as its bits: XLA's CPU backend upcasts bfloat16 ops to
        # float32, and a bfloat16 dynamic-update-slice of a chunk became a conversion of the
        # whole leaf to float32 and back for every chunk (see _paged._slice_bits).
        out, compute = as_bits(out), _bits_out(compute, dtype)
        got, crcs, token = page_leaf(
            table, ios, crcs_in, read_slot, chunk_elems, n_full, tail, out, compute, token,
            split_phase=split_phase, head=head,
        )  # fmt: skip
        return lax.bitcast_convert_type(got, dtype), crcs, token

    def size(i):
        return chunk_elems if i < n_full else tail

    if split_phase:
        return _page_leaf_split(
            table,
            ios,
            fids,
            offs,
            crcs_in,
            read_slot,
            write_slot,
            num,
            n_full,
            chunk_elems,
            size,
            out,
            compute,
            token,
            crcs_out,
            list(head or []),
        )
    if head:
        raise ValueError("page_leaf: prefetched head chunks need split_phase=True")

    def read(i, n, tok):
        xs = []
        for k, io in enumerate(ios):
            x, tok = page_in(
                table,
                fids[k][read_slot, i],
                offs[k][i],
                crcs_in[k][i],
                tok,
                shape=(n,),
                dtype=io.storage,
            )
            xs.append(x)
        return xs, tok

    def write(i, xs, tok, crcs):
        crcs = list(crcs)
        for k, x in enumerate(xs):
            crc, tok = page_out(table, fids[k][write_slot, i], offs[k][i], x, tok)
            crcs[k] = crcs[k].at[i].set(crc)
        return tok, crcs

    def stage(i, n, next_n, carry):
        cur, pend, out, tok_r, tok_w, crcs = carry
        nxt = None
        if next_n:
            nxt, tok_r = read(i + 1, next_n, tok_r)
        out_chunk, new = compute(i, n, cur)
        out = lax.dynamic_update_slice(out, out_chunk.astype(out.dtype), (i * chunk_elems,))
        if pend is not None:
            tok_w, crcs = write(i - 1, pend, tok_w, crcs)
        return nxt, new, out, tok_r, tok_w, crcs

    cur, tok_r = read(0, size(0), token)
    carry = (cur, None, out, tok_r, token, crcs_out)
    carry = stage(0, size(0), size(1) if num > 1 else 0, carry)
    if n_full >= 3:  # the uniform middle: chunks 1 .. n_full-2, each reading a full chunk

        def body(carry, i):
            return stage(i, chunk_elems, chunk_elems, carry), None

        carry, _ = lax.scan(body, carry, jnp.arange(1, n_full - 1, dtype=jnp.int32))
    for i in range(max(1, n_full - 1), num):
        carry = stage(i, size(i), size(i + 1) if i + 1 < num else 0, carry)
    _, pend, out, _, tok_w, crcs = carry
    tok_w, crcs = write(num - 1, pend, tok_w, crcs)
    return out, crcs, tok_w


def prefetch_chunk(
    table: str,
    ios: list[EntryIO],
    crcs_in: list[jax.Array],
    read_slot: jax.Array,
    i,
    n: int,
    token: jax.Array,
) -> list[jax.Array]:
    """Starts the reads of chunk ``i`` (``n`` elements) of every entry; returns their tickets.

    Each prefetch is issued after the previous one (the last ticket orders them all)."""
    tickets = []
    for k, io in enumerate(ios):
        token = page_prefetch(
            table,
            jnp.asarray(io.file_ids)[read_slot, i],
            jnp.asarray(io.offsets)[i],
            crcs_in[k][i],
            token,
            shape=(n,),
            dtype=io.storage,
        )
        tickets.append(token)
    return tickets


def _page_leaf_split(
    table,
    ios,
    fids,
    offs,
    crcs_in,
    read_slot,
    write_slot,
    num,
    n_full,
    chunk_elems,
    size,
    out,
    compute,
    token,
    crcs_out,
    head,
):
    h = len(head)
    if h > num:
        raise ValueError(f"page_leaf: {h} prefetched head chunks for a leaf of {num}")

    def prefetch(i, n, tok):
        return prefetch_chunk(table, ios, crcs_in, read_slot, i, n, tok)

    def take(n, tickets, tok):
        xs = []
        for io, t in zip(ios, tickets, strict=True):
            x, tok = page_take(table, t, tok, shape=(n,), dtype=io.storage)
            xs.append(x)
        return xs

    def stage(i, n, next_n, carry, given=None):
        tickets, out, tok, crcs = carry
        if given is not None:  # chunk i + 1's tickets, prefetched by the caller
            nxt = given
            xs = take(n, tickets, tok)
        else:
            nxt = prefetch(i + 1, next_n, tok) if next_n else None
            xs = take(n, tickets, nxt[-1] if nxt else tok)  # after the prefetch of chunk i+1
        out_chunk, new = compute(i, n, xs)
        out = lax.dynamic_update_slice(out, out_chunk.astype(out.dtype), (i * chunk_elems,))
        crcs = list(crcs)
        for k, x in enumerate(new):
            crc, tok = page_out(
                table, fids[k][write_slot, i], offs[k][i], x, tok, write_behind=True
            )
            crcs[k] = crcs[k].at[i].set(crc)
        return nxt, out, tok, crcs

    first = head[0] if h else prefetch(0, size(0), token)
    carry = (first, out, token, crcs_out)
    # The chunks whose successor the caller prefetched (0 .. h-2: full ones, as only the last
    # chunk may be short) as one scan over those tickets when there are several, the last
    # prefetched head chunk as a static stage, then the uniform middle as a scan (chunks
    # lo .. n_full-2, each reading a full chunk), then the last one or two chunks.
    lo, done = max(1, h), 0
    if h >= 3:
        later = [jnp.stack([head[i][k] for i in range(1, h)]) for k in range(len(ios))]

        def head_body(carry, x):
            i, nxt = x
            return stage(i, chunk_elems, chunk_elems, carry, given=list(nxt)), None

        carry, _ = lax.scan(head_body, carry, (jnp.arange(h - 1, dtype=jnp.int32), later))
        done = h - 1
    for i in range(done, lo):
        given = head[i + 1] if i + 1 < h else None
        carry = stage(i, size(i), size(i + 1) if i + 1 < num else 0, carry, given)
    if n_full - 1 > lo:

        def body(carry, i):
            return stage(i, chunk_elems, chunk_elems, carry), None

        carry, _ = lax.scan(body, carry, jnp.arange(lo, n_full - 1, dtype=jnp.int32))
    for i in range(max(lo, n_full - 1), num):
        carry = stage(i, size(i), size(i + 1) if i + 1 < num else 0, carry)
    _, out, tok, crcs = carry
    return out, crcs, tok
