"""The GPU pager's first device run: one command, its own deadline, one JSON file a section.

    python bench/gpu/pager_probe.py OUT [--deadline-s 340] [--store-dir /dev/shm/x]
    python bench/gpu/pager_probe.py OUT --smoke      # small sizes; runs on the CPU too

Sections, in order of priority; each writes OUT/<section>.json as soon as it ends, and one
that would not finish before the deadline is skipped with the reason (OUT/summary.json lists
them all, with the commit, the device, the driver and the versions):

  pcie        PCIe through XLA's own transfers: a pinned_host array to the device and back,
              three times each, and both directions at once (GB/s). The bound every later
              figure is compared with.
  handlers    the pager's calls on the device JAX has: a lax.scan of page_take of 4 KiB (us
              a call), the same at 16 MiB (GB/s), and page_out of 16 MiB chunks with the writes
              behind the step (GB/s, until Pager.settle: durable and committed).
  gpu_pager   the CUDA pager's calls (jaxoff_pager_begin/_take/_out/_commit, which never wait
              for the GPU): a step of page_out of 32 chunks of 16 MiB, then a step taking
              them back, checked bitwise, with host and device time and the pager's counters.
              Without a GPU (--smoke) it only lowers the two steps for CUDA and counts their
              calls and operands.
  xla_facts   what the GPU pager's design relies on, from a debug FFI target compiled here
              (ffi/src/probe_mark_handler.cc): a new run id per execution, calls in site order
              inside a scan, and whether XLA's thread runs ahead of the GPU (host time of each
              call against the time its stream reached it).
  fuyou       bench/capacity.py's fuyou-nvme at 4 and 16 layers (d_model 1024) and plain-bf16
              at 4, each in a child process with the engine counters and the GPU-busy time
              (jax.profiler trace of the run: the union of the GPU streams' kernels and copies).
  plain_vs_jaxoff  plain-bf16's largest size under the device cap (layers tried upward), then
              fuyou-nvme at that size: tokens/s of both in one run.
  capacity    fuyou-nvme at 3x plain's largest size and upward (a bracket: the largest that
              trained, the smallest that failed), each with MFU.

Without a GPU it stops at once (exit 3, ``no GPU: ...``) unless --smoke, which runs every
section at small sizes on whatever device JAX has, so that tests/test_gpu_probe_script.py
checks the script on a CPU machine.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
NO_GPU_EXIT = 3
GIB = 1 << 30
MIB = 1 << 20
PROBE_SRC = ROOT / "ffi" / "src" / "probe_mark_handler.cc"
# Dense bf16 peak FLOP/s by device kind (vendor datasheets, SXM parts), for MFU.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12}

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


class Clock:
    """The script's deadline: what is left, and whether a section of ``need`` seconds fits."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def fits(self, need: float) -> bool:
        return self.left() >= need


def write(out: Path, name: str, rec: dict) -> None:
    (out / f"{name}.json").write_text(json.dumps(rec, indent=1, default=str) + "\n")


# ---- provenance -------------------------------------------------------------------------


def provenance() -> dict:
    import importlib.metadata as md

    import jax

    def run(cmd):
        try:
            return subprocess.run(
                cmd, capture_output=True, text=True, timeout=20, cwd=ROOT
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    dev = jax.devices()[0]
    versions = {}
    for pkg in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    from jaxoff.aio import EngineConfig, backend_status

    return {
        "commit": run(["git", "rev-parse", "HEAD"]),
        "tree_clean": run(["git", "status", "--porcelain", "--untracked-files=no"]) == "",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv,
        "device": dev.device_kind,
        "platform": dev.platform,
        "driver": run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        ),
        "python": platform.python_version(),
        "versions": versions,
        "cpus": os.cpu_count(),
        "engine_defaults": EngineConfig().as_kwargs(),
        "io_backend": str(backend_status()),
    }


# ---- pcie -------------------------------------------------------------------------------


