"""Fuyou's store layout: how a model's optimizer state (and, with ``page_params``, its
block parameters) sits in the page store, and the tables the step indexes; the state's
checks (`StepCommit`) and the read-ahead (`StepPlan`) of that layout.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx

from jaxoff._errors import ConfigError
from jaxoff.aio import (
    HostCalls,
    PageStore,
    PageStoreError,
    register_file_table,
    unregister_file_table,
)
from jaxoff.nn import BLOCKS  # the stacked blocks of a jaxoff.nn model
from jaxoff.optim import PagedTransformation
from jaxoff.optim.chunks import (
    RAM_ENTRY,
    ChunkUpdater,
    Plan,
    StepCommit,
    StepPlan,
    chunk_updater,
    ends_with_paged,
    entry_ios,
    path_name,
)

from . import _params as fp


class FuyouState(NamedTuple):
    """The RAM part of Fuyou's optimizer state; the rest is version ``version`` of the store.

    Attributes:
      version: the store version this state describes (reads come from its slot).
      crcs: per plan entry (``ChunkUpdater.plan`` order), the crc32c of each chunk: ``uint32[L, n]``
        for an entry of a stacked block leaf (``n`` chunks per layer), ``uint32[n]`` else;
        then ``uint32[1]`` for the ``ram`` entry.
      ram: the inner optimizer's RAM leaves (step counts, ...).
      params: with paged parameters (``page_params=True``), per stacked block leaf (plan
        order), the crc32c of each chunk of each layer's parameters, ``uint32[L, n]``; else
        empty.
    """

    version: jax.Array
    crcs: tuple[jax.Array, ...]
    ram: tuple[jax.Array, ...]
    params: tuple[jax.Array, ...] = ()


@dataclasses.dataclass
class _Layout:
    """How one model's optimizer state sits in the store, and the tables the step indexes."""

    plan: Plan
    blocks: tuple[bool, ...]  # per plan leaf: a stacked block leaf
    num_layers: int
    store_names: list[str]  # the optimizer state's store entry names, in store order
    store_of: list[tuple[int, int]]  # per store entry: (crcs index, layer or -1)
    fids: list[np.ndarray]  # per plan entry: int32 [L, 2, n] (block) or [2, n]
    offs: list[np.ndarray]  # per plan entry: uint32 [L, n, 2] (block) or [n, 2]
    store: PageStore
    params: list[fp.ParamEntry]  # with paged parameters: per stacked block leaf; else empty
    calls: HostCalls  # the step's host calls (and the table's name)
    # per plan leaf with paged tensors: the sizes (elements) of the leading chunks of its
    # part (a layer's slice, or the whole leaf) read ahead of its update (`_read_ahead`)
    head_sizes: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    read_ahead_bytes: int = 0  # the budget head_sizes were chosen within
    commits: StepCommit | None = None  # the step's check and commit (`_named_crcs`)

    @property
    def table(self) -> str:
        """The file table's name: the host calls' owner prefix (see ``Pager.table``)."""
        return self.calls.prefix


_layouts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()

_CLIP_MESSAGE = (
    "the fuyou strategy updates each layer inside the backward pass, as soon as its gradients "
    "exist, so it cannot run {ops}, which needs every gradient before the first update; use "
    "--clip-norm 0 (drop the global operation), or use zero_infinity (update after backward)"
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
        raise ConfigError(
            _CLIP_MESSAGE.format(
                ops="the global operations leading the chain "
                "given to jaxoff.paged (gradient clipping, ...)"
            )
        )
    return updater


def _check_model(model_cfg) -> None:
    from jaxoff.nn import check_model

    check_model(model_cfg, needs=["fuyou"])
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
            f"read_ahead_bytes={read_ahead_bytes!r}: give the bytes of optimizer state read "
            "ahead of a layer's update as an int >= 0 (0 reads each tensor's first chunk "
            f"only; None, the default, {default_read_ahead_bytes()} on this machine, reads a "
            "layer whole when its state fits)"
        )
    return int(read_ahead_bytes)


