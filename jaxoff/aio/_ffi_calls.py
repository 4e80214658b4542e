"""Typed wrappers of the XLA FFI paging calls: ``page_in`` / ``page_out``, the split-phase
``page_prefetch`` / ``page_take``, and ``page_flush``.

A program pages through a *file table*: a named list of files registered once from Python
(:func:`register_file_table`). Calls name the table (a compile-time attribute) and pass the
file index, byte offset and checksum as *operands*, so one compiled program serves every step
and every chunk (slot flips and per-chunk offsets are data, never recompiles).

Both calls are asynchronous on the C++ side (they return an ``ffi::Future`` completed by the
engine's completion thread), so XLA keeps computing while the disk works; order between calls
comes only from the *token*: feed the token returned by one call into the next. Two calls
without a token path between them may run in any order.

Offsets: with ``jax_enable_x64`` off JAX has no int64 arrays, so an offset operand may be an
int32 scalar (< 2 GiB), or ``uint32[2]`` = (low word, high word) — :func:`encode_offsets` makes
those from Python/numpy integers. With x64 on, an int64 scalar works too.

>>> import jax, jax.numpy as jnp
>>> _ = register_file_table("doc", [tmp_path / "a.bin"])  # returns its registration number
>>> @jax.jit
... def roundtrip(x):
...     crc, tok = page_out("doc", 0, encode_offsets(0), x, new_token())
...     y, tok = page_in("doc", 0, encode_offsets(0), crc, tok, shape=x.shape, dtype=x.dtype)
...     return y
>>> bool((roundtrip(jnp.arange(5.0)) == jnp.arange(5.0)).all())
True

Overlap that does not depend on XLA's scheduling: XLA's CPU runtime runs a small program (or
scan body) strictly in order and awaits each asynchronous call before the next, so an async
``page_in`` only overlaps with compute when the body has more than 8 thunks. Split-phase
paging hands the overlap to the engine's threads instead: :func:`page_prefetch` starts a read
into the engine's staging and returns a *ticket* at once; :func:`page_take` (later, after the
compute) waits for that read only, verifies and copies it out. Writes go the other way with
``page_out(..., write_behind=True)``: it returns once the bytes are in staging and
:func:`page_flush` waits for every such write (and reports their errors): a commit must depend
on its token. Reads and writes of one table that overlap on disk keep their order.

On a GPU the same calls run the CUDA handlers of ``jaxoff._ffi_cuda`` (registered for platform
``CUDA`` under the same names): the disk side is the CPU engine's, and the bytes move between
the device and page-locked host staging with ``cudaMemcpyAsync`` on XLA's stream. Those
handlers are synchronous (the host waits for the disk), so on a GPU overlap comes from
split-phase paging alone. A jaxoff built without CUDA fails a paging call traced for a GPU with
a one-line :class:`~jaxoff.JaxoffError` (see :func:`jaxoff.aio.cuda_status`).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxoff import _ffi
from jaxoff._errors import JaxoffError
from jaxoff.aio import _cuda
from jaxoff.aio._engine import EngineConfig

PAGE_IN = "jaxoff_page_in"
PAGE_OUT = "jaxoff_page_out"
PAGE_PREFETCH = "jaxoff_page_prefetch"
PAGE_TAKE = "jaxoff_page_take"
PAGE_FLUSH = "jaxoff_page_flush"

_lock = threading.Lock()
_registered = False


def register_targets() -> None:
    """Registers every jaxoff FFI target and state type with XLA. Idempotent.

    CPU always; when JAX has a GPU backend, also the paging targets for platform ``CUDA``
    (from ``jaxoff._ffi_cuda``, if this build has it: :func:`jaxoff.aio._cuda.register`).
    State types can only be registered once a backend exists, so this calls ``jax.devices()``.
    """
    global _registered
    with _lock:
        if not _registered:
            jax.devices()
            for name, type_registration in _ffi.state_types().items():
                jax.ffi.register_ffi_type(name, type_registration, platform="cpu")
            for name, capsule in _ffi.registrations().items():
                jax.ffi.register_ffi_target(name, capsule, platform="cpu")
            _registered = True
        _cuda.register()


def cuda_registered() -> bool:
    """The paging targets are registered for platform CUDA in this process."""
    return _cuda.registered()


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


_tables: dict[str, int] = {}  # table name -> its current registration
_registrations = itertools.count(1)
_tables_lock = threading.Lock()


def register_file_table(
    name: str,
    paths: Sequence[str | os.PathLike | Sequence[str | os.PathLike]],
    *,
    config: EngineConfig | None = None,
    stripe_bytes: int = 0,
) -> int:
    """Opens (creating if missing) the files a program pages to, under the table ``name``.

    Args:
      name: the table's name, passed as ``table=`` to :func:`page_in` / :func:`page_out`.
        Registering a name again replaces the table (running executables keep the old one).
      paths: ``file_id`` ``i`` is ``paths[i]``: one path, or a list of paths over which one
        logical file is striped round-robin in ``stripe_bytes`` chunks (e.g. one per disk).
      config: engine knobs for this table (its own ring/threads and staging pool).
      stripe_bytes: stripe size for striped entries; a positive multiple of 4096.

    Returns:
      this registration's number: `unregister_file_table` given it forgets the table only
      while it is still this registration (not one that replaced it since).

    Raises:
      OSError: a file cannot be opened (message names the path, errno and what to do).
      ValueError: a bad knob.
    """
    config = config if config is not None else EngineConfig()
    files = []
    for p in paths:
        if isinstance(p, str | os.PathLike):
            files.append([os.fspath(p)])
        else:
            files.append([os.fspath(q) for q in p])
    with _tables_lock:
        _ffi.register_file_table(name, files, stripe_bytes=int(stripe_bytes), **config.as_kwargs())
        registration = _tables[name] = next(_registrations)
    from jaxoff.aio._backend import note_backend

    note_backend(config.backend, _ffi.file_table_backend(name))  # logs a fallback once
    return registration


def unregister_file_table(name: str, registration: int | None = None) -> bool:
    """Forgets a table (files close once no executable uses it). False if it did not exist.

    ``registration``: what `register_file_table` returned; the table is then forgotten only if
    it is still that registration, so an owner closing late does not drop the table that
    another one registered under the same name since (False then)."""
    with _tables_lock:
        if registration is not None and _tables.get(name) != registration:
            return False
        _tables.pop(name, None)
        return bool(_ffi.unregister_file_table(name))


def file_table_backend(name: str) -> str | None:
    """The engine backend (``io_uring`` / ``posix``) of a registered table, else None."""
    return _ffi.file_table_backend(name)


def new_token() -> jax.Array:
    """A fresh token (int32 scalar) to start a chain of paging calls."""
    return jnp.zeros((), jnp.int32)


def encode_offsets(offsets: Any) -> np.ndarray:
    """Byte offsets (ints, any shape) as ``uint32[..., 2]`` (low, high): an offset operand that
    needs no x64. Use the result as ``lax.scan`` xs to give each chunk its own offset.

    >>> encode_offsets([1, 1 << 33]).tolist()
    [[1, 0], [0, 2]]
    """
    o = np.asarray(offsets, dtype=np.int64)
    if (o < 0).any():
        raise ValueError("offsets must be non-negative")
    u = o.astype(np.uint64)
    return np.stack([(u & 0xFFFFFFFF).astype(np.uint32), (u >> 32).astype(np.uint32)], axis=-1)


def _offset_operand(offset: Any) -> jax.Array:
    if isinstance(offset, int | np.integer):
        return jnp.asarray(encode_offsets(int(offset)))
    offset = jnp.asarray(offset)
    ok = (offset.shape == () and offset.dtype in (jnp.int32, jnp.uint32, jnp.int64)) or (
        offset.shape == (2,) and offset.dtype == jnp.uint32
    )
    if not ok:
        raise TypeError(
            f"offset must be an int, an int32/int64 scalar or uint32[2] (lo, hi) "
            f"from encode_offsets; got {offset.dtype}{list(offset.shape)}"
        )
    return offset


def _file_id_operand(file_id: Any) -> jax.Array:
    file_id = jnp.asarray(file_id)
    if file_id.shape != () or not jnp.issubdtype(file_id.dtype, jnp.integer):
        raise TypeError(f"file_id must be an integer scalar, got {file_id.dtype}{file_id.shape}")
    return file_id.astype(jnp.int32)


_TOKEN = jax.ShapeDtypeStruct((), jnp.int32)


def page_in(
    table: str,
    file_id: Any,
    offset: Any,
    expected_crc: Any,
    token: jax.Array,
    *,
    shape: Sequence[int],
    dtype: Any,
    verify: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Reads a tensor of ``shape``/``dtype`` from ``offset`` of file ``file_id`` of ``table``.

    Works inside ``jit`` and ``lax.scan`` (all of ``file_id``, ``offset``, ``expected_crc`` may
    be traced). With ``verify``, the crc32c of the bytes read must equal ``expected_crc``
    (uint32), else the program fails with ``DATA_LOSS`` naming the path, offset and both
    checksums.

    Returns:
      ``(tensor, token)``; pass the token to the next call that must come after this one.
    """
    _require_platform(PAGE_IN)
    crc = jnp.asarray(expected_crc if verify else 0).astype(jnp.uint32)
    out, token = jax.ffi.ffi_call(
        PAGE_IN,
        (jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype)), _TOKEN),
        has_side_effect=True,
    )(
        _file_id_operand(file_id),
        _offset_operand(offset),
        crc,
        token,
        table=str(table),
        verify=bool(verify),
    )
    return out, token


