"""The pager: the four paging calls a step lowers, and the host-side object behind them.

A paged step is one transaction over a page store, lowered as four XLA FFI calls on one token
chain, the same on the CPU and on CUDA:

    token = page_begin(table, plan, version)        # version: the state's int32 store version
    x, token = page_take(table, plan, site, token, shape=..., dtype=...)
    token = page_out(table, plan, site, x, token)
    token = page_commit(table, plan, token)

No operand carries paging metadata: a call names its file table, its step plan and its *site*
(which call of the program it is) as attributes. The plan, registered on the host when the
step is traced (`Pager.register_plan`, one variant per parity of the store version the step
reads), lists every read and write of the step in call order as ``(site, file, offset,
bytes)``; the pager keeps one cursor per site (a site inside a scan runs once per trip),
reads ahead in plan order, verifies each chunk's crc32c, writes behind and commits once the
step's writes are durable (``ffi/engine/gpu_pager.h``). ``page_begin`` waits for the previous
step's commit and checks that the state describes the store's version (a stale state fails);
``page_commit`` ends the step and returns at once.

On the CPU the pager runs with host memory as the device (``jaxoff._ffi``); on a GPU with the
CUDA runtime (``jaxoff._ffi_cuda``): its own copy streams, a pinned arena and a device ring,
so that no call waits for the GPU. `Pager` opens the one of the platform a traced program
runs on (`platform`).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import itertools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxoff import _ffi
from jaxoff._errors import JaxoffError
from jaxoff.aio import _cuda
from jaxoff.aio._ffi_calls import register_targets

PAGER_BEGIN = "jaxoff_pager_begin"
PAGER_TAKE = "jaxoff_pager_take"
PAGER_OUT = "jaxoff_pager_out"
PAGER_COMMIT = "jaxoff_pager_commit"
PAGER_TARGETS = (PAGER_BEGIN, PAGER_TAKE, PAGER_OUT, PAGER_COMMIT)

_TOKEN = jax.ShapeDtypeStruct((), jnp.int32)


def _require_platform(target: str) -> None:
    """Registers the targets; a paging call traced for a GPU that has no CUDA handlers fails
    here with one line, not with an XLA lowering error at compile time."""
    register_targets()
    missing = _cuda.missing()
    if missing and _cuda.default_is_gpu():
        raise JaxoffError(
            f"{target} cannot run on the GPU: {missing}; {_cuda.REINSTALL}, "
            f"or run the step on the CPU (jax.default_device(jax.devices('cpu')[0]))"
        )


def page_begin(table: str, plan: int, version: Any) -> jax.Array:
    """Starts step plan ``plan`` of ``table``'s pager; returns the token of the step's chain.

    ``version`` (an int32 scalar, traced): the store version the caller's state describes; a
    state that does not describe the store's version fails the step (stale)."""
    _require_platform(PAGER_BEGIN)
    return jax.ffi.ffi_call(PAGER_BEGIN, _TOKEN, has_side_effect=True)(
        jnp.asarray(version, jnp.int32), table=str(table), plan=np.int64(plan)
    )


def page_take(
    table: str, plan: int, site: int, token: jax.Array, *, shape: Sequence[int], dtype: Any
) -> tuple[jax.Array, jax.Array]:
    """The next chunk the plan gives ``site``, read (and verified) by the pager; its bytes must
    be those of ``shape`` and ``dtype``. Returns ``(tensor, token)``."""
    _require_platform(PAGER_TAKE)
    out, token = jax.ffi.ffi_call(
        PAGER_TAKE,
        (jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype)), _TOKEN),
        has_side_effect=True,
    )(token, table=str(table), plan=np.int64(plan), site=np.int64(site))
    return out, token


def page_out(table: str, plan: int, site: int, x: jax.Array, token: jax.Array) -> jax.Array:
    """Hands ``x`` to the pager as the next chunk the plan gives ``site`` to write (to the slot
    of the next version); returns at once, the disk write runs behind. Returns the token."""
    _require_platform(PAGER_OUT)
    return jax.ffi.ffi_call(PAGER_OUT, _TOKEN, has_side_effect=True)(
        jnp.asarray(x), token, table=str(table), plan=np.int64(plan), site=np.int64(site)
    )


def page_commit(table: str, plan: int, token: jax.Array) -> jax.Array:
    """Ends the step: the pager commits it as the store's next version once its writes are
    durable (the next `page_begin` waits for that). Returns the token."""
    _require_platform(PAGER_COMMIT)
    return jax.ffi.ffi_call(PAGER_COMMIT, _TOKEN, has_side_effect=True)(
        token, table=str(table), plan=np.int64(plan)
    )


