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

import threading
from typing import Any

import jax
import numpy as np
import optax

from jaxoff.aio import EngineConfig, PageStore
from jaxoff.optim import _checkpoint, _chunk
from jaxoff.optim._checks import chain_members
from jaxoff.optim._codec import ram_bytes, ram_bytes_np, ram_from_bytes
from jaxoff.optim._paged import PagedTransformation, Pager
from jaxoff.optim._pipeline import EntryNames
from jaxoff.optim._plan import RAM_ENTRY, LeafPlan, Plan
from jaxoff.optim._transaction import PageTransaction, StepRecorder
from jaxoff.optim._update import update_leaf

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
        """The I/O engine settings of the page files."""
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
        """The transformation's page store while it is open (the one ``tx.close()``
        releases)."""
        return self._pager.store

    def open(
        self,
        entries,
        *,
        discard_torn: bool = False,
        read_ahead_bytes: int | None = None,
        stale_fix: str | None = None,
    ) -> PageTransaction:
        """The `PageTransaction` of this transformation's store, laid out with ``entries``
        (``{name: (shape, dtype)}``, in store order: a strategy's own layout): the one open,
        or the store opened or created at `root`. ``tx.close()`` closes it.
        ``read_ahead_bytes``: the pager's read-ahead (default: `paged`'s); ``stale_fix``: what
        a stale state's message tells the user to do (default: `paged`'s)."""
        more = {} if stale_fix is None else {"stale_fix": stale_fix}
        return self._pager.open(
            entries, discard_torn=discard_torn, read_ahead_bytes=read_ahead_bytes, **more
        )

    def on_close(self, fn) -> None:
        """Runs ``fn()`` when the transformation is closed (``tx.close()``), after its store."""
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

    # ------------------------------------------------------------------ init

    def ram_init(self, plan: Plan) -> list:
        """The inner optimizer's initial RAM leaves (step counts, ...)."""
        return _chunk.ram_init(plan, self._pager.inner, self._pager.master_dtype)

    def chunk_init(self, plan: Plan, j: int, p: jax.Array) -> list:
        """The initial state chunks (flat, per paged state tensor) of leaf ``j`` for its
        flat master (or parameter) chunk ``p``; the master chunk itself is not included."""
        return _chunk.chunk_init(plan, self._pager.inner, self._pager.master_dtype, j, p)

    def ram_chunk(self, plan: Plan, ram: list) -> tuple[str, int, np.ndarray]:
        """``(entry, chunk index, bytes)`` of the RAM leaves ``ram`` (concrete) as `paged`
        stores them: the last chunk of an initial version (``txn.write_initial``)."""
        return RAM_ENTRY, 0, ram_bytes_np(plan, ram)

    # ------------------------------------------------------------------ update

    def ram_update(self, plan: Plan, ram: list, extra: dict | None = None) -> list:
        """The inner optimizer's new RAM leaves after one update, from its current ``ram``."""
        extra = {} if extra is None else extra
        return _chunk.ram_update(plan, self._pager.inner, self._pager.master_dtype, ram, extra)

    def update_leaf(
        self,
        rec: StepRecorder,
        plan: Plan,
        leaf: LeafPlan,
        grads: jax.Array,
        params: jax.Array,
        ram: list,
        names: EntryNames,
        *,
        extra: dict | None = None,
        apply: bool = True,
    ) -> jax.Array:
        """Pages ``params`` (leaf ``leaf`` of ``plan``, or a slice of it) through the update,
        in the step ``rec``.

        Takes the chunks of every paged tensor of the leaf, runs `paged`'s chunk arithmetic
        on them (bitwise what `paged` computes) and puts the new chunks. ``grads`` and
        ``params`` may be any contiguous part of the leaf that the store entries ``names``
        hold (e.g. one layer of a stacked leaf): it is cut into chunks of
        ``leaf.chunk_elems`` elements, the last one short.

        Args:
          rec: the step's recorder (`PageTransaction.begin`).
          plan: from `plan`.
          leaf: the leaf of ``plan`` these tensors belong to.
          grads: its gradients.
          params: its parameters.
          ram: the inner optimizer's current RAM leaves (not `ram_update`'s result).
          names: the store entries of the leaf's paged tensors (``leaf.entries`` order), as
            a function of the scans the update runs in (`jaxoff.optim.chunks.fixed_names`
            when they are fixed).
          extra: extra arguments of the inner update.
          apply: return the new parameters; else float32 updates (``optax.apply_updates``
            of them gives the new parameters).

        Returns:
          the new params or updates (shape of params).
        """
        extra = {} if extra is None else extra
        return update_leaf(
            self._pager, rec, plan, leaf, grads, params, ram, names, extra=extra, apply=apply
        )

    def put_ram(self, rec: StepRecorder, plan: Plan, ram: list) -> None:
        """Puts the new RAM leaves ``ram`` (traced: `ram_update`'s result) in the step
        ``rec``, as `paged`'s own step does before its commit."""
        rec.put(lambda env: (RAM_ENTRY, 0), ram_bytes(plan, ram))

    def read_ram(self, plan: Plan, store: PageStore) -> list:
        """The RAM leaves of ``store``'s committed version (verified), as arrays."""
        return [np.asarray(x) for x in ram_from_bytes(plan, store.read(RAM_ENTRY))]

    # ------------------------------------------------------------------ checkpoints

    def copy_out(self, txn: PageTransaction, directory, **kw) -> int:
        """Streams the committed version of ``txn``'s store into the checkpoint
        ``directory`` (atomic, every chunk verified on the way): what `jaxoff.optim`'s
        ``save_paged`` writes. ``in_store=True`` records that version of the store by its
        checksums instead of copying it; ``extra`` is kept in its manifest. Returns bytes."""
        return _checkpoint.copy_out(txn.store, directory, **kw)

    def copy_in(self, txn: PageTransaction, plan: Plan, directory, want=None) -> int:
        """Writes the checkpoint ``directory`` (of `copy_out`) into ``txn``'s store as its
        committed version, every chunk checked first; ``want``: ``{entry: (shape, dtype)}``
        it must hold (default ``plan``'s entries). Returns the version it recorded."""
        return _checkpoint.copy_in(txn, plan, directory, want=want)


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
