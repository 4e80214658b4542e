"""``jaxoff.paged``: an optax transformation whose state and fp32 master weights live on disk."""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import jax
import jax.core  # jax imports it itself; named so the type checker knows jax.core
import jax.numpy as jnp
import numpy as np
import optax

from jaxoff.aio import (
    EngineConfig,
    PageStore,
    PageStoreError,
    PageStoreLayoutError,
    check_chunk_bytes,
    check_slots,
)
from jaxoff.optim import _chunk
from jaxoff.optim._checks import chain_members, refuse_known_offenders, split_global_prefix
from jaxoff.optim._codec import ram_bytes_np
from jaxoff.optim._fused import FusedAdamW
from jaxoff.optim._plan import RAM_ENTRY, Plan, canonical, make_plan
from jaxoff.optim._probe import probe_elementwise
from jaxoff.optim._state import PagedState, make_state
from jaxoff.optim._transaction import STALE_FIX, PagedTable, PageTransaction, wait_for_steps
from jaxoff.optim._update import paged_update

DEFAULT_CHUNK_BYTES = 16 << 20
DEFAULT_ENGINE = EngineConfig()  # the page files' engine unless given
# the pager's read-ahead and writes in flight unless given: a few chunks of each
DEFAULT_READ_AHEAD_BYTES = 128 << 20


class PagedTransformation(optax.GradientTransformationExtraArgs):
    """What `paged` returns: an optax transformation, plus access to its page store."""

    __slots__ = ()

    @property
    def pager(self) -> Pager:
        return self.init.__self__  # pyright: ignore[reportAttributeAccessIssue]  # Pager.init, bound

    @property
    def store(self) -> PageStore | None:
        """The page store (None until `init` or the first `update` traced)."""
        return self.pager.store

    def close(self) -> None:
        """Releases the page store's lock."""
        self.pager.close()


def paged(
    tx: optax.GradientTransformation,
    store: str | os.PathLike | PageStore,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    master_dtype: Any = jnp.float32,
    engine: EngineConfig | None = None,
    slots: int = 2,
    probe: bool = True,
    read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES,
    host_mem: int = 0,
) -> PagedTransformation:
    """Pages the state of an element-wise optax transformation, and fp32 master weights, to SSD.

    Use it where ``tx`` was. Parameters stay in RAM in their own dtype; where that is not
    ``master_dtype`` (e.g. bfloat16), an fp32 master copy is kept in the store and the returned
    updates make ``optax.apply_updates(params, updates)`` equal ``master.astype(param.dtype)``.
    Every update reads the committed version of the store chunk by chunk, writes the next one
    and commits it once its writes are durable (a crash leaves the previous version).

    ``tx`` may be a chain led by global operations (``clip_by_global_norm``, ...): they are
    split off and run on the gradients in RAM before the pipeline. The rest must be
    element-wise (`init` refuses anything else, saying why).

    Args:
      tx: the optax transformation, e.g. ``optax.adamw(lr)``.
      store: a page store directory (created or reopened at `init`) or an open `PageStore`
        whose layout matches.
      read_ahead_bytes: the pager's read-ahead (and, as much again, its writes in flight):
        how far ahead of the update the store is read, in chunks of ``chunk_bytes``.
      chunk_bytes: bytes per chunk of each paged tensor (a multiple of 4096).
      master_dtype: dtype of the master weights and of what the optimizer sees.
      engine: I/O engine knobs for the page files.
      slots: for a store directory: 2 (default) keeps the committed version while the next
        is written, so a crash mid-update leaves the previous step; 1 writes every update in
        place (half the disk: 12 instead of 24 bytes/parameter for fp32 masters and Adam
        moments), and a crash mid-update then needs a checkpoint (`PageStoreTornError`).
      probe: run the element-wise probe (a small tree updated whole and chunk by chunk,
        compared) at the first `init` or `update` of each parameter tree: a few seconds of
        tracing. Pass False only for a transformation known to be element-wise: `jaxoff
        train` does for its own optimizers (adamw, adam, lion, sgd, rmsprop), whose paged
        updates the tests compare bitwise with optax's.
      host_mem: for a store directory: bytes of host memory (a RAM filesystem, see
        `jaxoff.aio._ramtier`) that keep the store's first entries, the rest on disk; one
        store, the same checksums and commits. 0 (default): everything on disk.

    >>> import optax, jax.numpy as jnp, tempfile
    >>> tx = paged(optax.adamw(1e-3), tempfile.mkdtemp() + "/store", chunk_bytes=4096)
    >>> params = {"w": jnp.ones((3, 5), jnp.bfloat16)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.ones((3, 5), jnp.bfloat16)}, state, params)
    >>> int(state.version), updates["w"].dtype
    (2, dtype('float32'))
    >>> tx.close()
    """
    pager = Pager(
        tx,
        store,
        chunk_bytes=chunk_bytes,
        master_dtype=master_dtype,
        engine=engine,
        slots=slots,
        probe=probe,
        read_ahead_bytes=read_ahead_bytes,
        host_mem=host_mem,
    )
    # optax types states as arrays and containers of them; a PagedState is a pytree all the same
    return PagedTransformation(pager.init, pager.update)  # pyright: ignore[reportArgumentType]


