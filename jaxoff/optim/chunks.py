"""The chunk API of the paged optimizer, for strategy authors: how a strategy pages its state.

`jaxoff.optim.paged` updates every parameter leaf chunk by chunk after the backward pass. A
strategy that runs the update elsewhere (Fuyou, ``jaxoff.strategies.fuyou``: layer ``j``'s
update inside the backward layer scan) lays out a page store of its own and drives the
paging itself, but computes every chunk exactly as `paged` does, so that its training is
bitwise the sequential paged update. This module is what it builds on; a strategy imports
nothing private of ``jaxoff.optim``.

How a strategy pages its state, step by step:

1. **Chunk layout.** `chunk_updater` (``tx`` is what `paged` returns; `ends_with_paged` tells
   a chain ending with it) gives the transformation's `ChunkUpdater`, whose ``plan(params)``
   is a `Plan`: per parameter leaf a `LeafPlan` (shape, chunk size, its store ``entries``:
   the fp32 master copy first when the parameter is not one, then each state tensor), the
   entry names (`path_name` spells a leaf's tree path as they do) and the inner optimizer's
   small RAM leaves (step counts), kept as the bytes of one entry named `RAM_ENTRY`.
   ``Plan.store_entries()`` is the store layout `paged` uses; a strategy may cut it further
   (Fuyou stores one entry per layer of a stacked leaf).
2. **Initial state.** ``updater.chunk_init`` and ``updater.ram_init`` give the initial
   chunks and RAM leaves; `write_chunk` writes a chunk into the store's inactive slot and
   returns its crc32c, and ``PageStore.commit`` makes them version 1. `ram_bytes` (traced)
   and `ram_bytes_np` (concrete) encode the RAM leaves as that entry's bytes;
   `ram_from_bytes` decodes them.
3. **Step plan.** `StepPlan` over the plan (and per leaf the parts it is paged in: a
   stacked leaf a layer at a time) lists the step's reads and writes in order, one `ChunkIO`
   each, and chooses what is read ahead within a staging budget (``read_ahead``).
4. **Paging the update.** `entry_ios` gives, per store entry, where its chunks are (an
   `EntryIO`: file ids per slot and offsets); ``updater.update_leaf`` reads a leaf's (or a
   layer's) chunks from the slot the state names, runs `paged`'s chunk arithmetic on them and
   writes the new chunks to the other slot, returning their checksums;
   ``updater.prefetch_head`` / ``prefetch_chunks`` start reads early. `as_bits` is the
   bit-cast a strategy uses to carry 16-bit floats through a scan unchanged.
5. **Commit.** `StepCommit` holds the step's two host calls over neutral data (the store,
   the state's version, the chunk checksums by entry name): ``check`` before the first read
   refuses a stale state (`stale_reason` says why), ``commit`` after every write is durable
   makes the next version, committed in the background; `commit_gate` is the token every
   write of the next step follows. The checksums travel as one host-call operand:
   `pack_crcs` packs them, `unpack_crcs` with `crc_shapes` splits them.
6. **Checkpoints.** `copy_out` streams the store's committed version into a checkpoint
   directory; `copy_in` writes it back as the store's next version (what `save_paged` and
   `restore_paged` do for `paged`'s own store).

Example: the plan of a small parameter tree, the reads of its step, and a store laid out as
`paged` lays it out, written and committed by hand (a strategy's init):

    >>> import optax, tempfile, numpy as np, jax.numpy as jnp
    >>> from jaxoff.aio import PageStore
    >>> from jaxoff.optim import paged
    >>> from jaxoff.optim.chunks import (
    ...     StepPlan, chunk_updater, ram_bytes_np, stale_reason, write_chunk, RAM_ENTRY)
    >>> tx = paged(optax.adam(1e-3), tempfile.mkdtemp() + "/s", chunk_bytes=4096)
    >>> updater = chunk_updater(tx)
    >>> params = {"w": jnp.ones((2, 1500), jnp.float32)}
    >>> plan = updater.plan(params)
    >>> [e.name for e in plan.entries]  # float32 parameters are their own master copy
    ['opt.0.mu.w', 'opt.0.nu.w']
    >>> StepPlan(plan).chunks(plan.leaves[0])  # 3000 elements in chunks of 1024
    [1024, 1024, 952]
    >>> [(io.kind, io.entry, io.chunk) for io in StepPlan(plan).ios()][:4]
    [('read', 0, 0), ('read', 1, 0), ('write', 0, 0), ('write', 1, 0)]
    >>> store = PageStore.create(tempfile.mkdtemp(), plan.store_entries(), chunk_bytes=4096)
    >>> leaf = plan.leaves[0]
    >>> crcs = {e.name: [] for e in plan.entries}
    >>> for c, n in enumerate(StepPlan(plan).chunks(leaf)):
    ...     p = jnp.ones((n,), jnp.float32)
    ...     for k, x in zip(leaf.entries, updater.chunk_init(plan, 0, p)):
    ...         name = plan.entries[k].name
    ...         crcs[name].append(write_chunk(store, name, c, np.asarray(x)))
    >>> ram = ram_bytes_np(plan, updater.ram_init(plan))
    >>> crcs[RAM_ENTRY] = [write_chunk(store, RAM_ENTRY, 0, ram)]
    >>> version = store.commit(crcs)
    >>> stale_reason(store, version, crcs) is None  # a state of this version is current
    True
    >>> store.close(); tx.close()
"""

from __future__ import annotations

from ._checkpoint import copy_in as copy_in
from ._checkpoint import copy_out as copy_out
from ._chunks_api import ChunkUpdater as ChunkUpdater
from ._chunks_api import chunk_updater as chunk_updater
from ._chunks_api import ends_with_paged as ends_with_paged
from ._chunks_api import write_chunk as write_chunk
from ._codec import crc_shapes as crc_shapes
from ._codec import entry_ios as entry_ios
from ._codec import pack_crcs as pack_crcs
from ._codec import ram_bytes as ram_bytes
from ._codec import ram_bytes_np as ram_bytes_np
from ._codec import ram_from_bytes as ram_from_bytes
from ._codec import unpack_crcs as unpack_crcs
from ._commit import StepCommit as StepCommit
from ._commit import commit_gate as commit_gate
from ._commit import stale_reason as stale_reason
from ._pipeline import EntryIO as EntryIO
from ._pipeline import as_bits as as_bits
from ._plan import RAM_ENTRY as RAM_ENTRY
from ._plan import LeafPlan as LeafPlan
from ._plan import Plan as Plan
from ._plan import path_name as path_name
from ._stepplan import ChunkIO as ChunkIO
from ._stepplan import StepPlan as StepPlan

__all__ = [
    # 1. chunk layout
    "RAM_ENTRY",
    "ChunkUpdater",
    "LeafPlan",
    "Plan",
    "chunk_updater",
    "ends_with_paged",
    "path_name",
    # 2. initial state, the RAM entry
    "ram_bytes",
    "ram_bytes_np",
    "ram_from_bytes",
    "write_chunk",
    # 3. step plan
    "ChunkIO",
    "StepPlan",
    # 4. paging the update
    "EntryIO",
    "as_bits",
    "entry_ios",
    # 5. commit
    "StepCommit",
    "commit_gate",
    "crc_shapes",
    "pack_crcs",
    "stale_reason",
    "unpack_crcs",
    # 6. checkpoints
    "copy_in",
    "copy_out",
]
