"""The GPU pager's device run: one command, a deadline for each part, at most six files.

    python bench/gpu/pager_probe.py OUT [--deadline-s 480] [--store-dir /dev/shm/x]
    python bench/gpu/pager_probe.py OUT --pager legacy --legacy-tree .legacy   # the old pager
    python bench/gpu/pager_probe.py OUT --smoke      # small sizes; runs on the CPU too

bench/gpu_session.sh runs it after installing jaxoff on a lent machine. Parts, in order
(``--parts``); each has its own deadline (``BUDGET_S``, cut to what is left of the run's) and
writes its record as soon as it ends; OUT/summary.json says, after every part, each part's
status (``running`` while it runs, so a run killed mid-part still says where), the commit,
the machine, the versions and the headline figures against their goals:

  pager       (pager.json) Fuyou's step (bench/capacity.py's fuyou-nvme: optimizer state and
              block parameters in the page store) at 4 and 16 layers, d_model 1024, with the
              GPU-busy share of its steps (jax.profiler trace), and plain-bf16 at 4 layers.
              ``--pager legacy`` runs the same Fuyou probes from a checkout of commit 8abcffe,
              the last with the old paging calls (jaxoff_page_prefetch/_take/_out/_in/_flush
              and host callbacks); without that tree it stops at once, in one line. The old
              path's recorded figure, 1.54 s a 16-layer step on an H100
              (bench/results/gpu-h100/probe_fuyou_16L.json), is the one the new step is
              compared with; the goal is 0.2 s.
  plain_vs_jaxoff  (plain_vs_jaxoff.json) plain-bf16's largest size under the device cap: a
              bracket on layers of at most ``--plain-probes`` probes (the pager part's 4 layers
              count as one verdict more), then fuyou-nvme at that size: tokens/s of both, and
              their ratio (goal 0.8).
  gpu_pager, xla_facts, pcie, handlers  (facts.json, one key each) the CUDA pager's calls
              (a step of page_out of 32 chunks of 16 MiB, a step taking them back, checked
              bitwise; without a GPU only the lowering), what its design relies on in XLA (a
              run id per execution, calls in site order in a scan, the host running ahead of
              the GPU: a debug FFI target built from ffi/src/probe_mark_handler.cc), PCIe
              through XLA's transfers, and the pager's calls on the device JAX has.
  capacity    (capacity.json; not in the default parts) fuyou-nvme from 3x plain's largest
              size upward: the largest that trained, the smallest that failed.

Without a GPU it stops at once (exit 3, ``no GPU: ...``) unless --smoke, which runs every
part at small sizes on whatever device JAX has (tests/test_gpu_probe_script.py).
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps  # noqa: E402  (bench/gpu/steps.py: the step probes' child processes)

PARTS = ["pager", "plain_vs_jaxoff", "gpu_pager", "xla_facts", "pcie", "handlers"]
EXTRA_PARTS = ["capacity"]
FACTS = ("gpu_pager", "xla_facts", "pcie", "handlers")  # one file between them: facts.json
# Each part's own deadline (seconds; the run's deadline cuts them all), and the least it
# starts with on a GPU (a quarter of that in the smoke run).
BUDGET_S = {
    "pager": 200,
    "plain_vs_jaxoff": 210,
    "gpu_pager": 45,
    "xla_facts": 50,
    "pcie": 20,
    "handlers": 40,
    "capacity": 150,
}
NEED_S = {
    "pager": 60,
    "plain_vs_jaxoff": 60,
    "gpu_pager": 20,
    "xla_facts": 25,
    "pcie": 10,
    "handlers": 20,
    "capacity": 60,
}
LEGACY_COMMIT = "8abcffe"  # the last commit with the old paging calls
# The old path's figure the new step is compared with, and the goals of the figures.
LEGACY_RECORD = {
    "fuyou_16L_step_s": 1.543,
    "device": "NVIDIA H100 80GB HBM3",
    "file": "bench/results/gpu-h100/probe_fuyou_16L.json",
    "paging": "the old calls (jaxoff_page_prefetch/_take/_out/_in/_flush, host callbacks)",
}
GOALS = {
    "fuyou_16L_step_s": ("<=", 0.2),
    "gpu_busy_fraction_16L": (">=", 0.5),
    "tokens_per_s_ratio": (">=", 0.8),
}

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


def source() -> dict:
    """The commit and whether the tree is that commit's: from git, or, in a copy without .git
    (a lent machine's), from .whl/source.json (bench/gpu/wheels.sh: the blob id of every
    tracked file), each file's blob id computed here."""
    import hashlib

    def git(*args):
        try:
            r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=20, cwd=ROOT)
            return r.stdout.strip() if r.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    if commit:
        return {
            "commit": commit,
            "commit_from": "git",
            "tree_clean": git("status", "--porcelain", "--untracked-files=no") == "",
        }
    path = ROOT / ".whl" / "source.json"
    if not path.exists():
        return {"commit": None, "commit_from": "no .git, no .whl/source.json (bench/gpu/wheels.sh)"}
    doc = json.loads(path.read_text())
    edited = []
    for name, blob in doc["blobs"].items():
        f = ROOT / name
        data = f.read_bytes() if f.is_file() else None
        sha = None if data is None else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        if sha != blob:
            edited.append(name)
    return {
        "commit": doc["commit"],
        "commit_from": f".whl/source.json of {doc['written_utc']}",
        "tree_clean": not edited,
        "edited": edited[:20],
    }


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
    for pkg in (
        "jax",
        "jaxlib",
        "jax-cuda13-plugin",
        "jax-cuda12-plugin",
        "flax",
        "optax",
        "orbax-checkpoint",
        "numpy",
        "jaxoff",
    ):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    rec = {
        **source(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv,
        "machine": {
            "device": dev.device_kind,
            "platform": dev.platform,
            "gpu": run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,memory.total",
                    "--format=csv,noheader",
                ]
            ),
            "cpus": os.cpu_count(),
            "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
        },
        "python": platform.python_version(),
        "versions": versions,
    }
    try:  # the legacy tree's jaxoff may lack them
        from jaxoff.aio import EngineConfig, backend_status

        rec["engine_defaults"] = EngineConfig().as_kwargs()
        rec["io_backend"] = str(backend_status())
    except Exception as e:
        rec["engine_defaults"] = f"{type(e).__name__}: {e}"
    return rec


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
            pager = Pager(
                table,
                version=0,
                crcs=[],
                commit=lambda version, rows: None,
                config=PagerConfig(**knobs),
            )
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


