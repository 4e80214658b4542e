"""The step probes of bench/gpu/pager_probe.py: Fuyou and plain-bf16 steps, each in a child
process of its own (its own device peak; an out-of-memory probe cannot take the run down).

    python bench/gpu/steps.py '{"mode": "fuyou-nvme", "layers": 4, ...}'   # one probe, JSON out

A probe is the instrumented loop's ``run_probe`` (bench/_common/step_loop.py) of one mode,
from the tree ``spec["tree"]`` (this one, or a checkout of the legacy pager: ``--pager
legacy``), traced by jax.profiler when ``spec["profile"]``. The GPU-busy share is the union of
the GPU streams' kernels and copies inside the steps after the first (wall-clock windows taken
at each step's start and end), over the length of those steps: compilation, autotuning and the
store's first fill are not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Dense bf16 peak FLOP/s by device kind (vendor datasheets, SXM parts), for MFU.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12}


def union_s(spans: list, lo: float | None = None, hi: float | None = None) -> float:
    """Seconds covered by the union of ``(start_ns, end_ns)`` spans (streams overlap), each
    clipped to ``[lo, hi]`` when given."""
    if lo is not None or hi is not None:
        lo = float("-inf") if lo is None else lo
        hi = float("inf") if hi is None else hi
        spans = [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]
    if not spans:
        return 0.0
    spans = sorted(spans)
    busy, (a, b) = 0, spans[0]
    for s, e in spans[1:]:
        if s > b:
            busy, a, b = busy + b - a, s, e
        else:
            b = max(b, e)
    return (busy + b - a) / 1e9


def gpu_spans(trace_dir: str) -> list | None:
    """``(start_ns, end_ns)`` of every kernel and copy on a GPU stream in a jax.profiler trace
    (None: no trace file, or no GPU plane in it)."""
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
    return spans or None


def busy_share(spans: list, windows: list) -> dict:
    """The GPU-busy share of the steps after the first: busy seconds inside their wall-clock
    windows over the windows' length. The trace's GPU clock is the host's wall clock (XLA's
    CUPTI collector aligns them); where no span falls inside the windows the clocks differ,
    and the share over the whole trace is given instead, marked so."""
    steady = windows[1:] or windows
    lo, hi = steady[0][0], steady[-1][1]
    inside = sum(union_s(spans, s, e) for s, e in steady)
    length = sum(e - s for s, e in steady) / 1e9
    if inside > 0 and length > 0:
        return {
            "gpu_busy_s": round(inside, 4),
            "gpu_busy_fraction": round(inside / length, 4),
            "gpu_busy_over": f"steps 2..{len(windows)}",
        }
    whole = union_s(spans)
    extent = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e9
    return {
        "gpu_busy_s": round(whole, 4),
        "gpu_busy_fraction": round(whole / extent, 4) if extent else None,
        "gpu_busy_over": "the whole trace (no GPU span inside the steps' wall-clock "
        f"windows {lo}..{hi}: the trace's clock is not the host's)",
    }


def child(spec: dict) -> dict:
    """One probe of the instrumented loop (``_common/step_loop.py``; ``capacity.py`` in an
    older tree) from ``spec["tree"]``'s bench/, in this process."""
    import jax

    tree = Path(spec.get("tree") or ROOT)
    sys.path.insert(0, str(tree / "bench"))
    from _gpu import probe as gpu_probe

    try:  # this tree's instrumented loop (bench/_common/step_loop.py)
        from _capacity.sizes import model_config
        from _common import step_loop as loop

        def run_probe(mode, layers, d_model, seq_len, *args, **kw):
            cfg = model_config(layers, d_model, seq_len, mode)
            return loop.run_probe(mode, cfg, seq_len, *args, **kw)
    except ImportError:  # a tree from before it moved out of bench/capacity.py
        import capacity as loop

        run_probe = loop.run_probe

    windows: list = []
    sampler_name = "Sampler" if hasattr(loop, "Sampler") else "_Sampler"
    base = getattr(loop, sampler_name)

    class Sampler(base):  # each step's wall-clock window, for the busy share
        def __init__(self, *args, **kw):
            self.wall0 = time.time_ns()
            super().__init__(*args, **kw)

        def stop(self):
            windows.append((self.wall0, time.time_ns()))
            return super().stop()

    setattr(loop, sampler_name, Sampler)
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
                rec = run_probe(
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
        rec.pop("timelines", None)  # second by second: too long for a summary record
        rec["profile_error"] = profile_error
        rec["step_windows"] = len(windows)
        rec["gpu_busy_s"] = rec["gpu_busy_fraction"] = None
        spans = gpu_spans(trace) if trace else None
        if spans and windows:
            rec.update(busy_share(spans, windows))
        ns = argparse.Namespace(
            steps=spec["steps"],
            layers=spec["layers"],
            seq_len=spec["seq_len"],
            d_model=spec["d_model"],
            batch_size=spec["batch_size"],
        )
        figs = gpu_probe.step_figures(ns, dev, rec["params"], rec["step_s"], rec["losses"])
        figs.pop("loss_falling", None)
        figs.pop("memory_stats", None)
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


def spawn(clock, spec: dict, need: float, cap_s: float, env: dict | None = None) -> dict:
    """Runs `child` in a process of its own, killed after ``cap_s`` or at ``clock``'s end;
    skipped (``ok`` None) when ``clock`` has under ``need`` seconds left."""
    if not clock.fits(need):
        return {
            **spec,
            "ok": None,
            "skipped": f"deadline: {clock.left():.0f} s left, ~{need} s needed",
        }
    limit = max(5.0, min(cap_s, clock.left() - 3))
    t = time.perf_counter()
    try:
        r = subprocess.run(
            [sys.executable, __file__, json.dumps(spec)],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            timeout=limit,
        )
    except subprocess.TimeoutExpired:
        if limit < cap_s:  # the deadline's, not the probe's: no verdict on the size
            return {**spec, "ok": None, "skipped": f"deadline: killed after {limit:.0f} s"}
        return {**spec, "ok": False, "timeout": True, "error": f"killed at its {cap_s:.0f} s cap"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        return {**spec, "ok": False, "error": f"exit {r.returncode}: {r.stderr[-800:]}"}
    rec = json.loads(lines[-1])
    rec["wall_s"] = round(time.perf_counter() - t, 1)
    return rec


def next_size(fit: list[int], failed: list[int], start: int) -> int | None:
    """The plain bracket's next size: doubling from ``start`` until one fails, then halving
    the gap; None once the gap is one layer (or one layer fails)."""
    lo = max(fit, default=None)
    hi = min((n for n in failed if lo is None or n > lo), default=None)
    if lo is None and hi is None:
        return start
    if lo is None:
        return None if hi <= 1 else max(1, hi // 2)
    if hi is None:
        return 2 * lo
    return None if hi - lo <= 1 else (lo + hi) // 2


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.argv[1])), default=str))
