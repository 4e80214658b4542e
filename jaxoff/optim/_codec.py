"""How a paged state's bytes are encoded: the RAM leaves as the bytes of the ``ram`` entry
(`ram_bytes` traced, `ram_bytes_np` concrete, `ram_from_bytes` back), and a chunk written with
its crc32c (`write_chunk`).

>>> import numpy as np, types
>>> leaves = [np.int32(7), np.ones(2, np.float32)]
>>> raw = ram_bytes_np(types.SimpleNamespace(ram_nbytes=16), leaves)
>>> raw.size, raw[:4].view(np.int32).tolist()
(16, [7])
"""

from __future__ import annotations

import crc32c
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxoff.aio import PageStore
from jaxoff.optim._plan import Plan


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
