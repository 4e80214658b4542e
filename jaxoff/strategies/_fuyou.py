"""Fuyou: the NVMe-paged optimizer update runs inside the backward layer scan, pipelined.

Liao et al. 2024, "Adding NVMe SSDs to Enable and Accelerate 100B Model Fine-tuning on a
Single GPU". Plain paged training runs the whole backward pass, then pages every layer's
optimizer state through the update. Here the backward pass is a hand-written reverse scan over
the stacked blocks whose body computes layer ``j``'s gradients (the block's VJP, the block
recomputed from its saved input as under ``nothing_saveable``) and pages layer ``j + 1``'s
fp32 master and moments through the update (its gradients come from the previous body):
split-phase reads, the chunk arithmetic of ``jaxoff.paged`` (through its public chunk-update
API, `jaxoff.optim.chunk_updater`, so every element is bitwise what the sequential paged
update computes) and write-behind writes. Layer 0 is updated after the scan, then the
embeddings, final norm and head.

The backward scan is software-pipelined: its step for layer ``j`` differentiates layer ``j``
and pages layer ``j + 1``'s update (gradients carried from the previous step), with no data
path between the two in either direction (``tests/test_fuyou.py`` checks this on the traced
program), so the update's reads, arithmetic and writes may run while layer ``j``'s matmuls
do; ``jaxoff_page_take`` hands XLA's thread back while a read is in flight. Layer ``j``'s
optimizer state is read in the step that differentiates layer ``j``, a step before its update
takes it (the tickets cross the scan's carry): the whole layer when it fits
``fuyou_init``'s ``read_ahead_bytes`` (default 128 MiB or 1/32 of RAM), else the leading
chunks of every tensor that fit, the rest read by the update's own pipeline. The store commit
runs behind the next step (``PageStore.commit(background=True)``). A layer's gradients are
carried to its update flat: in their own shapes XLA:CPU stored the 2-D ones column-major and
transposed them back twice a layer. On the 2-core CPU this project is measured on
(``bench/fuyou.py``, ``bench/fuyou_capacity.py``, ``docs/strategies.md``), the step is 1.02,
1.01, 1.25, 1.27 and 0.99 times (five runs, median 1.02; its reads wait only while the disk
slows) its bound max(compute-only, pure I/O) at the 132-layer capacity record (d = 2048,
6.65B; compute-only extrapolated from 4 to 16 layers), 1.03 times on ``medium`` (304M) at
batch 1 and 1.11 times on ``mini`` (3.4M) at batch 4 (medians of three runs). On ``mini`` at
batch 1 it is 1.55 times: the update's own CPU work, many small calls, competes
with the matmuls for the same two cores, and XLA's CPU runtime runs a scan body's update
after its matmuls. The paper runs the update on the host CPU while the GPU computes.
Not done here: Fuyou's activation swapping to SSD, pipelined GPU-CPU-SSD, and its automatic
choice of how much to swap; activations stay on the device (each block's input, the block
recomputed in backward).

Store layout: each paged tensor of a stacked block leaf is stored as one entry per layer
(``<entry>@<layer>``), so that layer ``j``'s chunks are addressed with the dynamic scan index
(file ids, offsets and crcs are ``[L, ...]`` operands indexed by ``j``). Crash consistency is
the store's: every write goes to the inactive slot and one commit, after a ``page_flush`` of all
of the step's writes, makes them the next version at the end of the step.

Global operations that need every gradient first (``clip_by_global_norm``, ...) are refused.

Example:
    >>> import optax, tempfile, jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxoff.models.gpt import CONFIGS
    >>> from jaxoff.optim import paged
    >>> from jaxoff.step import TrainState
    >>> cfg = CONFIGS["tiny"]
    >>> graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    >>> tx = paged(optax.adamw(1e-3), tempfile.mkdtemp() + "/s", chunk_bytes=1 << 16)
    >>> state = TrainState(jnp.zeros((), jnp.int32), params, fuyou_init(cfg, tx, params))
    >>> step = jax.jit(make_fuyou_step(graphdef, cfg, tx), donate_argnums=0)
    >>> tokens = jnp.zeros((2, 16), jnp.int32)
    >>> state, metrics = step(state, tokens, tokens)
    >>> int(state.opt_state.version)
    2
    >>> tx.close()
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jaxoff._errors import ConfigError
from jaxoff._xla import is_half_float
from jaxoff.aio import (
    HostCalls,
    PageStore,
    PageStoreError,
    host_call,
    new_token,
    page_flush,
    page_out,
    register_file_table,
    unregister_file_table,
)
from jaxoff.nn import BLOCKS  # the stacked blocks of a jaxoff.nn model
from jaxoff.optim import (
    RAM_ENTRY,
    ChunkUpdater,
    EntryIO,
    PagedTransformation,
    Plan,
    as_bits,
    chunk_updater,
    commit_gate,
    copy_in,
    copy_out,
    crc_shapes,
    ends_with_paged,
    entry_ios,
    pack_crcs,
    path_name,
    ram_bytes,
    ram_bytes_np,
    ram_from_bytes,
    unpack_crcs,
    write_chunk,
)
from jaxoff.step import cross_entropy

from . import _fuyou_params as fp


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
    chunks = {}
    for leaf in leaves:
        if leaf.entries:
            n_full, tail = _part_chunks(leaf, parts)
            chunks[leaf.index] = [leaf.chunk_elems] * n_full + ([tail] if tail else [])

    def nbytes(k: int, n: int) -> int:
        return updater.read_bytes(plan, plan.leaves[k], n)

    taken = {k: c[:1] for k, c in chunks.items()}
    used = sum(nbytes(k, n) for k, c in taken.items() for n in c)
    while True:
        grew = False
        for k, c in chunks.items():
            i = len(taken[k])
            if i < len(c):
                cost = nbytes(k, c[i])
                if used + cost > budget:
                    return taken
                taken[k].append(c[i])
                used += cost
                grew = True
        if not grew:
            return taken


def _part_chunks(leaf, parts: int) -> tuple[int, int]:
    """``(n_full, tail)`` of one of ``parts`` equal parts of ``leaf``."""
    return divmod(leaf.size // parts, leaf.chunk_elems)


def _layer_chunks(lay: _Layout, leaf) -> tuple[int, int]:
    """``(n_full, tail)`` of one layer's slice of a stacked leaf, or of a whole other leaf."""
    return _part_chunks(leaf, lay.num_layers if lay.blocks[leaf.index] else 1)


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
      read_ahead_bytes: optimizer state read ahead of each layer's update, while the layer
        above it is differentiated (default `default_read_ahead_bytes`: 128 MiB or 1/32 of
        RAM, the larger): the whole layer when its state fits, else the leading chunks of
        each of its tensors (the rest is read by the update, after the layer's matmuls, not
        hidden). Staging may hold four times this (two layers in flight, each read counted
        twice); lower it to bound memory, 0 reads each tensor's first chunk only. Fixed
        while the store is open: a different value for the same ``tx`` raises
        `ConfigError` (None keeps the one it was opened with).

    Returns:
      the `FuyouState` to put in ``TrainState.opt_state``.
    """
    _check_model(model_cfg)
    updater = _updater(tx)
    lay = _layout(tx, params, page_params, read_ahead_bytes)
    plan, store = lay.plan, lay.store
    with jax.ensure_compile_time_eval():
        ram = [np.asarray(x) for x in updater.ram_init(plan)]
    crcs: dict[str, list[int]] = {}
    paged_leaves = {e.leaf: e for e in lay.params}
    inits = [
        jax.jit(functools.partial(updater.chunk_init, plan, leaf.index)) for leaf in plan.leaves
    ]
    leaves = plan.params_def.flatten_up_to(params)

    def write(leaf, x, suffix: str) -> None:
        """Writes one leaf (one layer of a block leaf) and its optimizer state."""
        flat = np.asarray(x).reshape(-1)
        n_full, tail = _layer_chunks(lay, leaf)
        for c in range(n_full + (1 if tail else 0)):
            pc = flat[c * leaf.chunk_elems :][: leaf.chunk_elems]
            if leaf.master:
                pc = pc.astype(updater.master_dtype)
            chunks = [np.asarray(y) for y in inits[leaf.index](pc)]
            if leaf.master:
                chunks = [pc, *chunks]
            for k, y in zip(leaf.entries, chunks, strict=True):
                e = plan.entries[k]
                name = e.name + suffix
                crcs.setdefault(name, []).append(write_chunk(store, name, c, y.astype(e.storage)))
        pe = paged_leaves.get(leaf.index)
        if pe is not None:
            crcs[pe.name + suffix] = [
                write_chunk(store, pe.name + suffix, c, flat[start : start + n].astype(pe.dtype))
                for c, (start, n) in enumerate(pe.chunks)
            ]

    for leaf, p in zip(plan.leaves, leaves, strict=True):
        if not lay.blocks[leaf.index]:
            write(leaf, p, "")
    # layer by layer (every leaf of layer j, then j + 1): one layer in memory at a time,
    # and a layerwise model (jaxoff.nn.layerwise_params) makes each layer once
    for j in range(lay.num_layers):
        for leaf, p in zip(plan.leaves, leaves, strict=True):
            if lay.blocks[leaf.index]:
                write(leaf, p[j], f"@{j}")
    crcs[RAM_ENTRY] = [write_chunk(store, RAM_ENTRY, 0, ram_bytes_np(plan, ram))]
    version = store.commit(crcs)
    return _state(lay, version, crcs, ram)


def _state(lay: _Layout, version: int, crcs: dict, ram) -> FuyouState:
    """The `FuyouState` of store version ``version``: ``crcs`` per store entry name."""
    out = []
    for e in lay.plan.entries:
        if lay.blocks[e.leaf]:
            out.append(np.stack([crcs[f"{e.name}@{j}"] for j in range(lay.num_layers)]))
        else:
            out.append(np.asarray(crcs[e.name]))
    out.append(np.asarray(crcs[RAM_ENTRY]))
    pcrcs = [np.stack([crcs[f"{e.name}@{j}"] for j in range(lay.num_layers)]) for e in lay.params]
    return FuyouState(
        jnp.asarray(version, jnp.int32),
        tuple(jnp.asarray(np.asarray(c, np.uint32)) for c in out),
        tuple(jnp.asarray(x) for x in ram),
        tuple(jnp.asarray(np.asarray(c, np.uint32)) for c in pcrcs),
    )


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


def fuyou_save(tx, opt_state: FuyouState, directory) -> int:
    """Copies the store version ``opt_state`` describes (optimizer state and, with
    ``page_params``, the block parameters) into the checkpoint directory ``directory``;
    returns its bytes.

    The copy is atomic and every chunk is verified on the way (``jaxoff.optim``'s
    ``copy_out``, the format `fuyou_restore` and ``restore_paged`` read).

    Raises:
      PageStoreError: ``opt_state`` is not the store's committed version (a stale state).
    """
    lay = _laid_out(tx, "fuyou_save")
    version = int(jax.device_get(jax.block_until_ready(opt_state).version))
    if version != lay.store.version:
        raise PageStoreError(
            f"fuyou_save: the optimizer state describes version {version} of page store "
            f"{lay.store.root}, which is at version {lay.store.version}: save the state the "
            "last step returned"
        )
    return copy_out(lay.store, directory)


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
    crcs, _ = copy_in(lay.store, lay.plan, directory, want=want)
    ram = ram_from_bytes(lay.plan, lay.store.read(RAM_ENTRY))
    return _state(lay, lay.store.version, crcs, [np.asarray(x) for x in ram])


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


def _used_inputs(fn, *args) -> list[bool]:
    """Per flat input of ``fn(*args)``: whether its jaxpr reads it."""
    closed = jax.make_jaxpr(fn)(*args)
    used = {id(v) for eqn in closed.jaxpr.eqns for v in eqn.invars}
    used |= {id(v) for v in closed.jaxpr.outvars}
    return [id(v) in used for v in closed.jaxpr.invars]


def make_fuyou_step(
    graphdef: nnx.GraphDef,
    model_cfg,
    tx,
    *,
    blocks_as_bits: bool = False,
    page_params: bool = False,
):
    """``train_step(state, inputs, targets) -> (state, metrics)`` with the update in backward.

    Same contract as ``jaxoff.train.make_train_step`` (the caller jits it with
    ``donate_argnums=0``); ``state.opt_state`` comes from `fuyou_init`.

    ``blocks_as_bits``: the stacked block leaves of ``state.params`` come (and go back) as
    their raw bits (`blocks_to_bits`). XLA's CPU backend computes 16-bit floats in float32,
    slicing and updating included, so the scans run over the bits of 16-bit floats either
    way; given such floats, the step converts them to bits and back (a second copy of the
    blocks while it runs), given bits it updates them in place. Use it when a 16-bit model
    nearly fills RAM. float32 blocks are updated in place as they are.

    ``page_params``: the stacked block parameters live in the page store
    (``fuyou_init(..., page_params=True)``; ``state.params`` is `fuyou_resident` of them).
    Each layer's parameters are read one layer ahead in forward and again in backward, and
    its new ones written by its update (see ``_fuyou_params``); `fuyou_params` reads them
    back. The arithmetic is unchanged: the step is bitwise the one without paging.

    Raises:
      ConfigError: ``tx`` is not a paged optimizer, or holds a global operation (clipping).
    """
    _check_model(model_cfg)
    updater = _updater(tx)
    cfg = model_cfg
    if page_params and blocks_as_bits:
        raise ConfigError(
            "page_params keeps the block parameters in the page store, not in the state: "
            "blocks_as_bits does not apply (drop it)"
        )
    abstract = _abstract_params(cfg) if page_params else None

    # the model protocol's two ends (jaxoff.nn): the blocks in between are run here
    def front(model, tokens):
        return model.embed_tokens(tokens)

    def back(model, h, targets):
        return cross_entropy(model.logits(h), targets)

    param_dtype = jnp.dtype(cfg.param_dtype)

    def train_step(state, inputs, targets):
        as_floats = (
            jax.tree.map(
                lambda x: (
                    jax.ShapeDtypeStruct(x.shape, param_dtype)
                    if jnp.issubdtype(x.dtype, jnp.unsignedinteger)
                    else x
                ),
                state.params,
            )
            if blocks_as_bits
            else state.params
        )
        lay = _layout(tx, abstract if page_params else as_floats, page_params)
        plan, opt = lay.plan, state.opt_state
        leaves = plan.params_def.flatten_up_to(state.params)
        bidx = [i for i, b in enumerate(lay.blocks) if b]
        ridx = [i for i, b in enumerate(lay.blocks) if not b]
        if page_params:
            fp.check_placeholders(leaves, bidx)
        read_slot = (opt.version % 2).astype(jnp.int32)

        def merged(rest, blocks):
            full = [None] * len(leaves)
            for i, x in zip(ridx, rest, strict=True):
                full[i] = x
            for i, x in zip(bidx, blocks, strict=True):
                full[i] = x
            return nnx.merge(graphdef, jax.tree.unflatten(plan.params_def, full))

        rest = [leaves[i] for i in ridx]
        dtypes = [plan.leaves[i].dtype for i in bidx]
        stacked = [leaves[i] if blocks_as_bits else _stack_form(leaves[i]) for i in bidx]
        block = _block_fn(merged(rest, stacked).blocks)

        # forward: each block's input is saved, nothing else (the block is recomputed)
        fwd = lambda r, t: front(merged(r, stacked), t)  # noqa: E731
        x0, front_vjp = jax.vjp(lambda r: fwd(r, inputs), rest)

        # Both scans slice layer j out of a 16-bit float stacked leaf's bits: XLA's CPU
        # backend computes 16-bit floats in float32, dynamic slices and updates included, and
        # would make a float32 copy of every such leaf (twice its bytes) and rewrite it whole
        # at every layer. Wider floats are sliced as they are (`_stack_form`).
        last = lay.num_layers - 1
        if page_params:
            # layer j + 1's reads run while layer j computes; the top layer's parameters are
            # kept for the backward scan, which differentiates it first
            h, saved, top_params = fp.forward(lay, opt.params, read_slot, block, x0)
        else:

            def fbody(h, j):
                return block(_layer(stacked, j, dtypes), h), h

            h, saved = lax.scan(fbody, x0, jnp.arange(lay.num_layers))
        bk = lambda r, h: back(merged(r, stacked), h, targets)  # noqa: E731
        loss, back_vjp = jax.vjp(bk, rest, h)
        # The last step's commit runs in the background (its cache flush behind this step's
        # forward pass); the first write of this step overwrites the slot of the version
        # before it, so every write follows this gate, which waits for that commit to be
        # durable (and raises its error) once the loss exists.
        gated = commit_gate(lambda: lay.store, lay.store.root, new_token(), loss, calls=lay.calls)
        g_back, gh = back_vjp(jnp.ones((), loss.dtype))

        inner_ram = list(opt.ram)
        new_ram = updater.ram_update(plan, inner_ram, {})
        new_crcs: list = [None] * (len(plan.entries) + 1)

        def leaf_ios(leaf, fids, offs):
            return [
                EntryIO(f, o, plan.entries[k].storage)
                for k, f, o in zip(leaf.entries, fids, offs, strict=True)
            ]

        def update_leaf(leaf, g, p, heads, crcs, fids, offs, tok):
            ios = leaf_ios(leaf, fids, offs)
            return updater.update_leaf(
                lay.table,
                plan,
                leaf,
                g,
                p,
                inner_ram,
                ios,
                crcs,
                read_slot,
                tok,
                extra={},
                heads=heads,
            )

        def prefetch_heads(leaves_, crcs, fids, offs):
            """Tickets of the leading chunks (`_read_ahead`) of every entry of ``leaves_`` (of
            one layer, for block leaves), for `update_leaf`'s ``heads``: issued a layer ahead
            of the update, so that its reads are not waited for (in order, after no write of
            this step: nothing reads what this step writes)."""
            tok, heads = new_token(), []
            for leaf, c, f, o in zip(leaves_, crcs, fids, offs, strict=True):
                sizes = lay.head_sizes.get(leaf.index)
                if not sizes:
                    heads.append(None)
                    continue
                ios = leaf_ios(leaf, f, o)
                t = updater.prefetch_chunks(lay.table, ios, c, read_slot, sizes, tok)
                heads.append(t)
                tok = t[-1][-1]
            return heads

        bleaves = [plan.leaves[i] for i in bidx]

        def per_leaf(table, leaves_=bleaves):
            return [[table[k] for k in leaf.entries] for leaf in leaves_]

        def vjp_layer(layer, h_in, gh):
            """The gradients of a layer's parameters (flat) and of its input.

            Flat: a gradient is carried to the next scan step, whose update reads it as a flat
            array. Carried in its own shape, XLA's CPU layout assignment gave a 2-D gradient
            a column-major layout, and transposed it into row-major order twice (for the
            squares and for the update), ~3x the time of that layer's matmuls at d = 2048.
            """
            _, vjp = jax.vjp(block, layer, h_in)
            g_layer, gh = vjp(gh)
            return [g.reshape(-1) for g in g_layer], gh

        def backward(blocks, j, h_in, gh):
            """Layer ``j``'s parameters, their gradients, and the gradient of its input."""
            layer = _layer(blocks, j, dtypes)
            g_layer, gh = vjp_layer(layer, h_in, gh)
            return layer, g_layer, gh

        def layer_heads(crcs, fids, offs):
            """`prefetch_heads` of one layer's block leaves (tables indexed by that layer)."""
            return prefetch_heads(bleaves, crcs, fids, offs)

        def update_layer(g_layer, layer, heads, crcs, fids, offs, tok):
            """One layer's paged update: its new parameters, crcs and squares."""
            new_layer, out_crcs, sq = [], [], []
            for leaf, g, p, hd, c, f, o in zip(
                bleaves, g_layer, layer, heads, crcs, fids, offs, strict=True
            ):
                p_new, c_new, tok = update_leaf(leaf, g, p, hd, c, f, o, tok)
                new_layer.append(p_new)
                out_crcs.append(c_new)
                sq.append(jnp.sum(jnp.square(g.astype(jnp.float32))))
            return new_layer, out_crcs, jnp.stack(sq), tok

        # backward, software-pipelined: the scan step of layer j differentiates layer j and
        # updates layer j + 1 (whose gradients the previous step computed and carried). The
        # two have no data path between them, so the update's page reads, arithmetic and
        # writes run while layer j's matmuls do. The stacked parameters are the loop's carry,
        # updated in place (with the state donated, in the parameters' own buffers: no second
        # copy of the model): layer j + 1's new values are written into the stack one step
        # later, at the top of layer j - 1's step, before that step slices its layers (j - 1
        # to differentiate, j to update: its old parameters are still in the stack), so every
        # read of the stack follows every write and XLA needs no copy of it to keep an old
        # value. The top layer is differentiated before the scan, layer 0 updated after it.
        tables = (per_leaf(opt.crcs), per_leaf(lay.fids), per_leaf(lay.offs))
        # Reads a layer ahead: the leading chunks (`_read_ahead`: all of them when the
        # layer's state fits the read-ahead budget) of every paged tensor of the layer updated
        # next are prefetched one scan step before its update (in the step that
        # differentiates it), so the update takes chunks already in staging; the top
        # layer's and the other leaves' are prefetched now, before the backward pass.
        rleaves = [plan.leaves[i] for i in ridx]
        rest_tables = [per_leaf(t, rleaves) for t in (opt.crcs, lay.fids, lay.offs)]
        rest_heads = prefetch_heads(rleaves, *rest_tables)
        top_heads = layer_heads(*jax.tree.map(lambda t: t[last], tables))
        pcrcs_b: list = []
        if page_params:
            write_slot = 1 - read_slot
            crcs_b, sq_b, pcrcs_b, gh, tok = fp.backward(
                lay,
                opt.params,
                read_slot,
                write_slot,
                tables,
                saved,
                top_params,
                gh,
                vjp_layer,
                update_layer,
                layer_heads,
                top_heads,
                gated,
            )
            new_stacked = [leaves[i] for i in bidx]  # the placeholders, as they came
        else:
            layer, g_layer, gh = backward(stacked, last, saved[last], gh)
            top = _like(layer, stacked)  # first written: the top layer, unchanged

            def bbody(carry, xs):
                gh, tok, blocks, g_up, heads_up, pending, pending_j = carry
                j, h_in, up_tables, tables_j = xs  # layer j + 1's tables, layer j's
                heads_j = layer_heads(*tables_j)  # for the next step's update of layer j
                blocks = _put_layer(blocks, pending, pending_j)
                _, g_layer, gh = backward(blocks, j, h_in, gh)
                # layer j + 1's parameters, still the old ones (sliced again, not carried:
                # a carried slice is copied into the loop's buffer at every step)
                p_up = _layer(blocks, j + 1, dtypes)
                new_up, crcs_up, sq_up, tok = update_layer(g_up, p_up, heads_up, *up_tables, tok)
                carry = (gh, tok, blocks, g_layer, heads_j, _like(new_up, blocks), j + 1)
                return carry, (crcs_up, sq_up)

            xs = (
                jnp.arange(last),
                saved[:last],
                jax.tree.map(lambda t: t[1:], tables),
                jax.tree.map(lambda t: t[:last], tables),
            )
            carry = (gh, gated, stacked, g_layer, top_heads, top, jnp.asarray(last))
            carry, (crcs_up, sq_up) = lax.scan(bbody, carry, xs, reverse=True)
            gh, tok, new_stacked, g_layer, heads_0, pending, pending_j = carry
            first = jax.tree.map(lambda t: t[0], tables)
            layer = _layer(new_stacked, 0, dtypes)
            new_0, crcs_0, sq_0, tok = update_layer(g_layer, layer, heads_0, *first, tok)
            # layer 0 first: its update reads and writes slot 0 of the same stack, in place;
            # written after layer 1's, XLA would read slot 0 from the stack before that write
            # and copy the whole stack to keep it
            new_stacked = _put_layer(new_stacked, _like(new_0, new_stacked), 0)
            new_stacked = _put_layer(new_stacked, pending, pending_j)
            crcs_b = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), crcs_0, crcs_up)
            sq_b = jnp.concatenate([sq_0[None], sq_up])
            if not blocks_as_bits:
                new_stacked = [_unbits(b, d) for b, d in zip(new_stacked, dtypes, strict=True)]
        for leaf, cs in zip(bleaves, crcs_b, strict=True):
            for k, c in zip(leaf.entries, cs, strict=True):
                new_crcs[k] = c
        (g_front,) = front_vjp(gh)

        # the embeddings, final norm and head: after the scan
        used_front = _used_inputs(lambda r: fwd(r, inputs), rest)
        used_back = _used_inputs(lambda r: bk(r, h), rest)
        new_leaves = [None] * len(leaves)
        for i, ni in zip(bidx, new_stacked, strict=True):
            new_leaves[i] = ni
        sq_r = []
        for i, gf, gb, uf, ub, hd, c, f, o in zip(
            ridx, g_front, g_back, used_front, used_back, rest_heads, *rest_tables, strict=True
        ):
            g = gf + gb if uf and ub else (gf if uf else gb)
            g = lax.optimization_barrier(g)
            sq_r.append(jnp.sum(jnp.square(g.astype(jnp.float32))))
            leaf = plan.leaves[i]
            p_new, cs, tok = update_leaf(
                leaf,
                g,
                leaves[i],
                hd,
                c,
                f,
                o,
                tok,
            )
            new_leaves[i] = p_new
            for k, c in zip(leaf.entries, cs, strict=True):
                new_crcs[k] = c
        crc, tok_ram = page_out(
            lay.table,
            jnp.asarray(lay.fids[-1])[1 - read_slot, 0],
            jnp.asarray(lay.offs[-1])[0],
            ram_bytes(plan, new_ram),
            gated,
        )
        new_crcs[-1] = crc.reshape(1)
        # every write of the step is durable before the commit (write-behind ones included)
        flushed = page_flush(lay.table, tok + tok_ram)
        shapes = (crc_shapes(new_crcs), crc_shapes(pcrcs_b))
        version = host_call(
            functools.partial(_commit_packed, lay, *shapes),
            jax.ShapeDtypeStruct((), jnp.int32),
            opt.version,
            pack_crcs([*new_crcs, *pcrcs_b]),
            flushed,
            name=lay.calls.name("commit", shapes),
        )
        params = jax.tree.unflatten(plan.params_def, new_leaves)
        grad_norm = jnp.sqrt(jnp.sum(sq_b) + sum(sq_r))
        new_opt = FuyouState(version, tuple(new_crcs), tuple(new_ram), tuple(pcrcs_b))
        from jaxoff.step import TrainState

        return (TrainState(state.step + 1, params, new_opt), {"loss": loss, "grad_norm": grad_norm})

    return train_step


