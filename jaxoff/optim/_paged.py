"""``jaxoff.paged``: an optax transformation whose state and fp32 master weights live on disk."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import threading
from typing import Any

import crc32c
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jaxoff import _faults
from jaxoff.aio import PageStore, PageStoreError, PageStoreLayoutError, PageStoreTornError
from jaxoff.aio._engine import EngineConfig
from jaxoff.aio._error_from import record
from jaxoff.aio._ffi_calls import (
    new_token,
    page_flush,
    page_out,
    register_file_table,
    unregister_file_table,
)
from jaxoff.aio._host_call import HostCalls, host_call
from jaxoff.aio._layout import ALIGN, MAX_CHUNK_BYTES, check_chunk_bytes, check_slots
from jaxoff.optim import _chunk
from jaxoff.optim._checks import chain_members, refuse_known_offenders, split_global_prefix
from jaxoff.optim._pipeline import EntryIO, page_leaf, prefetch_chunk
from jaxoff.optim._plan import RAM_ENTRY, LeafPlan, Plan, canonical, make_plan
from jaxoff.optim._probe import probe_elementwise
from jaxoff.optim._state import PagedState, make_state

DEFAULT_CHUNK_BYTES = 16 << 20
DEFAULT_ENGINE = EngineConfig(pool_bytes=128 << 20)  # the paging calls' engine unless given


class PagedTransformation(optax.GradientTransformationExtraArgs):
    """What `paged` returns: an optax transformation, plus access to its page store."""

    __slots__ = ()

    @property
    def pager(self) -> Pager:
        return self.init.__self__

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
      chunk_bytes: bytes per chunk of each paged tensor (a multiple of 4096).
      master_dtype: dtype of the master weights and of what the optimizer sees.
      engine: I/O engine knobs for the paging calls.
      slots: for a store directory: 2 (default) keeps the committed version while the next
        is written, so a crash mid-update leaves the previous step; 1 writes every update in
        place (half the disk: 12 instead of 24 bytes/parameter for fp32 masters and Adam
        moments), and a crash mid-update then needs a checkpoint (`PageStoreTornError`).
      probe: run the element-wise probe (a small tree updated whole and chunk by chunk,
        compared) at the first `init` or `update` of each parameter tree: a few seconds of
        tracing. Pass False only for a transformation known to be element-wise: `jaxoff
        train` does for its own optimizers (adamw, adam, lion, sgd, rmsprop), whose paged
        updates the tests compare bitwise with optax's.

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
    )
    return PagedTransformation(pager.init, pager.update)


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
    from jaxoff.optim._fused import FusedAdamW  # local: keeps the fused path to these lines

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
        params, states[-1] = members[-1].update.__self__.apply(
            grads, states[-1], params, **extra_args
        )
        return params, tuple(states)
    updates, opt_state = tx.update(grads, opt_state, params, **extra_args)
    return optax.apply_updates(params, updates), opt_state


def _is_concrete(tree) -> bool:
    """Whether ``tree`` holds values and no trace is being built (under ``jax.eval_shape`` of
    a closure, concrete parameters still see a trace: a new array is then a tracer)."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree)):
        return False
    return not isinstance(jnp.zeros((), jnp.int32), jax.core.Tracer)


