"""`jaxoff io-bench`: read/write GB/s of the I/O engine (numpy API and XLA FFI path) against fio.

Every configuration is measured engine / FFI / fio side by side on the same files, repetitions
interleaved across configurations, and reported as medians plus the median of per-sample ratios
engine/fio (the disk here is noisy: compare ratios from one run, not absolute figures).
`--tune` sweeps the knobs and writes the best EngineConfig (JSON or TOML) for `EngineConfig.load`.

    jaxoff io-bench                                           # default sweep
    jaxoff io-bench --sizes 256M --block-sizes 1M,8M --queue-depths 8,32
    jaxoff io-bench --tune --out engine.toml                  # pick knobs for this disk
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from jaxoff._errors import ConfigError
from jaxoff._output import console
from jaxoff.aio import Engine, EngineConfig, backend_status
from jaxoff.optim.chunks import PagedTable, PageTransaction
from jaxoff.plan import parse_size as _hardware_parse_size

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


OPS = ("read", "write")
FFI_CHUNK_BYTES = 16 << 20  # the FFI path's chunks: the paged optimizer's default
BACKENDS = ("auto", "io_uring", "posix")


def parse_size(text: str) -> int:
    """A size of an io-bench option in bytes: its units are binary (``64M`` = ``64MB`` =
    ``64MiB`` = 64 * 2**20), as its help says.

    >>> parse_size("64M"), parse_size("1MiB"), parse_size("4k"), parse_size("4096")
    (67108864, 1048576, 4096, 4096)
    >>> parse_size("-64M")  # a sign is kept, for the option's own "must be positive"
    -67108864
    """
    text = text.strip()
    sign = -1 if text.startswith("-") else 1
    return sign * int(_hardware_parse_size(text.removeprefix("-"), binary=True))


def _sizes(option: str, text: str, multiple: int = 1) -> list[int]:
    """The comma-separated sizes of ``--option``, each positive and a multiple of ``multiple``."""
    out = []
    for item in text.split(","):
        try:
            n = parse_size(item)
        except ValueError:
            raise ConfigError(
                f"--{option} {item.strip()!r} is not a size; write e.g. 4K, 1M, 64M or 1G"
            ) from None
        if n <= 0 or n % multiple:
            need = "positive" if multiple == 1 else f"a positive multiple of {fmt_size(multiple)}"
            raise ConfigError(f"--{option} {item.strip()!r} must be {need} (e.g. 1M)")
        out.append(n)
    return out


def _ints(option: str, text: str, low: int, high: int) -> list[int]:
    """The comma-separated integers of ``--option``, each in ``[low, high]``."""
    out = []
    for item in text.split(","):
        try:
            n = int(item)
        except ValueError:
            raise ConfigError(f"--{option} {item.strip()!r} is not an integer") from None
        if not low <= n <= high:
            raise ConfigError(f"--{option} {n} must be between {low} and {high}")
        out.append(n)
    return out


def _choices(option: str, text: str, valid: Sequence[str]) -> list[str]:
    """The comma-separated names of ``--option``, each one of ``valid``."""
    names = [n.strip() for n in text.split(",")]
    for n in names:
        if n not in valid:
            raise ConfigError(
                f"--{option} {n!r} is not one of {', '.join(valid)} (a comma-separated list, "
                f"e.g. {','.join(valid[:2])})"
            )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--{option} {text!r} lists {', '.join(twice)} twice")
    return names


def fmt_size(n: int) -> str:
    for unit in ("G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


@dataclasses.dataclass(frozen=True)
class Case:
    """One measured configuration."""

    op: str  # "read" | "write"
    size: int
    config: EngineConfig

    @property
    def label(self) -> str:
        c = self.config
        return (
            f"{self.op:5s} {fmt_size(self.size):>5s} bs={fmt_size(c.block_size):>3s} "
            f"qd={c.queue_depth:<3d} thr={c.threads} {c.backend}"
        )


def fio_available() -> bool:
    return shutil.which("fio") is not None


def run_fio(
    path: str,
    op: str,
    size: int,
    block_size: int,
    iodepth: int,
    numjobs: int = 1,
    ioengine: str = "libaio",
) -> float:
    """GB/s of one fio job (direct=1) on `path`, which must hold `size` bytes."""
    cmd = [
        "fio",
        "--output-format=json",
        "--name=jaxoff",
        f"--filename={path}",
        f"--rw={op}",
        f"--bs={block_size}",
        f"--iodepth={iodepth}",
        f"--numjobs={numjobs}",
        f"--ioengine={ioengine}",
        "--direct=1",
        f"--size={size // numjobs}",
        "--group_reporting",
        "--thread",
    ]
    if numjobs > 1:
        cmd.append(f"--offset_increment={size // numjobs}")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0][op]
    return job["io_bytes"] / (job["runtime"] / 1e3) / 1e9 if job["runtime"] else math.nan


def aligned_empty(n: int, align: int = 4096) -> np.ndarray:
    """An uninitialised uint8 array of `n` bytes whose data starts on an `align` boundary."""
    raw = np.empty(n + align, np.uint8)
    start = -raw.ctypes.data % align
    a = raw[start : start + n]
    a[:] = 0  # first touch now, not inside a timed read
    return a


class Bench:
    """Files, engines and FFI tables of one run (cleaned up by close())."""

    def __init__(self, root: str, sizes: Sequence[int], with_ffi: bool):
        self.root = root
        self.with_ffi = with_ffi
        # Page-aligned host arrays (like DeepSpeed's pinned tensors): O_DIRECT goes straight to
        # them; unaligned arrays would be staged through the engine's pool instead.
        self.data = {s: aligned_empty(s) for s in sizes}
        for s, d in self.data.items():
            d[:] = np.random.default_rng(s).integers(0, 255, s, dtype=np.uint8)
        self.out = {s: aligned_empty(s) for s in sizes}
        self._engines: dict[EngineConfig, Engine] = {}
        # (config, size) -> (jitted read, jitted write, the array written)
        # (config, size) -> [transaction, jitted read, jitted write, array written, version]
        self._tables: dict[tuple[EngineConfig, int], list[Any]] = {}
        base = Engine(EngineConfig(block_size=8 << 20, pool_bytes=64 << 20))
        for s in sizes:  # written once, untimed: reads read them, writes overwrite them
            for name in ("engine", "fio"):
                base.write(self.path(name, s), 0, self.data[s]).result()

    def path(self, who: str, size: int) -> str:
        return os.path.join(self.root, f"{who}.{size}.bin")

    def engine(self, cfg: EngineConfig) -> Engine:
        if cfg not in self._engines:
            self._engines[cfg] = Engine(cfg)
        return self._engines[cfg]

    def time_engine(self, case: Case) -> float:
        eng = self.engine(case.config)
        p = self.path("engine", case.size)
        t0 = time.perf_counter()
        if case.op == "read":
            eng.read_into(p, 0, self.out[case.size]).result()
        else:
            eng.write(p, 0, self.data[case.size]).result()
        return case.size / (time.perf_counter() - t0) / 1e9

    def time_ffi(self, case: Case) -> float:
        """One step of paging calls (`jaxoff.optim.chunks.PageTransaction`) over a one-entry
        store of ``case.size`` bytes: every chunk taken (read), or every chunk put and the
        step committed durably (write), the product's own path."""

        key = (case.config, case.size)
        if key not in self._tables:
            n = case.size // 4
            chunk = min(case.size, FFI_CHUNK_BYTES)
            per = chunk // 4
            spans = [(c, min(per, n - c)) for c in range(0, n, per)]
            txn = PageTransaction.open(
                os.path.join(self.root, f"ffi.{len(self._tables)}"),
                {"x": ((n,), np.float32)},
                chunk_bytes=chunk,
                slots=1,  # in place: one copy of the file, as the engine and fio write
                table=PagedTable("jaxoff.iobench"),
                engine=case.config,
                read_ahead_bytes=min(case.size, 4 * chunk),
                write_behind_bytes=min(case.size, 4 * chunk),
            )
            x = self.data[case.size].view(np.float32)
            txn.write_initial(("x", i, x[s : s + m]) for i, (s, m) in enumerate(spans))

            def address(i):
                return lambda env: ("x", i)

            @jax.jit
            def read(version):
                rec = txn.begin(version)
                parts = [rec.take(address(i), (m,), jnp.float32) for i, (_, m) in enumerate(spans)]
                rec.commit()  # a step that only reads: no new version
                return parts

            @jax.jit
            def write(version, x):
                rec = txn.begin(version)
                for i, (s, m) in enumerate(spans):
                    rec.put(address(i), x[s : s + m])
                rec.commit()
                return version + 1

            self._tables[key] = [txn, read, write, jnp.asarray(x), jnp.int32(txn.store.version)]
            jax.block_until_ready(read(self._tables[key][4]))  # compile
            self._tables[key][4] = write(self._tables[key][4], self._tables[key][3])
            txn.settle()
        entry = self._tables[key]
        txn, read, write, x, version = entry
        t0 = time.perf_counter()
        if case.op == "read":
            jax.block_until_ready(read(version))
        else:
            entry[4] = jax.block_until_ready(write(version, x))
            txn.settle()  # the writes are on disk and the step committed
        return case.size / (time.perf_counter() - t0) / 1e9

    def time_fio(self, case: Case) -> float:
        c = case.config
        return run_fio(self.path("fio", case.size), case.op, case.size, c.block_size, c.queue_depth)

    def close(self):
        for txn, *_ in self._tables.values():
            txn.close()
        self._tables.clear()
        self._engines.clear()