def pcie(a, dev) -> dict:
    import jax
    import numpy as np

    kinds = [m.kind for m in dev.addressable_memories()]
    host_kind = "pinned_host" if "pinned_host" in kinds else None
    n = (16 * MIB) if a.smoke else GIB
    host = jax.sharding.SingleDeviceSharding(dev, memory_kind=host_kind)
    on_dev = jax.sharding.SingleDeviceSharding(dev)
    x_host = jax.device_put(np.ones(n // 4, np.float32), host).block_until_ready()
    y_dev = jax.device_put(np.ones(n // 4, np.float32), on_dev).block_until_ready()

    def timed(fn):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        return time.perf_counter() - t

    h2d = [timed(lambda: jax.device_put(x_host, on_dev)) for _ in range(3)]
    d2h = [timed(lambda: jax.device_put(y_dev, host)) for _ in range(3)]
    both = [
        timed(lambda: (jax.device_put(x_host, on_dev), jax.device_put(y_dev, host)))
        for _ in range(3)
    ]
    gbs = lambda ts, k=1: round(k * n / min(ts) / 1e9, 2)  # noqa: E731
    return {
        "bytes": n,
        "host_memory_kind": host_kind,
        "memory_kinds": kinds,
        "h2d_s": h2d,
        "d2h_s": d2h,
        "bidirectional_s": both,
        "h2d_gb_s": gbs(h2d),
        "d2h_gb_s": gbs(d2h),
        "bidirectional_gb_s": gbs(both, 2),
    }


# ---- the pager's calls, on whatever device JAX has --------------------------------------


def handlers(a, dev, store: str) -> dict:
    """The pager's calls on one file (no checksums: the bytes are zeros): a step taking 4 KiB
    chunks from one site in a scan (us a call), the same with large chunks (GB/s), and a
    step putting large chunks, its writes behind it (dispatch time, and the time until its
    writes are durable and committed: `Pager.settle`)."""
    import jax
    import jax.numpy as jnp

    from jaxoff.aio import EngineConfig, register_file_table, unregister_file_table
    from jaxoff.aio._pager import (
        Pager,
        PagerConfig,
        owner_name,
        page_begin,
        page_commit,
        page_out,
        page_take,
    )

    big = (1 * MIB) if a.smoke else (16 * MIB)
    small_calls, big_calls = (200, 8) if a.smoke else (2000, 32)
    slots = 8  # read offsets cycle over the first `slots` places of the file
    path = os.path.join(store, "handlers.pages")
    with open(path, "wb") as f:
        f.truncate(max(slots, big_calls) * big)
    engine = EngineConfig()
    table = owner_name("probe")
    registration = register_file_table(table, [path], config=engine)
    rec = {"engine": engine.as_kwargs(), "store": store}
    pager = None
    try:
        with jax.default_device(dev):
            config = PagerConfig(slot_bytes=big, arena_slots=8, write_slots=8)
            pager = Pager(table, version=0, crcs=[], commit=lambda v, rows: None, config=config)
            rec["platform"] = pager.platform
            for plan, (label, size, calls) in enumerate(
                (("take_4k", 4096, small_calls), ("take_big", big, big_calls)), start=1
            ):
                reads = [(0, 0, (i % slots) * big, size) for i in range(calls)]
                pager.register_plan(plan, (reads, []), (reads, []))
                shape = (size // 4,)

                @jax.jit
                def step(version, plan=plan, shape=shape, calls=calls):
                    tok = page_begin(table, plan, version)

                    def body(carry, _):
                        tok, acc = carry
                        x, tok = page_take(table, plan, 0, tok, shape=shape, dtype=jnp.float32)
                        return (tok, acc + x[0]), None

                    (tok, acc), _ = jax.lax.scan(body, (tok, jnp.float32(0)), None, length=calls)
                    return page_commit(table, plan, tok), acc

                version = jnp.int32(pager.stats()["version"])  # a read-only step keeps it
                jax.block_until_ready(step(version))  # compile and warm
                t = time.perf_counter()
                jax.block_until_ready(step(version))
                s = time.perf_counter() - t
                rec[label] = {
                    "bytes": size,
                    "calls": calls,
                    "s": s,
                    "us_per_call": round(s / calls * 1e6, 2),
                    "gb_s": round(size * calls / s / 1e9, 3),
                }
            writes = [(0, 0, i * big, big) for i in range(big_calls)]
            pager.register_plan(3, ([], writes), ([], writes))

            @jax.jit
            def put_step(version, x):
                def body(tok, _):
                    return page_out(table, 3, 0, x, tok), None

                tok = jax.lax.scan(body, page_begin(table, 3, version), None, length=big_calls)[0]
                return page_commit(table, 3, tok)

            x = jnp.ones((big // 4,), jnp.float32)
            jax.block_until_ready(put_step(jnp.int32(pager.stats()["version"]), x))
            pager.settle()
            t = time.perf_counter()
            jax.block_until_ready(put_step(jnp.int32(pager.stats()["version"]), x))
            enq = time.perf_counter() - t
            pager.settle()
            s = time.perf_counter() - t
        rec["write_behind_big"] = {
            "bytes": big,
            "calls": big_calls,
            "enqueue_s": enq,
            "with_flush_s": s,
            "gb_s": round(big * big_calls / s / 1e9, 3),
        }
        rec["stats"] = pager.stats()
    finally:
        if pager is not None:
            pager.close()
        unregister_file_table(table, registration)
        os.unlink(path)
    return rec


# ---- the GPU pager's calls --------------------------------------------------------------

PAGER_TARGETS = (
    "jaxoff_pager_begin",
    "jaxoff_pager_take",
    "jaxoff_pager_out",
    "jaxoff_pager_commit",
)


def pager_steps(table: str, elems: int, n: int, write_plan: int = 1, read_plan: int = 2):
    """Two jitted steps on the pager's targets (``jaxoff.aio._pager.page_*``): ``write(version,
    xs)`` puts the ``n`` rows of ``xs`` (float32[n, elems]) from one site inside a scan,
    ``read(version)`` takes ``n`` such chunks back from one site. Which chunk each call moves
    is the registered plan's business: the calls carry only attributes and a token (the
    begin's: the store version the step reads)."""
    import jax
    import jax.numpy as jnp

    from jaxoff.aio._pager import page_begin, page_commit, page_out, page_take

    def write(version, xs):
        t = page_begin(table, write_plan, version)

        def body(t, x):
            return page_out(table, write_plan, 0, x, t), None

        t = jax.lax.scan(body, t, xs)[0]
        return page_commit(table, write_plan, t)

    def read(version):
        t = page_begin(table, read_plan, version)

        def body(t, _):
            y, t = page_take(table, read_plan, 0, t, shape=(elems,), dtype=jnp.float32)
            return t, y

        t, ys = jax.lax.scan(body, t, None, length=n)
        return ys, page_commit(table, read_plan, t)

    return jax.jit(write), jax.jit(read)


def pager_lowering(elems: int = 1024, n: int = 4) -> dict:
    """The two steps lowered for CUDA (no GPU needed): per target, its calls and the operand
    count of each; and how many host callbacks the steps hold (none)."""
    import re

    import jax
    import jax.numpy as jnp
    from jax import export

    write, read = pager_steps("lowering", elems, n)
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in PAGER_TARGETS]
    version = jax.ShapeDtypeStruct((), jnp.int32)
    text = ""
    for fn, args in (
        (write, (version, jax.ShapeDtypeStruct((n, elems), jnp.float32))),
        (read, (version,)),
    ):
        text += export.export(fn, platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()
    calls: dict = {t: [] for t in PAGER_TARGETS}
    attrs: dict = {t: set() for t in PAGER_TARGETS}
    for m in re.finditer(r"stablehlo\.custom_call @(\w+)\(([^)]*)\)([^\n]*)", text):
        if m.group(1) in calls:
            calls[m.group(1)].append(len([o for o in m.group(2).split(",") if o.strip()]))
            config = re.search(r"mhlo\.backend_config = \{([^}]*)\}", m.group(3))
            names = re.findall(r"(\w+) = ", config.group(1)) if config else []
            attrs[m.group(1)].add(tuple(sorted(names)))
    return {
        "operands": calls,
        "attributes": {t: sorted(v) for t, v in attrs.items()},
        "callbacks": text.count("callback"),
    }


def gpu_pager(a, dev, store: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxoff.aio import EngineConfig, register_file_table, unregister_file_table
    from jaxoff.aio._pager import Pager, PagerConfig, owner_name

    rec: dict = {"lowering": pager_lowering()}
    if dev.platform != "gpu":
        rec["skipped"] = f"no GPU ({dev.platform}): the pager's calls run only on CUDA"
        return rec
    size = (1 if a.smoke else 16) * MIB
    n = 8 if a.smoke else 32
    table = owner_name("gpu_pager_probe")
    path = os.path.join(store, "gpu_pager.pages")
    with open(path, "wb") as f:
        f.truncate(n * size)
    reg = register_file_table(table, [path], config=EngineConfig())
    pager = None
    try:
        with jax.default_device(dev):
            knobs = dict(slot_bytes=size, arena_slots=8, ring_slots=4, write_slots=4, io_threads=8)
            pager = Pager(table, version=0, crcs=[], commit=lambda version, rows: None,
                          config=PagerConfig(**knobs))  # fmt: skip
            if pager.platform != "cuda":
                raise RuntimeError(f"the pager on {dev} is {pager.platform}'s, not CUDA's")
            rec["pager"] = knobs
            refs = [(0, 0, i * size, size) for i in range(n)]
            pager.register_plan(1, ([], refs), ([], refs))
            pager.register_plan(2, (refs, []), (refs, []))
            write, read = pager_steps(table, size // 4, n)
            xs = jax.device_put(np.arange(n * (size // 4), dtype=np.float32).reshape(n, -1), dev)
            jax.block_until_ready(xs)
            version = 0
            jax.block_until_ready(write(jnp.int32(version), xs))  # compiles; the first write
            version += 1  # (its commit: read's begin waits for it)
            jax.block_until_ready(read(jnp.int32(version)))  # compiles; reads it back
            for rnd in range(2):
                t = time.perf_counter()
                tok = write(jnp.int32(version), xs)
                w_host = time.perf_counter() - t  # dispatch: the handlers enqueue and return
                jax.block_until_ready(tok)
                w_dev = time.perf_counter() - t
                version += 1
                t = time.perf_counter()
                ys, tok = read(jnp.int32(version))  # its begin waits for the write's commit
                jax.block_until_ready((ys, tok))
                r_s = time.perf_counter() - t
                rec[f"round{rnd}"] = {
                    "write_dispatch_s": round(w_host, 6),
                    "write_done_s": round(w_dev, 6),
                    "read_s": round(r_s, 6),
                    "read_gb_s": round(n * size / r_s / 1e9, 3),
                    "write_gb_s": round(n * size / w_dev / 1e9, 3),
                }
            pager.settle()
            rec["bitwise"] = bool((np.asarray(ys) == np.asarray(xs)).all())
            rec["bytes"] = n * size
            rec["stats"] = pager.stats()
    finally:
        if pager is not None:
            pager.close()
        unregister_file_table(table, reg)
        os.unlink(path)
    return rec


# ---- XLA facts --------------------------------------------------------------------------


def build_probe_target(out: Path, cuda: bool) -> Path:
    """Compiles the debug target (ffi/src/probe_mark_handler.cc) into a shared library."""
    import jax.ffi

    lib = out / ("probe_mark_cuda.so" if cuda else "probe_mark.so")
    cmd = [
        os.environ.get("CXX", "g++"),
        "-O2",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-isystem",
        jax.ffi.include_dir(),
        str(PROBE_SRC),
        "-o",
        str(lib),
    ]
    if cuda:
        nvcc = shutil.which("nvcc")
        home = Path(
            os.environ.get(
                "CUDA_HOME", Path(nvcc).resolve().parents[1] if nvcc else "/usr/local/cuda"
            )
        )
        cmd[5:5] = ["-DJAXOFF_PROBE_CUDA", "-isystem", str(home / "include")]
        cmd += [f"-L{home / 'lib64'}", "-lcudart_static", "-ldl", "-lrt", "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if r.returncode:
        raise RuntimeError(f"building the probe target failed: {r.stderr[-1500:]}")
    return lib


def xla_facts(a, dev, out: Path) -> dict:
    import jax
    import jax.numpy as jnp

    cuda = dev.platform == "gpu"
    lib = ctypes.CDLL(str(build_probe_target(out, cuda)))
    lib.jaxoff_probe_handler.restype = ctypes.c_void_p
    capsule = ctypes.pythonapi.PyCapsule_New
    capsule.restype = ctypes.py_object
    capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    jax.ffi.register_ffi_target(
        "jaxoff_probe_mark",
        capsule(lib.jaxoff_probe_handler(), None, None),
        platform="CUDA" if cuda else "cpu",
    )

    def mark(x, site):
        return jax.ffi.ffi_call(
            "jaxoff_probe_mark", jax.ShapeDtypeStruct(x.shape, x.dtype), has_side_effect=True
        )(x, site=site)

    trips, d = (20, 256) if a.smoke else (100, 4096)

    @jax.jit
    def program(w, v):
        def body(v, _):
            v = mark(v, site=0)
            v = jnp.tanh(w @ v)  # GPU work between the two sites
            v = mark(v, site=1)
            return v, None

        return jax.lax.scan(body, v, None, length=trips)[0]

    with jax.default_device(dev):
        w = jnp.ones((d, d), jnp.float32) / d
        v = jnp.ones((d, d), jnp.float32)
        jax.block_until_ready(program(w, v))
        lib.jaxoff_probe_reset()
        dispatch = []
        for _ in range(3):
            t = time.perf_counter()
            r = program(w, v)
            dispatch.append(time.perf_counter() - t)
            jax.block_until_ready(r)
    buf = (ctypes.c_int64 * 4)()
    recs = []
    for i in range(lib.jaxoff_probe_count()):
        lib.jaxoff_probe_read(i, buf)
        recs.append(list(buf))
    runs = {}
    for run_id, site, host_ns, gpu_ns in recs:
        runs.setdefault(run_id, []).append((site, host_ns, gpu_ns))
    fact = {
        "executions": 3,
        "calls": len(recs),
        "run_ids": len(runs),
        "run_id_per_execution": len(runs) == 3,
        "site_order": all([s for s, _, _ in calls] == [0, 1] * trips for calls in runs.values()),
        "calls_per_execution": sorted(len(c) for c in runs.values()),
        "dispatch_s": dispatch,
    }
    if cuda:
        leads = [g - h for calls in runs.values() for _, h, g in calls if g >= 0]
        # The host ran ahead when it ran the last call of an execution before the GPU had
        # reached the first: XLA's thread enqueues the whole scan without waiting.
        ahead = [calls[-1][1] < calls[0][2] for calls in runs.values() if calls[0][2] >= 0]
        fact.update(
            host_ahead_of_gpu=bool(ahead) and all(ahead),
            max_lead_ms=round(max(leads) / 1e6, 3) if leads else None,
            median_lead_ms=round(sorted(leads)[len(leads) // 2] / 1e6, 3) if leads else None,
        )
    else:
        fact["host_ahead_of_gpu"] = None  # no device stream on the CPU
    return fact


# ---- Fuyou and plain probes (each in a child process) --------------------------------------


def gpu_busy_s(trace_dir: str) -> float | None:
    """Seconds in which any GPU stream ran a kernel or a copy, from a jax.profiler trace."""
    from jax.profiler import ProfileData

    files = list(Path(trace_dir).rglob("*.xplane.pb"))
    if not files:
        return None
    spans = []
    for plane in ProfileData.from_file(str(files[0])).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        lines = [ln for ln in plane.lines if ln.name.startswith("Stream")] or list(plane.lines)
        for ln in lines:
            spans += [(e.start_ns, e.start_ns + e.duration_ns) for e in ln.events]
    return union_s(spans) if spans else None


def union_s(spans: list) -> float:
    """Seconds covered by the union of ``(start_ns, end_ns)`` spans (streams overlap)."""
    spans = sorted(spans)
    busy, (lo, hi) = 0, spans[0]
    for s, e in spans[1:]:
        if s > hi:
            busy, lo, hi = busy + hi - lo, s, e
        else:
            hi = max(hi, e)
    return (busy + hi - lo) / 1e9


def child(spec: dict) -> dict:
    """One capacity.run_probe, traced by jax.profiler when asked; runs in its own process."""
    import jax

    sys.path.insert(0, str(BENCH))
    import capacity
    from _gpu import probe as gpu_probe

    dev = jax.devices()[0]
    store = gpu_probe.new_store(spec.get("store_dir"))
    trace_dir = tempfile.mkdtemp(prefix="jaxoff-trace-") if spec.get("profile") else None
    trace = trace_dir
    try:
        with jax.default_device(dev):
            profile_error = None
            if trace:
                try:  # device activity only: no Python or host-thread tracing (overhead)
                    opts = jax.profiler.ProfileOptions()
                    opts.python_tracer_level = 0
                    opts.host_tracer_level = 0
                    opts.enable_hlo_proto = False
                    jax.profiler.start_trace(trace, profiler_options=opts)
                except Exception as e:  # no CUPTI: the probe still runs, without busy time
                    profile_error, trace = f"{type(e).__name__}: {str(e)[:300]}", None
            try:
                rec = capacity.run_probe(
                    spec["mode"],
                    spec["layers"],
                    spec["d_model"],
                    spec["seq_len"],
                    spec["batch_size"],
                    spec["steps"],
                    store,
                    slots=1,
                )
            finally:
                if trace:
                    jax.profiler.stop_trace()
        rec["profile_error"] = profile_error
        if trace:
            busy = gpu_busy_s(trace)
            steps = sum(rec["step_s"])
            rec["gpu_busy_s"] = busy
            rec["gpu_busy_fraction"] = None if busy is None else round(min(1.0, busy / steps), 4)
        ns = argparse.Namespace(
            steps=spec["steps"],
            layers=spec["layers"],
            seq_len=spec["seq_len"],
            d_model=spec["d_model"],
            batch_size=spec["batch_size"],
        )
        figs = gpu_probe.step_figures(ns, dev, rec["params"], rec["step_s"], rec["losses"])
        figs.pop("loss_falling", None)
        rec.update(figs)
        peak = PEAK_BF16.get(next((k for k in PEAK_BF16 if k in dev.device_kind), ""), None)
        rec["mfu"] = round(rec["model_flops_per_s"] / peak, 4) if peak else None
        # trained: finite, and (from 10 steps, two passes over the same windows) loss falling
        falling = rec.get("loss_falling", True) if spec["steps"] >= 10 else True
        rec["ok"] = bool(rec.get("finite", True) and falling)
    except Exception as e:  # an OOM is a result, not a crash
        rec = {
            "ok": False,
            "error": f"{type(e).__name__}: {str(e)[:400]}",
            "oom": "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower(),
        }
    finally:
        shutil.rmtree(store, ignore_errors=True)
        if trace_dir:
            shutil.rmtree(trace_dir, ignore_errors=True)
    rec.update({k: spec[k] for k in ("mode", "layers", "d_model")})
    return rec


def spawn(a, clock: Clock, spec: dict, need: float) -> dict:
    """Runs `child` in a process of its own, killed at the deadline."""
    if not clock.fits(need):
        return {
            **spec,
            "ok": None,
            "skipped": f"deadline: {clock.left():.0f} s left, ~{need} s needed",
        }
    env = dict(os.environ)
    if a.mem_fraction and not a.smoke:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(a.mem_fraction)
    spec = {**spec, "store_dir": a.store_dir}
    try:
        r = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=max(5.0, clock.left() - 5),
        )
    except subprocess.TimeoutExpired:
        return {**spec, "ok": False, "error": "killed at the script's deadline"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        return {**spec, "ok": False, "error": f"exit {r.returncode}: {r.stderr[-800:]}"}
    return json.loads(lines[-1])


def size(a, mode: str, layers: int) -> dict:
    if a.smoke:
        return dict(mode=mode, layers=layers, d_model=64, seq_len=32, batch_size=2, steps=2)
    return dict(mode=mode, layers=layers, d_model=1024, seq_len=1024, batch_size=8, steps=10)


def fuyou(a, clock: Clock) -> dict:
    layer_sets = [1] if a.smoke else [4, 16]
    rec = {"plain_bf16": spawn(a, clock, {**size(a, "plain-bf16", layer_sets[0])}, 40)}
    for n in layer_sets:
        rec[f"fuyou_{n}L"] = spawn(
            a, clock, {**size(a, "fuyou-nvme", n), "profile": True}, 40 if n <= 4 else 70
        )
    p, f = rec["plain_bf16"], rec[f"fuyou_{layer_sets[0]}L"]
    if p.get("ok") and f.get("ok"):
        rec["step_ratio_fuyou_over_plain"] = round(f["step_s_median"] / p["step_s_median"], 2)
    return rec


def plain_vs_jaxoff(a, clock: Clock) -> dict:
    tries = [1] if a.smoke else [8, 12]
    plain = [spawn(a, clock, size(a, "plain-bf16", n), 35) for n in tries]
    passed = [r for r in plain if r.get("ok")]
    rec = {"plain": plain, "plain_largest_layers": passed[-1]["layers"] if passed else None}
    if passed:
        n = passed[-1]["layers"]
        j = spawn(a, clock, {**size(a, "fuyou-nvme", n), "profile": True}, 60)
        rec["jaxoff"] = j
        if j.get("ok"):
            rec["tokens_per_s_ratio"] = round(j["tokens_per_s"] / passed[-1]["tokens_per_s"], 3)
    return rec


def capacity_bracket(a, clock: Clock, plain_largest: int | None) -> dict:
    n = 3 * (plain_largest or (1 if a.smoke else 8))
    probes, lo, hi = [], None, None
    while hi is None and (not a.smoke or not probes):
        r = spawn(a, clock, size(a, "fuyou-nvme", n), 90)
        probes.append(r)
        if r.get("ok") is None:  # skipped: out of time
            break
        if r.get("ok"):
            lo, n = n, int(n * 1.5) + 1
        else:
            hi = n
    return {
        "probes": probes,
        "trained_layers": lo,
        "failed_layers": hi,
        "plain_largest_layers": plain_largest,
        "ratio_lower_bound": round(lo / plain_largest, 2) if lo and plain_largest else None,
    }


# ---- driver -------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="folder for the JSON records (created)")
    p.add_argument("--deadline-s", type=float, default=340.0)
    p.add_argument(
        "--smoke",
        "--dry-run",
        action="store_true",
        help="small sizes on whatever device JAX has (a CPU too)",
    )
    p.add_argument(
        "--store-dir",
        default=None,
        help="page stores (default /dev/shm if it exists: host memory, not NVMe)",
    )
    p.add_argument(
        "--mem-fraction",
        type=float,
        default=None,
        help="XLA_PYTHON_CLIENT_MEM_FRACTION of the probes (default: 3.4 GB of "
        "the GPU's memory, the Fuyou pair's cap in bench/gpu_session.sh; 0 leaves "
        "XLA's default)",
    )
    p.add_argument(
        "--sections",
        nargs="*",
        default=[
            "pcie",
            "handlers",
            "gpu_pager",
            "xla_facts",
            "fuyou",
            "plain_vs_jaxoff",
            "capacity",
        ],
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.child)), default=str))
        return 0
    if not a.out:
        p.error("give the output folder: python bench/gpu/pager_probe.py OUT")
    clock = Clock(a.deadline_s)
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus and not a.smoke:
        print(
            f"no GPU: JAX's backend is {jax.default_backend()}; use --smoke to check the "
            "script on a CPU",
            file=sys.stderr,
        )
        return NO_GPU_EXIT
    dev = (gpus or jax.devices())[0]
    if a.mem_fraction is None and gpus:
        total = (dev.memory_stats() or {}).get("bytes_limit")
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            smi = []
        total = int(smi[0]) * MIB if smi and smi[0].isdigit() else total
        a.mem_fraction = round(3.4e9 / total, 4) if total else None
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.store_dir is None:
        a.store_dir = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    os.makedirs(a.store_dir, exist_ok=True)
    store = tempfile.mkdtemp(prefix="jaxoff-pager-probe-", dir=a.store_dir)
    summary = {
        "provenance": provenance(),
        "smoke": a.smoke,
        "mem_fraction": a.mem_fraction,
        "store_dir": a.store_dir,
        "sections": {},
    }
    write(out, "summary", summary)
    plain_largest = None
    # seconds each section needs at least (a full GPU run; the smoke run is smaller)
    need = {
        "pcie": 20,
        "handlers": 40,
        "gpu_pager": 30,
        "xla_facts": 40,
        "fuyou": 60,
        "plain_vs_jaxoff": 60,
        "capacity": 90,
    }
    for name in a.sections:
        t = time.perf_counter()
        if not clock.fits(need.get(name, 30) / (4 if a.smoke else 1)):
            status = f"skipped: deadline ({clock.left():.0f} s left)"
        else:
            try:
                if name == "pcie":
                    rec = pcie(a, dev)
                elif name == "handlers":
                    rec = handlers(a, dev, store)
                elif name == "gpu_pager":
                    rec = gpu_pager(a, dev, store)
                elif name == "xla_facts":
                    rec = xla_facts(a, dev, out)
                elif name == "fuyou":
                    rec = fuyou(a, clock)
                elif name == "plain_vs_jaxoff":
                    rec = plain_vs_jaxoff(a, clock)
                    plain_largest = rec["plain_largest_layers"]
                elif name == "capacity":
                    rec = capacity_bracket(a, clock, plain_largest)
                else:
                    raise ValueError(f"unknown section {name!r}")
                status = "ok"
            except Exception as e:  # a section's failure is a result; the next one runs
                rec, status = {"error": f"{type(e).__name__}: {str(e)[:1500]}"}, "failed"
            rec["section_s"] = round(time.perf_counter() - t, 2)
            write(out, name, rec)
        summary["sections"][name] = status
        summary["left_s"] = round(clock.left(), 1)
        write(out, "summary", summary)
        print(
            f"{name}: {status} ({time.perf_counter() - t:.1f} s, {clock.left():.0f} s left)",
            flush=True,
        )
    shutil.rmtree(store, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
