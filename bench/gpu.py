"""GPU measurements of jaxoff, one command per part, JSON into an output directory.

    python bench/gpu.py --out bench/results/gpu           # env + tests (the default parts)
    python bench/gpu.py --out bench/results/gpu --parts placements   # peak memory, step time
    python bench/gpu.py --out bench/results/gpu --parts policies
    python bench/gpu.py --out bench/results/gpu --parts capacity --capacity-mode plain
    python bench/gpu.py --out bench/results/gpu --parts capacity --capacity-mode jaxoff
    python bench/gpu.py probe --placement host_params_stream1 --layers 8   # one measurement

Parts:
  env         device, driver, JAX/flax/optax/orbax versions (and whether they sit inside
              pyproject.toml's ranges), jaxoff.aio.cuda_status() -> env.json
  tests       the gpu-marked tests (tests/test_gpu.py) and tests/test_cuda_build.py under
              JAX_PLATFORMS=cuda,cpu -> tests.json (and the junit XML)
  placements  per placement (jaxoff.placement presets, plus the paged optimizer): the device's
              peak_bytes_in_use, compiled memory_analysis, step time, tokens/s -> placements.json
  policies    the same per remat preset (jaxoff.policy.PRESETS), device placement -> policies.json
  capacity    bracketing search on layers at a fixed width: the largest GPT that trains
              (>= --capacity-steps steps, finite, loss falling) with plain flax + optax AdamW
              on the device (mode plain: each of --plain-plans) versus jaxoff's plans (mode
              jaxoff: each of --jaxoff-plans), with tokens/s and MFU -> <--capacity-name>.json
              (every probe kept, including failures). A plan is a placement, paged:<placement>,
              or bench:<mode> for the instrumented loop's plain-bf16 and fuyou-nvme probes
              (_common/step_loop.py, at bench/capacity.py's GPT shape)

Every measurement runs in a child process of its own (``bench/gpu.py probe``, the code in
``_gpu/probe.py``): a device's peak cannot be reset, and an out-of-memory probe must not take
down the search. Each invocation stops starting probes once --budget-s is spent and says so;
running the same command again resumes (probes already recorded in the output directory are
not run again), so each part fits the 10-minute limit of a lent machine. Without a GPU it stops
at once: ``no GPU: ...``.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = [str(ROOT / "bench" / "gpu.py"), "probe"]  # one measurement, a process of its own
NO_GPU_EXIT = 3
PLACEMENTS = [
    "device",
    "host_opt",
    "host_opt_xfer",
    "host_params",
    "host_params_stream1",
    "host_params_stream2",
    "paged:device",
    "paged:host_params",
]
# Dense peak FLOP/s by device kind and compute dtype (vendor datasheets, SXM parts; float32
# matmuls run as TF32 under JAX's default precision on these GPUs). MFU is null elsewhere.
PEAK_FLOPS = {
    "H100": {"bfloat16": 989e12, "float32": 494e12},
    "H200": {"bfloat16": 989e12, "float32": 494e12},
    "A100": {"bfloat16": 312e12, "float32": 156e12},
}


# XLA_PYTHON_CLIENT_MEM_FRACTION for the probes (--mem-fraction): caps the device memory the
# allocator may use, so that a capacity search brackets a smaller "HBM" within a short lease.
MEM_FRACTION: float | None = None


def forced_env() -> dict[str, str]:
    """What every child (probe or test run) is given over this process's environment."""
    env = {"JAX_PLATFORMS": "cuda,cpu"}  # the tests' conftest defaults to cpu
    if MEM_FRACTION is not None:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(MEM_FRACTION)
    return env


def child_env() -> dict[str, str]:
    env = dict(os.environ, **forced_env())
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


def env_prefix() -> list[str]:
    """`forced_env` as the words of a shell command, for the records' ``command``."""
    return [f"{k}={v}" for k, v in forced_env().items()]