def measure(
    bench: Bench, cases: Sequence[Case], reps: int, use_fio: bool, progress: bool = True
) -> list[dict]:
    """Interleaved repetitions of every case; one result dict per case."""
    kinds = ["engine"] + (["ffi"] if bench.with_ffi else []) + (["fio"] if use_fio else [])
    samples = {(i, k): [] for i in range(len(cases)) for k in kinds}
    timers = {"engine": bench.time_engine, "ffi": bench.time_ffi, "fio": bench.time_fio}
    total = reps * len(cases) * len(kinds)
    bar = _progress(progress)
    with bar:
        task = bar.add_task("io-bench", total=total)
        for rep in range(reps):
            for i, case in enumerate(cases):
                order = kinds if rep % 2 == 0 else kinds[::-1]  # alternate who goes first
                for k in order:
                    bar.update(task, description=f"{k:6s} {case.label}")
                    samples[(i, k)].append(timers[k](case))
                    bar.advance(task)
    results = []
    for i, case in enumerate(cases):
        r = dict(op=case.op, size=case.size, **case.config.as_kwargs())
        r["backend_used"] = bench.engine(case.config).backend
        for k in kinds:
            r[f"{k}_GBps"] = statistics.median(samples[(i, k)])
        if use_fio:
            for k in ("engine", "ffi"):
                if k in kinds:
                    r[f"{k}_vs_fio"] = statistics.median(
                        a / b for a, b in zip(samples[(i, k)], samples[(i, "fio")], strict=True)
                    )
        results.append(r)
    return results


