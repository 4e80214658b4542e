"""`PageTransaction`: a page store, its file table and its pager, and the one transaction every
paged step runs through, the paged optimizer's and Fuyou's alike.

Lifecycle (host side):

- `PageTransaction.open` opens (or creates) the store, registers its files as the file table
  the step's calls name and opens the platform's pager at the store's committed version with
  its checksums;
- `PageTransaction.write_initial` writes a first version (every chunk) and commits it;
  `PageTransaction.adopt` tells the pager of a version written from outside (a restored
  checkpoint);
- `PageTransaction.settle` waits for the steps in flight and their commits (before anything
  reads the store from Python), `PageTransaction.close` releases everything.

One step (traced): `PageTransaction.begin` lowers ``page_begin`` with the state's version and
returns a `StepRecorder`; the step's reads (`StepRecorder.take`) and writes
(`StepRecorder.put`) follow on one token chain, in scans through `StepRecorder.scan`;
`StepRecorder.commit` lowers ``page_commit`` and registers the `StepPlan` the recorder kept,
mapped to the store's files, for both parities of the version a step reads. The pager
commits the step once its writes are durable: its thread calls back here, and the store
records the new version in its manifest (`PageStore.commit`).

>>> import tempfile, jax, jax.numpy as jnp, numpy as np
>>> txn = PageTransaction.open(tempfile.mkdtemp(), {"w": ((1024,), "float32")},
...                            chunk_bytes=4096, slots=2, table=PagedTable("doc"))
>>> txn.write_initial([("w", 0, np.ones(1024, np.float32))])
1
>>> @jax.jit
... def step(version):
...     rec = txn.begin(version)
...     x = rec.take(lambda env: ("w", 0), (1024,), jnp.float32)
...     rec.put(lambda env: ("w", 0), 2 * x)
...     rec.commit()
...     return version + 1, x.sum()
>>> version, total = step(jnp.int32(1))
>>> int(version), float(total)
(2, 1024.0)
>>> txn.settle(); float(txn.store.read("w").sum())
2048.0
>>> txn.close()
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import numpy as np
from jax import lax

from jaxoff.aio import (
    EngineConfig,
    Pager,
    PagerConfig,
    PagerError,
    PageStore,
    PageStoreError,
    PageStoreLayoutError,
    PageStoreTornError,
    check_ram_tier,
    layout_differences,
    owner_name,
    page_begin,
    page_commit,
    page_out,
    page_take,
    plan_layout,
    ram_tier_differences,
    ram_tier_dir,
    read_manifest,
    register_file_table,
    store_error_from,
    unregister_file_table,
    wait_for_steps,
)
from jaxoff.optim._codec import write_chunk
from jaxoff.optim._stepplan import Address, Loop, Site, StepPlan

# the pager's default buffers: read-ahead and writes in flight, in bytes
READ_AHEAD_BYTES = 64 << 20
WRITE_BEHIND_BYTES = 64 << 20

# what a stale state's message tells the user to do (`PageTransaction.check_version`)
STALE_FIX = (
    "It was probably saved or restored without its page store contents (e.g. by orbax "
    "StandardSave/StandardRestore alone) after the store moved on. Checkpoint a paged state "
    "with jaxoff's checkpoint functions (jaxoff.optim.PagedSave / PagedRestore, save_paged / "
    "restore_paged, fuyou_save / fuyou_restore), or start again from a fresh init"
)


def stale_reason(store: PageStore, version, fix: str = STALE_FIX) -> str | None:
    """Why a state describing version ``version`` of ``store`` cannot be read from it (the
    store holds another version: the state is stale), or None.

    >>> import tempfile, numpy as np
    >>> store = PageStore.create(tempfile.mkdtemp(), {"w": ((4,), np.float32)}, chunk_bytes=4096)
    >>> store.write("w", np.ones(4, np.float32)); store.commit()
    1
    >>> stale_reason(store, 1) is None, "is stale" in stale_reason(store, 0)
    (True, True)
    >>> store.close()
    """
    version = int(np.asarray(version))
    if version == store.version:
        return None
    return (
        f"the optimizer state describes version {version} of page store {store.root}, but the "
        f"store holds version {store.version}: the state is stale. {fix}"
    )


class PagedTable:
    """The name of one owner's file table (`jaxoff.aio.owner_name`) and the step plans
    traced for it: it outlives the transactions of its owner, so that a step compiled before
    the store was closed and opened again finds its plans in the new pager."""

    def __init__(self, label: str):
        self.name = owner_name(label)
        self.plans: dict[int, StepPlan] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def next_id(self) -> int:
        with self._lock:
            return next(self._ids)


class PageTransaction:
    """A page store with its file table and pager. Make it with `open`."""

    def __init__(
        self,
        store: PageStore,
        *,
        table: PagedTable,
        engine: EngineConfig | None = None,
        read_ahead_bytes: int = READ_AHEAD_BYTES,
        write_behind_bytes: int = WRITE_BEHIND_BYTES,
        stale_fix: str = STALE_FIX,
    ):
        self.store = store
        self.stale_fix = stale_fix
        self.root = store.root
        self.owner = table
        self.table = table.name
        self.engine = engine if engine is not None else EngineConfig()
        self._registration = register_file_table(self.table, store.file_table(), config=self.engine)
        # what the pager's thread calls to commit: it holds the store, not this transaction,
        # so that a transaction nobody holds is collected and closed (`_release`)
        self._committer = _Committer(store)
        # slots as large as the largest chunk there is (a store of small leaves with a large
        # chunk size needs small slots)
        largest = max((c.padded_nbytes for e in store.layout.entries for c in e.chunks), default=1)
        self.config = PagerConfig.for_budget(largest, read_ahead_bytes, write_behind_bytes)
        try:
            self.pager = Pager(
                self.table,
                version=store.version,
                crcs=self._store_crcs(),
                commit=self._committer,
                config=self.config,
                stale_hint=stale_fix,
            )
        except BaseException:
            unregister_file_table(self.table, self._registration)
            raise
        for plan_id, plan in table.plans.items():  # steps compiled against an earlier pager
            self.pager.register_plan(plan_id, *(self._placed(plan, p) for p in (0, 1)))
        store.settle_hook = weakref.WeakMethod(self._settle_hook)
        # a transaction dropped without `close` (an optimizer a user let go) gives back its
        # files, pager and lock when it is collected, its last step committed
        self._finalizer = weakref.finalize(
            self, _release, self.pager, store, self.table, self._registration, self._committer
        )

    @classmethod
    def open(
        cls,
        root,
        entries: Mapping[str, Any],
        *,
        chunk_bytes: int,
        slots: int = 2,
        table: PagedTable | None = None,
        engine: EngineConfig | None = None,
        discard_torn: bool = False,
        store: PageStore | None = None,
        read_ahead_bytes: int = READ_AHEAD_BYTES,
        write_behind_bytes: int = WRITE_BEHIND_BYTES,
        stale_fix: str = STALE_FIX,
        host_mem: int = 0,
    ) -> PageTransaction:
        """Opens (or creates) the store at ``root`` with ``entries`` (``{name: (shape,
        dtype)}``, in store order), or takes the open ``store`` (whose entries must be those),
        and opens its pager.

        ``host_mem``: bytes of the store's RAM tier (`jaxoff.aio._ramtier`): entries, in
        order, whose files fit in it live in host memory, the rest on disk; checked against
        the machine before anything is written.

        ``discard_torn``: a single-slot store left mid-update by a crash is made again empty
        instead of raising `PageStoreTornError` (for a caller that writes every chunk anew).
        ``stale_fix``: what a stale state's message tells the user to do (`stale_reason`).

        Raises:
          PageStoreError: the store holds other entries (another model or layout).
        """
        if store is None or store.closed:
            planned = plan_layout(
                entries,
                chunk_bytes,
                slots=slots,
                ram_bytes=int(host_mem),
                ram_dir=ram_tier_dir(root) if host_mem else None,
            )
            check_ram_tier(planned, os.path.abspath(os.fspath(root)))
            try:
                store = PageStore.open_or_create(root, planned, slots=slots)
            except PageStoreTornError:
                if not discard_torn:
                    raise
                store = PageStore.create(root, planned, exist_ok=True, slots=slots)
            except PageStoreLayoutError:
                # a restore (which rewrites every chunk) may move pages between the RAM tier
                # and the disk: a resumed run may be given another --host-mem
                if not discard_torn or not _only_the_ram_tier_differs(root, planned):
                    raise
                store = PageStore.create(root, planned, exist_ok=True, slots=slots)
        if list(store.entries) != list(entries):
            store.close()
            raise PageStoreError(
                f"page store {store.root} holds other entries than this model's optimizer "
                "needs (another model, optimizer or layout): give it its own store directory"
            )
        try:
            return cls(
                store,
                table=table if table is not None else PagedTable("jaxoff.store"),
                engine=engine,
                read_ahead_bytes=read_ahead_bytes,
                write_behind_bytes=write_behind_bytes,
                stale_fix=stale_fix,
            )
        except BaseException:
            store.close()
            raise

    @property
    def closed(self) -> bool:
        return self.store.closed

    # ------------------------------------------------------------------ host side

    def write_initial(self, chunks: Iterable[tuple[str, int, np.ndarray]]) -> int:
        """Writes a whole version, ``(entry, chunk index, data)`` for every chunk of every
        entry, and commits it; returns its version. What `init` of a paged step does."""
        self.settle()
        crcs: dict[str, list] = {
            name: [None] * len(e.chunks) for name, e in self.store.entries.items()
        }
        for name, index, data in chunks:
            crcs[name][index] = write_chunk(self.store, name, index, data)
        version = self.store.commit(crcs)
        self.adopt()
        return version

    def adopt(self) -> None:
        """Makes the pager hold the store's committed version and its checksums, after the
        store was written from Python (`write_initial`, a restored checkpoint)."""
        try:
            self.pager.reset(self.store.version, self._store_crcs())
        except PagerError as e:
            raise PageStoreError(f"page store {self.root}: {e}") from None

    def settle(self) -> None:
        """Waits until every step in flight has run and its commit is durable, and raises
        the first error a step left behind (a failed write or commit), once."""
        wait_for_steps()
        try:
            self.pager.settle()
        except PagerError as e:
            cause, self._committer.error = self._committer.error, None
            if isinstance(cause, PageStoreError):
                raise cause from None
            error = PageStoreError(
                f"page store {self.root}: a step's write or commit failed: {e}; the store "
                "keeps its last committed version"
            )
            raise (store_error_from(error) or error) from None

    def _settle_hook(self) -> None:
        """The store's `settle_hook`: what this process reads of the store is what its steps
        made (not on the pager's thread, which commits through the store)."""
        if not self._committer.committing and not self.pager.closed:
            self.settle()  # (nothing to wait for once another owner replaced the pager)

    def check_version(self, version) -> None:
        """Raises `PageStoreError` unless ``version`` is the store's committed version (see
        `stale_reason`)."""
        reason = stale_reason(self.store, version, self.stale_fix)
        if reason is not None:
            raise PageStoreError(reason)

    def stats(self) -> dict[str, int]:
        return self.pager.stats()

    def close(self) -> None:
        """Waits for the steps in flight and their commits, then closes the pager, the store
        and the file table. Idempotent; a step's failed commit is raised after all is
        closed."""
        if self.pager.closed:
            return
        error = None
        try:
            self.settle()
        except PageStoreError as e:
            error = e
        self._finalizer()
        if error is not None:
            raise error

    # ------------------------------------------------------------------ one step (traced)

    def begin(self, version) -> StepRecorder:
        """Starts a step that reads store version ``version`` (the state's: an int32 scalar,
        traced): lowers ``page_begin`` and returns the recorder of the step's calls."""
        plan_id = self.owner.next_id()
        return StepRecorder(self, plan_id, page_begin(self.table, plan_id, version))

    def register(self, plan_id: int, plan: StepPlan) -> None:
        """Gives the pager `StepPlan` ``plan`` as plan ``plan_id``: its reads and writes mapped
        to the store's files, one variant per parity of the version a step reads."""
        variants = tuple(self._placed(plan, parity) for parity in (0, 1))
        self.owner.plans[plan_id] = plan
        self.pager.register_plan(plan_id, *variants)

    def _placed(self, plan: StepPlan, parity: int):
        read_slot = "A" if parity == 0 else "B"
        write_slot = "B" if parity == 0 else "A"
        reads, writes = [], []
        for io in plan.ios():
            slot = read_slot if io.kind == "read" else write_slot
            where = self._address_index(slot).get((io.entry, io.chunk))
            if where is None:
                raise PageStoreError(
                    f"a paged step {io.kind}s chunk {io.chunk} of {io.entry!r}, which page "
                    f"store {self.root} does not hold"
                )
            file_id, offset, nbytes = where
            if nbytes != io.nbytes:
                raise PageStoreError(
                    f"a paged step {io.kind}s {io.nbytes} bytes as chunk {io.chunk} of "
                    f"{io.entry!r}, which holds {nbytes} in page store {self.root}"
                )
            (reads if io.kind == "read" else writes).append((io.site, file_id, offset, nbytes))
        return reads, writes

    def _address_index(self, slot: str) -> dict[tuple[str, int], tuple[int, int, int]]:
        return self._committer.address_index(slot)

    def _store_crcs(self) -> list[tuple[int, int, int]]:
        return self._committer.store_crcs()


def _only_the_ram_tier_differs(root, planned) -> bool:
    try:
        have = read_manifest(os.fspath(root))[0]
    except PageStoreError:
        return False
    diffs = layout_differences(have, planned)
    return bool(diffs) and diffs == ram_tier_differences(have, planned)


def _release(pager, store: PageStore, table: str, registration, committer) -> None:
    """Closes what a transaction holds, once its steps in flight have run: the pager (making
    the last step's pending commit), the store and the file table. Where the collector runs
    it on the pager's own thread (mid-commit), a thread of its own does it, as the pager
    cannot wait for itself."""
    if committer.committing:
        threading.Thread(
            target=_release, args=(pager, store, table, registration, committer)
        ).start()
        return
    try:
        if not pager.closed:
            wait_for_steps()  # steps dispatched before it was let go still page through it
        pager.close()
    finally:
        store.settle_hook = None
        try:
            store.close()
        finally:
            unregister_file_table(table, registration)


class _Committer:
    """The pager's commit of a store (called on the pager's thread): the step that read the
    store's version wrote ``rows`` (``(file id, offset, crc32c)``) to the other slot, synced:
    record them as the store's next version."""

    def __init__(self, store: PageStore):
        self.store = store
        self.error: BaseException | None = None
        self._index: dict[str, dict[tuple[str, int], tuple[int, int, int]]] = {}
        self._local = threading.local()  # set on the pager's thread while it commits

    @property
    def committing(self) -> bool:
        return getattr(self._local, "committing", False)

    def address_index(self, slot: str) -> dict[tuple[str, int], tuple[int, int, int]]:
        if slot not in self._index:
            t = self.store.chunk_table(slot)
            names = list(self.store.entries)
            self._index[slot] = {
                (names[e], int(c)): (int(f), int(o), int(n))
                for e, c, f, o, n in zip(
                    t["entry"], t["chunk"], t["file_id"], t["offset"], t["nbytes"], strict=True
                )
            }
        return self._index[slot]

    def store_crcs(self) -> list[tuple[int, int, int]]:
        """The committed version's checksums as ``(file id, offset, crc32c)``."""
        if self.store.version == 0:
            return []
        index = self.address_index(self.store.active_slot)
        out = []
        for name in self.store.entries:
            for c, crc in enumerate(self.store.crcs(name)):
                if crc is not None:
                    f, o, _ = index[(name, c)]
                    out.append((f, o, int(crc)))
        return out

    def __call__(self, version: int, rows: list) -> None:
        self._local.committing = True
        try:
            store = self.store
            if store.closed:
                raise PageStoreError(f"page store {store.root} was closed during a step")
            if version != store.version + 1:
                raise PageStoreError(
                    f"the pager of page store {store.root} commits version {version}, but the "
                    f"store holds version {store.version}"
                )
            by_file = {
                (f, o): key for key, (f, o, _) in self.address_index(store.inactive_slot).items()
            }
            crcs: dict[str, list] = {n: [None] * len(e.chunks) for n, e in store.entries.items()}
            for f, o, crc in rows:
                name, c = by_file[(int(f), int(o))]
                crcs[name][c] = int(crc)
            store.commit(crcs, durable=True)
        except BaseException as e:
            self.error = e
            raise
        finally:
            self._local.committing = False


class StepRecorder:
    """The paging calls of one traced step, on one token chain; see `PageTransaction.begin`.

    An address (of `take` and `put`) is ``address(env) -> (entry name, chunk index)``, where
    ``env`` maps each `Loop` the call runs in (from `scan`) to the static value of the trip.
    """

    def __init__(self, txn: PageTransaction, plan_id: int, token: jax.Array):
        self.txn, self.plan_id, self.token = txn, plan_id, token
        self._root: list = []
        self._stack: list[list] = [self._root]
        self._loops: list[Loop] = []
        self._sites: list[Site] = []
        self.plan: StepPlan | None = None  # set by commit

    def _site(self, kind, address: Address, nbytes: int) -> Site:
        if self.plan is not None:
            raise RuntimeError("this step is committed: begin another one")
        site = Site(len(self._sites), kind, address, int(nbytes), tuple(self._loops))
        self._sites.append(site)
        self._stack[-1].append(site)
        return site

    def take(self, address: Address, shape, dtype) -> jax.Array:
        """Reads the chunk at ``address`` (verified) as an array of ``shape`` and ``dtype``."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        site = self._site("read", address, nbytes)
        x, self.token = page_take(
            self.txn.table, self.plan_id, site.index, self.token, shape=shape, dtype=dtype
        )
        return x

    def put(self, address: Address, x: jax.Array) -> None:
        """Writes ``x`` as the chunk at ``address`` of the next version (behind the step)."""
        site = self._site("write", address, x.size * x.dtype.itemsize)
        self.token = page_out(self.txn.table, self.plan_id, site.index, x, self.token)

    def scan(
        self,
        body: Callable,
        carry,
        xs=None,
        *,
        values,
        reverse: bool = False,
        length: int | None = None,
    ):
        """``lax.scan`` whose body pages through this step: ``body(carry, x, loop) -> (carry,
        y)``, with ``loop`` the `Loop` its addresses read their trip's value from; ``values``:
        each trip's static value, in the order of ``xs`` (a reverse scan runs them last
        first). The token rides in the scan's carry."""
        order = tuple(values)[::-1] if reverse else tuple(values)
        traced: list[Loop] = []

        def wrapped(c, x):
            tok, c = c
            loop = Loop(order)
            traced.append(loop)
            outer = self.token
            self._stack.append(loop.body)
            self._loops.append(loop)
            self.token = tok
            try:
                c, y = body(c, x, loop)
                tok = self.token
            finally:
                self._stack.pop()
                self._loops.pop()
                self.token = outer
            return (tok, c), y

        (tok, carry), ys = lax.scan(
            wrapped, (self.token, carry), xs, reverse=reverse, length=length
        )
        if traced:  # JAX may trace a body more than once: the last trace is the program's
            self._stack[-1].append(traced[-1])
        self.token = tok
        return carry, ys

    def commit(self) -> jax.Array:
        """Ends the step (lowers ``page_commit``) and registers its plan; returns the token."""
        self.token = page_commit(self.txn.table, self.plan_id, self.token)
        self.plan = StepPlan(tuple(self._root), tuple(self._sites))
        self.txn.register(self.plan_id, self.plan)
        return self.token
