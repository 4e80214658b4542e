"""The XLA FFI targets of jaxoff (registered once per process) and the *file tables* they page
through: a named list of files opened once from Python (:func:`register_file_table`), each
with an engine of its own. The paging calls themselves (``page_begin`` ... ``page_commit``)
and the pager behind them are in :mod:`jaxoff.aio._pager`.

>>> _ = register_file_table("doc", [tmp_path / "a.bin"])  # returns its registration number
>>> file_table_backend("doc") in ("io_uring", "posix")
True
>>> unregister_file_table("doc")
True
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence

import jax

from jaxoff import _ffi
from jaxoff.aio import _cuda
from jaxoff.aio._backend import note_backend
from jaxoff.aio._engine import EngineConfig

_lock = threading.Lock()
_registered = False


def register_targets() -> None:
    """Registers every jaxoff FFI target with XLA. Idempotent.

    CPU always; when JAX has a GPU backend, also the paging targets for platform ``CUDA``
    (from ``jaxoff._ffi_cuda``, if this build has it: :func:`jaxoff.aio._cuda.register`).
    """
    global _registered
    with _lock:
        if not _registered:
            jax.devices()
            for name, capsule in _ffi.registrations().items():
                jax.ffi.register_ffi_target(name, capsule, platform="cpu")
            _registered = True
        _cuda.register()


def cuda_registered() -> bool:
    """The paging targets are registered for platform CUDA in this process."""
    return _cuda.registered()


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
      name: the table's name, which its pager and the paging calls name.
        Registering a name again replaces the table (running executables keep the old one).
      paths: ``file_id`` ``i`` is ``paths[i]``: one path, or a list of paths over which one
        logical file is striped round-robin in ``stripe_bytes`` chunks (e.g. one per disk).
      config: engine knobs for this table (its own ring, threads and block pool).
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

    note_backend(config.backend, _ffi.file_table_backend(name))  # logs a fallback once
    return registration


def unregister_file_table(name: str, registration: int | None = None) -> bool:
    """Forgets a table (files close once no pager uses it). False if it did not exist.

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


def file_table_stats(table: str) -> dict[str, int] | None:
    """The engine of a table: ``io_busy_ns`` (time with I/O in flight), ``read_bytes`` and
    ``write_bytes``; None if no table."""
    return _ffi.file_table_stats(table)
