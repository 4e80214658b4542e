"""What a machine offers the planner: memory per tier and the speeds that price a plan.

Either named presets for common accelerators (datasheet figures, sources below) so a
user can plan for hardware they do not have, or :func:`calibrate` on this machine (a
short matmul and copy measurement; disk speeds from ``jaxoff io-bench --json`` output, or
a quick measurement).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from .._errors import ConfigError

GB = 1e9
GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Budgets (bytes) and speeds (FLOP/s, bytes/s) of one machine.

    Attributes:
        name: preset name or ``"calibrated"``.
        device_mem: accelerator memory.
        host_mem: host RAM the run may use.
        disk: NVMe space the run may use for page files.
        flops: sustained matmul FLOP/s at the model's compute dtype (datasheet peak times
            ``efficiency`` for presets; measured when calibrated).
        link: host <-> device bytes/s, each direction (PCIe / host interconnect).
        disk_read, disk_write: NVMe bytes/s.
        device_mem_bw: device memory bandwidth (the optimizer update on device).
        host_mem_bw: host memory bandwidth (the optimizer update on host).
        shared_memory: device and host memory are one pool (a CPU: offloading moves
            bytes without freeing any).
        source: where the figures come from.
    """

    name: str
    device_mem: float
    host_mem: float
    disk: float
    flops: float
    link: float
    disk_read: float
    disk_write: float
    device_mem_bw: float
    host_mem_bw: float
    shared_memory: bool = False
    source: str = ""

    def with_budgets(self, device_mem=None, host_mem=None, disk=None) -> Hardware:
        """A copy with the budgets given (``None`` keeps the preset's)."""
        changes = {
            k: float(v)
            for k, v in dict(device_mem=device_mem, host_mem=host_mem, disk=disk).items()
            if v is not None
        }
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# Datasheet peaks (dense, no sparsity); fp32 training on NVIDIA uses TF32 tensor cores.
# Sustained throughput is taken as EFFICIENCY x peak (a typical model-FLOPs utilisation).
EFFICIENCY = 0.5
_NVME = dict(disk_read=7.0 * GB, disk_write=5.0 * GB)  # a PCIe 4.0 NVMe SSD (assumed)
_SERVER_HOST = dict(host_mem=512 * GIB, host_mem_bw=150 * GB, disk=2000 * GB)
_DESKTOP_HOST = dict(host_mem=64 * GIB, host_mem_bw=60 * GB, disk=1000 * GB)


def _preset(name, mem_gib, hbm_tbs, tf_bf16, tf_fp32, link_gbs, host, source):
    return {
        "name": name,
        "device_mem": mem_gib * GIB,
        "device_mem_bw": hbm_tbs * 1e12,
        "flops_bf16": tf_bf16 * 1e12 * EFFICIENCY,
        "flops_fp32": tf_fp32 * 1e12 * EFFICIENCY,
        "link": link_gbs * GB,
        "source": source,
        **_NVME,
        **host,
    }


PRESETS: dict[str, dict] = {
    p["name"]: p
    for p in (
        _preset(
            "h100-sxm",
            80,
            3.35,
            989,
            494.5,
            64,
            _SERVER_HOST,
            "NVIDIA H100 datasheet (SXM5: 80 GB HBM3, 3.35 TB/s, BF16 989 / TF32 494.5 "
            "TFLOPS dense, PCIe Gen5 x16 64 GB/s to host)",
        ),
        _preset(
            "h100-pcie",
            80,
            2.0,
            756,
            378,
            64,
            _SERVER_HOST,
            "NVIDIA H100 datasheet (PCIe: 80 GB HBM2e, 2.0 TB/s, BF16 756 / TF32 378 "
            "TFLOPS dense, PCIe Gen5 x16 64 GB/s)",
        ),
        _preset(
            "a100-40",
            40,
            1.555,
            312,
            156,
            32,
            _SERVER_HOST,
            "NVIDIA A100 datasheet (40 GB HBM2, 1.555 TB/s, BF16 312 / TF32 156 TFLOPS "
            "dense, PCIe Gen4 x16 32 GB/s)",
        ),
        _preset(
            "a100-80",
            80,
            2.039,
            312,
            156,
            32,
            _SERVER_HOST,
            "NVIDIA A100 datasheet (80 GB HBM2e SXM, 2.039 TB/s, BF16 312 / TF32 156 "
            "TFLOPS dense, PCIe Gen4 x16 32 GB/s)",
        ),
        _preset(
            "rtx4090",
            24,
            1.008,
            165.2,
            82.6,
            32,
            _DESKTOP_HOST,
            "NVIDIA Ada Lovelace architecture whitepaper (RTX 4090: 24 GB GDDR6X, "
            "1008 GB/s, FP16/BF16 tensor with FP32 accumulate 165.2 TFLOPS dense, FP32 "
            "82.6 TFLOPS, PCIe Gen4 x16 32 GB/s)",
        ),
        _preset(
            "tpu-v5e",
            16,
            0.819,
            197,
            197 / 3,
            32,
            _SERVER_HOST,
            "Google Cloud TPU v5e docs (16 GiB HBM2 at 819 GB/s, 197 TFLOPS BF16 per "
            "chip); fp32 matmuls taken as 3 bf16 passes and the host link as PCIe Gen4 "
            "x16 (assumptions, not published figures)",
        ),
    )
}
"""Accelerator presets: ``--hardware NAME``. Host, disk and NVMe figures are typical
machine assumptions (server: 512 GiB DDR5 at 150 GB/s; desktop: 64 GiB at 60 GB/s;
PCIe 4.0 NVMe 7 / 5 GB/s read / write); override the budgets with --host-mem / --disk."""