def _progress(enabled: bool):
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        disable=not enabled,
        transient=True,
    )


def print_table(results: list[dict]) -> None:

    t = Table(title="jaxoff I/O engine vs fio (GB/s = 1e9 B/s, medians)")
    cols = [
        "op",
        "size",
        "block",
        "qd",
        "thr",
        "backend",
        "engine",
        "ffi",
        "fio",
        "engine/fio",
        "ffi/fio",
    ]
    for c in cols:
        t.add_column(c, justify="right")

    def f(r, k):
        return f"{r[k]:.2f}" if k in r else "-"

    for r in results:
        t.add_row(
            r["op"],
            fmt_size(r["size"]),
            fmt_size(r["block_size"]),
            str(r["queue_depth"]),
            str(r["threads"]),
            _backend(r),
            f(r, "engine_GBps"),
            f(r, "ffi_GBps"),
            f(r, "fio_GBps"),
            f(r, "engine_vs_fio"),
            f(r, "ffi_vs_fio"),
        )
    console().print(t)


def _auto_backend() -> str:
    """What ``--backends auto`` gives here, and why (``jaxoff.aio.backend_status``)."""

    return f"backend auto: {backend_status()}"


def _backend(r: dict) -> str:
    """The backend asked for, and the one in use when they differ (auto -> io_uring)."""
    used = r.get("backend_used", r["backend"])
    return r["backend"] if used == r["backend"] else f"{r['backend']}->{used}"