def xla_facts(a, dev) -> dict:
    import jax
    import jax.numpy as jnp

    cuda = dev.platform == "gpu"
    lib = ctypes.CDLL(str(build_probe_target(Path(tempfile.mkdtemp()), cuda)))
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


# ---- the step parts (bench/gpu/steps.py: a child process a probe) ---------------------------


def size(a, mode: str, layers: int, profile: bool = False) -> dict:
    spec = dict(mode=mode, layers=layers, d_model=1024, seq_len=1024, batch_size=8, steps=10)
    if a.smoke:
        spec.update(d_model=64, seq_len=32, batch_size=2, steps=2)
    return {**spec, "profile": profile, "store_dir": a.store_dir}


def probe(a, clock: Clock, spec: dict, need: float, cap_s: float) -> dict:
    env = {}
    if a.mem_fraction and not a.smoke:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(a.mem_fraction)
    if a.pager == "legacy":
        spec = {**spec, "tree": str(a.legacy_tree)}
    if a.smoke:
        need /= 4
    return steps.spawn(clock, spec, need, cap_s, env)


def pager(a, clock: Clock, found: dict) -> dict:
    """Fuyou's step at 4 and 16 layers (1 and 2 in the smoke run) with its GPU-busy share,
    and plain-bf16 at the first size (its step, for the ratio; a fit for the plain bracket)."""
    small, large = (1, 2) if a.smoke else (4, 16)
    rec: dict = {"pager": a.pager, "legacy_record": LEGACY_RECORD}
    if a.pager == "legacy":
        rec["tree"] = str(a.legacy_tree)
    for n, need, cap in ((small, 40, 90), (large, 60, 150)):
        rec[f"fuyou_{n}L"] = probe(a, clock, size(a, "fuyou-nvme", n, profile=True), need, cap)
    if a.pager == "new":  # plain does not page: its figure is the same under either pager
        rec[f"plain_bf16_{small}L"] = probe(a, clock, size(a, "plain-bf16", small), 30, 90)
        found["plain"] = [rec[f"plain_bf16_{small}L"]]
    f, big = rec[f"fuyou_{small}L"], rec[f"fuyou_{large}L"]
    p = rec.get(f"plain_bf16_{small}L", {})
    rec["figures"] = {
        f"fuyou_{large}L_step_s": big.get("step_s_median") if big.get("ok") else None,
        f"gpu_busy_fraction_{large}L": big.get("gpu_busy_fraction"),
        f"fuyou_{small}L_step_s": f.get("step_s_median") if f.get("ok") else None,
        f"gpu_busy_fraction_{small}L": f.get("gpu_busy_fraction"),
        "step_ratio_fuyou_over_plain": (
            round(f["step_s_median"] / p["step_s_median"], 2)
            if f.get("ok") and p.get("ok")
            else None
        ),
        "speedup_over_legacy_record": (
            round(LEGACY_RECORD["fuyou_16L_step_s"] / big["step_s_median"], 2)
            if big.get("ok") and not a.smoke
            else None
        ),
    }
    found["figures"].update(
        fuyou_16L_step_s=rec["figures"][f"fuyou_{large}L_step_s"],
        gpu_busy_fraction_16L=rec["figures"][f"gpu_busy_fraction_{large}L"],
    )
    return rec


