"""Python face of the C++ async I/O engine: its configuration and numpy read/write futures.

The engine (``ffi/engine``) splits each request into ``block_size`` blocks, keeps
``queue_depth`` of them in flight, and stages data that O_DIRECT cannot take directly (memory or
lengths not 4 KiB aligned) through a bounded pool of ``pool_bytes`` of aligned buffers. The
backend is io_uring when it initialises, else a POSIX thread pool; the environment variable
``JAXOFF_AIO_BACKEND`` (``auto`` | ``io_uring`` | ``posix``) overrides ``backend="auto"``.
Why ``auto`` gave POSIX is in `Engine.backend_reason` and ``jaxoff.aio.backend_status()``, and
is logged once (logger ``jaxoff.aio``).

With O_DIRECT, a write whose size is not a multiple of 4096 pads its last block with zeros to
the next 4 KiB boundary: a write of ``n`` bytes at ``offset`` occupies
``[offset, offset + round_up(n, 4096))`` on disk (the page store reserves such padded slots).
Reads never copy more than the requested bytes and accept a file that ends right after them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tomllib
from typing import Any

import numpy as np

from jaxoff import _ffi
from jaxoff.aio._backend import note_backend

_BACKENDS = ("auto", "io_uring", "posix")
_ALIGN = 4096
_MIB = 1 << 20


def sized_for_cores(cores: int) -> dict[str, int]:
    """The engine knobs a host with ``cores`` usable cores gets by default.

    A 2-core box keeps the values the engine was tuned on (2 threads, 8 requests of 1 MiB in
    flight, a 16 MiB staging pool), so CPU results do not move. A GPU host has to feed PCIe at
    tens of GB/s from NVMe or the page cache: half its cores become I/O and checksum workers
    (at most 16, leaving the rest to XLA's and the data loader's threads), 4 requests in flight
    per worker (8 to 64), and blocks of 4 MiB from 8 workers up (fewer, larger O_DIRECT
    requests; 1-4 MiB is where NVMe reaches its sequential rate). The staging pool holds one
    block per request in flight.

    >>> sized_for_cores(2)
    {'threads': 2, 'queue_depth': 8, 'block_size': 1048576, 'pool_bytes': 16777216}
    >>> sized_for_cores(16)["threads"], sized_for_cores(16)["queue_depth"]
    (8, 32)
    """
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores={cores!r} must be a positive int (os.cpu_count() gives one)")
    threads = min(16, max(2, cores // 2))
    queue_depth = min(64, max(8, 4 * threads))
    block_size = (4 if threads >= 8 else 1) * _MIB
    return dict(
        threads=threads,
        queue_depth=queue_depth,
        block_size=block_size,
        pool_bytes=max(16 * _MIB, block_size * queue_depth),
    )


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


@functools.cache
def _machine_defaults() -> dict[str, int]:
    return sized_for_cores(usable_cores())


def _host_default(name: str):
    return dataclasses.field(default_factory=lambda: _machine_defaults()[name])


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Knobs of the I/O engine.

    Attributes:
      block_size: bytes per I/O request; a positive multiple of 4096.
      queue_depth: requests in flight at once (io_uring submission depth; POSIX queue bound).
      threads: worker threads of the POSIX backend, and the engine's copy/checksum threads
        (staging copies and crc32c run there, off the I/O completion path, for both backends).
      o_direct: bypass the page cache (falls back to buffered I/O where the filesystem refuses).
      pool_bytes: total size of the aligned staging pool, at least one block.
      backend: ``"auto"`` (io_uring if available, overridable by ``JAXOFF_AIO_BACKEND``),
        ``"io_uring"`` (required) or ``"posix"``.

    ``threads``, ``queue_depth``, ``block_size`` and ``pool_bytes`` default to
    `sized_for_cores` of the cores this process may use (a 2-core machine: 2, 8, 1 MiB,
    16 MiB).

    >>> EngineConfig(block_size=1 << 20, queue_depth=8).pool_buffers
    16
    """

    block_size: int = _host_default("block_size")
    queue_depth: int = _host_default("queue_depth")
    threads: int = _host_default("threads")
    o_direct: bool = True
    pool_bytes: int = _host_default("pool_bytes")
    backend: str = "auto"

    def __post_init__(self):
        def fail(msg: str):
            raise ValueError(f"EngineConfig: {msg}")

        for name in ("block_size", "queue_depth", "threads", "pool_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | np.integer):
                fail(f"{name} must be an int, got {v!r}")
        if self.block_size <= 0 or self.block_size % _ALIGN:
            fail(f"block_size={self.block_size} must be a positive multiple of 4096 (e.g. 1 << 20)")
        if not 1 <= self.queue_depth <= 4096:
            fail(f"queue_depth={self.queue_depth} must be in [1, 4096]")
        if not 1 <= self.threads <= 256:
            fail(f"threads={self.threads} must be in [1, 256]")
        if self.pool_bytes < self.block_size:
            fail(
                f"pool_bytes={self.pool_bytes} must hold at least one block "
                f"(block_size={self.block_size}); try pool_bytes=block_size*queue_depth"
            )
        if not isinstance(self.o_direct, bool):
            fail(f"o_direct must be a bool, got {self.o_direct!r}")
        if self.backend not in _BACKENDS:
            fail(f"backend={self.backend!r} must be one of {_BACKENDS}")

    @property
    def pool_buffers(self) -> int:
        """Number of staging buffers (``pool_bytes // block_size``)."""
        return self.pool_bytes // self.block_size

    def as_kwargs(self) -> dict[str, Any]:
        """The knobs as keyword arguments of the native ``Engine`` / ``register_file_table``."""
        return dataclasses.asdict(self)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the config as JSON (``.json``) or TOML (``.toml``)."""
        path = os.fspath(path)
        d = self.as_kwargs()
        if path.endswith(".toml"):
            lines = ["[engine]"]
            for k, v in d.items():
                lines.append(f"{k} = {json.dumps(v)}")
            text = "\n".join(lines) + "\n"
        else:
            text = json.dumps({"engine": d}, indent=2) + "\n"
        with open(path, "w") as f:
            f.write(text)

    @classmethod
    def load(cls, path: str | os.PathLike) -> EngineConfig:
        """Reads a config written by :meth:`save` (JSON or TOML; a top-level ``engine`` table
        or the knobs at top level). Unknown keys are an error."""
        path = os.fspath(path)
        with open(path, "rb") as f:
            raw = f.read()
        try:
            d = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
        except (ValueError, tomllib.TOMLDecodeError) as e:
            raise ValueError(
                f"engine config {path} is not valid "
                f"{'TOML' if path.endswith('.toml') else 'JSON'}: {e}"
            ) from None
        d = d.get("engine", d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"engine config {path}: unknown keys {unknown}; expected some of {sorted(known)}"
            )
        return cls(**d)


class Engine:
    """An I/O engine: asynchronous reads and writes of numpy arrays, returning futures.

    Args:
      config: the knobs; defaults to ``EngineConfig()``.

    >>> import numpy as np, tempfile, os
    >>> eng = Engine(EngineConfig(block_size=1 << 16, pool_bytes=1 << 18))
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> eng.write(path, 0, np.arange(10, dtype=np.int32)).result()
    >>> out = np.zeros(10, np.int32)
    >>> eng.read_into(path, 0, out).result()
    >>> int(out[9])
    9
    """

    def __init__(self, config: EngineConfig | None = None):
        self._config = config if config is not None else EngineConfig()
        self._native = _ffi.Engine(**self._config.as_kwargs())
        self.backend_reason  # noqa: B018 (logs a fallback to POSIX once per process)

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def backend(self) -> str:
        """``"io_uring"`` or ``"posix"``: the backend actually in use."""
        return self._native.backend

    @property
    def backend_reason(self) -> str:
        """Why this engine runs `backend`: for ``auto`` on POSIX, why io_uring was not used
        (not compiled in, or ``io_uring_setup`` refused with an errno); see `backend_status`."""

        return note_backend(self._config.backend, self.backend)

    def read_into(self, path: str | os.PathLike, offset: int, array: np.ndarray) -> _ffi.IoFuture:
        """Starts reading ``array.nbytes`` bytes at ``offset`` of ``path`` into ``array``.

        ``array`` must be C-contiguous and writable, and must not be touched until the future
        is done. ``future.result()`` raises ``OSError`` naming path, offset and errno (reading
        past the end of the file is an error).
        """
        _check_array(array, writable=True)
        return self._native.read_into(os.fspath(path), _check_offset(offset), _bytes_view(array))

    def write(self, path: str | os.PathLike, offset: int, array: np.ndarray) -> _ffi.IoFuture:
        """Starts writing the bytes of ``array`` at ``offset`` of ``path`` (created if missing).

        Disk full / file size limit come back from ``future.result()`` as ``OSError`` with
        ``errno`` ENOSPC / EFBIG and a message saying what to do.
        """
        _check_array(array, writable=False)
        return self._native.write(os.fspath(path), _check_offset(offset), _bytes_view(array))


def _check_array(array: Any, *, writable: bool) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected a numpy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError("the array must be C-contiguous (use np.ascontiguousarray)")
    if writable and not array.flags.writeable:
        raise ValueError("read_into needs a writable array")


def _bytes_view(array: np.ndarray) -> np.ndarray:
    # A flat uint8 view of the same memory: any dtype (bfloat16 too) crosses as plain bytes.
    return array.reshape(-1).view(np.uint8)


def _check_offset(offset: Any) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int | np.integer) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")
    return int(offset)


_default: Engine | None = None


def default_engine() -> Engine:
    """A process-wide engine with the default config (created on first use)."""
    global _default
    if _default is None:
        _default = Engine()
    return _default


def read_into(path: str | os.PathLike, offset: int, array: np.ndarray) -> _ffi.IoFuture:
    """``default_engine().read_into(...)``."""
    return default_engine().read_into(path, offset, array)


def write(path: str | os.PathLike, offset: int, array: np.ndarray) -> _ffi.IoFuture:
    """``default_engine().write(...)``."""
    return default_engine().write(path, offset, array)


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C (Castagnoli) of a bytes-like object or contiguous array, continuing ``value``.

    Equals ``crc32c.crc32c(bytes(data))`` of the PyPI ``crc32c`` package.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    """
    if isinstance(data, bytes | bytearray | memoryview):
        data = np.frombuffer(data, np.uint8)
    return int(_ffi.crc32c(_bytes_view(np.ascontiguousarray(data)), value))