def preset(name: str, dtype: str = "float32") -> Hardware:
    """The preset ``name`` with FLOP/s for ``dtype`` (``float32`` or ``bfloat16``)."""
    if name not in PRESETS:
        raise ConfigError(
            f"--hardware {name!r} is not a preset; choose one of {', '.join(PRESETS)} "
            f"or 'cpu' (calibrate this machine)"
        )
    p = dict(PRESETS[name])
    bf16, fp32 = p.pop("flops_bf16"), p.pop("flops_fp32")
    return Hardware(flops=bf16 if dtype in ("bfloat16", "float16") else fp32, **p)


def parse_size(text: str | float | int, *, binary: bool = False) -> float:
    """``"16GiB"``, ``"24GB"``, ``"512MiB"``, ``"1.5T"`` or a number of bytes.

    A unit with ``i`` is binary (``MiB`` = 2**20), one without is decimal (``MB`` = ``M`` =
    10**6), unless ``binary``: then every unit is binary (``jaxoff io-bench``'s sizes, where
    ``1M`` = ``1MB`` = ``1MiB``, whole 4 KiB pages).

    >>> parse_size("512MiB"), parse_size("24GB"), parse_size("1.5k"), parse_size(4096)
    (536870912.0, 24000000000.0, 1500.0, 4096.0)
    >>> parse_size("1M", binary=True) == parse_size("1MB", binary=True) == 2**20
    True
    """
    if isinstance(text, int | float):
        return float(text)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgtp]?)(i?)b?\s*", str(text).lower())
    if not m:
        raise ConfigError(f"{text!r} is not a size; write e.g. 16GiB, 24GB or 512MiB")
    try:
        value = float(m.group(1))
    except ValueError:  # e.g. "1.2.3"
        raise ConfigError(f"{text!r} is not a size; write e.g. 16GiB, 24GB or 512MiB") from None
    unit, base = m.group(2), 1024 if binary or m.group(3) else 1000
    return value * base ** " kmgtp".index(unit) if unit else value


def _time(fn, reps: int) -> float:
    fn()  # warm-up (compile, first touch)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_compute(n: int = 1024, dtype: str = "float32", reps: int = 3) -> dict[str, float]:
    """Matmul FLOP/s and memory copy bytes/s of this JAX backend (a few seconds)."""

    a = jnp.ones((n, n), dtype)
    mm = jax.jit(lambda x: x @ x)
    t = _time(lambda: mm(a).block_until_ready(), reps)
    flops = 2 * n**3 / t
    big = jnp.ones((64 * 2**20,), jnp.float32)  # 256 MiB
    cp = jax.jit(lambda x: x + 1)  # reads and writes every byte once
    t = _time(lambda: cp(big).block_until_ready(), reps)
    return {"flops": flops, "mem_bw": 2 * big.nbytes / t}


def measure_disk(directory: str | None = None, size: int = 256 * 2**20) -> dict[str, float]:
    """Sequential write then read bytes/s of one file (fsync'd write, page cache dropped
    for the file with posix_fadvise, so the read comes from disk where the OS allows)."""
    data = os.urandom(1 << 20) * (size >> 20)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = Path(tmp) / "probe.bin"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        write = size / (time.perf_counter() - t0)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            while os.read(fd, 8 << 20):
                pass
            read = size / (time.perf_counter() - t0)
        finally:
            os.close(fd)
    return {"disk_read": read, "disk_write": write}


def disk_from_iobench(path: str | Path) -> dict[str, float]:
    """Best engine read/write bytes/s from ``jaxoff io-bench --json FILE`` (JSON lines)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--io-bench {path}: no such file (write it with jaxoff io-bench --json)")
    best = {"read": 0.0, "write": 0.0}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        speed = r.get("engine_GBps") or r.get("ffi_GBps") or 0.0
        if r.get("op") in best:
            best[r["op"]] = max(best[r["op"]], speed * GB)
    if not best["read"] or not best["write"]:
        raise ConfigError(
            f"--io-bench {path}: needs read and write results (run io-bench with --ops read,write)"
        )
    return {"disk_read": best["read"], "disk_write": best["write"]}


def total_ram() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def free_disk(directory: str = ".") -> float:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def calibrate(
    dtype: str = "float32", io_bench: str | Path | None = None, disk_dir: str | None = None
) -> Hardware:
    """This machine: JAX's default backend measured; a CPU is one shared memory pool."""

    m = measure_compute(dtype=dtype)
    disk = disk_from_iobench(io_bench) if io_bench else measure_disk(disk_dir)
    dev = jax.devices()[0]
    cpu = dev.platform == "cpu"
    stats = {} if cpu else (dev.memory_stats() or {})
    ram = total_ram()
    return Hardware(
        name="calibrated",
        device_mem=ram if cpu else float(stats.get("bytes_limit", 0)),
        host_mem=ram,
        disk=free_disk(disk_dir or "."),
        flops=m["flops"],
        link=m["mem_bw"] / 2,  # a device<->host copy on one RAM: read + write
        disk_read=disk["disk_read"],
        disk_write=disk["disk_write"],
        device_mem_bw=m["mem_bw"],
        host_mem_bw=m["mem_bw"],
        shared_memory=cpu,
        source=f"measured on this machine ({dev.platform}: jitted {dtype} matmul, copy; "
        + (f"disk from {io_bench})" if io_bench else "disk from a 256 MiB file)"),
    )


def get_hardware(name: str, dtype: str = "float32", io_bench=None) -> Hardware:
    """``"cpu"``/``"calibrate"`` measures this machine; anything else is a preset."""
    if name in ("cpu", "calibrate", "this"):
        return calibrate(dtype, io_bench)
    return preset(name, dtype)