def read_bytes(plan: Plan, leaf: LeafPlan, n: int) -> int:
    """Bytes that reads of ``n`` elements of every paged tensor of ``leaf`` transfer: each
    read's size rounded up to ``ALIGN`` (O_DIRECT transfers and staging buffers are 4 KiB
    aligned)."""
    return sum(-(-n * plan.entries[k].storage.itemsize // ALIGN) * ALIGN for k in leaf.entries)


def prefetch_bytes(plan: Plan, leaf: LeafPlan, n: int) -> int:
    """Staging that a prefetch of ``n`` elements of every paged tensor of ``leaf`` may hold
    until it is taken: each read counted twice its `read_bytes` (staging may serve a request
    with a cached buffer up to twice as large; a prefetch that finds no room is refused)."""
    return 2 * read_bytes(plan, leaf, n)


class Pager:
    """Everything behind one `paged` transformation: plan, store, compiled tables."""

    def __init__(self, tx, store, *, chunk_bytes, master_dtype, engine, slots=2, probe=True):
        if not isinstance(tx, optax.GradientTransformation) and hasattr(
            tx, "gradient_transformation"
        ):  # optax.MultiSteps
            tx = tx.gradient_transformation()
        pre, inner = split_global_prefix(tx)
        refuse_known_offenders(inner)
        self.pre = None if pre is None else optax.with_extra_args_support(pre)
        self.inner = optax.with_extra_args_support(inner)
        self.master_dtype = np.dtype(master_dtype)
        self._engine_given = engine is not None
        self.engine = engine if engine is not None else DEFAULT_ENGINE
        self.slots = check_slots(slots)
        if isinstance(store, PageStore):
            self.store, self.root, self.chunk_bytes = store, store.root, store.chunk_bytes
            self.slots = store.layout.slots
        else:
            self.store, self.root = None, os.path.abspath(store)
            self.chunk_bytes = _check_chunk_bytes(chunk_bytes)
        self._plans: dict = {}
        self._chunk_fns: dict = {}  # (id(plan), leaf) -> (plan, jitted chunk update)
        self._probe = probe
        self._probed: set = set()
        self._ios: list[EntryIO] | None = None
        self._registration: int | None = None  # of the file table, while _ios is set
        self._lock = threading.Lock()
        self.close_hooks: list = []  # run by close(), once: what strategies opened beside
        self.calls = HostCalls("jaxoff.paged")  # the step's host calls: cacheable names

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
    def table(self) -> str:
        """The name of this optimizer's file table: unique in the process, and the same in a
        new process that builds its optimizers in the same order, so a compiled step (which
        names it) is the same program there, whatever the store's path."""
        return self.calls.prefix

    def open_store(self, plan: Plan, *, discard_torn: bool = False) -> PageStore:
        """Opens (or creates) the store for ``plan`` and registers its files with the engine.

        ``discard_torn``: a single-slot store left mid-update by a crash is re-created empty
        instead of raising `PageStoreTornError` (for a restore that rewrites every chunk).
        """
        with self._lock:
            entries = plan.store_entries()
            if self.store is None or self.store.closed:
                try:
                    self.store = PageStore.open_or_create(
                        self.root, entries, chunk_bytes=self.chunk_bytes, slots=self.slots
                    )
                except PageStoreTornError:
                    if not discard_torn:
                        raise
                    self.store = PageStore.create(
                        self.root,
                        entries,
                        exist_ok=True,
                        chunk_bytes=self.chunk_bytes,
                        slots=self.slots,
                    )
                self._ios = None
            if list(self.store.entries) != list(entries):
                raise PageStoreError(
                    f"page store {self.root} holds other entries than this model's optimizer "
                    "needs; pass jaxoff.paged a directory (it creates the store) or another store"
                )
            if self._ios is None:
                need = self.split_phase_bytes(plan)
                if not self._engine_given and self.engine.pool_bytes < need:
                    self.engine = dataclasses.replace(self.engine, pool_bytes=need)
                self._registration = register_file_table(
                    self.table, self.store.file_table(), config=self.engine
                )
                self._ios = entry_ios(self.store, [dt for _, dt in entries.values()])
            return self.store

    def split_phase_bytes(self, plan: Plan) -> int:
        """Staging for split-phase paging: per leaf, two chunks of every entry prefetched at
        the take, plus one chunk of every entry in write-behind."""
        per_leaf = [  # a leaf smaller than a chunk stages only itself
            sum(plan.entries[k].storage.itemsize for k in leaf.entries)
            * min(leaf.chunk_elems, leaf.size)
            for leaf in plan.leaves
        ]
        return 3 * max(per_leaf, default=0) + (1 << 20)

    def _head_chunks(self, plan: Plan) -> list[int]:
        """Per leaf, how many of its first chunks a step prefetches at its start: the longest
        prefix of the step's chunks (leaf by leaf) whose staged bytes fit in the staging the
        pipeline does not need (``pool_bytes - split_phase_bytes``). Each chunk is counted
        twice its size rounded up to ``ALIGN`` (staging buffers, like O_DIRECT transfers, are
        4 KiB-aligned): staging may serve a request with a cached buffer up to twice
        as large, and a prefetch that finds no room is refused."""
        room = self.engine.pool_bytes - self.split_phase_bytes(plan)
        heads = [0] * len(plan.leaves)
        for leaf in plan.leaves:
            if not leaf.entries:  # nothing paged (e.g. masked out): nothing to read
                continue
            for i in range(leaf.num_chunks):
                need = prefetch_bytes(plan, leaf, leaf.chunk_size(i))
                if need > room:
                    return heads
                room -= need
                heads[leaf.index] += 1
        return heads

    def close(self) -> None:
        # A step returns before it has run (JAX dispatches programs asynchronously, and on the
        # CPU the paged step has no io_callback to make it synchronous): its page and host
        # calls must find the store and the file table open.
        wait_for_steps()
        if self.store is not None:
            self.store.close()
        if self._ios is not None:
            # the table holds every page file open; a reopened store registers it again.
            # Only this optimizer's registration: another one may have replaced it since.
            unregister_file_table(self.table, self._registration)
            self._ios = None
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
            crcs = tuple(
                jnp.zeros((self._num_chunks(plan, e),), jnp.uint32) for e in [*plan.store_entries()]
            )
            return make_state(plan, self.root, jnp.zeros((), jnp.int32), crcs, ram)
        store = self.open_store(plan, discard_torn=True)  # init rewrites every chunk
        with jax.ensure_compile_time_eval():
            ram = [np.asarray(x) for x in pre_state]
            ram += [np.asarray(x) for x in _chunk.ram_init(plan, self.inner, self.master_dtype)]
        crcs = {}
        p_leaves = plan.params_def.flatten_up_to(params)
        for leaf, p in zip(plan.leaves, p_leaves, strict=True):
            entries = [plan.entries[k] for k in leaf.entries]
            init = jax.jit(
                functools.partial(
                    _chunk.chunk_init, plan, self.inner, self.master_dtype, leaf.index
                )
            )
            flat = np.asarray(p).reshape(-1)
            for e in entries:
                crcs[e.name] = []
            for c in range(leaf.num_chunks):
                start = c * leaf.chunk_elems
                pc = flat[start : start + leaf.chunk_size(c)]
                if leaf.master:
                    pc = pc.astype(self.master_dtype)
                chunks = [np.asarray(x) for x in init(pc)]
                if leaf.master:
                    chunks = [pc, *chunks]
                for e, x in zip(entries, chunks, strict=True):
                    crcs[e.name].append(_write_chunk(store, e.name, c, x.astype(e.storage)))
        crcs[RAM_ENTRY] = [_write_chunk(store, RAM_ENTRY, 0, ram_bytes_np(plan, ram))]
        version = store.commit(crcs)
        return make_state(
            plan,
            self.root,
            jnp.asarray(version, jnp.int32),
            [jnp.asarray(np.asarray(v, np.uint32)) for v in crcs.values()],
            [jnp.asarray(x) for x in ram],
        )

    def _num_chunks(self, plan: Plan, name: str) -> int:
        if name == RAM_ENTRY:
            return 1
        e = next(e for e in plan.entries if e.name == name)
        return plan.leaves[e.leaf].num_chunks

    # ------------------------------------------------------------------ update

    def update(self, updates, state: PagedState, params=None, **extra_args):
        """optax ``update``: returns float32 updates (exact through ``optax.apply_updates``)."""
        return self._step(updates, state, params, apply=False, extra=extra_args)

    def apply(self, grads, state: PagedState, params, **extra_args):
        """Returns ``(new params, new state)`` written chunk by chunk into the parameters."""
        return self._step(grads, state, params, apply=True, extra=extra_args)

    def _step(self, grads, state: PagedState, params, *, apply: bool, extra: dict):
        if params is None:
            raise ValueError(
                "jaxoff.paged needs the parameters: call tx.update(grads, state, params)"
            )
        out_def = jax.tree.structure(params)  # the result keeps the caller's wrappers
        params, grads = canonical(params), canonical(grads)
        plan = self.plan(params)
        self.open_store(plan)
        ios = self._ios
        ram = list(state.ram)
        if len(ram) != len(plan.ram_avals) or len(state.crcs) != len(ios):
            raise ValueError(
                "jaxoff.paged: this optimizer state does not belong to these parameters (it "
                f"holds {len(ram)} RAM leaves and {len(state.crcs)} store entries, the plan "
                f"{len(plan.ram_avals)} and {len(ios)}); make it with tx.init(params)"
            )
        pre_ram, inner_ram = ram[: plan.num_pre], ram[plan.num_pre :]
        if self.pre is not None:
            pre_state = jax.tree.unflatten(plan.pre_def, pre_ram)
            grads, pre_state = self.pre.update(grads, pre_state, params, **extra)
            pre_ram = jax.tree.leaves(pre_state)
        new_inner_ram = _chunk.ram_update(plan, self.inner, self.master_dtype, inner_ram, extra)
        read_slot = (state.version % 2).astype(jnp.int32)
        g_leaves = plan.params_def.flatten_up_to(grads)
        p_leaves = plan.params_def.flatten_up_to(params)
        outs, new_crcs, tokens = [], [None] * len(ios), []
        # One token runs through all leaves: leaf k+1's first read waits for leaf k's last
        # write, so XLA cannot schedule every leaf's prologue at once (bounded buffers).
        # The first read waits for the check that the state describes the store's committed
        # version: a stale state (e.g. restored without its pages) is refused with its cause.
        shapes, packed = crc_shapes(state.crcs), pack_crcs(state.crcs)
        tok = new_token() + host_call(
            functools.partial(self._check_packed, shapes),
            jax.ShapeDtypeStruct((), jnp.int32),
            state.version,
            packed,
            name=self.calls.name("check", shapes),
        )
        split = self.engine.pool_bytes >= self.split_phase_bytes(plan)
        # Head start: the first chunks of the step (in paging order, as many as the staging
        # left over by the pipeline holds) are prefetched now. Nothing here depends on the
        # gradients, so their reads run during the forward and backward passes.
        heads = self._head_chunks(plan) if split else [0] * len(plan.leaves)
        head_tickets = []
        for leaf, h in zip(plan.leaves, heads, strict=True):
            leaf_ios = [ios[k] for k in leaf.entries]
            leaf_crcs = [state.crcs[k] for k in leaf.entries]
            tickets = []
            for i in range(h):
                tickets.append(
                    prefetch_chunk(
                        self.table, leaf_ios, leaf_crcs, read_slot, i, leaf.chunk_size(i), tok
                    )
                )
                tok = tickets[-1][-1]
            head_tickets.append(tickets)
        # The previous step's commit runs in the background (its cache flush behind this
        # step's forward and backward passes); this step's first write overwrites the slot
        # of the version before it, so every write waits for it to be durable. The gate
        # reads a gradient, so it runs once backward has produced one, by when the commit
        # is long done.
        tok = tok + commit_gate(lambda: self.store, self.root, tok, g_leaves[0], calls=self.calls)
        gated = tok
        for leaf, g, p, head in zip(plan.leaves, g_leaves, p_leaves, head_tickets, strict=True):
            compute = functools.partial(
                self._compute, plan, leaf, g.reshape(-1), p.reshape(-1), inner_ram, extra, apply
            )
            pipeline = functools.partial(
                page_leaf,
                self.table,
                [ios[k] for k in leaf.entries],
                [state.crcs[k] for k in leaf.entries],
                read_slot,
                leaf.chunk_elems,
                leaf.n_full,
                leaf.tail,
            )
            out = p.reshape(-1) if apply else jnp.zeros((leaf.size,), self.master_dtype)
            # The pipeline reads materialised gradients (see _one_trip): fused into some
            # chunks' updates and not others, the last ops of the gradient (or of clipping)
            # would change FMA contraction and hence the last bit.
            out, crcs, tok = _one_trip(pipeline, out, compute, tok, split_phase=split, head=head)
            for k, c in zip(leaf.entries, crcs, strict=True):
                new_crcs[k] = c
            outs.append(out.reshape(leaf.shape))
            if leaf.index == 0 and _faults.armed("store.write"):
                tok = tok + _write_fault_point(tok)
            tokens.append(tok)
        new_ram = tuple(pre_ram) + tuple(new_inner_ram)
        ram_io = ios[-1]
        crc, tok = page_out(
            self.table,
            jnp.asarray(ram_io.file_ids)[1 - read_slot, 0],
            jnp.asarray(ram_io.offsets)[0],
            ram_bytes(plan, new_ram),
            gated,
        )
        new_crcs[-1] = crc.reshape(1)
        tokens.append(tok)
        # The commit follows every write of the step onto disk: write-behind writes included.
        # Its order is data: it waits for the flush token, and the next step reads the
        # version it returns. (ordered=True would add an effect token, which jax 0.10.2
        # cannot lower next to outputs placed in host memory.)
        tokens = [page_flush(self.table, functools.reduce(jnp.add, tokens))]
        new_shapes = crc_shapes(new_crcs)
        version = host_call(
            functools.partial(self._commit_packed, shapes, new_shapes),
            jax.ShapeDtypeStruct((), jnp.int32),
            state.version,
            packed,
            pack_crcs(new_crcs),
            tuple(tokens),
            name=self.calls.name("commit", (shapes, new_shapes, len(tokens))),
        )
        out_tree = jax.tree.unflatten(out_def, outs)
        return out_tree, make_state(plan, self.root, version, new_crcs, new_ram)

    def _compute(self, plan, leaf, g_flat, p_flat, inner_ram, extra, apply, i, n, chunks):
        start = i * leaf.chunk_elems
        g = _slice_bits(g_flat, start, n)
        p_ram = _slice_bits(p_flat, start, n)
        entries = [plan.entries[k] for k in leaf.entries]
        chunks = [x.astype(e.dtype) for e, x in zip(entries, chunks, strict=True)]
        p_in, states = (chunks[0], chunks[1:]) if leaf.master else (p_ram, chunks)
        u, new_states = self._chunk_update(plan, leaf.index, g, p_in, states, inner_ram, extra)
        # The new parameters are computed here, fused with the update as plain optax fuses
        # them (XLA contracts a*b+c to FMA inside a fusion); the returned updates are then the
        # exact difference, so that optax.apply_updates(params, updates) reproduces them.
        new_p = optax.apply_updates(p_in, u)
        if leaf.master:
            writes = [new_p, *new_states]
            new_param = new_p.astype(leaf.dtype)
        else:
            writes = list(new_states)
            new_param = new_p
        out = new_param if apply else exact_delta(new_param, p_ram)
        return out, [w.astype(e.storage) for e, w in zip(entries, writes, strict=True)]

    def _chunk_update(self, plan, j, g, p, states, inner_ram, extra):
        """`_chunk.chunk_update` of leaf ``j``, traced once per leaf and chunk shape
        (`_chunk.traced_once`). Extra arguments (a user's ``value=`` and the like) are passed
        as they are, untraced, by the plain call."""
        args = (g, p, states, inner_ram)
        if extra or not all(isinstance(x, jax.Array) for x in jax.tree.leaves(args)):
            return _chunk.chunk_update(
                plan, self.inner, self.master_dtype, j, g, p, states, inner_ram, extra
            )
        key = (id(plan), j)
        if key not in self._chunk_fns:  # the plan kept alive with it: its id stays its own
            self._chunk_fns[key] = (
                plan,
                _chunk.traced_once(plan, self.inner, self.master_dtype, j),
            )
        return self._chunk_fns[key][1](*args)

    def _check_packed(self, shapes, version, packed):
        return self._check(version, unpack_crcs(packed, shapes))

    def _commit_packed(self, old_shapes, new_shapes, version, old_packed, new_packed, tokens):
        old = unpack_crcs(old_packed, old_shapes)
        return self._commit(version, old, unpack_crcs(new_packed, new_shapes), tokens)

    def _check(self, version, crcs):
        store = self.store
        if store is None or store.closed:
            raise record(PageStoreError(f"page store {self.root} was closed during the update"))
        if store.commit_failed() is not None:  # the last step's background commit
            store.wait_committed()  # raises its error
        reason = stale_reason(store, version, crcs)
        if reason is not None:
            raise record(PageStoreError(reason))
        return np.zeros((), np.int32)

    def _commit(self, version, old_crcs, crcs, tokens):
        del tokens  # only a dependency: every write of the step has completed
        self._check(version, old_crcs)  # no other step committed since this one started
        store = self.store
        names = list(store.entries)
        new = store.commit(
            {n: np.asarray(c, np.uint32).reshape(-1) for n, c in zip(names, crcs, strict=True)},
            background=True,  # durable behind the next step (see commit_gate)
        )
        return np.asarray(new, np.int32)


def wait_for_steps() -> None:
    """Waits until every computation in flight in this process has run: it blocks on every
    live JAX array (an array the user holds is an output of the step that computes it). A
    failed step's error stays that step's: here it is ignored."""
    for x in jax.live_arrays():
        if not x.is_deleted():
            try:
                x.block_until_ready()
            except Exception:  # noqa: BLE001, S110 - reported where the step's outputs are used
                pass


def crc_shapes(crcs) -> tuple[tuple[int, ...], ...]:
    """The shapes `unpack_crcs` needs to split what `pack_crcs` packed from ``crcs``."""
    return tuple(tuple(c.shape) for c in crcs)


def pack_crcs(crcs) -> jax.Array:
    """Every chunk checksum of a state as one operand of a host call. A state holds one
    checksum array per store entry; a host call has one operand per array (and on a GPU,
    ``io_callback`` moves each to the host in a dispatch of its own): packed, a step's calls
    take two operands instead of two per entry (`unpack_crcs` splits them again)."""
    return jnp.concatenate([jnp.ravel(c).astype(jnp.uint32) for c in crcs])


def unpack_crcs(packed, shapes) -> list[np.ndarray]:
    """The per-entry checksum arrays `pack_crcs` packed, with their ``shapes``."""
    flat = np.asarray(packed, np.uint32)
    sizes = [math.prod(s) for s in shapes]
    if flat.size != sum(sizes):
        raise ValueError(f"{flat.size} packed checksums for shapes holding {sum(sizes)}")
    parts = np.split(flat, np.cumsum(sizes)[:-1]) if shapes else []
    return [x.reshape(s) for x, s in zip(parts, shapes, strict=True)]


def _check_chunk_bytes(chunk_bytes) -> int:
    try:
        return check_chunk_bytes(chunk_bytes)
    except PageStoreLayoutError as e:
        raise PageStoreLayoutError(
            f"jaxoff.paged: {e} (`jaxoff train --chunk-mib` sets it in MiB: 1 to "
            f"{MAX_CHUNK_BYTES >> 20})"
        ) from None


def commit_gate(
    store_of, root, token: jax.Array, after: jax.Array, *, calls: HostCalls | None = None
) -> jax.Array:
    """A token that follows a host call waiting for the background commit of the store
    ``store_of()`` returns (the page store at ``root``) to be durable, and raising its error
    (or one saying the store was closed); it runs after ``token`` and once ``after`` (one
    element of it) exists. Every write of a step follows it: a write must not overwrite the
    slot of the last durable version. ``calls``: the owner's host-call names (by default a
    new owner's; see `jaxoff.aio.host_call`)."""

    def gate(token, after):
        del token, after  # only dependencies
        store = store_of()
        if store is None or store.closed:
            raise record(PageStoreError(f"page store {root} was closed during the step"))
        store.wait_committed()
        return np.zeros((), np.int32)

    calls = calls if calls is not None else HostCalls("jaxoff.commit_gate")
    return host_call(
        gate,
        jax.ShapeDtypeStruct((), jnp.int32),
        token,
        jnp.ravel(after)[:1],
        name=calls.name("gate"),
    )


_FAULT_CALLS = HostCalls("jaxoff.fault")


def _write_fault_point(tok: jax.Array) -> jax.Array:
    """Fault point ``store.write`` as a host callback between the first leaf's page writes and
    the next leaf's (and the commit): the writes happen inside FFI calls of the jitted step,
    so a callback ordered by the paging token is the one Python-level place between chunk
    writes of a step. Only traced when ``JAXOFF_FAULT`` arms it: a plain step has none."""

    def visit(t):
        del t
        _faults.point("store.write")
        return np.zeros((), np.int32)

    return host_call(
        visit, jax.ShapeDtypeStruct((), jnp.int32), tok, name=_FAULT_CALLS.name("write")
    )


def stale_reason(store: PageStore, version, crcs) -> str | None:
    """Why a state (``version``, per-entry ``crcs``) cannot be read from ``store``, or None.

    A state is current when its chunk checksums are those of the store's committed version
    and its version reads the slot that holds it. The numbers need not be equal: a
    checkpoint restored into a store (`restore_paged`, `PagedRestore`) becomes a later
    version of that store with the same contents.
    """
    version = int(np.asarray(version))
    names = list(store.entries)
    if len(crcs) != len(names):
        return (
            f"the optimizer state has {len(crcs)} store entries, page store {store.root} "
            f"{len(names)}: the state belongs to another model or optimizer"
        )
    differ = [
        n
        for n, c in zip(names, crcs, strict=True)
        if [int(x) for x in np.asarray(c).reshape(-1)] != store.crcs(n)
    ]
    parity = store.layout.slots == 1 or version % 2 == store.version % 2
    if not differ and parity:
        return None
    return (
        f"the optimizer state describes version {version} of page store {store.root}, but the "
        f"store holds version {store.version} and its contents differ "
        f"({len(differ)} of {len(names)} entries, e.g. {(differ or names)[0]!r}): the state is "
        "stale. It was probably saved or restored without its page store contents (e.g. by "
        "orbax StandardSave/StandardRestore alone) after the store moved on. Checkpoint a "
        "paged state with jaxoff.optim.PagedSave / PagedRestore (orbax CheckpointManager) or "
        "jaxoff.optim.save_paged / restore_paged, or start again from tx.init(params)"
    )


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


def _one_trip(fn, carry, *args, **kwargs):
    """``fn(carry, *args, **kwargs)`` (a tuple, carry first), run as the body of a one-trip loop.

    XLA:CPU removes optimization barriers before fusion, so a barrier does not keep the
    last ops of a leaf's gradient (clipping's ``g / norm * max_norm``, a sum of gradient
    contributions, ...) out of the fused chunk updates; fused, they change how LLVM contracts
    the update's multiply-adds to FMA, hence its last bit (and only in the chunks outside the
    pipeline's scan, which reads the gradient as a loop operand). A loop's operands are
    materialised buffers: every chunk reads the gradient from memory, as plain optax reads
    a jitted update's argument. The body's paging calls have side effects, so XLA keeps the
    loop although it runs once.
    """

    def body(c, _):
        c, *rest = fn(c, *args, **kwargs)
        return c, tuple(rest)

    carry, rest = lax.scan(body, carry, None, length=1)
    return (carry, *(jax.tree.map(lambda x: x[0], r) for r in rest))


def _slice_bits(flat: jax.Array, start, n: int) -> jax.Array:
    """``flat[start:start + n]``, sliced as raw bits for 16-bit floats.

    XLA's CPU backend upcasts bfloat16 ops to float32; a bfloat16 slice inside the chunk
    loop becomes a slice of the whole leaf converted to float32, which loop-invariant code
    motion then hoists out of the loop: a float32 copy of every gradient leaf at once.
    Slicing the bits as uint16 keeps the loop's temporaries at chunk size.
    """
    if flat.dtype.itemsize != 2 or not jnp.issubdtype(flat.dtype, jnp.floating):
        return lax.dynamic_slice(flat, (start,), (n,))
    bits = lax.bitcast_convert_type(flat, jnp.uint16)
    return lax.bitcast_convert_type(lax.dynamic_slice(bits, (start,), (n,)), flat.dtype)


def exact_delta(new: jax.Array, old: jax.Array) -> jax.Array:
    """float32 ``u`` with ``old + u == new`` exactly (in float32) wherever one exists.

    ``new - old`` is exact when the two are within a factor of two (Sterbenz); otherwise it
    can be one ulp off, which a nudge towards the target repairs.
    """
    new, old = new.astype(jnp.float32), old.astype(jnp.float32)
    u = new - old
    for _ in range(2):
        # The barrier keeps XLA from simplifying old + (new - old) to new.
        r = old + lax.optimization_barrier(u)
        u = jnp.where(r == new, u, jnp.nextafter(u, jnp.where(new > r, jnp.inf, -jnp.inf)))
    return u


def encode(offsets) -> np.ndarray:
    from jaxoff.aio._ffi_calls import encode_offsets

    return encode_offsets(np.asarray(offsets, np.int64)).reshape(-1, 2)


def entry_ios(store: PageStore, storages=None) -> list[EntryIO]:
    """Per entry of ``store`` (in store order): its chunks' file ids per slot and encoded
    offsets, for the paging calls; ``storages``: per entry, the dtype on disk (default: the
    store's)."""
    if storages is None:
        storages = [e.dtype for e in store.entries.values()]
    tabs = [store.chunk_table(s) for s in ("A", "B")]
    out = []
    for ei, storage in enumerate(storages):
        rows = tabs[0]["entry"] == ei
        fids = np.stack([t["file_id"][t["entry"] == ei] for t in tabs]).astype(np.int32)
        out.append(EntryIO(fids, encode(tabs[0]["offset"][rows]), np.dtype(storage)))
    return out


def _write_chunk(store: PageStore, name: str, i: int, x: np.ndarray) -> int:
    x = np.ascontiguousarray(x)
    store.write_chunk(name, i, x)
    return crc32c.crc32c(x.view(np.uint8).reshape(-1))


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
