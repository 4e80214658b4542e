"""How a scanned step's device temporaries grow with depth: the figure the planner's
pricing extrapolates (``jaxoff.plan.Pricer``). Compiles one plan at several depths and
reports the per-layer growth and the error of extrapolating from two depths.

    python bench/plan.py depth --json bench/results/plan_depth/NAME.json
"""

from __future__ import annotations

import argparse
import dataclasses

from _common.results import write_result

from _plan.probe import SHAPES  # the two probed shapes
from jaxoff.plan import measured_temp_bytes, preset_plan, profile

DEPTHS = (2, 3, 4, 6, 8, 12, 16, 24)
PAIRS = ((2, 4), (4, 8))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bench/plan.py depth", description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--plans", default="full,attention_core,offload_dots")
    ap.add_argument(
        "--json", default=None, help="default: bench/results/plan_depth/DATE-COMMIT.json"
    )
    a = ap.parse_args(argv)
    rows = []
    for shape in a.shapes.split(","):
        base, batch, seq = SHAPES[shape]
        for dtype in a.dtypes.split(","):
            cfg = dataclasses.replace(base, dtype=dtype, param_dtype=dtype)
            prof = profile(cfg, batch, seq, model=shape, calibrate=False)
            for name in a.plans.split(","):
                acts = dict(preset_plan(prof, name).actions)
                temp = {
                    d: measured_temp_bytes(prof, dataclasses.replace(cfg, num_layers=d), acts)
                    for d in DEPTHS
                }
                errors = {}
                for lo, hi in PAIRS:
                    slope = (temp[hi] - temp[lo]) / (hi - lo)
                    for depth in (d for d in DEPTHS if d > hi):
                        errors[f"{lo},{hi}->{depth}"] = (temp[lo] + (depth - lo) * slope) / temp[
                            depth
                        ] - 1
                rows.append(
                    dict(shape=shape, dtype=dtype, plan=name, temp=temp, extrapolation=errors)
                )
                print(
                    f"{shape} {dtype} {name}: "
                    + ", ".join(f"{k} {100 * v:+.2f}%" for k, v in errors.items()),
                    flush=True,
                )
    worst = {
        f"{lo},{hi}": max(
            abs(v)
            for r in rows
            for k, v in r["extrapolation"].items()
            if k.startswith(f"{lo},{hi}->")
        )
        for lo, hi in PAIRS
    }
    print("worst |error| per pair of depths:", {k: f"{100 * v:.2f}%" for k, v in worst.items()})
    write_result("plan_depth", args=vars(a), summary=worst, records=rows, path=a.json)
