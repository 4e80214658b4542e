"""The memory-budget planner: profile vs the compiled program, MILP vs brute force,
plan files, the CLI and ``jaxoff train --plan``."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from jaxoff.models.gpt import CONFIGS, RESIDUAL_NAMES, GPTConfig
from jaxoff.plan import (
    InfeasibleError,
    Plan,
    brute_force,
    evaluate,
    greedy,
    load_plan,
    preset,
    profile,
    smallest_budget,
    solve,
)
from jaxoff.plan._cost import fits, residual_split
from jaxoff.plan._hardware import GIB, disk_from_iobench, parse_size
from jaxoff.plan._planfile import PlanFile
from jaxoff.plan._profile import measured_temp_bytes, traced_residual_bytes
from jaxoff.plan._solver import _solve
from jaxoff.train._options import flat_options

# deep and narrow: the stacked residuals dominate as in real models, compiles stay fast
DEEP = GPTConfig(12, 64, 4, 256, max_seq_len=64)


@pytest.fixture(scope="module")
def deep_profile():
    return profile(DEEP, 2, 64, model="deep", calibrate=True)


@pytest.fixture(scope="module")
def tiny_profile():
    return profile(CONFIGS["tiny"], 4, 32, model="tiny", calibrate=False)


def _random_actions(seed):
    rng = random.Random(seed)
    return {n: rng.choice(["device", "offload", "remat"]) for n in RESIDUAL_NAMES}


def test_profile_reads_the_jaxpr(tiny_profile):
    p = tiny_profile
    up = p.name("mlp_up")
    assert up.bytes == 4 * 32 * 512 * 4 and up.direct
    assert up.preds == ("mlp_norm",)
    # the up-projection: 2 * tokens * d * f multiply-adds, plus the bias
    assert up.flops == pytest.approx(2 * 4 * 32 * 128 * 512, rel=0.01)
    assert p.name("layer_input").fixed
    assert not p.name("mlp_down").direct  # backward reads mlp_act and the output grad
    assert p.param_bytes == CONFIGS["tiny"].num_params() * 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_residual_model_equals_traced_residuals(tiny_profile, seed):
    acts = _random_actions(seed)
    dev, host = residual_split(tiny_profile, Plan.from_actions(tiny_profile, acts))
    assert dev + host == traced_residual_bytes(CONFIGS["tiny"], 4, 32, acts)


@pytest.mark.parametrize("spec", ["random0", "random3", "selective"])
def test_predicted_temp_within_5_percent_of_memory_analysis(deep_profile, spec):
    from jaxoff.policy import PRESETS

    if spec.startswith("random"):
        acts = _random_actions(int(spec[-1]))
    else:
        acts = {n: a.value for n, a in PRESETS[spec].policy.actions}
    plan = Plan.from_actions(deep_profile, acts)
    pred = evaluate(deep_profile, preset("h100-sxm"), plan, cpu_lowering=True)
    measured = measured_temp_bytes(deep_profile, DEEP, acts)
    assert abs(pred.device_temp_bytes / measured - 1) < 0.05, (pred.device_temp_bytes, measured)


def _cases(prof):
    free = ["attn_q", "attn_logits", "attn_probs", "mlp_up", "mlp_act"]
    allowed = {n.name: ("device",) for n in prof.names if n.name not in free}
    base = evaluate(
        prof, preset("rtx4090"), Plan.from_actions(prof, dict.fromkeys(RESIDUAL_NAMES, "device"))
    ).device_bytes
    for name in ("rtx4090", "a100-40", "tpu-v5e"):
        for frac in (1.2, 0.8, 0.6, 0.45):
            hw = preset(name).with_budgets(device_mem=frac * base, host_mem=0.03 * GIB)
            yield hw, allowed


def test_milp_equals_brute_force(tiny_profile):
    for hw, allowed in _cases(tiny_profile):
        for cpu in (False, True):
            best, best_pred = brute_force(tiny_profile, hw, allowed, cpu_lowering=cpu)
            if best is None:
                with pytest.raises(InfeasibleError):
                    solve(tiny_profile, hw, allowed=allowed, cpu_lowering=cpu)
                continue
            plan, value = _solve(
                tiny_profile, hw, allowed, None, cpu, "time", {"dev", "host", "disk"}
            )
            pred = evaluate(tiny_profile, hw, plan, cpu_lowering=cpu)
            assert fits(pred, hw)
            assert pred.step_s == pytest.approx(value, rel=1e-6)  # MILP encodes evaluate
            assert pred.step_s == pytest.approx(best_pred.step_s, rel=1e-6)
            g, gp = greedy(tiny_profile, hw, allowed=allowed, cpu_lowering=cpu)
            if g is not None:
                assert fits(gp, hw) and gp.step_s >= pred.step_s * (1 - 1e-9)


def test_infeasible_budget_names_the_smallest_that_works(tiny_profile):
    hw = preset("rtx4090").with_budgets(device_mem=1e5, host_mem=0.5 * GIB)
    with pytest.raises(InfeasibleError, match="smallest device budget that works is"):
        solve(tiny_profile, hw)
    need = smallest_budget(tiny_profile, hw, "dev")
    plan = solve(tiny_profile, hw.with_budgets(device_mem=need * 1.0001))
    assert fits(
        evaluate(tiny_profile, hw.with_budgets(device_mem=need * 1.0001), plan),
        hw.with_budgets(device_mem=need * 1.0001),
    )
    with pytest.raises(InfeasibleError):
        solve(tiny_profile, hw.with_budgets(device_mem=need * 0.99))


def test_hardware_parsing(tmp_path):
    assert parse_size("16GiB") == 16 * 2**30
    assert parse_size("24GB") == 24e9
    assert parse_size("512MiB") == 512 * 2**20
    assert preset("h100-sxm", "bfloat16").flops > preset("h100-sxm").flops
    f = tmp_path / "io.jsonl"
    f.write_text(
        json.dumps({"op": "read", "engine_GBps": 0.9})
        + "\n"
        + json.dumps({"op": "write", "engine_GBps": 2.5})
        + "\n"
    )
    assert disk_from_iobench(f) == {"disk_read": 0.9e9, "disk_write": 2.5e9}


def test_plan_file_round_trip_and_model_check(tiny_profile, tmp_path):
    hw = preset("rtx4090")
    plan = solve(tiny_profile, hw)
    pf = PlanFile("tiny", tiny_profile.model_config, 4, 32, plan, hw.to_json(), {}, None)
    path = pf.save(tmp_path / "p.json")
    back = load_plan(path)
    assert back == pf
    back.check_model(CONFIGS["tiny"], 4, 32)
    with pytest.raises(Exception, match="made for model 'tiny'"):
        back.check_model(CONFIGS["mini"], 4, 32)
    with pytest.raises(Exception, match="batch 4 x seq 32"):
        back.check_model(CONFIGS["tiny"], 8, 32)
    rotary = dataclasses.replace(CONFIGS["tiny"], positions="rotary")
    with pytest.raises(Exception, match="positions planned 'learned'"):
        back.check_model(rotary, 4, 32)


def test_cli_plan_then_train(tmp_path, capsys):
    from jaxoff.cli import main

    out = tmp_path / "plan.json"
    args = ["plan", "--model", "tiny", "--hardware", "rtx4090", "--batch", "4", "--seq", "32"]
    assert main([*args, "--device-mem", "1KiB", "--out", str(out)]) == 2
    assert "smallest device budget" in capsys.readouterr().err
    assert main([*args, "--device-mem", "40MiB", "--out", str(out)]) == 0
    pf = load_plan(out)
    assert pf.prediction["device_bytes"] <= 40 * 2**20
    common = [
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--steps",
        "2",
        "--eval-every",
        "0",
        "--ckpt-every",
        "0",
        "--no-progress",
        "--plan",
        str(out),
    ]
    assert main(["train", "--model", "tiny", "--out-dir", str(tmp_path / "r"), *common]) == 0
    cfg = flat_options(json.loads((tmp_path / "r" / "config.json").read_text()))
    assert cfg["policy"] == pf.policy_spec()
    assert main(["train", "--model", "mini", "--out-dir", str(tmp_path / "r2"), *common]) == 2
    assert "made for model 'tiny'" in capsys.readouterr().err


def test_plan_defaults_are_trains():
    """`jaxoff plan` with no options plans what `jaxoff train` with none runs (it planned
    for batch 8 while train ran 16)."""
    from jaxoff.plan import PlanConfig
    from jaxoff.train import TrainConfig

    plan, train = PlanConfig(), TrainConfig()
    assert (plan.model, plan.batch_size, plan.grad_accum, plan.seq_len) == (
        train.model,
        train.batch_size,
        train.grad_accum,
        train.seq_len,
    )


def test_plan_never_overwrites_a_file_unless_asked(tiny_profile, tmp_path, capsys):
    from jaxoff.cli import main

    out = tmp_path / "plan.json"
    out.write_text("the user's own file\n")
    args = ["plan", "--model", "tiny", "--hardware", "rtx4090", "--batch", "4", "--seq", "32"]
    assert main([*args, "--out", str(out)]) == 2  # refused before any profiling
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"jaxoff plan: error: --out {out} already exists; pass --overwrite to replace it, "
        "or choose another --out"
    )
    assert out.read_text() == "the user's own file\n"
    assert main(["plan", "--out", str(tmp_path), "--model", "tiny"]) == 2
    assert "is a directory" in capsys.readouterr().err
    # the Python API refuses too, and replaces the file when asked
    hw = preset("rtx4090")
    pf = PlanFile("tiny", tiny_profile.model_config, 4, 32, solve(tiny_profile, hw), {}, {})
    with pytest.raises(Exception, match="already exists; pass --overwrite"):
        pf.save(out)
    assert out.read_text() == "the user's own file\n"
    assert load_plan(pf.save(out, overwrite=True)) == pf
    assert main([*args, "--device-mem", "40MiB", "--out", str(out), "--overwrite"]) == 0
    assert load_plan(out).batch == 4


@pytest.mark.parametrize(
    "params, opt, actions, store, want",
    [
        ("device", "device", "mixed", "auto", ("device", "none", None)),
        ("device", "host", "mixed", "auto", ("host_opt", "none", None)),
        ("device", "nvme", "mixed", "none", ("device", "auto", None)),
        ("device", "nvme", "mixed", "/ssd/s", ("device", "/ssd/s", None)),
        ("host", "nvme", "remat", "auto", ("host_params_stream1", "auto", "full")),
        ("host", "host", "mixed", "auto", ("host_params", "none", None)),
        ("nvme", "nvme", "remat", "auto", ("device", "auto", "none")),
        ("nvme", "host", "mixed", "none", ("device", "auto", "none")),
    ],
)
def test_plan_homes_map_to_train_options(params, opt, actions, store, want):
    from jaxoff.plan._planfile import train_homes
    from jaxoff.plan._profile import CARRY

    names = [n for n in RESIDUAL_NAMES if n != CARRY]
    acts = [(CARRY, "device")] + [
        (n, "remat" if actions == "remat" or i % 2 else "offload") for i, n in enumerate(names)
    ]
    from jaxoff.plan._cost import Plan

    pf = PlanFile("tiny", {}, 4, 32, Plan(tuple(acts), params, opt), {}, {}, None)
    changes, notes = train_homes(pf, store)
    placement, got_store, policy = want
    assert changes["placement"] == placement
    assert changes["store"] == got_store
    assert changes["policy"] == (policy or pf.policy_spec())
    assert any("NVMe" in n for n in notes) == (params == "nvme")
    assert any("whole" in n for n in notes) == (placement == "host_params")
    # parameters on NVMe: paged by Fuyou's step (with its optimizer state)
    assert changes.get("fuyou", False) == changes.get("page_params", False) == (params == "nvme")
    assert any("optimizer state too" in n for n in notes) == (params == "nvme" and opt != "nvme")


def _all_remat_plan_run(tiny_profile, tmp_path, params: str):
    """A ``TrainConfig`` of 3 steps of tiny under a saved plan that recomputes every residual,
    pages the optimizer state and homes the parameters in ``params``."""
    from jaxoff.plan._cost import Plan
    from jaxoff.train import TrainConfig

    acts = tuple((n.name, "device" if n.fixed else "remat") for n in tiny_profile.names)
    plan = Plan(acts, params, "nvme")
    pf = PlanFile(
        "tiny", tiny_profile.model_config, 4, 32, plan, preset("rtx4090").to_json(), {}, None
    )
    return TrainConfig(
        model="tiny",
        batch_size=4,
        seq_len=32,
        steps=3,
        eval_every=0,
        ckpt_every=0,
        progress=False,
        out_dir=tmp_path / "r",
        plan=pf.save(tmp_path / "p.json"),
    )


def test_train_runs_a_plan_with_optimizer_on_nvme(tiny_profile, tmp_path):
    """A plan that pages the optimizer and streams parameters runs in jaxoff train."""
    from jaxoff.train import train

    cfg = _all_remat_plan_run(tiny_profile, tmp_path, "host")
    got = cfg.validate()
    assert (got.placement, got.policy, got.store_dir()) == (
        "host_params_stream1",
        "full",
        tmp_path / "r" / "store",
    )
    result = train(cfg)
    assert (tmp_path / "r" / "store").is_dir() and len(result.losses) == 3


def test_train_runs_a_plan_with_parameters_on_nvme(tiny_profile, tmp_path):
    """A plan that homes the parameters on NVMe trains with Fuyou's step, the block
    parameters in the page store (one entry per layer and leaf), once --clip-norm 0 is
    given; with clipping on, the error says so."""
    from jaxoff._errors import ConfigError
    from jaxoff.aio import PageStore
    from jaxoff.train import train

    cfg = _all_remat_plan_run(tiny_profile, tmp_path, "nvme")
    with pytest.raises(ConfigError, match="`clip_norm=0`"):
        cfg.validate()
    cfg = dataclasses.replace(cfg, clip_norm=0.0)
    got = cfg.validate()
    assert (got.fuyou, got.page_params, got.store_dir()) == (True, True, tmp_path / "r" / "store")
    result = train(cfg)
    assert len(result.losses) == 3
    store = PageStore.open(tmp_path / "r" / "store")
    n_layers = CONFIGS["tiny"].num_layers
    assert sum(n.startswith("param.") for n in store.entries) % n_layers == 0
    assert {n.rsplit("@", 1)[1] for n in store.entries if n.startswith("param.")} == {
        str(j) for j in range(n_layers)
    }
    store.close()