def _layout(tx, params, page_params: bool = False, read_ahead_bytes=None) -> _Layout:
    """The layout of ``params``' optimizer state (opens the store and registers its files);
    with ``page_params``, the stacked block parameters' entries too. ``read_ahead_bytes``
    (None: what the layout was made with, else `default_read_ahead_bytes`): the budget of the
    optimizer state read ahead of a layer's update, staged twice (see `_read_ahead`)."""
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
                    f"{lay.read_ahead_bytes} (its staging is sized for it); to read "
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
        entries, store_of = {}, []
        for k, e in enumerate(plan.entries):
            shape = plan.leaves[e.leaf].shape
            if blocks[e.leaf]:
                for layer in range(num_layers):
                    entries[f"{e.name}@{layer}"] = (shape[1:], e.storage)
                    store_of.append((k, layer))
            else:
                entries[e.name] = (shape, e.storage)
                store_of.append((k, -1))
        pleaves = [leaf for leaf in plan.leaves if page_params and blocks[leaf.index]]
        for leaf in pleaves:
            for layer in range(num_layers):
                entries[f"{fp.entry_name(leaf.name)}@{layer}"] = (leaf.shape[1:], leaf.dtype)
        entries[RAM_ENTRY] = ((plan.ram_nbytes,), np.dtype(np.uint8))
        store_of.append((len(plan.entries), -1))
        store = updater.store
        if store is None or store.closed:
            store = PageStore.open_or_create(
                updater.root, entries, chunk_bytes=updater.chunk_bytes, slots=updater.slots
            )
        if list(store.entries) != list(entries):
            raise PageStoreError(
                f"page store {updater.root} holds other entries than the fuyou layout of this "
                f"model{' with paged parameters' if page_params else ''} (a plain jaxoff.paged "
                "store, or one laid out with the other page_params?): give fuyou its own store "
                "directory"
            )
        updater.store = store  # tx.close() releases it
        need = updater.split_phase_bytes(plan)
        chunk = store.chunk_bytes
        # a layer's parameters prefetched ahead, and a layer's written behind, when paged
        need += 2 * sum(-(-fp.layer_nbytes(lf) // chunk) * chunk for lf in pleaves)
        # the leading chunks of every leaf of a layer prefetched a layer ahead of its update
        # (two layers' at once: one being taken, the next one issued), and of every other
        # leaf from the start of the backward pass
        head_sizes = {}
        for group in (True, False):
            leaves_ = [lf for lf in plan.leaves if blocks[lf.index] == group]
            parts = num_layers if group else 1
            head_sizes.update(_read_ahead(updater, plan, leaves_, parts, budget))
        for k, sizes in head_sizes.items():
            leaf = plan.leaves[k]
            held = sum(updater.head_bytes(plan, leaf, n) for n in sizes)
            need += (2 if blocks[k] else 1) * held
        engine = updater.engine
        if engine.pool_bytes < need:
            engine = dataclasses.replace(engine, pool_bytes=need)
        calls = HostCalls("jaxoff.fuyou")  # names the table and the host calls (see Pager.table)
        table = calls.prefix
        registration = register_file_table(table, store.file_table(), config=engine)
        # the table holds the store's files open: released with the store (tx.close())
        updater.on_close(functools.partial(unregister_file_table, table, registration))
        per_store = [(io.file_ids, io.offsets) for io in entry_ios(store)]
        n_opt = len(store_of) - 1
        fids: list = [[] for _ in plan.entries]
        offs: list = [[] for _ in plan.entries]
        for (k, _), (f, o) in zip(store_of[:-1], per_store[:n_opt], strict=True):
            fids[k].append(f)
            offs[k].append(o)
        for k, e in enumerate(plan.entries):
            if blocks[e.leaf]:
                fids[k], offs[k] = np.stack(fids[k]), np.stack(offs[k])
            else:
                fids[k], offs[k] = fids[k][0], offs[k][0]
        fids.append(per_store[-1][0])
        offs.append(per_store[-1][1])
        pentries = []
        for i, leaf in enumerate(pleaves):
            rows = per_store[n_opt + i * num_layers : n_opt + (i + 1) * num_layers]
            pentries.append(
                fp.ParamEntry(
                    leaf.index,
                    fp.entry_name(leaf.name),
                    tuple(leaf.shape[1:]),
                    np.dtype(leaf.dtype),
                    fp.layer_chunks(leaf.shape[1:], leaf.dtype, chunk),
                    np.stack([f for f, _ in rows]),
                    np.stack([o for _, o in rows]),
                )
            )
        names = list(entries)  # the optimizer's entries, then the parameters', then RAM's
        names = names[:n_opt] + names[-1:]
        lay = _Layout(
            plan,
            blocks,
            num_layers,
            names,
            store_of,
            fids,
            offs,
            store,
            pentries,
            calls,
            head_sizes,
            budget,
        )
        lay.commits = StepCommit(
            lambda: lay.store, store.root, calls, functools.partial(_named_crcs, lay), _STALE_FIX
        )
        _layouts[updater] = lay
        return lay


# ``read_ahead_bytes`` of `fuyou_init` and `fuyou_restore`: bytes of optimizer state read
# ahead of one layer's update (and, separately, of the other leaves' updates): the leading
# chunks of its tensors, read while the layer above is differentiated. A layer whose state
# fits is read whole before its update starts; a larger one has its first chunks read ahead
# and the rest in its update's pipeline, after the layer's matmuls (on XLA's CPU runtime),
# so that part of its I/O is not hidden. Staging holds two layers' worth at once (one being
# taken, the next one issued), each read counted twice (see `prefetch_bytes`).
READ_AHEAD_BYTES = 128 << 20  # the least default
READ_AHEAD_RAM_FRACTION = 32  # the default is at most this fraction of RAM above the least


def default_read_ahead_bytes() -> int:
    """The default ``read_ahead_bytes``: ``max(READ_AHEAD_BYTES, RAM / 32)`` (768 MiB on a
    24 GiB machine, a whole layer of a 50M-parameter block's AdamW state): the staging it may
    hold, four times the budget, stays within an eighth of RAM."""
    from jaxoff.plan._hardware import total_ram

    return max(READ_AHEAD_BYTES, int(total_ram()) // READ_AHEAD_RAM_FRACTION)


def _read_ahead(updater, plan, leaves, parts: int, budget: int) -> dict[int, list[int]]:
    """Per leaf of ``leaves`` (one group: a layer's block leaves, or the other leaves) with
    paged tensors, the sizes of the leading chunks of one of its ``parts`` equal parts to read
    ahead: every leaf's first chunk, then each leaf's next chunk in turn while the group's
    reads stay within ``budget`` bytes."""
    cost = lambda leaf, n: updater.read_bytes(plan, leaf, n)  # noqa: E731
    parts_of = tuple(parts for _ in plan.leaves)
    return StepPlan(plan, parts_of).read_ahead(leaves, budget, cost, order="round_robin")


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
    ``jaxoff.aio.file_table_stats``: its I/O time and waits)."""
    return _laid_out(tx, "fuyou_table").table


def _is_block_path(path) -> bool:
    return path_name(path[:1]) == BLOCKS


_STALE_FIX = (
    "It was probably restored without its page store contents after the store moved on: "
    "checkpoint a fuyou state with fuyou_save / fuyou_restore, or start again from fuyou_init"
)


def _named_crcs(lay: _Layout, crcs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """A `FuyouState`'s checksum arrays (its ``crcs``, then its ``params``) by store entry
    name: ``<entry>@<layer>`` for a layer of a stacked entry (row ``layer``)."""
    n_opt = len(lay.plan.entries) + 1
    out = {}
    for name, (k, layer) in zip(lay.store_names, lay.store_of, strict=True):
        c = np.asarray(crcs[k], np.uint32)
        out[name] = (c[layer] if layer >= 0 else c).reshape(-1)
    for e, c in zip(lay.params, crcs[n_opt:], strict=True):
        c = np.asarray(c, np.uint32)
        for j in range(lay.num_layers):
            out[f"{e.name}@{j}"] = c[j]
    return out


check_model = _check_model  # public: a model Fuyou can step (raises ConfigError naming what not)
