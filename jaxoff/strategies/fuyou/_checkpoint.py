"""Fuyou's state in and out of the store: `fuyou_init`, `fuyou_save`, `fuyou_restore`, and
the parameters of a ``page_params`` store (`fuyou_resident`, `fuyou_params`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxoff._errors import ConfigError
from jaxoff.aio import PageStoreError
from jaxoff.optim.chunks import as_bits

from . import _params as fp
from ._bits import put_bits
from ._layout import (
    FuyouState,
    _abstract_params,
    _check_model,
    _is_block_path,
    _laid_out,
    _layer_chunks,
    _layout,
    _layouts,
    _updater,
)


def fuyou_init(
    model_cfg, tx, params, *, page_params: bool = False, read_ahead_bytes: int | None = None
) -> FuyouState:
    """Writes the initial optimizer state of ``params`` to ``tx``'s store (version 1).

    Args:
      model_cfg: the model's ``GPTConfig``.
      tx: ``jaxoff.optim.paged(inner, store_dir, chunk_bytes=...)``, with no global operations.
      params: the model's ``nnx.Param`` state (concrete arrays). A stacked block leaf is read
        one layer at a time (``leaf[j]``, every leaf of layer ``j`` before layer ``j + 1``),
        so it may also be any object with ``shape``, ``dtype`` and ``__getitem__(layer)``
        that makes a layer when asked, as :func:`jaxoff.nn.layerwise_params` gives: a model
        larger than memory is then never whole in it (with ``page_params``).
      page_params: write the stacked block parameters to the store too, for
        ``make_fuyou_step(..., page_params=True)``; the training state then holds
        `fuyou_resident` ``(params)`` instead of ``params``.
      read_ahead_bytes: how far the pager reads ahead of the step's takes (the next
        layer's state while a layer is differentiated and updated), and as much again of
        writes in flight (default `default_read_ahead_bytes`: 128 MiB or 1/32 of RAM, the
        larger); lower it to bound memory (at least two chunks are held each way). Fixed
        while the store is open: a different value for the same ``tx`` raises `ConfigError`
        (None keeps the one it was opened with).

    Returns:
      the `FuyouState` to put in ``TrainState.opt_state``.
    """
    _check_model(model_cfg)
    updater = _updater(tx)
    lay = _layout(tx, params, page_params, read_ahead_bytes)
    plan = lay.plan
    with jax.ensure_compile_time_eval():
        ram = [np.asarray(x) for x in updater.ram_init(plan)]
    paged_leaves = {e.leaf: e for e in lay.params}
    inits = [
        jax.jit(functools.partial(updater.chunk_init, plan, leaf.index)) for leaf in plan.leaves
    ]
    leaves = plan.params_def.flatten_up_to(params)

    def chunks(leaf, x, suffix: str):
        """One leaf's (one layer of a block leaf's) chunks and those of its state."""
        flat = np.asarray(x).reshape(-1)
        n_full, tail = _layer_chunks(lay, leaf)
        for c in range(n_full + (1 if tail else 0)):
            pc = flat[c * leaf.chunk_elems :][: leaf.chunk_elems]
            if leaf.master:
                pc = pc.astype(updater.master_dtype)
            out = [np.asarray(y) for y in inits[leaf.index](pc)]
            if leaf.master:
                out = [pc, *out]
            for k, y in zip(leaf.entries, out, strict=True):
                e = plan.entries[k]
                yield e.name + suffix, c, y.astype(e.storage)
        pe = paged_leaves.get(leaf.index)
        if pe is not None:
            for c, (start, n) in enumerate(pe.chunks):
                yield pe.name + suffix, c, flat[start : start + n].astype(pe.dtype)

    def every_chunk():
        for leaf, p in zip(plan.leaves, leaves, strict=True):
            if not lay.blocks[leaf.index]:
                yield from chunks(leaf, p, "")
        # layer by layer (every leaf of layer j, then j + 1): one layer in memory at a time,
        # and a layerwise model (jaxoff.nn.layerwise_params) makes each layer once
        for j in range(lay.num_layers):
            for leaf, p in zip(plan.leaves, leaves, strict=True):
                if lay.blocks[leaf.index]:
                    yield from chunks(leaf, p[j], f"@{j}")
        yield updater.ram_chunk(plan, ram)

    version = lay.txn.write_initial(every_chunk())
    return _state(version, ram)


def _state(version: int, ram) -> FuyouState:
    """The `FuyouState` of store version ``version`` with RAM leaves ``ram``."""
    return FuyouState(jnp.asarray(version, jnp.int32), tuple(jnp.asarray(x) for x in ram))


def fuyou_save(
    tx, opt_state: FuyouState, directory, *, in_store: bool = False, extra: dict | None = None
) -> int:
    """Copies the store version ``opt_state`` describes (optimizer state and, with
    ``page_params``, the block parameters) into the checkpoint directory ``directory``;
    returns its bytes.

    The copy is atomic and every chunk is verified on the way (``jaxoff.optim``'s
    ``ChunkUpdater.copy_out``, the format `fuyou_restore` and ``restore_paged`` read).
    ``in_store``: record that version of the store instead of copying it; ``extra``: recorded
    in its manifest.

    Raises:
      PageStoreError: ``opt_state`` is not the store's committed version (a stale state).
    """
    lay = _laid_out(tx, "fuyou_save")
    opt_state = jax.device_get(jax.block_until_ready(opt_state))
    lay.txn.settle()  # the step that made the state has committed
    try:
        lay.txn.check_version(opt_state.version)
    except PageStoreError as e:
        raise PageStoreError(f"fuyou_save: {e}; save the state the last step returned") from None
    return _updater(tx).copy_out(lay.txn, directory, in_store=in_store, extra=extra)


def fuyou_restore(
    model_cfg,
    tx,
    directory,
    *,
    page_params: bool = False,
    read_ahead_bytes: int | None = None,
) -> FuyouState:
    """Writes a checkpoint of `fuyou_save` into ``tx``'s store (any directory) as its next
    version; returns the `FuyouState` that reads it (to use instead of `fuyou_init`).
    ``page_params`` and ``read_ahead_bytes``: as for `fuyou_init`.

    Every chunk is checked against the checkpoint's checksums before it is written.

    Raises:
      PageStoreCorruptError: a chunk of the checkpoint is damaged (use an older one).
      PageStoreError: the checkpoint is incomplete, or holds another model's or another
        ``page_params``' state.
    """
    _check_model(model_cfg)
    lay = _layout(tx, _abstract_params(model_cfg), page_params, read_ahead_bytes)
    want = {n: (e.shape, e.dtype) for n, e in lay.store.entries.items()}
    updater = _updater(tx)
    updater.copy_in(lay.txn, lay.plan, directory, want=want)
    return _state(lay.store.version, updater.read_ram(lay.plan, lay.store))


def fuyou_resident(params):
    """``params`` with each stacked block leaf replaced by an empty array: the training
    state's parameters under ``page_params=True`` (the blocks are in the page store)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    return jax.tree.unflatten(
        treedef, [fp.placeholder(x) if _is_block_path(p) else x for p, x in flat]
    )


