"""``jaxoff plan`` prices the program that trains: its bf16 prices with and without
``jaxoff.compiler_options`` against the temporaries of the step ``jaxoff train`` compiles.

``jaxoff train`` compiles its step with ``jaxoff.compiler_options`` (on CPU with 16-bit
parameters: no float32 copy of the stacked layers, ``jaxoff/_xla.py``). The planner prices a
plan by compiling 4- and 8-layer copies of the step (``jaxoff.step.compile_step``) and
extrapolating in depth. This bench prices every preset plan of bf16 models twice in one
process, once with ``compile_step`` as it is (the options) and once with the options turned
off (XLA's default compile, what the planner priced before), and compares each price with the
full-depth step compiled as the trainer compiles it::

    python bench/plan.py options --json bench/results/plan_options/NAME.json

Prints, per model and plan, price / trained - 1 for both; and the profile's kept widening
(XLA:CPU's float32 size of a kept bf16 residual per traced byte) both ways.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import time

from _common.results import write_result

from jaxoff.models import load_model
from jaxoff.placement import xla_default_options
from jaxoff.plan import Pricer, compared_presets, measured_temp_bytes, preset, preset_plan, profile

HW = preset("h100-sxm")


def _xla_default():
    """``compile_step`` with the options turned off (XLA's default compile): ``jit_step``
    jits it without them."""
    return xla_default_options()


def run_model(model: str, layers: int, batch: int, seq: int) -> list[dict]:
    cfg = dataclasses.replace(
        load_model(model), num_layers=layers, dtype="bfloat16", param_dtype="bfloat16"
    )
    seq = min(seq, cfg.max_seq_len)
    rows = []
    priced = {}
    for variant in ("options", "xla_default"):
        with _xla_default() if variant == "xla_default" else contextlib.nullcontext():
            prof = profile(cfg, batch, seq, model=model)
            pricer = Pricer(prof, cfg)
            plans = {p: preset_plan(prof, p) for p in compared_presets()}
            priced[variant] = (
                prof.kept_widening,
                {
                    p: pricer.price(HW, plan, cpu_lowering=True).device_temp_bytes
                    for p, plan in plans.items()
                },
            )
    for p, plan in plans.items():
        t0 = time.perf_counter()
        trained = measured_temp_bytes(prof, cfg, dict(plan.actions))  # the trainer's compile
        with _xla_default():
            default = measured_temp_bytes(prof, cfg, dict(plan.actions))
        row = {
            "model": model,
            "layers": layers,
            "batch": batch,
            "seq": seq,
            "plan": p,
            "trained_temp_bytes": trained,
            "xla_default_temp_bytes": default,
            "priced_with_options": priced["options"][1][p],
            "priced_xla_default": priced["xla_default"][1][p],
            "error_with_options": priced["options"][1][p] / trained - 1,
            "error_xla_default": priced["xla_default"][1][p] / trained - 1,
            "kept_widening_with_options": priced["options"][0],
            "kept_widening_xla_default": priced["xla_default"][0],
            "compile_s": time.perf_counter() - t0,
        }
        rows.append(row)
        print(
            f"{model:6s} {layers:3d} layers {batch}x{seq} {p:18s} trained "
            f"{trained / 2**20:8.1f} MiB (XLA default {default / 2**20:8.1f})  price/trained-1: "
            f"options {row['error_with_options']:+7.2%}  XLA default "
            f"{row['error_xla_default']:+7.2%}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bench/plan.py options", description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "mini"])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    rows = []
    for m in a.models:
        rows += run_model(m, a.layers, a.batch, a.seq)
    summary = {
        v: {
            "median_abs_error": statistics.median(abs(r[f"error_{v}"]) for r in rows),
            "max_abs_error": max(abs(r[f"error_{v}"]) for r in rows),
        }
        for v in ("with_options", "xla_default")
    }
    print(json.dumps(summary, indent=1))
    if a.json:
        write_result("plan_options", args=vars(a), summary=summary, records=rows, path=a.json)