def make_fuyou_loss(graphdef: nnx.GraphDef, model_cfg, tx):
    """``loss_fn(params, opt_state, inputs, targets) -> loss`` of a ``page_params`` model:
    the forward pass of `make_fuyou_step` (each layer's parameters read from the store one
    layer ahead, verified), without its backward pass or update; for evaluation.

    ``params`` is the state's (`fuyou_resident`), ``opt_state`` its `FuyouState`: the loss is
    that of the store version it describes. Jit it (nothing is donated).
    """
    _check_model(model_cfg)
    _updater(tx)
    abstract = _abstract_params(model_cfg)

    def loss_fn(params, opt_state, inputs, targets):
        lay = _layout(tx, abstract, True)
        plan = lay.plan
        leaves = plan.params_def.flatten_up_to(params)
        bidx = [i for i, b in enumerate(lay.blocks) if b]
        fp.check_placeholders(leaves, bidx)
        model = nnx.merge(graphdef, params)
        block = _block_fn(model.blocks)
        read_slot = (opt_state.version % 2).astype(jnp.int32)
        x0 = model.embed_tokens(inputs)
        h, _, _ = fp.forward(lay, opt_state.params, read_slot, block, x0)
        return cross_entropy(model.logits(h), targets)

    return loss_fn


def _block_fn(blocks: nnx.Module):
    """``block(layer, h)``: one block of the stacked ``blocks`` module applied to ``h``, with
    ``layer`` (the flat leaves of one layer's parameters) as its parameters."""
    bgraph, bstate = nnx.split(blocks)
    bdef = jax.tree.structure(bstate)
    return lambda layer, h: nnx.merge(bgraph, jax.tree.unflatten(bdef, layer))(h)


