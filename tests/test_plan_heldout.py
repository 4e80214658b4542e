"""The planner's predicted device temporaries vs ``compiled.memory_analysis()`` on shapes
and depths it was not developed on, in float32 and bfloat16.

The planner prices a plan with the compiled program (:class:`jaxoff.plan._price.Pricer`):
4- and 8-layer copies of the model are compiled at the target's batch and sequence, and
their device temporaries extrapolated linearly to the model's depth. Each case here
profiles its own shape (as ``jaxoff plan`` does), prices one plan, then compiles the
full-depth (16-layer) step and compares: what is tested is that the extrapolation in
depth holds for every preset and MILP plan (each on both shapes and in both dtypes) at
long sequences, where the s^2 attention scores outweigh the [b, s, d] tensors and the
linear cost model errs by up to 21%. The two depths were chosen on the probes of
``bench/plan.py probe``'s two shapes (a GPT of width 48 at batch 3 x seq 149, a Llama of
width 64 at batch 2 x seq 203); these shapes, widths and head counts were not used.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from jaxoff.models.gpt import GPTConfig
from jaxoff.models.llama import LlamaConfig
from jaxoff.plan import (
    Plan,
    Pricer,
    compared_presets,
    evaluate,
    measured_temp_bytes,
    preset,
    profile,
    solve,
    solve_priced,
)

SHAPES = {
    # other width and head count (5 heads of 16), odd batch, long odd sequence
    "gpt-d80h5-b5s131": (GPTConfig(16, 80, 5, 320, max_seq_len=160), 5, 131),
    # rotary positions, grouped-query attention, gated MLP, long odd sequence
    "llama-d96h6kv3-b3s177": (LlamaConfig(16, 96, 6, 3, 256, max_seq_len=192), 3, 177),
}
DTYPES = ("float32", "bfloat16")
MILP_FRACS = (0.3, 0.6)  # budgets between full remat (0) and keep-everything (1)
PLANS = (*compared_presets(), *(f"milp@{f}" for f in MILP_FRACS))
HW = preset("h100-sxm")


@functools.cache
def _profile(shape: str, dtype: str):
    base, batch, seq = SHAPES[shape]
    cfg = dataclasses.replace(base, dtype=dtype, param_dtype=dtype)
    return cfg, profile(cfg, batch, seq, model=shape)


def _budget(prof, cfg, frac: float) -> float:
    keep = Plan.from_actions(prof, dict.fromkeys(cfg.residual_names, "device"))
    top = evaluate(prof, HW, keep, cpu_lowering=True).device_bytes
    low = evaluate(prof, HW, Plan.from_actions(prof, {}), cpu_lowering=True).device_bytes
    return low + frac * (top - low)


def _plan(prof, cfg, name: str) -> Plan:
    if name.startswith("milp@"):
        hw = HW.with_budgets(device_mem=_budget(prof, cfg, float(name[5:])))
        return solve(prof, hw, cpu_lowering=True)
    from jaxoff.policy import preset as policy_preset

    pol = policy_preset(name, cfg.residual_names)
    return Plan.from_actions(prof, {n: a.value for n, a in pol.actions})


def _plans(shape: str, dtype: str) -> tuple[str, ...]:
    """Half the plans per dtype, the other half in the other dtype (the other way round on the
    other shape): every plan is checked on every shape and in both dtypes, and each case
    compiles the full-depth step half as often (they are the suite's slowest compiles)."""
    parity = (list(SHAPES).index(shape) + DTYPES.index(dtype)) % 2
    return PLANS[parity::2]


def test_the_cases_cover_every_plan_on_every_shape_and_dtype():
    for shape in SHAPES:
        assert sorted(p for d in DTYPES for p in _plans(shape, d)) == sorted(PLANS)
    for dtype in DTYPES:
        assert sorted(p for s in SHAPES for p in _plans(s, dtype)) == sorted(PLANS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_priced_temp_within_5_percent_at_full_depth_on_heldout_shapes(shape, dtype):
    cfg, prof = _profile(shape, dtype)
    pricer = Pricer(prof, cfg)  # its own: compiles counted from none, whatever ran before
    errors = {}
    for name in _plans(shape, dtype):
        plan = _plan(prof, cfg, name)
        predicted = pricer.price(HW, plan, cpu_lowering=True).device_temp_bytes
        measured = measured_temp_bytes(prof, cfg, dict(plan.actions))
        errors[name] = predicted / measured - 1
    assert pricer.compiles == 2 * len({_plan(prof, cfg, n) for n in _plans(shape, dtype)})
    worst = max(errors, key=lambda n: abs(errors[n]))
    assert abs(errors[worst]) <= 0.05, {n: f"{e:+.2%}" for n, e in errors.items()}


def test_priced_solve_fits_the_budget_by_the_full_compile():
    """At a tight budget the priced solve moves the MILP's budget (the linear model
    misprices its plan on this shape) until the compiled price fits; the full-depth
    compile of its plan fits the real budget, and its predicted step is no slower."""
    cfg, prof = _profile("gpt-d80h5-b5s131", "float32")
    pricer = Pricer(prof, cfg)
    hw = HW.with_budgets(device_mem=_budget(prof, cfg, 0.3))
    plain = solve(prof, hw, cpu_lowering=True)
    found = solve_priced(prof, hw, pricer, cpu_lowering=True)
    assert found.rounds[0][1] == plain  # the first round is the model's own plan
    assert found.pred.device_bytes <= hw.device_mem
    # the compiled step keeps parameters and states on device: correct the priced device
    # bytes (with the plan's homes) by the extrapolation's error on that program
    actions = dict(found.plan.actions)
    error = measured_temp_bytes(prof, cfg, actions) - pricer.temp_bytes(actions)
    measured = found.pred.device_bytes + error
    assert measured <= hw.device_mem, (measured, hw.device_mem)
    assert found.pred.step_s <= evaluate(prof, hw, plain, cpu_lowering=True).step_s
    assert len(found.rounds) >= 2, "the model's +10% should have moved the budget"