def page_out(
    table: str,
    file_id: Any,
    offset: Any,
    x: jax.Array,
    token: jax.Array,
    *,
    write_behind: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Writes the bytes of ``x`` at ``offset`` of file ``file_id`` of ``table``.

    With O_DIRECT the tail is zero-padded to 4 KiB, so the slot at ``offset`` must reserve
    ``round_up(x.nbytes, 4096)`` bytes.

    Args:
      write_behind: return as soon as the bytes are copied into the table's staging (their
        crc32c is taken during that copy) while the disk write proceeds on the engine's
        threads. Later reads of the same bytes through this table (``page_in``,
        ``page_prefetch``) wait for it; anything else (another process, a commit) must follow
        :func:`page_flush`, which also reports a failed write. When the staging
        (``EngineConfig.pool_bytes``) cannot take ``x``, the write is synchronous.

    Returns:
      ``(crc, token)``: the crc32c (uint32) of the bytes written, and a token that is ready
      once the write is on its way to disk (with ``write_behind``: once it is in staging).
    """
    _require_platform(PAGE_OUT)
    crc, token = jax.ffi.ffi_call(
        PAGE_OUT,
        (jax.ShapeDtypeStruct((), jnp.uint32), _TOKEN),
        has_side_effect=True,
    )(
        _file_id_operand(file_id),
        _offset_operand(offset),
        jnp.asarray(x),
        token,
        table=str(table),
        write_behind=bool(write_behind),
    )
    return crc, token


_TICKET = jax.ShapeDtypeStruct((), jnp.int32)


def _nbytes(shape: Sequence[int], dtype: Any) -> int:
    return int(np.prod(tuple(shape), dtype=np.int64)) * jnp.dtype(dtype).itemsize


def page_prefetch(
    table: str,
    file_id: Any,
    offset: Any,
    expected_crc: Any,
    token: jax.Array,
    *,
    shape: Sequence[int],
    dtype: Any,
    verify: bool = True,
) -> jax.Array:
    """Starts reading a tensor of ``shape``/``dtype`` and returns its *ticket* at once.

    The read goes into the table's staging (at most ``EngineConfig.pool_bytes`` for all
    tickets not yet taken and write-behind writes not yet on disk) on the engine's threads,
    which also take its crc32c; :func:`page_take` waits for it. Each ticket must be taken
    exactly once; carry it through ``lax.scan`` like any int32 scalar. A read that fails (or
    whose checksum differs from ``expected_crc``, with ``verify``) fails at take time.

    Raises (when the program runs): ``RESOURCE_EXHAUSTED`` naming ``pool_bytes`` when the
    staging is full of tickets not yet taken. Tickets a failed program left behind are dropped
    by :func:`drain_prefetches`, by unregistering the table, or by a later prefetch that lacks
    room once they are 30 s old.

    >>> import jax, jax.numpy as jnp
    >>> _ = register_file_table("pf_doc", [tmp_path / "a.bin"])
    >>> @jax.jit
    ... def roundtrip(x):
    ...     crc, tok = page_out("pf_doc", 0, 0, x, new_token(), write_behind=True)
    ...     ticket = page_prefetch("pf_doc", 0, 0, crc, tok, shape=x.shape, dtype=x.dtype)
    ...     # ... compute here: the read proceeds meanwhile ...
    ...     y, tok = page_take("pf_doc", ticket, tok, shape=x.shape, dtype=x.dtype)
    ...     return y, page_flush("pf_doc", tok)
    >>> y, _ = roundtrip(jnp.arange(5.0))
    >>> bool((y == jnp.arange(5.0)).all())
    True

    Returns:
      the ticket (int32 scalar) for :func:`page_take`.
    """
    _require_platform(PAGE_PREFETCH)
    crc = jnp.asarray(expected_crc if verify else 0).astype(jnp.uint32)
    return jax.ffi.ffi_call(PAGE_PREFETCH, _TICKET, has_side_effect=True)(
        _file_id_operand(file_id),
        _offset_operand(offset),
        crc,
        token,
        table=str(table),
        nbytes=np.int64(_nbytes(shape, dtype)),
        verify=bool(verify),
    )


def page_take(
    table: str, ticket: jax.Array, token: jax.Array, *, shape: Sequence[int], dtype: Any
) -> tuple[jax.Array, jax.Array]:
    """Waits for the read of ``ticket`` (from :func:`page_prefetch`) and returns its tensor.

    ``shape``/``dtype`` must have the byte size given to the prefetch. Blocks only until that
    read is done; verifies its checksum (``DATA_LOSS`` naming path, offset and both crcs on a
    mismatch), copies it out of staging and releases the staging. The ticket is gone after
    this call, whatever its outcome.

    Returns:
      ``(tensor, token)``.
    """
    _require_platform(PAGE_TAKE)
    ticket = jnp.asarray(ticket)
    if ticket.shape != () or ticket.dtype != jnp.int32:
        raise TypeError(
            f"ticket must be the int32 scalar page_prefetch returned, got "
            f"{ticket.dtype}{list(ticket.shape)}"
        )
    out, token = jax.ffi.ffi_call(
        PAGE_TAKE,
        (jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype)), _TOKEN),
        has_side_effect=True,
    )(ticket, token, table=str(table))
    return out, token


def page_flush(table: str, token: jax.Array, *, fsync: bool = False) -> jax.Array:
    """Waits for every write-behind write of ``table`` started before it (``fsync`` also
    fsyncs the files they went to) and fails the program if one of them failed.

    Returns:
      a token; a commit (or any reader outside this table) must depend on it.
    """
    _require_platform(PAGE_FLUSH)
    return jax.ffi.ffi_call(PAGE_FLUSH, _TOKEN, has_side_effect=True)(
        token, table=str(table), fsync=bool(fsync)
    )


def drain_prefetches(table: str) -> int:
    """Drops the prefetch tickets of ``table`` that were never taken (e.g. after a program
    failed between prefetch and take); returns how many. Waits for their reads first."""
    n = int(_ffi.drain_prefetches(table))
    if n < 0:
        raise KeyError(f"file table {table!r} is not registered")
    return n


def flush_file_table(table: str, *, fsync: bool = False) -> None:
    """:func:`page_flush` from Python: waits for the table's write-behind writes.

    Raises:
      OSError: a write-behind write failed (path, offset, errno).
    """
    if not _ffi.flush_file_table(table, fsync):
        raise KeyError(f"file table {table!r} is not registered")


# `file_table_stats`' counters of time a step spent waiting on the table's I/O (nanoseconds):
# takes waiting for their reads, prefetches and write-behind writes for staging, flushes
WAIT_COUNTERS = ("take_wait_ns", "prefetch_wait_ns", "write_wait_ns", "flush_wait_ns")


def file_table_stats(table: str) -> dict[str, int] | None:
    """The split-phase staging of a table: ``tickets`` (prefetched, not taken),
    ``reads_in_flight``, ``writes_in_flight`` (write-behind), ``staging_in_use`` /
    ``staging_allocated`` / ``budget`` (bytes) and ``reclaimed`` tickets; None if no table."""
    return _ffi.file_table_stats(table)