def plain_vs_jaxoff(a, clock: Clock, found: dict) -> dict:
    """plain-bf16's largest size (layers) under the device cap, by a bracket of at most
    ``--plain-probes`` probes (a probe killed at its cap counts as failed: it did not train in
    the time), then fuyou-nvme at that size, profiled: tokens/s of both."""
    plain = [r for r in found.get("plain", []) if r.get("ok") is not None]  # the pager part's
    start = 2 if a.smoke else 8
    probes = 0
    plain_clock = Clock(clock.left() - 70)  # what the jaxoff probe at the end keeps
    while probes < a.plain_probes:
        n = steps.next_size(
            [r["layers"] for r in plain if r.get("ok")],
            [r["layers"] for r in plain if r.get("ok") is False],
            start,
        )
        if n is None:
            break
        r = probe(a, plain_clock, size(a, "plain-bf16", n), 30, 75)
        probes += 1
        if r.get("ok") is None:  # skipped: out of time
            break
        plain.append(r)
    fit = [r for r in plain if r.get("ok")]
    best = max(fit, key=lambda r: r["layers"]) if fit else None
    rec: dict = {
        "plain": plain,
        "plain_largest_layers": best and best["layers"],
        "plain_probes_run": probes,
        "plain_probes_cap": a.plain_probes,
    }
    found["plain_largest"] = best and best["layers"]
    if best:
        j = probe(a, clock, size(a, "fuyou-nvme", best["layers"], profile=True), 40, 150)
        rec["jaxoff"] = j
        rec["plain_tokens_per_s"] = best["tokens_per_s"]
        rec["jaxoff_tokens_per_s"] = j.get("tokens_per_s") if j.get("ok") else None
        if j.get("ok"):
            rec["tokens_per_s_ratio"] = round(j["tokens_per_s"] / best["tokens_per_s"], 3)
    found["figures"]["tokens_per_s_ratio"] = rec.get("tokens_per_s_ratio")
    return rec


def capacity(a, clock: Clock, found: dict) -> dict:
    plain_largest = found.get("plain_largest")
    n = 3 * (plain_largest or (1 if a.smoke else 8))
    probes, lo, hi = [], None, None
    while hi is None and (not a.smoke or not probes):
        r = probe(a, clock, size(a, "fuyou-nvme", n), 60, 150)
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


def legacy_problem(tree: Path) -> str | None:
    """Why ``tree`` is not a checkout of the legacy pager (None when it is one)."""
    calls = tree / "jaxoff" / "aio" / "_ffi_calls.py"
    if not calls.is_file() or "def page_prefetch" not in calls.read_text():
        return (
            f"--pager legacy needs a checkout of commit {LEGACY_COMMIT} (the old paging calls, "
            f"deleted since) at {tree}, which has none: make it with `git worktree add "
            f"{tree} {LEGACY_COMMIT}` and carry it; its recorded figure is 1.54 s a 16-layer "
            "d_model 1024 Fuyou step on an H100 (bench/results/gpu-h100/probe_fuyou_16L.json)"
        )
    return None


def verdicts(found: dict, smoke: bool) -> dict:
    """Each headline figure against its goal (``met`` null without the figure, or in the
    smoke run, whose sizes are not the goal's)."""
    out = {}
    for name, (op, goal) in GOALS.items():
        v = found["figures"].get(name)
        met = None if v is None or smoke else (v <= goal if op == "<=" else v >= goal)
        out[name] = {"value": v, "goal": f"{op} {goal}", "met": met}
    return out