def require_gpu() -> str:
    """The GPU's device kind, or exits at once with ``no GPU: <why>``."""
    code = "import jax; d = jax.devices('gpu'); print(d[0].device_kind if d else '')"
    try:
        r = subprocess.run(
            [sys.executable, "-c", code],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        kind = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
        why = (r.stderr.strip().splitlines() or ["jax.devices('gpu') is empty"])[-1]
    except subprocess.TimeoutExpired:
        kind, why = "", "JAX did not start its GPU backend within 300 s"
    if not kind:
        print(f"no GPU: {why}", file=sys.stderr)
        sys.exit(NO_GPU_EXIT)
    return kind


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1) + "\n")
    print(f"wrote {path}")


# ----------------------------------------------------------------------------- env
def version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def in_ranges() -> dict[str, dict]:
    """Installed versions against jaxoff's declared dependency ranges."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return {}
    out = {}
    for req in md.requires("jaxoff") or []:
        r = Requirement(req)
        if r.marker is not None or r.name not in (
            "jax",
            "jaxlib",
            "flax",
            "optax",
            "orbax-checkpoint",
        ):
            continue
        v = version(r.name)
        out[r.name] = {
            "installed": v,
            "range": str(r.specifier),
            "inside": v is not None and r.specifier.contains(v, prereleases=True),
        }
    return out


def part_env(out: Path, kind: str, a) -> None:
    code = (
        "import json, jax, dataclasses; from jaxoff.aio import cuda_status; "
        "d = jax.devices('gpu')[0]; s = cuda_status(); "
        "print(json.dumps({'device_kind': d.device_kind, 'devices': len(jax.devices('gpu')),"
        " 'memory_stats': d.memory_stats(), 'cuda_status': dataclasses.asdict(s)}))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=600
    )
    rec = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "versions": {
            d: version(d)
            for d in (
                "jax",
                "jaxlib",
                "jax-cuda13-plugin",
                "jax-cuda13-pjrt",
                "jax-cuda12-plugin",
                "flax",
                "optax",
                "orbax-checkpoint",
                "numpy",
                "jaxoff",
            )
        },
        "ranges": in_ranges(),
        "cpu_count": os.cpu_count(),
    }
    try:
        rec.update(json.loads(r.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        rec["error"] = r.stderr[-2000:]
    if shutil.which("nvidia-smi"):
        q = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,"
                "pcie.link.gen.max,pcie.link.width.max",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
        )
        rec["nvidia_smi"] = q.stdout.strip()
    write_json(out / "env.json", rec)


# ----------------------------------------------------------------------------- tests
def part_tests(out: Path, kind: str, a) -> None:
    xml = out / "tests.xml"
    # Every gpu-marked test, and the CUDA build's own checks (unmarked: they run on CI too).
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/test_gpu.py",
        "tests/test_cuda_build.py",
        "-rsx",
        "-q",
        # Two workers: a test that crashes its process fails alone (xdist replaces the worker)
        # instead of ending the run, as a segfault in the paging module did on the first GPU.
        "-n",
        "2",
        # Another machine's JAX, flax and optax releases may warn where ours do not: a warning
        # is shown there, not turned into a failure (the suite's filterwarnings=error).
        "-o",
        "filterwarnings=ignore::DeprecationWarning",
        f"--junitxml={xml}",
    ]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            cmd,
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=max(60, a.budget_s),
        )
        rc, tail = r.returncode, (r.stdout + r.stderr)[-6000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", str(e.stdout or "")[-6000:]
    rec = {
        "command": " ".join(env_prefix() + ["python"] + cmd[1:]),
        "returncode": rc,
        "seconds": round(time.perf_counter() - t0, 1),
        "output_tail": tail,
        "cases": [],
    }
    if xml.exists():
        import xml.etree.ElementTree as ET

        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = {"failure": "failed"}.get(tag, tag)
                    rec_msg = (el.get("message") or "")[:1000]
                    break
            else:
                rec_msg = ""
            rec["cases"].append(
                {
                    "test": f"{case.get('classname')}::{case.get('name')}",
                    "outcome": outcome,
                    "seconds": float(case.get("time", 0)),
                    "message": rec_msg,
                }
            )
    write_json(out / "tests.json", rec)


# ----------------------------------------------------------------------------- probes
def run_probe(args: dict, timeout: float) -> dict:
    cmd = [sys.executable, *PROBE]
    for k, v in args.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=max(30, timeout)
        )
        lines = r.stdout.strip().splitlines()
        rec = json.loads(lines[-1]) if lines else {"ok": False, "error": r.stderr[-1500:]}
        if r.returncode not in (0,) and "error" not in rec:
            rec["error"] = f"exit {r.returncode}: {r.stderr[-1500:]}"
    except subprocess.TimeoutExpired:
        rec = {"ok": False, "error": f"timeout after {timeout:.0f} s", "timeout": True}
    except json.JSONDecodeError:
        rec = {"ok": False, "error": "probe printed no JSON"}
    rec["probe_args"] = args
    rec["wall_s"] = round(time.perf_counter() - t0, 1)
    rec["command"] = " ".join(
        env_prefix()
        + ["python", "bench/gpu.py", "probe"]
        + [f"--{k.replace('_', '-')} {v}" for k, v in args.items()]
    )
    return rec


def load(path: Path) -> list[dict]:
    return json.loads(path.read_text())["probes"] if path.exists() else []


def sweep(out: Path, name: str, jobs: list[tuple[str, dict]], a, t_end: float) -> None:
    path = out / f"{name}.json"
    probes = load(path)
    done = {p["key"] for p in probes}
    left = []
    for key, args in jobs:
        if key in done:
            continue
        if time.perf_counter() > t_end:
            left.append(key)
            continue
        print(f"{name}: {key} ...", flush=True)
        rec = run_probe(args, t_end - time.perf_counter())
        rec["key"] = key
        probes.append(rec)
        write_json(path, {"part": name, "probes": probes, "left": left})
        print(
            f"  ok={rec.get('ok')} peak={rec.get('peak_bytes_in_use')} "
            f"step={rec.get('step_s_median')} s {rec.get('error', '')}",
            flush=True,
        )
    write_json(path, {"part": name, "probes": probes, "left": left})
    if left:
        print(
            f"{name}: budget spent; {len(left)} left ({', '.join(left)}): run the same "
            f"command again to continue"
        )


def size_args(a, **over) -> dict:
    d = dict(
        layers=a.layers,
        d_model=a.d_model,
        seq_len=a.seq_len,
        batch_size=a.batch_size,
        steps=a.steps,
        dtype=a.dtype,
        policy="full",
    )
    d.update(over)
    return d


def placement_args(spec: str, a, **size) -> dict:
    if spec.startswith("bench:"):  # _common/step_loop.py's mode (plain-bf16, fuyou-nvme)
        args = size_args(a, bench_mode=spec.split(":", 1)[1], **size)
        if a.store_dir:
            args["store_dir"] = os.path.join(a.store_dir, spec.replace(":", "-"))
        return args
    if spec.startswith("paged:"):
        args = size_args(a, placement=spec.split(":", 1)[1], optimizer="paged", **size)
        if a.store_dir:
            args["store_dir"] = os.path.join(a.store_dir, spec.replace(":", "-"))
        return args
    return size_args(a, placement=spec, **size)


def part_placements(out: Path, kind: str, a, t_end: float) -> None:
    sweep(out, "placements", [(p, placement_args(p, a)) for p in a.placements], a, t_end)


def part_policies(out: Path, kind: str, a, t_end: float) -> None:
    from jaxoff.policy import PRESETS

    names = a.policies or list(PRESETS)
    sweep(
        out, "policies", [(n, size_args(a, placement="device", policy=n)) for n in names], a, t_end
    )


# ----------------------------------------------------------------------------- capacity
def fits(rec: dict, steps: int) -> bool:
    return bool(rec.get("ok") and len(rec.get("losses", [])) >= steps and rec.get("loss_falling"))


def next_layers(probes: list[dict], start: int, grow: float) -> int | None:
    """Bracketing: grow (or shrink) by ``grow`` until one size fits and a larger one fails,
    then bisect; None once the bracket is one layer wide (or even one layer fails)."""
    fit = [p["layers"] for p in probes if p["fit"]]
    fail = [p["layers"] for p in probes if not p["fit"]]
    lo = max(fit) if fit else None
    above = [f for f in fail if lo is None or f > lo]
    hi = min(above) if above else None
    if lo is None and hi is None:
        return start
    if lo is None:
        return None if hi <= 1 else max(1, min(hi - 1, int(hi / grow)))
    if hi is None:
        return max(lo + 1, int(round(lo * grow)))
    return None if hi - lo <= 1 else (lo + hi) // 2


def mfu(rec: dict, kind: str) -> float | None:
    for name, peaks in PEAK_FLOPS.items():
        if name in kind and rec.get("model_flops_per_s"):
            return round(
                rec["model_flops_per_s"] / peaks.get(rec.get("dtype", "float32"), peaks["float32"]),
                4,
            )
    return None


def part_capacity(out: Path, kind: str, a, t_end: float) -> None:
    path = out / f"{a.capacity_name}.json"
    data = json.loads(path.read_text()) if path.exists() else {"searches": {}}
    if data.get("mem_fraction", MEM_FRACTION) != MEM_FRACTION:
        # a bracket's verdicts hold for one memory cap only
        raise SystemExit(
            f"{path} holds probes at --mem-fraction {data['mem_fraction']}, not "
            f"{MEM_FRACTION}: give this search another --capacity-name, or the same fraction"
        )
    data["mem_fraction"] = MEM_FRACTION
    plans = (
        {("plain" if p == "device" else f"plain:{p}"): p for p in a.plain_plans}
        if a.capacity_mode == "plain"
        else {f"jaxoff:{p}": p for p in a.jaxoff_plans}
    )
    for label, spec in plans.items():
        s = data["searches"].setdefault(label, {"spec": spec, "probes": []})
        while True:
            n = next_layers(s["probes"], a.capacity_start_layers, a.capacity_grow)
            if n is None:
                s["done"] = True
                break
            if time.perf_counter() > t_end:
                print(
                    f"capacity {label}: budget spent at {n} layers next; run the same "
                    f"command again to continue"
                )
                break
            args = placement_args(
                spec, a, layers=n, steps=a.capacity_steps, d_model=a.capacity_d_model
            )
            print(f"capacity {label}: {n} layers ...", flush=True)
            rec = run_probe(args, t_end - time.perf_counter() + 60)
            if rec.get("timeout"):
                # Not a verdict on the size: keep it, retry on the next invocation.
                s.setdefault("timeouts", []).append(rec)
                write_json(path, data)
                break
            rec["layers"] = n
            rec["fit"] = fits(rec, a.capacity_steps)
            rec["mfu"] = mfu(rec, kind)
            s["probes"].append(rec)
            print(
                f"  fit={rec['fit']} params={rec.get('params')} "
                f"tok/s={rec.get('tokens_per_s')} {rec.get('error', '')}",
                flush=True,
            )
            write_json(path, data)
        best = [p for p in s["probes"] if p["fit"]]
        s["largest"] = max(best, key=lambda p: p["layers"])["params"] if best else None
    searches = data["searches"]
    largest = {k: s.get("largest") for k, s in searches.items()}
    data["summary"] = {
        "largest_params": largest,
        # each jaxoff plan against each plain baseline (plain-bf16 is fuyou-nvme's own pair:
        # the same bf16 parameters with fp32 masters and moments)
        "ratios": {
            f"{j} / {p}": round(largest[j] / largest[p], 3)
            for j in searches
            if j.startswith("jaxoff:") and largest[j]
            for p in searches
            if p.startswith("plain") and largest[p]
        },
    }
    write_json(path, data)


def verdict(rec: dict) -> bool:
    """A probe that says something about the machine: it ran, or it ran out of memory. Any
    other failure (a crash, a compile error, a timeout) is jaxoff's or XLA's, not a size's."""
    return bool(rec.get("ok") or rec.get("oom") or "RESOURCE_EXHAUSTED" in rec.get("error", ""))


