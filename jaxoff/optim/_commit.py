"""The commit protocol of a paged step: one rule, for `paged` and for Fuyou alike.

A paged step reads the committed version of a page store, writes the next one into the other
slot, and commits it. What it holds between steps is neutral data: the store version it
read and the crc32c of every chunk, by store entry name. Two checks guard it:

- `check_state`, before the step's first read: the state describes the store's committed
  version (`stale_reason`: its checksums are the store's and its version reads the slot that
  holds them), else the step is refused, saying why (a state restored without its pages, a
  closed store, a failed background commit);
- `commit_state`, after every write of the step is durable: the same check (no other step
  committed meanwhile), then ``store.commit(new crcs, background=True)``, durable behind the
  next step, whose writes wait for it (`commit_gate`).

`StepCommit` makes the two host calls of one step owner (a `paged` optimizer, a Fuyou
layout) from the state's checksum arrays, packed into one operand each; ``names_of`` maps
those arrays to entry names (a plain state holds one array per store entry, in store order;
Fuyou one ``[layers, chunks]`` array per stacked entry).

>>> import tempfile, numpy as np
>>> from jaxoff.aio import PageStore
>>> store = PageStore.create(tempfile.mkdtemp(), {"w": ((4,), np.float32)}, chunk_bytes=4096)
>>> store.write_chunk("w", 0, np.ones(4, np.float32))
>>> v = store.commit({"w": store.crcs("w", store.inactive_slot)})
>>> stale_reason(store, v, {"w": store.crcs("w")}) is None
True
>>> "the state is stale" in stale_reason(store, v, {"w": [0]})
True
>>> store.close()
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np

from jaxoff.aio import PageStore, PageStoreError
from jaxoff.aio._error_from import record
from jaxoff.aio._host_call import HostCalls, host_call
from jaxoff.optim._codec import crc_shapes, pack_crcs, unpack_crcs

# what a plain paged state's owner does about a stale state (the default of `stale_reason`)
PAGED_FIX = (
    "It was probably saved or restored without its page store contents (e.g. by "
    "orbax StandardSave/StandardRestore alone) after the store moved on. Checkpoint a "
    "paged state with jaxoff.optim.PagedSave / PagedRestore (orbax CheckpointManager) or "
    "jaxoff.optim.save_paged / restore_paged, or start again from tx.init(params)"
)


def stale_reason(store: PageStore, version, crcs, fix: str = PAGED_FIX) -> str | None:
    """Why a state (``version``, ``crcs``) cannot be read from ``store``, or None.

    ``crcs``: the chunk checksums by entry name (a mapping), or per store entry in store
    order (a sequence). A state is current when its chunk checksums are those of the store's
    committed version and its version reads the slot that holds it. The numbers need not be
    equal: a checkpoint restored into a store (`restore_paged`, `PagedRestore`,
    ``fuyou_restore``) becomes a later version of that store with the same contents.
    ``fix``: what the message tells the user to do.
    """
    version = int(np.asarray(version))
    names = list(store.entries)
    if not isinstance(crcs, Mapping):
        if len(crcs) != len(names):
            return (
                f"the optimizer state has {len(crcs)} store entries, page store {store.root} "
                f"{len(names)}: the state belongs to another model or optimizer"
            )
        crcs = dict(zip(names, crcs, strict=True))
    elif sorted(crcs) != sorted(names):
        return (
            f"the optimizer state has {len(crcs)} store entries, page store {store.root} "
            f"{len(names)}: the state belongs to another model or optimizer"
        )
    differ = [
        n for n in names if [int(x) for x in np.asarray(crcs[n]).reshape(-1)] != store.crcs(n)
    ]
    parity = store.layout.slots == 1 or version % 2 == store.version % 2
    if not differ and parity:
        return None
    return (
        f"the optimizer state describes version {version} of page store {store.root}, but the "
        f"store holds version {store.version} and its contents differ "
        f"({len(differ)} of {len(names)} entries, e.g. {(differ or names)[0]!r}): the state is "
        f"stale. {fix}"
    )


def check_state(store, root, version, crcs, fix: str = PAGED_FIX) -> np.ndarray:
    """Raises `PageStoreError` unless the state (``version``, ``crcs``: see `stale_reason`)
    can be read from ``store`` (the store at ``root``, None when not open): the store is
    open, its last background commit did not fail (its error is raised), and the state is
    not stale. Returns int32 0 (a host call's result)."""
    if store is None or store.closed:
        raise record(PageStoreError(f"page store {root} was closed during the update"))
    if store.commit_failed() is not None:  # the last step's background commit
        store.wait_committed()  # raises its error
    reason = stale_reason(store, version, crcs, fix)
    if reason is not None:
        raise record(PageStoreError(reason))
    return np.zeros((), np.int32)


def commit_state(store, root, version, old_crcs, new_crcs: Mapping, fix: str = PAGED_FIX):
    """Commits the step that read state (``version``, ``old_crcs``) and wrote ``new_crcs``
    (by entry name, every entry of ``store``): `check_state` (no other step committed since
    this one started), then a background commit, durable behind the next step (whose writes
    wait for it: `commit_gate`). Returns the new version as int32."""
    check_state(store, root, version, old_crcs, fix)
    new = store.commit(
        {n: np.asarray(c, np.uint32).reshape(-1) for n, c in new_crcs.items()}, background=True
    )
    return np.asarray(new, np.int32)


class StepCommit:
    """The check and commit host calls of one step owner, over neutral data.

    Args:
      store_of: returns the owner's page store (None when not open), at call time.
      root: the store's directory (for messages).
      calls: the owner's host-call names (``check`` and ``commit``).
      names_of: maps the state's checksum arrays (numpy, as traced) to ``{entry name:
        crcs}``; default: one array per store entry, in store order.
      fix: what a stale state's message tells the user to do (`stale_reason`).
    """

    def __init__(
        self,
        store_of: Callable[[], PageStore | None],
        root,
        calls: HostCalls,
        names_of: Callable[[list[np.ndarray]], Mapping] | None = None,
        fix: str = PAGED_FIX,
    ):
        self.store_of, self.root, self.calls, self.fix = store_of, root, calls, fix
        self._names_of = names_of

    def names(self, crcs: list[np.ndarray]):
        """``crcs`` by entry name (a sequence in store order where no ``names_of`` is set)."""
        return crcs if self._names_of is None else self._names_of(crcs)

    def stale(self, version, crcs: Sequence) -> str | None:
        """`stale_reason` of the state (``version``, ``crcs``: its checksum arrays), outside
        a trace (e.g. before a checkpoint copies the store)."""
        store = self.store_of()
        assert store is not None  # its callers (fuyou_save) hold an open store
        return stale_reason(store, version, self.names([np.asarray(c) for c in crcs]), self.fix)

    def check(self, version: jax.Array, crcs: Sequence[jax.Array]) -> jax.Array:
        """A host call (int32 0) raising unless the state (``version``, ``crcs``) is the
        store's committed version; reads that follow it read a current state."""
        shapes = crc_shapes(crcs)
        return host_call(
            functools.partial(self._check_packed, shapes),
            jax.ShapeDtypeStruct((), jnp.int32),
            version,
            pack_crcs(crcs),
            name=self.calls.name("check", shapes),
        )

    def commit(
        self, version: jax.Array, old: Sequence[jax.Array], new: Sequence[jax.Array], after
    ) -> jax.Array:
        """A host call committing ``new`` (the step's checksums) once ``after`` (a token
        that follows every write of the step, flushed) exists; returns the new version."""
        shapes, new_shapes = crc_shapes(old), crc_shapes(new)
        key = (shapes, new_shapes, len(after)) if isinstance(after, tuple) else (shapes, new_shapes)
        return host_call(
            functools.partial(self._commit_packed, shapes, new_shapes),
            jax.ShapeDtypeStruct((), jnp.int32),
            version,
            pack_crcs(old),
            pack_crcs(new),
            after,
            name=self.calls.name("commit", key),
        )

    def _check_packed(self, shapes, version, packed):
        crcs = self.names(unpack_crcs(packed, shapes))
        return check_state(self.store_of(), self.root, version, crcs, self.fix)

    def _commit_packed(self, old_shapes, new_shapes, version, old_packed, new_packed, after):
        del after  # only a dependency: every write of the step has completed
        old = self.names(unpack_crcs(old_packed, old_shapes))
        new = self.names(unpack_crcs(new_packed, new_shapes))
        store = self.store_of()
        if not isinstance(new, Mapping) and store is not None:
            new = dict(zip(store.entries, new, strict=True))
        # still a list only when no store is open, which commit_state's check refuses first
        return commit_state(store, self.root, version, old, cast(Mapping, new), self.fix)


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