def update_and_apply(
    tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any, **extra_args
) -> tuple[Any, Any]:
    """``(new params, new state)``: for a paged ``tx`` (or ``optax.chain(global ops...,
    paged(...))``), the new parameters are computed chunk by chunk together with the update,
    as plain optax computes them when ``apply_updates`` fuses with the update (bitwise the
    same), and written in place: no float32 updates tree in RAM. Anything else:
    ``tx.update`` then ``optax.apply_updates``.

    Prefer it to ``tx.update`` + ``apply_updates`` for paged optimizers: for float32
    parameters the updates ``new - old`` cannot always reproduce the fused result in the last
    bit (when an update is much larger than the new value), and they cost 4 bytes/parameter.
    A `fused_adamw` updates the parameters in one pass (in place when they are donated).
    """

    if isinstance(tx, FusedAdamW):
        return tx.apply(grads, opt_state, params)
    if isinstance(tx, PagedTransformation):
        return tx.pager.apply(grads, opt_state, params, **extra_args)
    members = chain_members(tx, flatten=False)
    if members and isinstance(getattr(members[-1].update, "__self__", None), Pager):
        # optax.chain(global ops..., jaxoff.paged(...)): the global ops run in RAM first.
        states = list(opt_state)
        for k, m in enumerate(members[:-1]):
            grads, states[k] = m.update(grads, states[k], params, **extra_args)
        pager = members[-1].update.__self__  # pyright: ignore[reportAttributeAccessIssue]  # a Pager's
        params, states[-1] = pager.apply(grads, states[-1], params, **extra_args)
        return params, tuple(states)
    updates, opt_state = tx.update(grads, opt_state, params, **extra_args)
    return optax.apply_updates(params, updates), opt_state


