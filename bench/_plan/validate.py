"""Validates the planner on this machine (CPU, scanned GPT or Llama, float32 and bfloat16).

1. **Memory**: predicted device temporaries vs ``compiled.memory_analysis()`` over a grid
   of models, batch shapes and plans (the MILP's plan at a few budgets, presets, random
   plans, and the priced solve's plan at the same budgets), twice: by the linear cost
   model alone (``evaluate``, what ``--no-price`` reports) and priced by compiles of 4- and
   8-layer copies extrapolated in depth (``Pricer``, what ``jaxoff plan`` reports).
   Offloaded residuals count on device (XLA's CPU backend keeps them there).
2. **Speed under a budget**: for a device budget between full remat and keep-everything,
   the measured step time of the MILP's plan vs the fastest preset whose *measured*
   memory fits the same budget (same run, same process, ratios).

    python bench/plan.py validate                       # default grid (~5-10 min here)
    python bench/plan.py validate --models tiny --quick # a minute
    python bench/plan.py validate --models tiny,llama-tiny --shapes 3x37 --quick
    python bench/plan.py validate --models tiny,llama-tiny --shapes 3x149 --layers 16 --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random
import time

from _common.results import write_result

from jaxoff.models import load_model
from jaxoff.plan import (
    Plan,
    Pricer,
    calibrate,
    compared_presets,
    evaluate,
    measured_temp_bytes,
    preset_plan,
    profile,
    solve,
    solve_priced,
)


def _model(name: str, dtype: str, layers: int | None):
    cfg = dataclasses.replace(load_model(name), dtype=dtype, param_dtype=dtype)
    return cfg if layers is None else dataclasses.replace(cfg, num_layers=layers)


def memory_grid(models, shapes, dtypes, seed, hw, out, layers=None):
    rows = []
    rng = random.Random(seed)
    for model, dtype in itertools.product(models, dtypes):
        cfg = _model(model, dtype, layers)
        RESIDUAL_NAMES = cfg.residual_names  # noqa: N806
        for batch, seq in shapes:
            seq = min(seq, cfg.max_seq_len)
            t0 = time.perf_counter()
            prof = profile(cfg, batch, seq, model=model)
            t_prof = time.perf_counter() - t0
            pricer = Pricer(prof, cfg)
            plans = {p: preset_plan(prof, p) for p in compared_presets()}
            plans["all-device"] = Plan.from_actions(prof, dict.fromkeys(RESIDUAL_NAMES, "device"))
            for i in range(2):
                acts = {n: rng.choice(["device", "offload", "remat"]) for n in RESIDUAL_NAMES}
                plans[f"random{i}"] = Plan.from_actions(prof, acts)
            budgets = {}
            top = evaluate(prof, hw, plans["all-device"], cpu_lowering=True).device_bytes
            low = evaluate(prof, hw, plans["full"], cpu_lowering=True).device_bytes
            for frac in (0.3, 0.7):
                budget = low + frac * (top - low)
                hwb = hw.with_budgets(device_mem=budget)
                try:
                    plans[f"milp@{frac}"] = solve(prof, hwb, cpu_lowering=True)
                    found = solve_priced(prof, hwb, pricer, cpu_lowering=True)
                    plans[f"priced@{frac}"] = found.plan
                    budgets[f"priced@{frac}"] = budget
                except Exception as e:  # noqa: BLE001 - report, keep going
                    print(f"  milp@{frac}: {e}")
            for name, plan in plans.items():
                # the priced solve's plan with its own homes (for the fit by the full compile)
                homes = pricer.price(hw, plan, cpu_lowering=True) if name in budgets else None
                # the compiled step keeps params/grads on device: validate the residual
                # plan with those homes (placement is checked elsewhere)
                plan = dataclasses.replace(plan, params="device", opt="device")
                modelled = evaluate(prof, hw, plan, cpu_lowering=True)
                priced = pricer.price(hw, plan, cpu_lowering=True)
                meas = measured_temp_bytes(prof, cfg, dict(plan.actions))
                r = dict(
                    model=model,
                    dtype=dtype,
                    layers=prof.num_layers,
                    batch=batch,
                    seq=seq,
                    plan=name,
                    predicted=priced.device_temp_bytes,
                    predicted_model=modelled.device_temp_bytes,
                    measured=meas,
                    error=priced.device_temp_bytes / meas - 1,
                    error_model=modelled.device_temp_bytes / meas - 1,
                    profile_s=t_prof,
                )
                if name in budgets:  # the priced solve's plan, corrected by the full compile
                    device = homes.device_bytes + meas - priced.device_temp_bytes
                    r["budget"] = budgets[name]
                    r["fits_measured"] = device <= budgets[name]
                rows.append(r)
                print(
                    f"{model:10s} {dtype:8s} L{prof.num_layers:<3d} b{batch:<3d} s{seq:<5d} "
                    f"{name:12s} measured {meas / 2**20:8.2f} MiB, priced "
                    f"{100 * r['error']:+6.2f}%, model {100 * r['error_model']:+6.2f}%"
                    + (f", fits: {r['fits_measured']}" if "fits_measured" in r else ""),
                    flush=True,
                )
                out.write(json.dumps(r) + "\n")
    for dtype in dtypes:
        sub = [r for r in rows if r["dtype"] == dtype]
        for key, label in (("error", "priced"), ("error_model", "cost model")):
            worst = max(abs(r[key]) for r in sub)
            ok = sum(abs(r[key]) <= 0.05 for r in sub)
            print(
                f"memory {dtype}, {label}: {len(sub)} (model, shape, plan) cases, worst "
                f"|error| {100 * worst:.2f}%, within 5%: {ok}/{len(sub)}"
            )
    return rows


def speed_under_budget(model, batch, seq, frac, steps, hw, out):
    from jaxoff.compare import measure_policy

    cfg = load_model(model)
    prof = profile(cfg, batch, seq, model=model)
    RESIDUAL_NAMES = cfg.residual_names  # noqa: N806
    top = evaluate(
        prof,
        hw,
        Plan.from_actions(prof, dict.fromkeys(RESIDUAL_NAMES, "device")),
        cpu_lowering=True,
    ).device_bytes
    low = evaluate(prof, hw, preset_plan(prof, "full"), cpu_lowering=True).device_bytes
    budget = low + frac * (top - low)
    hwb = hw.with_budgets(device_mem=budget)
    plan = solve(prof, hwb, cpu_lowering=True)
    spec = ",".join(f"{n}={a}" for n, a in plan.actions)
    candidates = {
        "milp": spec,
        **{p: p for p in ("none", *compared_presets(), "sqrt", "dots_saveable")},
    }
    results = {}
    for label, s in candidates.items():
        r = measure_policy(model, s, batch, seq, steps=steps, warmup=1)
        args = r["argument_bytes"]
        r["device_bytes"] = r["temp_bytes"] + args
        r["fits"] = r["device_bytes"] <= budget
        results[label] = r
        print(
            f"  {label:16s} temp {r['temp_bytes'] / 2**20:8.1f} MiB + args "
            f"{args / 2**20:6.1f} MiB fits={r['fits']!s:5s} step {r['step_s'] * 1e3:8.1f} ms",
            flush=True,
        )
    fitting = {k: v for k, v in results.items() if k != "milp" and v["fits"]}
    best = min(fitting, key=lambda k: fitting[k]["step_s"]) if fitting else None
    pred = evaluate(prof, hwb, plan, cpu_lowering=True)
    line = dict(
        model=model,
        batch=batch,
        seq=seq,
        budget=budget,
        plan=spec,
        milp_step_s=results["milp"]["step_s"],
        milp_fits=results["milp"]["fits"],
        predicted_step_s=pred.step_s,
        best_preset=best,
        best_preset_step_s=fitting[best]["step_s"] if best else None,
    )
    out.write(json.dumps(line) + "\n")
    print(
        f"speed: budget {budget / 2**20:.1f} MiB: MILP plan {line['milp_step_s'] * 1e3:.1f} ms "
        f"(predicted {pred.step_s * 1e3:.1f} ms, fits measured: {line['milp_fits']}); "
        + (
            f"fastest fitting preset {best} {line['best_preset_step_s'] * 1e3:.1f} ms; ratio "
            f"{line['milp_step_s'] / line['best_preset_step_s']:.3f}"
            if best
            else "no preset fits"
        )
    )
    return line


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bench/plan.py validate", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,mini,small")
    ap.add_argument("--shapes", default="2x64,8x128", help="BATCHxSEQ,...")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="compute dtypes, comma-separated")
    ap.add_argument("--speed-model", default="mini")
    ap.add_argument("--speed-shape", default="8x256")
    ap.add_argument(
        "--budget-frac",
        type=float,
        default=0.5,
        help="budget between full remat (0) and keep-everything (1)",
    )
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one shape, no speed test")
    ap.add_argument(
        "--layers", type=int, default=None, help="depth of every model (default: its own)"
    )
    ap.add_argument("--out", default="runs/plan_validate.jsonl")
    ap.add_argument(
        "--json",
        default=None,
        help="summary: every memory case and the worst error per dtype (default: "
        "bench/results/plan_validate/DATE-COMMIT.json)",
    )
    a = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    if a.quick:
        shapes = shapes[:1]
    hw = calibrate()
    print(
        f"hardware: {hw.flops / 1e9:.1f} GFLOP/s, copy {hw.device_mem_bw / 1e9:.2f} GB/s, "
        f"disk {hw.disk_read / 1e9:.2f}/{hw.disk_write / 1e9:.2f} GB/s"
    )
    import pathlib

    pathlib.Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    speed = None
    with open(a.out, "w") as out:
        rows = memory_grid(
            a.models.split(","), shapes, a.dtypes.split(","), 0, hw, out, layers=a.layers
        )
        if not a.quick:
            b, s = (int(x) for x in a.speed_shape.split("x"))
            speed = speed_under_budget(a.speed_model, b, s, a.budget_frac, a.steps, hw, out)
    worst, worst_model = {}, {}
    for r in rows:
        key = f"{r['dtype']}"
        worst[key] = max(worst.get(key, 0.0), abs(r["error"]))
        worst_model[key] = max(worst_model.get(key, 0.0), abs(r["error_model"]))
    summary = dict(
        worst_abs_error=worst,
        within_5_percent=f"{sum(abs(r['error']) <= 0.05 for r in rows)}/{len(rows)}",
        worst_abs_error_model=worst_model,
        within_5_percent_model=f"{sum(abs(r['error_model']) <= 0.05 for r in rows)}/{len(rows)}",
        priced_plans_fit_measured=f"{sum(r.get('fits_measured', False) for r in rows)}/"
        f"{sum('fits_measured' in r for r in rows)}",
        memory=rows,
        speed=speed,
    )
    write_result("plan_validate", args=vars(a), path=a.json, **summary)