def run_part(name: str, a, dev, store: str, clock: Clock, found: dict) -> dict:
    if name == "pager":
        return pager(a, clock, found)
    if name == "plain_vs_jaxoff":
        return plain_vs_jaxoff(a, clock, found)
    if name == "capacity":
        return capacity(a, clock, found)
    if name == "pcie":
        return pcie(a, dev)
    if name == "handlers":
        return handlers(a, dev, store)
    if name == "gpu_pager":
        return gpu_pager(a, dev, store)
    if name == "xla_facts":
        return xla_facts(a, dev)
    raise ValueError(f"unknown part {name!r}")


def part_status(rec: dict) -> str:
    """ok, or partial when a probe of the part was skipped or killed at its deadline."""
    text = json.dumps(rec, default=str)
    if '"skipped": "deadline' in text or '"timeout": true' in text:
        return "partial: a probe was skipped or killed at its deadline"
    return "ok"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="folder for the JSON records (created)")
    p.add_argument("--deadline-s", type=float, default=480.0)
    p.add_argument(
        "--smoke",
        "--dry-run",
        action="store_true",
        help="small sizes on whatever device JAX has (a CPU too)",
    )
    p.add_argument("--pager", choices=("new", "legacy"), default="new")
    p.add_argument(
        "--legacy-tree",
        type=Path,
        default=ROOT / ".legacy",
        help=f"a checkout of {LEGACY_COMMIT}, built (--pager legacy)",
    )
    p.add_argument("--check", action="store_true", help="check the arguments only, and exit")
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
        "--plain-probes",
        type=int,
        default=None,
        help="the plain bracket's most probes (default 3; 1 in the smoke run)",
    )
    p.add_argument(
        "--parts",
        "--sections",
        nargs="*",
        default=None,
        choices=PARTS + EXTRA_PARTS,
        help=f"default: {' '.join(PARTS)}",
    )
    p.add_argument("--setup", default=None, help="the session's setup record (JSON)")
    a = p.parse_args(argv)
    if a.pager == "legacy" and (why := legacy_problem(a.legacy_tree)):
        print(why, file=sys.stderr)
        return 2
    a.parts = PARTS if a.parts is None else a.parts
    if a.pager == "legacy":
        a.parts = [x for x in a.parts if x == "pager"]  # the rest is the new pager's
    if a.plain_probes is None:
        a.plain_probes = 1 if a.smoke else 3
    if a.check:
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
    found: dict = {"figures": {}}
    summary = {
        **provenance(),
        "pager": a.pager,
        "smoke": a.smoke,
        "setup": json.loads(a.setup) if a.setup else None,
        "mem_fraction": a.mem_fraction,
        "store_dir": a.store_dir,
        "deadline_s": a.deadline_s,
        "parts": {name: {"status": "not started"} for name in a.parts},
        "figures": {},
        "legacy_record": LEGACY_RECORD,
    }
    write(out, "summary", summary)
    facts: dict = {}
    for name in a.parts:
        t = time.perf_counter()
        budget = min(BUDGET_S[name], clock.left())
        part_clock = Clock(budget)
        file = "facts" if name in FACTS else name
        entry = summary["parts"][name]
        entry.update(file=f"{file}.json", budget_s=round(budget, 1))
        if clock.left() < NEED_S[name] / (4 if a.smoke else 1):
            entry["status"] = f"skipped: deadline ({clock.left():.0f} s left)"
        else:
            entry["status"] = "running (a run killed here was stopped at its deadline)"
            write(out, "summary", summary)
            try:
                rec = run_part(name, a, dev, store, part_clock, found)
                status = part_status(rec)
            except Exception as e:  # a part's failure is a result; the next one runs
                rec, status = {"error": f"{type(e).__name__}: {str(e)[:1500]}"}, "failed"
            rec["part_s"] = round(time.perf_counter() - t, 2)
            if file == "facts":
                facts[name] = rec
                write(out, "facts", facts)
            else:
                write(out, file, rec)
            entry["status"] = status
        entry["seconds"] = round(time.perf_counter() - t, 1)
        summary["figures"] = verdicts(found, a.smoke)
        summary["left_s"] = round(clock.left(), 1)
        write(out, "summary", summary)
        print(
            f"{name}: {entry['status']} ({entry['seconds']} s, {clock.left():.0f} s left)",
            flush=True,
        )
    shutil.rmtree(store, ignore_errors=True)
    print("figures: " + json.dumps(summary["figures"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