def _is_concrete(tree) -> bool:
    """Whether ``tree`` holds values and no trace is being built (under ``jax.eval_shape`` of
    a closure, concrete parameters still see a trace: a new array is then a tracer)."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree)):
        return False
    return not isinstance(jnp.zeros((), jnp.int32), jax.core.Tracer)


class Pager:
    """Everything behind one `paged` transformation: plan, store, compiled tables."""

    # the ChunkUpdater of this transformation: set by chunk_updater() (jaxoff.optim.chunks,
    # which builds on this module) at its first call, under its lock
    _chunk_updater: Any

    def __init__(
        self,
        tx,
        store,
        *,
        chunk_bytes,
        master_dtype,
        engine,
        slots=2,
        probe=True,
        read_ahead_bytes=DEFAULT_READ_AHEAD_BYTES,
        host_mem=0,
    ):
        if not isinstance(tx, optax.GradientTransformation) and hasattr(
            tx, "gradient_transformation"
        ):  # optax.MultiSteps
            tx = tx.gradient_transformation()
        pre, inner = split_global_prefix(tx)
        refuse_known_offenders(inner)
        self.pre = None if pre is None else optax.with_extra_args_support(pre)
        self.inner = optax.with_extra_args_support(inner)
        self.master_dtype = np.dtype(master_dtype)
        self.engine = engine if engine is not None else DEFAULT_ENGINE
        self.read_ahead_bytes = int(read_ahead_bytes)
        self.slots = check_slots(slots)
        if isinstance(host_mem, bool) or not isinstance(host_mem, int) or host_mem < 0:
            raise ValueError(f"host_mem must be a non-negative int (bytes), got {host_mem!r}")
        self.host_mem = int(host_mem)
        self._given: PageStore | None = None  # a store given open to `paged`
        if isinstance(store, PageStore):
            self._given, self.root, self.chunk_bytes = store, store.root, store.chunk_bytes
            self.slots = store.layout.slots
        else:
            self.root = os.path.abspath(store)
            self.chunk_bytes = _check_chunk_bytes(chunk_bytes)
        self.txn: PageTransaction | None = None  # the store, its files and pager, while open
        self.owner = PagedTable("jaxoff.paged")  # its table's name and the steps' plans
        self._plans: dict = {}
        self._eager: dict[bool, Any] = {}  # jitted steps for eager calls, by `apply`
        self._chunk_fns: dict = {}  # (id(plan), leaf) -> (plan, jitted chunk update)
        self._probe = probe
        self._probed: set = set()
        self._lock = threading.Lock()
        self.close_hooks: list = []  # run by close(), once: what strategies opened beside

    # ------------------------------------------------------------------ plan and store

    def plan(self, params, parts: tuple[int, ...] | None = None) -> Plan:
        leaves, treedef = jax.tree.flatten(params)
        key = (treedef, tuple((np.shape(x), np.dtype(x.dtype)) for x in leaves), parts)
        if key not in self._plans:
            self._plans[key] = _chunk.one_leaf_plan(
                make_plan(
                    self.pre, self.inner, params, self.chunk_bytes, self.master_dtype, parts=parts
                ),
                self.inner,
                self.master_dtype,
            )
        plan = self._plans[key]
        if self._probe and key not in self._probed:
            probe_elementwise(self.inner, plan, self.master_dtype)
            self._probed.add(key)
        return plan

    @property
    def store(self) -> PageStore | None:
        return None if self.txn is None or self.txn.closed else self.txn.store

    @property
    def table(self) -> str:
        """The name of this optimizer's file table: unique in the process, and the same in a
        new process that builds its optimizers in the same order, so a compiled step (which
        names it) is the same program there, whatever the store's path."""
        return self.owner.name

    def open(
        self,
        entries,
        *,
        discard_torn: bool = False,
        read_ahead_bytes: int | None = None,
        stale_fix: str = STALE_FIX,
    ) -> PageTransaction:
        """The transaction of the store holding ``entries`` (``{name: (shape, dtype)}``): the
        one open, or the store opened (or created) with its file table and pager.

        ``discard_torn``: a single-slot store left mid-update by a crash is re-created empty
        instead of raising `PageStoreTornError` (for an init that rewrites every chunk).
        ``read_ahead_bytes``: the pager's read-ahead and writes in flight (default: `paged`'s).
        ``stale_fix``: what a stale state's message tells the user to do.
        """
        ahead = self.read_ahead_bytes if read_ahead_bytes is None else int(read_ahead_bytes)
        with self._lock:
            if self.txn is None or self.txn.closed:
                self.txn = PageTransaction.open(
                    self.root,
                    entries,
                    chunk_bytes=self.chunk_bytes,
                    slots=self.slots,
                    table=self.owner,
                    engine=self.engine,
                    discard_torn=discard_torn,
                    store=self._given,
                    read_ahead_bytes=ahead,
                    write_behind_bytes=ahead,
                    stale_fix=stale_fix,
                    host_mem=self.host_mem,
                )
                self._given = None
            elif list(self.txn.store.entries) != list(entries):
                raise PageStoreError(
                    f"page store {self.root} holds other entries than this model's optimizer "
                    "needs; pass jaxoff.paged a directory (it creates the store) or another store"
                )
            return self.txn

    def transaction(self, plan: Plan, *, discard_torn: bool = False) -> PageTransaction:
        """`open` for the store layout of ``plan`` (`Plan.store_entries`)."""
        return self.open(plan.store_entries(), discard_torn=discard_torn)

    def close(self) -> None:
        # A step returns before it has run (JAX dispatches programs asynchronously): its
        # paging calls must find the pager open; closing waits for them and their commits.
        wait_for_steps()
        try:
            if self.txn is not None:
                self.txn.close()
        finally:
            hooks, self.close_hooks = self.close_hooks, []
            for hook in hooks:
                hook()

    # ------------------------------------------------------------------ init

    def init(self, params) -> PagedState:
        _refuse_placeholder(params)
        params = canonical(params)
        plan = self.plan(params)
        pre_state = [] if self.pre is None else jax.tree.leaves(self.pre.init(params))
        if not _is_concrete(params):  # under eval_shape/jit: shapes only, disk untouched
            ram = tuple(pre_state) + tuple(_chunk.ram_init(plan, self.inner, self.master_dtype))
            return make_state(plan, self.root, jnp.zeros((), jnp.int32), ram)
        txn = self.transaction(plan, discard_torn=True)  # init rewrites every chunk
        with jax.ensure_compile_time_eval():
            ram = [np.asarray(x) for x in pre_state]
            ram += [np.asarray(x) for x in _chunk.ram_init(plan, self.inner, self.master_dtype)]
        version = txn.write_initial(self._initial_chunks(plan, params, ram))
        return make_state(
            plan, self.root, jnp.asarray(version, jnp.int32), [jnp.asarray(x) for x in ram]
        )

    def _initial_chunks(self, plan: Plan, params, ram):
        """Every chunk of the first version: per leaf the master (if any) and the inner
        optimizer's initial state, chunk by chunk; then the RAM leaves' entry."""
        p_leaves = plan.params_def.flatten_up_to(params)
        for leaf, p in zip(plan.leaves, p_leaves, strict=True):
            entries = [plan.entries[k] for k in leaf.entries]
            init = jax.jit(
                functools.partial(
                    _chunk.chunk_init, plan, self.inner, self.master_dtype, leaf.index
                )
            )
            flat = np.asarray(p).reshape(-1)
            for c in range(leaf.num_chunks):
                start = c * leaf.chunk_elems
                pc = flat[start : start + leaf.chunk_size(c)]
                if leaf.master:
                    pc = pc.astype(self.master_dtype)
                chunks = [np.asarray(x) for x in init(pc)]
                if leaf.master:
                    chunks = [pc, *chunks]
                for e, x in zip(entries, chunks, strict=True):
                    yield e.name, c, x.astype(e.storage)
        yield RAM_ENTRY, 0, ram_bytes_np(plan, ram)

    # ------------------------------------------------------------------ update

    def update(self, updates, state: PagedState, params=None, **extra_args):
        """optax ``update``: returns float32 updates (exact through ``optax.apply_updates``)."""
        return self._step(updates, state, params, apply=False, extra=extra_args)

    def apply(self, grads, state: PagedState, params, **extra_args):
        """Returns ``(new params, new state)`` written chunk by chunk into the parameters."""
        return self._step(grads, state, params, apply=True, extra=extra_args)

    def _step(self, grads, state: PagedState, params, *, apply: bool, extra: dict):
        args = (grads, state, params, extra)
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
            return paged_update(self, grads, state, params, apply=apply, extra=extra)
        # called eagerly: a step's paging calls run as one program, whose plan is registered
        # when it is traced (see `PageTransaction.begin`)
        step = self._eager.get(apply)
        if step is None:
            step = self._eager[apply] = jax.jit(
                lambda g, s, p, e: paged_update(self, g, s, p, apply=apply, extra=e)
            )
        return step(*args)


def _check_chunk_bytes(chunk_bytes) -> int:
    try:
        return check_chunk_bytes(chunk_bytes)
    except PageStoreLayoutError as e:
        raise PageStoreLayoutError(f"jaxoff.paged: {e}") from None


def _refuse_placeholder(params) -> None:
    is_placeholder = lambda x: type(x).__name__ == "_ParamsPlaceholder"  # noqa: E731
    if any(map(is_placeholder, jax.tree.leaves(params, is_leaf=is_placeholder))):
        raise TypeError(
            "optax.tree_map_params cannot map over a jaxoff.paged state: its per-parameter "
            "tensors (moments, master weights) are not in the state but in the page store "
            "(the state holds PagedTensors nodes naming its entries), so there is nothing "
            "parameter-shaped to map. Map the RAM leaves with jax.tree.map, read the paged "
            "tensors with tx.store.read(name), or shard with the store per process"
        )