# ------------------------------------------------------------------ names


_owners: collections.defaultdict[str, itertools.count] = collections.defaultdict(
    lambda: itertools.count(1)
)
_owners_lock = threading.Lock()


def owner_name(label: str) -> str:
    """A name for one owner of a file table and its pager (``"jaxoff.paged#3"``): unique in
    this process, and the same in a new process that makes its owners in the same order, so a
    compiled step (which names its table) is the same program there, whatever the store's
    path, and JAX's persistent compilation cache serves it."""
    if "/" in label or "#" in label:
        raise ValueError(f"an owner label has no '/' or '#': {label!r}")
    with _owners_lock:
        return f"{label}#{next(_owners[label])}"


# ------------------------------------------------------------------ the host side


@dataclasses.dataclass(frozen=True)
class PagerConfig:
    """The pager's buffers: ``arena_slots`` pinned slots of ``slot_bytes`` (the largest chunk)
    bound the read-ahead, ``write_slots`` the writes in flight, ``ring_slots`` the chunks on
    the device not yet taken (a GPU's; the CPU reads straight from the arena);
    ``io_threads``: disk threads of a CUDA pager (the CPU's uses the file table's engine);
    ``wait_limit_s``: a call that waits longer fails (a hang, not a slow disk)."""

    slot_bytes: int
    arena_slots: int = 4
    ring_slots: int = 2
    write_slots: int = 4
    io_threads: int = 4
    wait_limit_s: float = 600.0

    @classmethod
    def for_budget(cls, slot_bytes: int, read_ahead_bytes: int, write_behind_bytes: int):
        """Slots of ``slot_bytes`` holding about ``read_ahead_bytes`` of read-ahead and
        ``write_behind_bytes`` of writes in flight (at least 2 of each)."""
        return cls(
            slot_bytes=int(slot_bytes),
            arena_slots=max(2, -(-int(read_ahead_bytes) // slot_bytes)),
            write_slots=max(2, -(-int(write_behind_bytes) // slot_bytes)),
        )


def platform_module() -> Any:
    """The module whose pager a program traced now runs through: ``jaxoff._ffi_cuda`` when the
    default backend is a GPU and its targets are registered, else ``jaxoff._ffi`` (CPU)."""
    register_targets()
    if _cuda.default_is_gpu() and _cuda.registered():
        module = _cuda.module()
        if module is not None:  # registered, so it loaded
            return module
    return _ffi


class PagerError(JaxoffError):
    """The pager reported an error of a step that had already returned (a write or commit
    that failed behind it): raised by `Pager.settle`."""

    def __init__(self, err: int, message: str):
        super().__init__(message)
        self.errno = err


class Pager:
    """The host side of one file table's paging: what `page_begin` ... `page_commit` of a
    program naming ``table`` run through.

    Args:
      table: a registered file table (`jaxoff.aio.register_file_table`).
      version: the store version it holds (its committed version).
      crcs: the checksums of that version's chunks, ``[(file id, offset, crc32c), ...]``.
      commit: ``commit(version, [(file id, offset, crc32c), ...])``, called on the pager's
        thread once a step's writes are durable (and synced), with the version the step makes
        and the checksums of what it wrote; it records the version (the store's manifest).
        An exception fails the commit: the store keeps its version.
      config: its buffers.
      stale_hint: what the message of a step refused for a stale state tells the user.
    """

    def __init__(
        self,
        table: str,
        *,
        version: int,
        crcs: Sequence[tuple[int, int, int]],
        commit: Callable[[int, list], None],
        config: PagerConfig,
        stale_hint: str = "",
    ):
        self.table = table
        self._module = platform_module()
        device = 0
        if self._module is not _ffi:
            device = jax.devices()[0].id  # the GPU a program traced now runs on
        self.serial = self._module.pager_open(
            table,
            device=device,
            version=int(version),
            crcs=[(int(f), int(o), int(c)) for f, o, c in crcs],
            commit=commit,
            slot_bytes=int(config.slot_bytes),
            arena_slots=int(config.arena_slots),
            ring_slots=int(config.ring_slots),
            write_slots=int(config.write_slots),
            io_threads=int(config.io_threads),
            wait_limit_s=float(config.wait_limit_s),
            stale_hint=stale_hint,
        )
        self.config = config
        self.closed = False
        with _open_lock:
            _open.add(self)

    @property
    def platform(self) -> str:
        return "cpu" if self._module is _ffi else "cuda"

    def register_plan(self, plan_id: int, even, odd) -> None:
        """Registers plan ``plan_id``: ``(reads, writes)`` of a step that reads an even and an
        odd store version, each ``[(site, file id, offset, bytes), ...]`` in call order."""
        self._module.pager_plan(self.table, self.serial, int(plan_id), *even, *odd)

    @property
    def replaced(self) -> bool:
        """Another owner opened a pager under this table's name since (this one was closed
        then, its pending commit made): nothing of it is left to wait for."""
        return self._module.pager_serial(self.table) != self.serial

    def settle(self) -> None:
        """Waits for the last step's writes and commit; raises `PagerError` with the first
        error since the last one raised (a failed write, sync or commit)."""
        if self.closed or self.replaced:
            return
        err, message = self._module.pager_settle(self.table, self.serial)
        if err or message:
            raise PagerError(int(err), str(message))

    def reset(self, version: int, crcs: Sequence[tuple[int, int, int]]) -> None:
        """Sets the store version and the checksums anew (the store was written from outside
        the pager: an initial write, a restored checkpoint); only between steps."""
        err, message = self._module.pager_reset(
            self.table, self.serial, int(version), [(int(f), int(o), int(c)) for f, o, c in crcs]
        )
        if err or message:
            raise PagerError(int(err), str(message))

    def checksums(self) -> list[tuple[int, int, int]]:
        return list(self._module.pager_checksums(self.table, self.serial))

    def stats(self) -> dict[str, int]:
        """Counters: steps, commits, takes, puts, disk reads and writes, syncs, and the time
        calls waited on the host (``take_wait_ns``: reads not hidden; ``put_wait_ns``: all
        write slots busy; ``begin_wait_ns``: the previous step's writes and commit)."""
        return dict(self._module.pager_stats(self.table, self.serial))

    def close(self) -> None:
        """Closes the pager: a step's pending commit is made, its writes waited for. Idempotent;
        a pager that another owner's replaced under the same table name is left alone."""
        if not self.closed:
            self.closed = True
            with _open_lock:
                _open.discard(self)
            self._module.pager_close(self.table, self.serial)


_open: weakref.WeakSet[Pager] = weakref.WeakSet()  # the pagers of this process not closed
_open_lock = threading.Lock()


def wait_for_steps() -> None:
    """Waits until every computation in flight in this process has run: JAX's effects barrier
    (every program with side effects, as every paged step is, whether or not its outputs are
    still held) and every live JAX array. A failed step's error stays that step's: here it is
    ignored."""
    drain_runtime_tokens()
    for x in jax.live_arrays():
        if not x.is_deleted():
            try:
                x.block_until_ready()
            except Exception:  # noqa: BLE001, S110 - reported where the step's outputs are used
                pass


def drain_runtime_tokens() -> None:
    """Waits for JAX's effects barrier; where a step failed, forgets the runtime tokens that
    carry its error. The error was raised where the step's outputs were used (or will be, from
    them); kept in the tokens, it would be raised again by every later barrier, JAX's exit
    handlers' included, as tracebacks after the one line that said what happened."""
    try:
        jax.effects_barrier()
    except Exception:  # noqa: BLE001 - reported where the step's outputs are used
        try:
            from jax._src import dispatch  # JAX's internals: another JAX may lack them

            dispatch.runtime_tokens.clear()
        except Exception:  # noqa: BLE001, S110 - another JAX: its exit may still say it
            pass


@atexit.register
def _close_at_exit() -> None:
    """Closes the pagers left open when the interpreter exits, while it still runs: the steps
    dispatched and not yet run page through them, and a step's pending commit calls into
    Python, which it cannot once the interpreter is finalising. (Registered after JAX's own
    exit handlers, so it runs before them.)"""
    with _open_lock:
        pagers = list(_open)
    if pagers:
        wait_for_steps()
    else:
        drain_runtime_tokens()
    for pager in pagers:
        try:
            pager.close()
        except Exception:  # noqa: BLE001, S110 - exiting: the store keeps its last version
            pass


# `Pager.stats`' counters of time a step's calls waited on the host (nanoseconds)
WAIT_COUNTERS = ("take_wait_ns", "put_wait_ns", "begin_wait_ns")


def io_stats(table: str) -> dict[str, int] | None:
    """The paging counters of ``table``: its engine's (``io_busy_ns``, ``read_bytes``,
    ``write_bytes``) and its pager's (`Pager.stats`), None when the table or its pager is
    not open. For a training loop that knows the table's name only."""
    engine = _ffi.file_table_stats(table)
    if engine is None:
        return None
    register_targets()
    for module in (_ffi, _cuda.module()):
        if module is not None and table in module.pager_tables():
            try:
                return {**dict(engine), **dict(module.pager_stats(table))}
            except ValueError:  # closed meanwhile
                return None
    return None