def _layer(stacked: list[jax.Array], j, dtypes) -> list[jax.Array]:
    """Layer ``j`` of the stacked leaves' bits, as floats (see the scans)."""
    return [
        _unbits(lax.dynamic_index_in_dim(x, j, keepdims=False), d)
        for x, d in zip(stacked, dtypes, strict=True)
    ]


def _put_layer(stacked: list[jax.Array], layer: list[jax.Array], j) -> list[jax.Array]:
    return [
        lax.dynamic_update_index_in_dim(b, x, j, 0) for b, x in zip(stacked, layer, strict=True)
    ]


def _bits(x: jax.Array) -> jax.Array:
    """A float array's bits as unsigned integers of its width; other arrays as they are."""
    return as_bits(x) if jnp.issubdtype(x.dtype, jnp.floating) else x


def _unbits(x: jax.Array, dtype) -> jax.Array:
    return x if x.dtype == dtype else lax.bitcast_convert_type(x, dtype)


def _stack_form(x: jax.Array) -> jax.Array:
    """How the scans hold a stacked block leaf: 16-bit floats as their bits (XLA's CPU
    backend computes them in float32, slices and updates included), wider floats as they
    are (converting those would only copy the whole stack, at each end of the step)."""
    return _bits(x) if is_half_float(x.dtype) else x


