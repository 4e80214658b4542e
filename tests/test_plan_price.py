"""Pricing plans with the compiled program (``jaxoff.plan._price``): the depth
extrapolation, the priced solve's budget loop, and ``jaxoff plan --price/--no-price``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from jaxoff.models.gpt import CONFIGS, RESIDUAL_NAMES
from jaxoff.plan import InfeasibleError, Plan, evaluate, preset, profile, solve
from jaxoff.plan._price import MARGIN, Pricer, solve_priced
from jaxoff.plan._profile import measured_temp_bytes

HW = preset("h100-sxm")
SHALLOW = dataclasses.replace(CONFIGS["tiny"], num_layers=3)


@pytest.fixture(scope="module")
def tiny():
    prof = profile(CONFIGS["tiny"], 4, 32, model="tiny", calibrate=True)
    return prof, CONFIGS["tiny"]


class OffsetPricer(Pricer):
    """The model's own temporaries plus a fixed error (no compile)."""

    def __init__(self, prof, cfg, offset):
        super().__init__(prof, cfg)
        self.offset = offset

    def temp_bytes(self, actions):
        plan = Plan.from_actions(self.prof, actions)
        return evaluate(self.prof, HW, plan, cpu_lowering=True).device_temp_bytes + self.offset


def _budget(prof, frac):
    keep = Plan.from_actions(prof, dict.fromkeys(RESIDUAL_NAMES, "device"))
    top = evaluate(prof, HW, keep, cpu_lowering=True).device_bytes
    low = evaluate(prof, HW, Plan.from_actions(prof, {}), cpu_lowering=True).device_bytes
    return low + frac * (top - low), top - low


def test_a_model_no_deeper_than_the_copies_is_compiled_as_it_is():
    prof = profile(SHALLOW, 2, 32, model="tiny3", calibrate=False)
    pricer = Pricer(prof, SHALLOW)
    acts = {"mlp_up": "device", "attn_q": "offload"}
    plan = Plan.from_actions(prof, acts)
    got = pricer.temp_bytes(dict(plan.actions))
    assert pricer.compiles == 1
    assert got == measured_temp_bytes(prof, SHALLOW, dict(plan.actions))
    assert pricer.temp_bytes(dict(plan.actions)) == got and pricer.compiles == 1  # cached


def test_price_corrects_only_the_temporaries(tiny):
    prof, cfg = tiny
    pricer = OffsetPricer(prof, cfg, 12345)
    plan = Plan.from_actions(prof, {"mlp_up": "device"}, params="host", opt="nvme")
    model = evaluate(prof, HW, plan, cpu_lowering=True)
    priced = pricer.price(HW, plan, cpu_lowering=True)
    assert priced.device_temp_bytes == model.device_temp_bytes + 12345
    assert priced.device_bytes == model.device_bytes + 12345
    assert (priced.host_bytes, priced.disk_bytes, priced.step_s) == (
        model.host_bytes,
        model.disk_bytes,
        model.step_s,
    )


def test_an_under_predicting_model_has_its_budget_lowered(tiny):
    prof, cfg = tiny
    budget, span = _budget(prof, 0.5)
    hw = HW.with_budgets(device_mem=budget)
    plain = solve(prof, hw, cpu_lowering=True)
    pricer = OffsetPricer(prof, cfg, int(0.2 * span))  # the compiler needs 20% of the span more
    assert pricer.price(hw, plain, cpu_lowering=True).device_bytes > budget
    found = solve_priced(prof, hw, pricer, cpu_lowering=True)
    assert found.pred.device_bytes <= budget * (1 - MARGIN)
    assert found.plan != plain and len(found.rounds) >= 2
    assert found.rounds[1][0] < budget  # the MILP saw a lower budget
    assert found.modelled == evaluate(prof, hw, found.plan, cpu_lowering=True)


def test_an_over_predicting_model_gets_a_faster_plan_that_still_fits(tiny):
    prof, cfg = tiny
    budget, span = _budget(prof, 0.4)
    hw = HW.with_budgets(device_mem=budget)
    plain = solve(prof, hw, cpu_lowering=True)
    found = solve_priced(prof, hw, OffsetPricer(prof, cfg, -int(0.3 * span)), cpu_lowering=True)
    assert found.pred.device_bytes <= budget * (1 - MARGIN)
    assert found.pred.step_s < evaluate(prof, hw, plain, cpu_lowering=True).step_s


def test_a_plan_a_byte_over_the_limit_still_leads_to_one_that_fits(tiny):
    prof, cfg = tiny
    budget, _ = _budget(prof, 0.5)
    hw = HW.with_budgets(device_mem=budget)
    plain = evaluate(prof, hw, solve(prof, hw, cpu_lowering=True), cpu_lowering=True)
    offset = int(budget * (1 - MARGIN)) - plain.device_bytes + 1  # the first plan: 1 B over
    found = solve_priced(prof, hw, OffsetPricer(prof, cfg, offset), cpu_lowering=True)
    assert found.rounds[0][2].device_bytes > budget * (1 - MARGIN)
    assert found.pred.device_bytes <= budget * (1 - MARGIN)


def test_nothing_priced_fits_is_one_clear_error(tiny):
    prof, cfg = tiny
    budget, span = _budget(prof, 0.5)
    hw = HW.with_budgets(device_mem=budget)
    with pytest.raises(InfeasibleError, match="--no-price"):
        solve_priced(prof, hw, OffsetPricer(prof, cfg, 10 * int(budget)), cpu_lowering=True)


def test_depths_are_checked(tiny):
    prof, cfg = tiny
    for bad in ((1, 3), (4, 2), (2,)):
        with pytest.raises(ValueError, match="two increasing depths"):
            Pricer(prof, cfg, bad)


def test_cli_prices_by_default_and_not_with_no_price(tmp_path, capsys):
    from jaxoff.cli import main

    # the shape of the `tiny` profile (and of test_plan.py's CLI test): its compiles are cached
    args = "plan --model tiny --hardware rtx4090 --batch 4 --seq 32 --device-mem 40MiB".split()
    assert main([*args, "--out", str(tmp_path / "priced.json")]) == 0
    assert "priced by the compiled program" in capsys.readouterr().out
    assert main([*args, "--no-price", "--out", str(tmp_path / "model.json")]) == 0
    assert "priced by the compiled program" not in capsys.readouterr().out
    priced = json.loads((tmp_path / "priced.json").read_text())["prediction"]
    model = json.loads((tmp_path / "model.json").read_text())["prediction"]
    assert priced["priced"] is True and model["priced"] is False
    assert priced["device_bytes"] <= 40 * 2**20