def tune(
    bench: Bench, size: int, block_sizes, queue_depths, threads, backends, reps: int, progress: bool
) -> tuple[EngineConfig, list[dict]]:
    """The config with the best geometric mean of read and write engine GB/s."""
    cases = []
    for bs, qd, thr, be in itertools.product(block_sizes, queue_depths, threads, backends):
        if be == "io_uring" and thr != threads[0]:
            continue  # threads only matter to the POSIX backend
        cfg = EngineConfig(
            block_size=bs, queue_depth=qd, threads=thr, pool_bytes=bs * min(qd, 16), backend=be
        )
        cases += [Case("read", size, cfg), Case("write", size, cfg)]
    results = measure(bench, cases, reps, use_fio=False, progress=progress)
    score: dict[EngineConfig, list[float]] = {}
    for case, r in zip(cases, results, strict=True):
        score.setdefault(case.config, []).append(r["engine_GBps"])
    best = max(score, key=lambda c: math.prod(score[c]))
    return best, results


@dataclasses.dataclass(frozen=True)
class IOBenchConfig:
    """Options of ``jaxoff io-bench``.

    Attributes:
        dir: directory for the test files (default: a temporary directory).
        sizes: tensor sizes, e.g. 64M,256M,1G (K, M, G are binary: 64M = 64 MiB).
        ops: read, write or both.
        block_sizes: engine block sizes to measure (tune sweeps them).
        queue_depths: requests in flight (tune sweeps them).
        threads: POSIX backend threads (tune sweeps them).
        backends: auto, io_uring, posix.
        pool_bytes: staging pool per engine.
        reps: repetitions per configuration (medians are reported).
        fio: run fio on the same files: auto (when installed), on, off.
        no_ffi: skip the XLA FFI path.
        tune: sweep the knobs and write the best engine configuration to --out.
        out: where --tune writes the configuration (.json or .toml).
        json: also write the results as JSON lines here.
        no_progress: hide the progress bar.
    """

    dir: str | None = None
    sizes: str = "64M,256M"
    ops: str = "read,write"
    block_sizes: str = "1M,8M"
    queue_depths: str = "8,32"
    threads: str = "2"
    backends: str = "auto"
    pool_bytes: str = "64M"
    reps: int = 5
    fio: str = "auto"
    no_ffi: bool = False
    tune: bool = False
    out: str = "engine_config.json"
    json: str | None = None
    no_progress: bool = False

    def validate(self) -> IOBenchConfig:
        """Checks every option up front; raises :class:`ConfigError` naming it and the fix."""
        if self.dir is not None:
            if os.path.exists(self.dir) and not os.path.isdir(self.dir):
                raise ConfigError(f"--dir {self.dir} is a file, not a directory; name a directory")
            if not os.path.isdir(self.dir):
                raise ConfigError(
                    f"--dir {self.dir}: no such directory; create it (mkdir -p) or leave --dir "
                    f"out to use a temporary directory"
                )
            if not os.access(self.dir, os.W_OK | os.X_OK):
                raise ConfigError(f"--dir {self.dir} is not writable; choose another --dir")
        _choices("ops", self.ops, OPS)
        _choices("backends", self.backends, BACKENDS)
        _sizes("sizes", self.sizes, multiple=4096)  # whole 4 KiB pages, as O_DIRECT reads them
        blocks = _sizes("block-sizes", self.block_sizes, multiple=4096)
        _sizes("pool-bytes", self.pool_bytes)
        _ints("queue-depths", self.queue_depths, 1, 4096)
        _ints("threads", self.threads, 1, 256)
        if self.fio not in ("auto", "on", "off"):
            raise ConfigError(f"--fio must be auto, on or off, got {self.fio!r}")
        if self.fio == "on" and not fio_available():
            raise ConfigError("--fio on: fio not found; install it (apt-get install fio)")
        if self.reps < 1:
            raise ConfigError(f"--reps must be at least 1, got {self.reps}")
        if self.tune and not self.out.endswith((".json", ".toml")):
            raise ConfigError(f"--out {self.out}: --tune writes .json or .toml; name one")
        for option, path in (("out", self.out if self.tune else None), ("json", self.json)):
            parent = os.path.dirname(os.path.abspath(path)) if path else None
            if parent is not None and not os.path.isdir(parent):
                raise ConfigError(f"--{option} {path}: no directory {parent}; create it first")
        if "io_uring" in self.backends.split(","):
            try:  # required, not a fallback: refuse now rather than after the files are written
                Engine(EngineConfig(block_size=blocks[0], pool_bytes=blocks[0], backend="io_uring"))
            except (OSError, RuntimeError, ValueError) as e:
                raise ConfigError(
                    f"--backends io_uring: not available here ({e}); use auto or posix"
                ) from None
        return self