def _like(layer: list[jax.Array], stacked: list[jax.Array]) -> list[jax.Array]:
    """A layer's leaves in the dtypes of the stack they are written into (`_stack_form`, or
    bits throughout with ``blocks_as_bits``)."""
    return [_unbits(x, s.dtype) for x, s in zip(layer, stacked, strict=True)]


def _is_block_path(path) -> bool:
    return path_name(path[:1]) == BLOCKS


def blocks_to_bits(params):
    """``params`` with every float leaf of the stacked blocks replaced by its bits (uint16
    for bfloat16), converted in place: the arrays given are donated. For
    ``make_fuyou_step(..., blocks_as_bits=True)``."""
    return _map_blocks(params, _bits)


def blocks_from_bits(params, dtype):
    """The inverse of `blocks_to_bits` (the block leaves become ``dtype`` again, in place)."""
    dtype = jnp.dtype(dtype)
    return _map_blocks(
        params,
        lambda x: x if not jnp.issubdtype(x.dtype, jnp.unsignedinteger) else _unbits(x, dtype),
    )


def _map_blocks(params, fn):
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    convert = jax.jit(fn, donate_argnums=0)
    return jax.tree.unflatten(treedef, [convert(x) if _is_block_path(p) else x for p, x in flat])


def _commit_packed(lay: _Layout, shapes, pshapes, version, packed, token) -> np.ndarray:
    """`_commit` from one packed operand (`jaxoff.optim.pack_crcs`)."""
    crcs = unpack_crcs(packed, (*shapes, *pshapes))
    return _commit(lay, version, crcs[: len(shapes)], crcs[len(shapes) :], token)


def _commit(lay: _Layout, version, crcs, pcrcs, token) -> np.ndarray:
    del token  # only a dependency: every write of the step has completed
    store, version = lay.store, int(version)
    if store.closed:
        raise PageStoreError(f"page store {store.root} was closed during the fuyou step")
    if version != store.version:
        raise PageStoreError(
            f"the optimizer state describes version {version} of page store {store.root}, but "
            f"the store is at version {store.version}: the state is stale (re-init, or resume "
            "from the store's version)"
        )
    out = {}
    for name, (k, layer) in zip(lay.store_names, lay.store_of, strict=True):
        c = np.asarray(crcs[k], np.uint32)
        out[name] = (c[layer] if layer >= 0 else c).reshape(-1)
    for e, c in zip(lay.params, pcrcs, strict=True):
        c = np.asarray(c, np.uint32)
        for j in range(lay.num_layers):
            out[f"{e.name}@{j}"] = c[j]
    # durable behind the next step's forward pass (its writes wait: see commit_gate)
    return np.asarray(store.commit(out, background=True), np.int32)
