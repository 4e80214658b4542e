"""The planner's predicted device temporaries against ``compiled.memory_analysis()`` for
the presets, the MILP's plans and (with ``all``) every plan that keeps one name and
recomputes the rest, on one held-out shape; writes ``bench/results/plan_probe/SHAPE-DTYPE.json``.

    python bench/plan.py probe gpt-d48h3-b3s149 float32 all
    python bench/plan.py probe llama-d64h4kv2-b2s203 bfloat16
"""

import argparse
import dataclasses
import pathlib
import sys

from _common.results import RESULTS, write_result

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))

from test_plan_heldout import HW, PLANS, _plan  # noqa: E402

from jaxoff.models.gpt import GPTConfig  # noqa: E402
from jaxoff.models.llama import LlamaConfig  # noqa: E402
from jaxoff.plan import Plan, evaluate, measured_temp_bytes, profile  # noqa: E402

SHAPES = {
    "gpt-d48h3-b3s149": (GPTConfig(6, 48, 3, 192, max_seq_len=160), 3, 149),
    "llama-d64h4kv2-b2s203": (LlamaConfig(6, 64, 4, 2, 160, max_seq_len=256), 2, 203),
}


def run(shape: str, dtype: str, every_single: bool) -> None:
    base, b, s = SHAPES[shape]
    cfg = dataclasses.replace(base, dtype=dtype, param_dtype=dtype)
    prof = profile(cfg, b, s, model=shape)
    plans = {p: _plan(prof, cfg, p) for p in PLANS}
    if every_single:
        for n in (n.name for n in prof.names if not n.fixed):
            plans[f"keep:{n}"] = Plan.from_actions(prof, {n: "device"})
    rows = {}
    for k, plan in plans.items():
        pred = evaluate(prof, HW, plan, cpu_lowering=True).device_temp_bytes
        meas = measured_temp_bytes(prof, cfg, dict(plan.actions))
        rows[k] = dict(actions=dict(plan.actions), pred=pred, meas=meas)
        print(f"{shape} {dtype} {k:22s} {pred:10d} {meas:10d} {pred / meas - 1:+.3%}", flush=True)
    out = RESULTS / "plan_probe" / f"{shape}-{dtype}.json"
    args = dict(shape=shape, dtype=dtype, every_single=every_single)
    write_result("plan_probe", args=args, records=rows, path=out, prof=prof.to_json())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bench/plan.py probe", description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=SHAPES)
    ap.add_argument("dtype", choices=("float32", "bfloat16"))
    ap.add_argument("all", nargs="?", choices=("all",), help="also every keep-one-name plan")
    a = ap.parse_args(argv)
    run(a.shape, a.dtype, a.all == "all")
