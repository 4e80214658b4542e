"""Fuyou's store layout: how a model's optimizer state (and, with ``page_params``, its
block parameters) sits in the page store, and the paging transaction its step runs through.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx

from jaxoff._errors import ConfigError, OptionError
from jaxoff.aio import PageStoreError
from jaxoff.nn import BLOCKS  # the stacked blocks of a jaxoff.nn model
from jaxoff.nn import check_model as check_protocol
from jaxoff.optim import PagedTransformation
from jaxoff.optim.chunks import (
    ChunkUpdater,
    PageTransaction,
    Plan,
    chunk_updater,
    ends_with_paged,
    path_name,
)
from jaxoff.plan import total_ram

from . import _params as fp


class FuyouState(NamedTuple):
    """The RAM part of Fuyou's optimizer state; the rest is version ``version`` of the store.

    Attributes:
      version: the store version this state describes (int32): the step reads it (the pager
        refuses a state that is not the store's version) and returns ``version + 1``.
      ram: the inner optimizer's RAM leaves (step counts, ...).
    """

    version: jax.Array
    ram: tuple[jax.Array, ...]


@dataclasses.dataclass
class _Layout:
    """How one model's optimizer state sits in the store, and the transaction of its step."""

    plan: Plan
    blocks: tuple[bool, ...]  # per plan leaf: a stacked block leaf
    num_layers: int
    txn: PageTransaction  # the store, its file table and pager
    params: list[fp.ParamEntry]  # with paged parameters: per stacked block leaf; else empty
    read_ahead_bytes: int = 0  # the pager's read-ahead (and writes in flight)

    @property
    def store(self):
        return self.txn.store

    @property
    def table(self) -> str:
        """The file table's name (what the step's paging calls name)."""
        return self.txn.table

    def names(self, leaf, layer_of=None):
        """The `EntryNames` of ``leaf``'s paged tensors: of one layer (``layer_of(env)``, the
        layer given the values of the scans the update runs in) for a stacked block leaf."""
        names = [self.plan.entries[k].name for k in leaf.entries]
        if layer_of is None:
            return lambda env: names
        return lambda env: [f"{n}@{layer_of(env)}" for n in names]


_layouts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()

_CLIP_MESSAGE = (
    "the fuyou strategy updates each layer inside the backward pass, as soon as its gradients "
    "exist, so it cannot run {ops}, which needs every gradient before the first update; use "
    "`clip_norm=0` (drop the global operation), or use zero_infinity (update after backward)"
)


def _updater(tx) -> ChunkUpdater:
    """The `ChunkUpdater` of ``tx``, refusing what Fuyou cannot run, saying why and what to do."""
    if not isinstance(tx, PagedTransformation):
        if ends_with_paged(tx):
            raise ConfigError(
                _CLIP_MESSAGE.format(
                    ops="global operations chained before jaxoff.paged (gradient clipping, ...)"
                )
            )
        raise ConfigError(
            "the fuyou strategy needs a paged optimizer: pass "
            "jaxoff.optim.paged(optax.adamw(...), store_dir, chunk_bytes=...) as tx"
        )
    updater = chunk_updater(tx)
    if updater.has_global_ops:
        raise OptionError(
            _CLIP_MESSAGE.format(
                ops="the global operations leading the chain "
                "given to jaxoff.paged (gradient clipping, ...)"
            )
        )
    return updater


def _check_model(model_cfg) -> None:

    check_protocol(model_cfg, needs=["fuyou"])
    stack = model_cfg.stack
    bad = {k: getattr(stack, k) for k in ("stream_window", "split_layers") if getattr(stack, k)}
    if stack.remat_every != 1:
        bad["remat_every"] = stack.remat_every
    if bad:
        raise ConfigError(
            f"the fuyou strategy runs one block per layer step (recomputed in backward) and "
            f"cannot be combined with {bad}; set them to their defaults"
        )


def _check_read_ahead(read_ahead_bytes) -> int:
    """``read_ahead_bytes`` (None: `default_read_ahead_bytes`) as a checked int."""
    if read_ahead_bytes is None:
        return default_read_ahead_bytes()
    if (
        isinstance(read_ahead_bytes, bool)
        or not isinstance(read_ahead_bytes, (int, np.integer))
        or read_ahead_bytes < 0
    ):
        raise ConfigError(
            f"read_ahead_bytes={read_ahead_bytes!r}: give the bytes the pager reads ahead of "
            "the step as an int >= 0 (0 keeps its least, two chunks; None, the default, "
            f"{default_read_ahead_bytes()} on this machine, reads a layer whole when its state "
            "fits)"
        )
    return int(read_ahead_bytes)


def _layout(tx, params, page_params: bool = False, read_ahead_bytes=None) -> _Layout:
    """The layout of ``params``' optimizer state (opens the store, its file table and pager);
    with ``page_params``, the stacked block parameters' entries too. ``read_ahead_bytes``
    (None: what the layout was made with, else `default_read_ahead_bytes`): the pager's
    read-ahead, and as much again of writes in flight."""
    updater = _updater(tx)
    budget = None if read_ahead_bytes is None else _check_read_ahead(read_ahead_bytes)
    with _lock:
        lay = _layouts.get(updater)
        if lay is not None and not lay.store.closed:
            if bool(lay.params) != page_params:
                raise ConfigError(
                    f"the fuyou store {updater.root} was laid out "
                    f"{'with' if lay.params else 'without'} paged parameters; use the same "
                    "page_params for fuyou_init and make_fuyou_step"
                )
            if budget is not None and budget != lay.read_ahead_bytes:
                raise ConfigError(
                    f"the fuyou store {updater.root} is open with read_ahead_bytes="
                    f"{lay.read_ahead_bytes} (its pager's buffers are sized for it); to read "
                    f"{budget} bytes ahead, close this optimizer (tx.close()) and pass "
                    "read_ahead_bytes to fuyou_init or fuyou_restore with a new one"
                )
            return lay
        if budget is None:
            budget = _check_read_ahead(None)
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        blocks = tuple(_is_block_path(p) for p, _ in flat)
        if not any(blocks):
            raise ConfigError(
                "the fuyou strategy needs a model with stacked blocks "
                f"(a '{BLOCKS}' parameter subtree, as jaxoff.nn models have)"
            )
        num_layers = next(np.shape(x)[0] for (_, x), b in zip(flat, blocks, strict=True) if b)
        # a stacked leaf is paged one layer at a time: only a layer's chunks are indexed
        plan = updater.plan(params, parts=tuple(num_layers if b else 1 for b in blocks))
        entries = {}
        for e in plan.entries:
            shape = plan.leaves[e.leaf].shape
            if blocks[e.leaf]:
                for layer in range(num_layers):
                    entries[f"{e.name}@{layer}"] = (shape[1:], e.storage)
            else:
                entries[e.name] = (shape, e.storage)
        pleaves = [leaf for leaf in plan.leaves if page_params and blocks[leaf.index]]
        for leaf in pleaves:
            for layer in range(num_layers):
                entries[f"{fp.entry_name(leaf.name)}@{layer}"] = (leaf.shape[1:], leaf.dtype)
        name, spec = plan.ram_entry()  # the RAM leaves' bytes, last
        entries[name] = spec
        store = updater.store
        if store is not None and list(store.entries) != list(entries):
            raise PageStoreError(
                f"page store {updater.root} holds other entries than the fuyou layout of this "
                f"model{' with paged parameters' if page_params else ''} (a plain jaxoff.paged "
                "store, or one laid out with the other page_params?): give fuyou its own store "
                "directory"
            )
        # tx.close() closes it
        txn = updater.open(entries, read_ahead_bytes=budget, stale_fix=STALE_FIX)
        chunk = txn.store.chunk_bytes
        pentries = [
            fp.ParamEntry(
                leaf.index,
                fp.entry_name(leaf.name),
                tuple(leaf.shape[1:]),
                np.dtype(leaf.dtype),
                fp.layer_chunks(leaf.shape[1:], leaf.dtype, chunk),
            )
            for leaf in pleaves
        ]
        lay = _Layout(plan, blocks, num_layers, txn, pentries, budget)
        _layouts[updater] = lay
        return lay


# ``read_ahead_bytes`` of `fuyou_init` and `fuyou_restore`: how far the pager reads ahead of
# the step's takes, in the order of its plan (the next layer's state while this layer is
# differentiated and updated; with paged parameters, the next layer's parameters too), and
# as much again of writes in flight. A layer whose state fits is read whole before its update
# starts; a larger one has part of its reads left for its update, after the layer's matmuls,
# not hidden.
READ_AHEAD_BYTES = 128 << 20  # the least default
READ_AHEAD_RAM_FRACTION = 32  # the default is at most this fraction of RAM above the least


def default_read_ahead_bytes() -> int:
    """The default ``read_ahead_bytes``: ``max(READ_AHEAD_BYTES, RAM / 32)`` (768 MiB on a
    24 GiB machine, a whole layer of a 50M-parameter block's AdamW state): the pager's
    buffers, twice the budget, stay within a sixteenth of RAM."""

    return max(READ_AHEAD_BYTES, int(total_ram()) // READ_AHEAD_RAM_FRACTION)


def _part_chunks(leaf, parts: int) -> tuple[int, int]:
    """``(n_full, tail)`` of one of ``parts`` equal parts of ``leaf``."""
    return divmod(leaf.size // parts, leaf.chunk_elems)


def _layer_chunks(lay: _Layout, leaf) -> tuple[int, int]:
    """``(n_full, tail)`` of one layer's slice of a stacked leaf, or of a whole other leaf."""
    return _part_chunks(leaf, lay.num_layers if lay.blocks[leaf.index] else 1)


def _abstract_params(model_cfg):
    """The ``nnx.Param`` state of ``model_cfg``'s model, as shapes (nothing allocated)."""
    return nnx.split(nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0))), nnx.Param)[1]


def _laid_out(tx, what: str) -> _Layout:
    """The layout `fuyou_init` / `fuyou_restore` made for ``tx``'s store (still open)."""
    lay = _layouts.get(_updater(tx))
    if lay is None or lay.store.closed:
        raise ConfigError(
            f"{what} needs the fuyou store of this optimizer open: run fuyou_init(...) or "
            "fuyou_restore(...) with it first (and do not close it before)"
        )
    return lay


def fuyou_table(tx) -> str:
    """The name of the file table the Fuyou step of ``tx`` pages through (for
    ``jaxoff.aio.io_stats``: its I/O time and waits)."""
    return _laid_out(tx, "fuyou_table").table


def _is_block_path(path) -> bool:
    return path_name(path[:1]) == BLOCKS


STALE_FIX = (
    "It was probably restored without its page store contents after the store moved on: "
    "checkpoint a fuyou state with fuyou_save / fuyou_restore, or start again from fuyou_init"
)


check_model = _check_model  # public: a model Fuyou can step (raises ConfigError naming what not)
