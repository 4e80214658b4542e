"""The paging pipeline of one parameter leaf: per chunk, take every paged tensor's chunk,
update it, put the new chunks.

The pager reads ahead in the step plan's order and writes behind (``jaxoff.aio._pager``), so
a chunk's take finds it read while the chunks before it were updated, and a put returns once
the bytes are in a write slot: the I/O overlaps the arithmetic whatever XLA's executor does.
Per leaf, the first chunk and the last one or two (the short tail) are staged in Python
(their sizes are static); the uniform middle is one scan (`StepRecorder.scan`), whose sites
move chunk ``i`` at trip ``i``.

Why per leaf and not one global scan: chunks never straddle two leaves (the page store cuts
each entry separately and the inner optimizer may treat leaves differently, e.g. masked weight
decay), and a leaf's gradients and parameters are sliced in place from their own buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxoff.optim._stepplan import Loop

# The entry names of a leaf's paged tensors, given the value of each scan the update runs in
# (Fuyou's layer scan names one layer's entries: ``<entry>@<layer>``).
EntryNames = Callable[[Mapping[Loop, int]], Sequence[str]]


def as_bits(x: jax.Array) -> jax.Array:
    """A float array's bits, as unsigned integers of its width."""
    return lax.bitcast_convert_type(x, jnp.dtype(f"uint{x.dtype.itemsize * 8}"))


def _bits_out(compute: Callable, dtype) -> Callable:
    """``compute`` with its output chunk cast to ``dtype`` and given as its bits."""

    def bits_compute(i, n, chunks):
        out_chunk, new = compute(i, n, chunks)
        return as_bits(out_chunk.astype(dtype)), new

    return bits_compute


def fixed_names(names: Sequence[str]) -> EntryNames:
    """The `EntryNames` of a leaf whose entries do not depend on any scan."""
    names = tuple(names)
    return lambda env: names


def page_leaf(
    rec,
    names: EntryNames,
    storages: Sequence[np.dtype],
    chunk_elems: int,
    n_full: int,
    tail: int,
    out: jax.Array,
    compute: Callable,
) -> jax.Array:
    """Pages one leaf (or one layer's part of it) through ``compute`` chunk by chunk.

    Args:
      rec: the step's `jaxoff.optim.chunks.StepRecorder`.
      names: the store entries of the leaf's paged tensors (one per tensor, `fixed_names`
        unless they depend on an enclosing scan); ``storages``: their dtypes on disk.
      chunk_elems, n_full, tail: chunk ``i`` holds ``chunk_elems`` elements (``tail`` the
        last one, if not 0); ``n_full`` full chunks.
      out: flat output buffer; chunk ``i`` of ``compute``'s first result lands at
        ``i * chunk_elems``.
      compute: ``(i, size, chunks_read) -> (out_chunk, chunks_to_write)``.

    Returns:
      ``out``, every chunk written.
    """
    num = n_full + (1 if tail else 0)
    if num == 0:
        return out
    dtype = out.dtype
    if dtype.itemsize == 2 and jnp.issubdtype(dtype, jnp.floating):
        # The output buffer is carried as its bits: XLA's CPU backend upcasts bfloat16 ops to
        # float32, and a bfloat16 dynamic-update-slice of a chunk became a conversion of the
        # whole leaf to float32 and back for every chunk (see _update._slice_bits).
        got = page_leaf(
            rec, names, storages, chunk_elems, n_full, tail, as_bits(out), _bits_out(compute, dtype)
        )
        return lax.bitcast_convert_type(got, dtype)

    def size(i):
        return chunk_elems if i < n_full else tail

    def stage(i, n, chunk_of, out):
        """Chunk ``i`` (traced or static) of ``n`` elements; ``chunk_of(env)``: its index."""
        xs = []
        for k, storage in enumerate(storages):
            address = lambda env, k=k: (names(env)[k], chunk_of(env))  # noqa: E731
            xs.append(rec.take(address, (n,), storage))
        out_chunk, new = compute(i, n, xs)
        out = lax.dynamic_update_slice(out, out_chunk.astype(out.dtype), (i * chunk_elems,))
        for k, x in enumerate(new):
            rec.put(lambda env, k=k: (names(env)[k], chunk_of(env)), x)
        return out

    out = stage(0, size(0), lambda env: 0, out)
    if n_full >= 3:  # the uniform middle: chunks 1 .. n_full-2, each a full chunk

        def body(out, i, loop):
            return stage(i, chunk_elems, lambda env: env[loop], out), None

        middle = range(1, n_full - 1)
        out, _ = rec.scan(body, out, jnp.arange(1, n_full - 1, dtype=jnp.int32), values=middle)
    for i in range(max(1, n_full - 1), num):
        out = stage(i, size(i), lambda env, i=i: i, out)
    return out
