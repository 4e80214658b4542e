"""The chunk-update API of a paged optimizer: what a strategy needs to page the update itself.

`paged` updates every parameter leaf chunk by chunk in its own step. A strategy that runs the
update elsewhere (Fuyou: layer ``j``'s update inside the backward layer scan) lays out its own
page store and drives the paging, but must compute every chunk exactly as `paged` does. This
module is that contract: `chunk_updater` gives the `ChunkUpdater` of a `paged` transformation,
whose methods run `paged`'s own code (the plan, the initial chunks, the RAM leaves, the chunk
arithmetic and its paging pipeline), so that a strategy built on it is bitwise the sequential
paged update. The helpers around it write chunks and encode the RAM leaves as `paged` stores
them.

Example:
    >>> import optax, tempfile, jax.numpy as jnp
    >>> from jaxoff.optim import paged
    >>> from jaxoff.optim.chunks import chunk_updater
    >>> tx = paged(optax.adamw(1e-3), tempfile.mkdtemp() + "/s", chunk_bytes=4096)
    >>> updater = chunk_updater(tx)
    >>> plan = updater.plan({"w": jnp.ones((3, 5), jnp.bfloat16)})
    >>> [e.name for e in plan.entries], plan.leaves[0].master
    (['master.w', 'opt.0.mu.w', 'opt.0.nu.w'], True)
    >>> [len(x) for x in updater.chunk_init(plan, 0, jnp.ones((15,), jnp.float32))]
    [15, 15]
    >>> tx.close()
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxoff.aio import EngineConfig, PageStore
from jaxoff.optim import _chunk
from jaxoff.optim._checks import chain_members
from jaxoff.optim._paged import (
    PagedTransformation,
    Pager,
    _write_chunk,
    commit_gate,
    crc_shapes,
    entry_ios,
    pack_crcs,
    prefetch_bytes,
    ram_bytes,
    ram_bytes_np,
    read_bytes,
    unpack_crcs,
)
from jaxoff.optim._pipeline import EntryIO, page_leaf, prefetch_chunk
from jaxoff.optim._plan import RAM_ENTRY, LeafPlan, Plan, check_index_range, path_name

__all__ = [
    "RAM_ENTRY",
    "ChunkUpdater",
    "EntryIO",
    "LeafPlan",
    "Plan",
    "chunk_updater",
    "commit_gate",
    "crc_shapes",
    "ends_with_paged",
    "entry_ios",
    "pack_crcs",
    "path_name",
    "ram_bytes",
    "ram_bytes_np",
    "unpack_crcs",
    "write_chunk",
]

_lock = threading.Lock()


class ChunkUpdater:
    """The chunk arithmetic and store settings of one `paged` transformation.

    Get it with `chunk_updater` (one per transformation: it can key a cache). Every method
    delegates to the code of `paged` itself.
    """

    def __init__(self, pager: Pager):
        self._pager = pager

    # ------------------------------------------------------------------ settings

    @property
    def root(self) -> str:
        """The page store directory given to `paged`."""
        return self._pager.root

    @property
    def chunk_bytes(self) -> int:
        return self._pager.chunk_bytes

    @property
    def slots(self) -> int:
        return self._pager.slots

    @property
    def engine(self) -> EngineConfig:
        """The I/O engine settings of the paging calls."""
        return self._pager.engine

    @property
    def master_dtype(self) -> np.dtype:
        return self._pager.master_dtype

    @property
    def has_global_ops(self) -> bool:
        """Whether global operations (``clip_by_global_norm``, ...) lead the chain given to
        `paged`: they need every gradient before the first chunk is updated."""
        return self._pager.pre is not None

    @property
    def store(self) -> PageStore | None:
        """The transformation's page store: the one ``tx.close()`` releases.

        A strategy that opens a store of its own layout for this transformation assigns it
        here, so that closing the transformation releases it.
        """
        return self._pager.store

    @store.setter
    def store(self, store: PageStore) -> None:
        self._pager.store = store

    def on_close(self, fn) -> None:
        """Runs ``fn()`` when the transformation is closed (``tx.close()``), after its store:
        e.g. to unregister a file table a strategy registered for it (its files stay open
        until then)."""
        self._pager.close_hooks.append(fn)

    # ------------------------------------------------------------------ plan

    def plan(self, params: Any, *, parts: tuple[int, ...] | None = None) -> Plan:
        """The plan of ``params``: the paged tensors per leaf, their chunking and RAM leaves.

        ``parts``: per leaf, into how many equal parts `update_leaf` is given it (the layers
        of a stacked leaf updated one at a time); default: each leaf whole. One part's chunk
        indices must fit int32, the whole leaf's need not.

        Refuses (`NotElementwiseError`) an inner optimizer that is not element-wise, or a
        part too large to index.
        """
        return self._pager.plan(params, parts)

    def split_phase_bytes(self, plan: Plan) -> int:
        """Engine staging bytes that split-phase paging of ``plan``'s leaves needs."""
        return self._pager.split_phase_bytes(plan)

    def head_bytes(self, plan: Plan, leaf: LeafPlan, n: int) -> int:
        """Staging that `prefetch_head` of ``n`` elements of ``leaf`` holds until taken (add
        it to ``split_phase_bytes`` for every head in flight at once)."""
        return prefetch_bytes(plan, leaf, n)

    def read_bytes(self, plan: Plan, leaf: LeafPlan, n: int) -> int:
        """Bytes that the reads of ``n`` elements of every paged tensor of ``leaf`` transfer
        (each rounded up to the 4 KiB alignment of direct I/O)."""
        return read_bytes(plan, leaf, n)

    # ------------------------------------------------------------------ init

    def ram_init(self, plan: Plan) -> list:
        """The inner optimizer's initial RAM leaves (step counts, ...)."""
        return _chunk.ram_init(plan, self._pager.inner, self._pager.master_dtype)

    def chunk_init(self, plan: Plan, j: int, p: jax.Array) -> list:
        """The initial state chunks (flat, per paged state tensor) of leaf ``j`` for its
        flat master (or parameter) chunk ``p``; the master chunk itself is not included."""
        return _chunk.chunk_init(plan, self._pager.inner, self._pager.master_dtype, j, p)

    # ------------------------------------------------------------------ update

    def prefetch_head(
        self,
        table: str,
        ios: list[EntryIO],
        crcs: list[jax.Array],
        read_slot: jax.Array,
        n: int,
        token: jax.Array,
    ) -> list[jax.Array]:
        """Starts the reads of the first chunk (``n`` elements) of every paged tensor behind
        ``ios`` (a leaf's entries, or one layer's part of them); returns the tickets to give
        `update_leaf` as ``head``. Nothing here depends on gradients or parameters, so a
        caller issues it early (a layer ahead) and the reads run behind other work. The
        tickets hold `head_bytes` of staging until taken.
        """
        return prefetch_chunk(table, ios, crcs, read_slot, 0, n, token)

    def prefetch_chunks(
        self,
        table: str,
        ios: list[EntryIO],
        crcs: list[jax.Array],
        read_slot: jax.Array,
        sizes: list[int],
        token: jax.Array,
    ) -> list[list[jax.Array]]:
        """`prefetch_head` of the leading ``len(sizes)`` chunks: chunk ``i`` of ``sizes[i]``
        elements (``leaf.chunk_elems`` but for a short last one), issued in chunk order.
        Returns per chunk its tickets, for `update_leaf`'s ``heads``. They hold the sum of
        `head_bytes` of every chunk until taken.
        """
        out = []
        for i, n in enumerate(sizes):
            tickets = prefetch_chunk(table, ios, crcs, read_slot, i, n, token)
            out.append(tickets)
            token = tickets[-1]
        return out

    def ram_update(self, plan: Plan, ram: list, extra: dict | None = None) -> list:
        """The inner optimizer's new RAM leaves after one update, from its current ``ram``."""
        extra = {} if extra is None else extra
        return _chunk.ram_update(plan, self._pager.inner, self._pager.master_dtype, ram, extra)

    def update_leaf(
        self,
        table: str,
        plan: Plan,
        leaf: LeafPlan,
        grads: jax.Array,
        params: jax.Array,
        ram: list,
        ios: list[EntryIO],
        crcs: list[jax.Array],
        read_slot: jax.Array,
        token: jax.Array,
        *,
        extra: dict | None = None,
        apply: bool = True,
        split_phase: bool = True,
        head: list[jax.Array] | None = None,
        heads: list[list[jax.Array]] | None = None,
    ) -> tuple[jax.Array, list[jax.Array], jax.Array]:
        """Pages ``params`` (leaf ``leaf`` of ``plan``, or a slice of it) through the update.

        Reads the chunks of every paged tensor of the leaf from ``read_slot``, runs `paged`'s
        chunk arithmetic on them (bitwise what `paged` computes) and writes the new chunks
        to the other slot. ``grads`` and ``params`` may be any contiguous part of the leaf
        that the store entries behind ``ios`` hold (e.g. one layer of a stacked leaf): it is
        cut into chunks of ``leaf.chunk_elems`` elements, the last one short.

        Args:
          table: the engine file table the store's files are registered under.
          plan: from `plan`.
          leaf: the leaf of ``plan`` these tensors belong to.
          grads: its gradients.
          params: its parameters.
          ram: the inner optimizer's current RAM leaves (not `ram_update`'s result).
          ios: per entry of the leaf (``leaf.entries``), where its chunks are.
          crcs: per entry, the crc32c of each chunk in ``read_slot`` (verified on read).
          read_slot: 0 (A) or 1 (B).
          token: orders the first read (after every write the token follows).
          extra: extra arguments of the inner update.
          apply: return the new parameters; else float32 updates (``optax.apply_updates``
            of them gives the new parameters).
          split_phase: write-behind writes: ``page_flush`` the table before committing.
            Staging must hold `split_phase_bytes`.
          head: split phase only: the tickets of `prefetch_head` for these entries' first
            chunk, issued earlier; the pipeline takes them instead of reading that chunk.
          heads: instead of ``head``: per leading chunk, its tickets (`prefetch_chunks`).

        Returns:
          ``(new params or updates (shape of params), per entry the crcs written, token)``.
        """
        extra = {} if extra is None else extra
        if head is not None and heads is not None:
            raise ValueError("update_leaf: give head (one chunk) or heads (several), not both")
        if head is not None:
            heads = [head]
        check_index_range(leaf.name, params.size, leaf.chunk_elems)
        n_full, tail = divmod(params.size, leaf.chunk_elems)
        compute = functools.partial(
            self._pager._compute,
            plan,
            leaf,
            grads.reshape(-1),
            params.reshape(-1),
            ram,
            extra,
            apply,
        )
        out = params.reshape(-1) if apply else jnp.zeros((params.size,), self.master_dtype)
        out, crcs, token = page_leaf(
            table,
            ios,
            crcs,
            read_slot,
            leaf.chunk_elems,
            n_full,
            tail,
            out,
            compute,
            token,
            split_phase=split_phase,
            head=heads,
        )
        return out.reshape(params.shape), crcs, token


def chunk_updater(tx: optax.GradientTransformation) -> ChunkUpdater:
    """The `ChunkUpdater` of a `paged` transformation (the same object at every call).

    Raises:
      TypeError: ``tx`` is not what `paged` returns (see `ends_with_paged` for a chain that
        ends with it).
    """
    if not isinstance(tx, PagedTransformation):
        raise TypeError(
            f"chunk_updater needs what jaxoff.optim.paged returns, not {type(tx).__name__}"
        )
    pager = tx.pager
    with _lock:
        updater = pager.__dict__.get("_chunk_updater")
        if updater is None:
            updater = pager._chunk_updater = ChunkUpdater(pager)
    return updater


def ends_with_paged(tx: optax.GradientTransformation) -> bool:
    """Whether ``tx`` is ``optax.chain(..., paged(...))``: a chain whose last member pages."""
    members = chain_members(tx, flatten=False)
    return bool(members) and isinstance(getattr(members[-1].update, "__self__", None), Pager)


def write_chunk(store: PageStore, name: str, i: int, x: np.ndarray) -> int:
    """Writes ``x`` as chunk ``i`` of entry ``name`` (inactive slot) and returns its crc32c,
    as `paged` records it for the commit."""
    return _write_chunk(store, name, i, x)