def seed_from(src: Path, out: Path) -> None:
    """Start from the records of an earlier session (``--seed bench/results/gpu``), keeping
    only verdicts: a part then runs only what that session did not settle."""
    for name in ("placements", "policies"):
        if (src / f"{name}.json").exists() and not (out / f"{name}.json").exists():
            doc = json.loads((src / f"{name}.json").read_text())
            doc["probes"] = [p for p in doc["probes"] if verdict(p)]
            write_json(out / f"{name}.json", doc)
    for path in sorted(src.glob("capacity*.json")):
        if (out / path.name).exists():
            continue
        doc = json.loads(path.read_text())
        for s in doc["searches"].values():
            s["probes"] = [p for p in s["probes"] if verdict(p)]
            s.pop("timeouts", None)
            if not s["probes"]:
                s.pop("done", None)
        write_json(out / path.name, doc)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["probe"]:  # one measurement (the parts' child processes)
        sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: _gpu, capacity
        from _gpu import probe

        probe.main(argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for the JSON records")
    p.add_argument(
        "--parts",
        nargs="+",
        default=["env", "tests"],
        choices=["env", "tests", "placements", "policies", "capacity"],
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="stop starting probes after this many seconds (resume by rerunning)",
    )
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--store-dir", default=None, help="page stores of paged probes (NVMe)")
    p.add_argument("--placements", nargs="+", default=PLACEMENTS)
    p.add_argument("--policies", nargs="+", default=None)
    p.add_argument("--capacity-mode", choices=("plain", "jaxoff"), default="plain")
    p.add_argument(
        "--plain-plans",
        nargs="+",
        default=["device"],
        help="plain baselines: device (fp32 flax + optax) or bench:plain-bf16",
    )
    p.add_argument(
        "--jaxoff-plans",
        nargs="+",
        default=["host_params_stream1"],
        help="placements (or paged:<placement>, or bench:fuyou-nvme) searched for jaxoff's "
        "capacity",
    )
    p.add_argument("--capacity-d-model", type=int, default=4096)
    p.add_argument("--capacity-start-layers", type=int, default=16)
    p.add_argument("--capacity-grow", type=float, default=1.5)
    p.add_argument("--capacity-steps", type=int, default=10)
    p.add_argument(
        "--capacity-name",
        default="capacity",
        help="the record's file name (without .json): one per device-memory cap and width",
    )
    p.add_argument(
        "--mem-fraction",
        type=float,
        default=None,
        help="XLA_PYTHON_CLIENT_MEM_FRACTION for every probe: the share of the device's memory "
        "its allocator may use (a capacity search against a smaller HBM)",
    )
    p.add_argument(
        "--seed",
        type=Path,
        default=None,
        help="an earlier session's records (e.g. bench/results/gpu): its verdicts are kept and "
        "not measured again",
    )
    a = p.parse_args(argv)
    global MEM_FRACTION
    MEM_FRACTION = a.mem_fraction
    t_end = time.perf_counter() + a.budget_s
    kind = require_gpu()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.seed is not None:
        seed_from(a.seed, out)
    for part in a.parts:
        if part in ("env", "tests"):
            {"env": part_env, "tests": part_tests}[part](out, kind, a)
        else:
            {"placements": part_placements, "policies": part_policies, "capacity": part_capacity}[
                part
            ](out, kind, a, t_end)


if __name__ == "__main__":
    main()