def run(a: IOBenchConfig) -> int:
    """Runs the benchmark (or the tuning sweep) described by ``a``."""
    a = a.validate()
    sizes = _sizes("sizes", a.sizes)
    blocks = _sizes("block-sizes", a.block_sizes)
    qds = _ints("queue-depths", a.queue_depths, 1, 4096)
    threads = _ints("threads", a.threads, 1, 256)
    backends = _choices("backends", a.backends, BACKENDS)
    use_fio = a.fio == "on" or (a.fio == "auto" and fio_available())
    if not use_fio and a.fio == "auto":
        print("fio not found: engine/fio ratios skipped (install: apt-get install fio)")
    if "auto" in backends:
        print(_auto_backend())
    root = tempfile.mkdtemp(prefix="jaxoff_iobench_", dir=a.dir)
    bench = Bench(root, sizes if not a.tune else sizes[:1], with_ffi=not a.no_ffi and not a.tune)
    try:
        if a.tune:
            best, results = tune(
                bench, sizes[0], blocks, qds, threads, backends, a.reps, not a.no_progress
            )
            print_table(results)
            best.save(a.out)
            print(f"best: {best}\nwritten to {a.out} (load with EngineConfig.load)")
        else:
            cases = [
                Case(
                    op,
                    s,
                    EngineConfig(
                        block_size=bs,
                        queue_depth=qd,
                        threads=thr,
                        pool_bytes=max(parse_size(a.pool_bytes), bs),
                        backend=be,
                    ),
                )
                for op in _choices("ops", a.ops, OPS)
                for s in sizes
                for bs in blocks
                for qd in qds
                for thr in threads
                for be in backends
            ]
            results = measure(bench, cases, a.reps, use_fio, not a.no_progress)
            print_table(results)
        if a.json:
            with open(a.json, "w") as f:
                for r in results:
                    f.write(json.dumps(r) + "\n")
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0
