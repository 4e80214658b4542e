"""How a paged state's bytes are encoded: chunk checksums packed into one host-call operand,
the RAM leaves as the bytes of the ``ram`` entry, and each entry's chunk addresses (file ids
per slot, encoded offsets) for the paging calls.

>>> import numpy as np
>>> crcs = [np.arange(4, dtype=np.uint32).reshape(2, 2), np.array([7], np.uint32)]
>>> [c.tolist() for c in unpack_crcs(pack_crcs(crcs), crc_shapes(crcs))]
[[[0, 1], [2, 3]], [7]]
"""

from __future__ import annotations

import math

import crc32c
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxoff.aio import PageStore
from jaxoff.optim._pipeline import EntryIO
from jaxoff.optim._plan import Plan


def crc_shapes(crcs) -> tuple[tuple[int, ...], ...]:
    """The shapes `unpack_crcs` needs to split what `pack_crcs` packed from ``crcs``."""
    return tuple(tuple(c.shape) for c in crcs)


def pack_crcs(crcs) -> jax.Array:
    """Every chunk checksum of a state as one operand of a host call. A state holds one
    checksum array per store entry; a host call has one operand per array (and on a GPU,
    ``io_callback`` moves each to the host in a dispatch of its own): packed, a step's calls
    take two operands instead of two per entry (`unpack_crcs` splits them again)."""
    return jnp.concatenate([jnp.ravel(c).astype(jnp.uint32) for c in crcs])


def unpack_crcs(packed, shapes) -> list[np.ndarray]:
    """The per-entry checksum arrays `pack_crcs` packed, with their ``shapes``."""
    flat = np.asarray(packed, np.uint32)
    sizes = [math.prod(s) for s in shapes]
    if flat.size != sum(sizes):
        raise ValueError(f"{flat.size} packed checksums for shapes holding {sum(sizes)}")
    parts = np.split(flat, np.cumsum(sizes)[:-1]) if shapes else []
    return [x.reshape(s) for x, s in zip(parts, shapes, strict=True)]


def encode(offsets) -> np.ndarray:
    from jaxoff.aio._ffi_calls import encode_offsets

    return encode_offsets(np.asarray(offsets, np.int64)).reshape(-1, 2)


def entry_ios(store: PageStore, storages=None) -> list[EntryIO]:
    """Per entry of ``store`` (in store order): its chunks' file ids per slot and encoded
    offsets, for the paging calls; ``storages``: per entry, the dtype on disk (default: the
    store's)."""
    if storages is None:
        storages = [e.dtype for e in store.entries.values()]
    tabs = [store.chunk_table(s) for s in ("A", "B")]
    out = []
    for ei, storage in enumerate(storages):
        rows = tabs[0]["entry"] == ei
        fids = np.stack([t["file_id"][t["entry"] == ei] for t in tabs]).astype(np.int32)
        out.append(EntryIO(fids, encode(tabs[0]["offset"][rows]), np.dtype(storage)))
    return out


def write_chunk(store: PageStore, name: str, i: int, x: np.ndarray) -> int:
    x = np.ascontiguousarray(x)
    store.write_chunk(name, i, x)
    # numpy's stubs give ndarray no __buffer__ before Python 3.12; it is a buffer
    return crc32c.crc32c(x.view(np.uint8).reshape(-1))  # pyright: ignore[reportArgumentType]


def ram_bytes(plan: Plan, leaves) -> jax.Array:
    """The RAM leaves as raw bytes (uint8[plan.ram_nbytes]), as stored in entry ``ram``."""
    parts = []
    for x in leaves:
        x = jnp.asarray(x)
        if x.dtype == jnp.bool_:
            x = x.astype(jnp.uint8)
        parts.append(lax.bitcast_convert_type(x, jnp.uint8).reshape(-1))
    raw = jnp.concatenate(parts) if parts else jnp.zeros((0,), jnp.uint8)
    return jnp.pad(raw, (0, plan.ram_nbytes - raw.shape[0]))


def ram_bytes_np(plan: Plan, leaves) -> np.ndarray:
    """`ram_bytes` in numpy, for concrete leaves (outside a trace)."""
    parts = []
    for x in leaves:
        x = np.asarray(x)
        x = x.astype(np.uint8) if x.dtype == np.bool_ else x
        parts.append(np.ascontiguousarray(x).reshape(-1).view(np.uint8))
    raw = np.concatenate(parts) if parts else np.zeros((0,), np.uint8)
    return np.pad(raw, (0, plan.ram_nbytes - raw.shape[0]))


def ram_from_bytes(plan: Plan, raw: np.ndarray) -> list[np.ndarray]:
    """The RAM leaves that `ram_bytes` / `ram_bytes_np` encoded as ``raw`` (the ``ram``
    entry's bytes), as numpy arrays of ``plan``'s ``ram_avals``."""
    out, pos = [], 0
    for a in plan.ram_avals:
        dt = np.dtype(a.dtype)
        width = 1 if dt == np.bool_ else dt.itemsize
        n = int(np.prod(a.shape)) * width
        chunk = raw[pos : pos + n]
        x = chunk.view(np.uint8).astype(np.bool_) if dt == np.bool_ else chunk.view(dt)
        out.append(x.reshape(a.shape))
        pos += n
    return out
