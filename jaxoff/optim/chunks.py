"""The chunk API of the paged optimizer, for strategy authors: how a strategy pages its state.

`jaxoff.optim.paged` updates every parameter leaf chunk by chunk after the backward pass. A
strategy that runs the update elsewhere (Fuyou, ``jaxoff.strategies.fuyou``: layer ``j``'s
update inside the backward layer scan) lays out a page store of its own and drives the
paging itself, but computes every chunk exactly as `paged` does, so that its training is
bitwise the sequential paged update, and pages through the same transaction. This module is
what it builds on; a strategy imports nothing private of ``jaxoff.optim``.

How a strategy pages its state, step by step:

1. **Chunk layout.** `chunk_updater` (``tx`` is what `paged` returns; `ends_with_paged` tells
   a chain ending with it) gives the transformation's `ChunkUpdater`, whose ``plan(params)``
   is a `Plan`: per parameter leaf a `LeafPlan` (shape, chunk size, its store ``entries``:
   the fp32 master copy first when the parameter is not one, then each state tensor), the
   entry names (`path_name` spells a leaf's tree path as they do) and the inner optimizer's
   small RAM leaves (step counts), kept as the bytes of one entry of their own
   (``updater.ram_chunk`` writes them, ``updater.put_ram`` in a step, ``updater.read_ram``
   reads them back). ``Plan.store_entries()`` is the store layout `paged` uses; a strategy
   may cut it further (Fuyou stores one entry per layer of a stacked leaf).
2. **The transaction.** ``updater.open(entries)`` opens the store with the strategy's
   layout, its file table and its pager: a `PageTransaction`, closed with ``tx.close()``
   (a `PagedTable` names the table and keeps the step plans traced for it).
   ``txn.write_initial`` writes and commits the first version (``updater.chunk_init`` and
   ``updater.ram_init`` give its chunks, ``updater.ram_chunk`` the RAM leaves' chunk).
3. **One step.** ``rec = txn.begin(state.version)`` starts it (the pager refuses a stale
   state) and returns the step's `StepRecorder`; ``updater.update_leaf(rec, ...)`` takes a
   leaf's (or a layer's) chunks, runs `paged`'s chunk arithmetic on them and puts the new
   chunks (`fixed_names` names a leaf's entries when no scan changes them);
   ``rec.take`` / ``rec.put`` move other chunks (Fuyou's paged parameters); ``rec.scan`` is
   ``lax.scan`` for a body that pages (a chunk or layer index of each trip addresses its
   chunks); ``updater.put_ram`` puts the new RAM leaves and ``rec.commit()`` ends the
   step. The recorded `StepPlan` is what the pager follows; the step returns
   ``state.version + 1``. `as_bits` is the bit-cast a strategy uses to carry 16-bit floats
   through a scan unchanged.
4. **Checkpoints.** ``updater.copy_out`` streams the store's committed version into a
   checkpoint directory; ``updater.copy_in`` writes it back as the store's next version (what
   `save_paged` and `restore_paged` do for `paged`'s own store); ``txn.check_version``
   refuses a stale state.

Example: a store laid out as `paged` lays it out, written by hand (a strategy's init), and
one step that updates the leaf through it, bitwise as plain optax does:

    >>> import optax, tempfile, numpy as np, jax, jax.numpy as jnp
    >>> from jaxoff.optim import paged
    >>> from jaxoff.optim.chunks import chunk_updater, fixed_names
    >>> tx = paged(optax.adam(1e-3), tempfile.mkdtemp() + "/s", chunk_bytes=4096)
    >>> updater = chunk_updater(tx)
    >>> params = {"w": jnp.ones((2, 1500), jnp.float32)}
    >>> plan = updater.plan(params)
    >>> [e.name for e in plan.entries]  # float32 parameters are their own master copy
    ['opt.0.mu.w', 'opt.0.nu.w']
    >>> txn = updater.open(plan.store_entries())
    >>> leaf, ram = plan.leaves[0], updater.ram_init(plan)
    >>> chunks = []
    >>> for c in range(leaf.num_chunks):  # 3000 elements in chunks of 1024
    ...     p = jnp.ones((leaf.chunk_size(c),), jnp.float32)
    ...     for k, x in zip(leaf.entries, updater.chunk_init(plan, 0, p)):
    ...         chunks.append((plan.entries[k].name, c, np.asarray(x)))
    >>> chunks.append(updater.ram_chunk(plan, ram))
    >>> txn.write_initial(chunks)
    1
    >>> @jax.jit
    ... def step(version, w, g, ram):
    ...     rec = txn.begin(version)
    ...     names = fixed_names([plan.entries[k].name for k in leaf.entries])
    ...     new_w = updater.update_leaf(rec, plan, leaf, g, w, ram, names)
    ...     new_ram = updater.ram_update(plan, ram)
    ...     updater.put_ram(rec, plan, new_ram)
    ...     rec.commit()
    ...     return version + 1, new_w, new_ram
    >>> grads = {"w": jnp.full((2, 1500), 0.5, jnp.float32)}
    >>> version, new_w, ram = step(jnp.int32(1), params["w"], grads["w"], ram)
    >>> ref = optax.adam(1e-3)
    >>> u, _ = ref.update(grads, ref.init(params), params)
    >>> int(version), bool(jnp.array_equal(new_w, optax.apply_updates(params, u)["w"]))
    (2, True)
    >>> tx.close()
"""

from __future__ import annotations

from ._chunks_api import ChunkUpdater as ChunkUpdater
from ._chunks_api import chunk_updater as chunk_updater
from ._chunks_api import ends_with_paged as ends_with_paged
from ._pipeline import as_bits as as_bits
from ._pipeline import fixed_names as fixed_names
from ._plan import LeafPlan as LeafPlan
from ._plan import Plan as Plan
from ._plan import path_name as path_name
from ._stepplan import StepPlan as StepPlan
from ._transaction import PagedTable as PagedTable
from ._transaction import PageTransaction as PageTransaction
from ._transaction import StepRecorder as StepRecorder

__all__ = [
    # 1. chunk layout
    "ChunkUpdater",
    "LeafPlan",
    "Plan",
    "chunk_updater",
    "ends_with_paged",
    "path_name",
    # 2. and 3. the transaction, one step
    "PageTransaction",
    "PagedTable",
    "StepPlan",
    "StepRecorder",
    "as_bits",
    "fixed_names",
]