def fuyou_params(tx, params):
    """``params`` (the state's, from a ``page_params`` step) with the stacked block leaves
    read back from ``tx``'s store: the committed version, every chunk verified. For
    evaluation or export; it holds the whole model in memory.
    """
    lay = _layouts.get(_updater(tx))
    if lay is None or lay.store.closed or not lay.params:
        raise ConfigError(
            "fuyou_params reads the parameters of a page_params fuyou store: run fuyou_init("
            "..., page_params=True) with this optimizer first"
        )
    leaves = lay.plan.params_def.flatten_up_to(params)
    for e in lay.params:
        leaves[e.leaf] = np.stack(
            [lay.store.read(f"{e.name}@{j}").reshape(e.shape) for j in range(lay.num_layers)]
        )
    return jax.tree.unflatten(lay.plan.params_def, leaves)


def fuyou_master_bits(tx, params):
    """``params`` with each stacked block leaf made again from the store's committed fp32
    masters, as the bits of ``master.astype(dtype)`` (``dtype``: the block leaf's): the cast
    each step makes of its new master, so bitwise the parameters that step left, in the form
    ``make_fuyou_step(..., blocks_as_bits=True)`` holds them. Read and verified one layer at a
    time, each written into a stack of bits made once: the blocks are never whole as floats.
    The block leaves of ``params`` may be placeholders.

    Raises:
      ConfigError: no open fuyou store for ``tx``, or a block leaf without a master copy (its
        parameters are their own masters: float32).
    """
    lay = _layouts.get(_updater(tx))
    if lay is None or lay.store.closed:
        raise ConfigError(
            "fuyou_master_bits reads an open fuyou store: run fuyou_init or fuyou_restore "
            "with this optimizer first"
        )
    leaves = lay.plan.params_def.flatten_up_to(params)
    for leaf in lay.plan.leaves:
        if not lay.blocks[leaf.index]:
            continue
        if not leaf.master:
            raise ConfigError(
                f"block leaf {leaf.name} has no fp32 master in the store (its parameters are "
                "their own masters); it cannot be made from the store"
            )
        master = lay.plan.entries[leaf.entries[0]]
        stack = jnp.zeros(leaf.shape, as_bits(jnp.zeros((), leaf.dtype)).dtype)
        for j in range(leaf.shape[0]):
            x = jnp.asarray(lay.store.read(f"{master.name}@{j}").reshape(leaf.shape[1:]))
            stack = put_bits(stack, x.astype(leaf.dtype), j)
        leaves[leaf.index] = stack
    return jax.tree.unflatten(lay.plan.params_def, leaves)
