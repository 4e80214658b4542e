"""jaxoff.strategies: every research system trains like plain training, shows its placement
in the exported cuda program, respects its budget; unknown names fail clearly; and
``jaxoff compare --strategies all`` writes its table, files and plot.

Optimizer: SGD with momentum. With AdamW, m/sqrt(v) turns one-ulp differences in
near-zero gradients into lr-sized parameter steps (measured here: 1.7e-3 after 10 steps for
``full`` vs ``none``; README, FSDP: 3e-4), so where the arithmetic changes (recompute fuses
differently) a tolerance could not tell a bug from round-off. With SGD the same runs differ
by at most 1.2e-7 (one float32 ulp at |p| ~ 1): tolerance 8 ulp of the largest parameter.
Where the arithmetic is unchanged (offload vs keep, placements, paged vs paged) we demand
bitwise equality. Fuyou's tests live in their own file (its engineer's).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxoff import ConfigError
from jaxoff.cli import main
from jaxoff.compare._strategies import export_check, offloaded_activation_bytes
from jaxoff.models import load_model
from jaxoff.models.gpt import CONFIGS
from jaxoff.nn import with_stack
from jaxoff.step import init_state, make_loss_fn
from jaxoff.strategies import (
    STRATEGIES,
    Context,
    Recipe,
    build_recipe,
    get_strategy,
    prepare,
    register,
    strategy_overrides,
)

STEPS = 10
B, T = 4, 32
TINY = CONFIGS["tiny"]
BUDGET = 21 * 2**20  # tiny at 4 x 32: keep-all needs ~24.3 MiB, recompute-all ~19.5 MiB
TOKENS = np.asarray(
    jax.random.randint(jax.random.key(1), (STEPS, B, T + 1), 0, 256), dtype=np.int32
)
NAMES = [n for n in STRATEGIES if n != "fuyou"]
# the same arithmetic with nothing moved: offload -> keep, placement -> device
SAME_ARITHMETIC = {
    "vdnn": Recipe(policy="*=device"),
    "te_offload": None,  # built from the recipe (same split, head kept on device)
    "zero_offload": Recipe(policy="none"),
    "l2l": Recipe(policy="full"),
    "stronghold": Recipe(policy="full"),
    "zero_infinity": Recipe(policy="full", store=True),  # the paged device run
}
PLAIN = {"zero_infinity": "full", "l2l": "full", "stronghold": "full"}  # else none


def sgd():
    return optax.sgd(3e-2, momentum=0.9)


def ctx(device_mem=BUDGET, model="tiny"):
    return Context(load_model(model), B, T, device_mem=device_mem, model=model)


def train(recipe: Recipe, store=None, model="tiny"):
    """``STEPS`` steps of ``recipe``'s real step on ``model``: (final state, losses)."""
    prep = prepare(recipe, load_model(model), sgd(), store_dir=store, chunk_bytes=8192)
    step = prep.step.lower(prep.state, TOKENS[0, :, :-1], TOKENS[0, :, 1:]).compile()
    state, losses = prep.state, []
    for i in range(STEPS):
        state, metrics = step(state, TOKENS[i, :, :-1], TOKENS[i, :, 1:])
        losses.append(float(metrics["loss"]))
    if hasattr(prep.tx, "close"):
        prep.tx.close()
    return state, losses


@functools.cache
def plain(policy: str, model: str = "tiny"):
    return train(Recipe(policy=policy), model=model)


def assert_bitwise(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_close(state, ref_state, losses, ref_losses):
    assert losses[0] == ref_losses[0]  # the forward pass is the same arithmetic
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6, atol=0)
    scale = max(float(jnp.abs(p).max()) for p in jax.tree.leaves(ref_state.params))
    atol = 8 * np.finfo(np.float32).eps * scale
    for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


@pytest.mark.parametrize("model", ["tiny", "llama-tiny"])
@pytest.mark.parametrize("name", NAMES)
def test_strategy_trains_like_plain_training(name, model, tmp_path):
    recipe = build_recipe(name, ctx(model=model))
    state, losses = train(recipe, store=tmp_path / "s", model=model)
    ref_state, ref_losses = plain(PLAIN.get(name, "none"), model)
    assert_close(state, ref_state, losses, ref_losses)
    if name in SAME_ARITHMETIC:
        same = SAME_ARITHMETIC[name] or dataclasses.replace(
            recipe, stack_overrides={**recipe.stack_overrides, "split_policy": "*=device"}
        )
        same_state, same_losses = train(same, store=tmp_path / "ref", model=model)
        assert losses == same_losses
        assert_bitwise(state.params, same_state.params)


def test_recipes_compose_what_the_papers_say():
    r = {n: build_recipe(n, ctx(None)) for n in NAMES}
    assert r["vdnn"].policy == "offload_all"
    assert r["chen_sqrt"].policy == "sqrt" and r["megatron_selective"].policy == "selective"
    assert r["zero_offload"].placement == "host_opt" and not r["zero_offload"].store
    assert r["zero_infinity"].store and r["zero_infinity"].placement.startswith("host_params")
    assert r["l2l"].placement == "host_params_stream1"
    assert r["stronghold"].placement == "host_params_stream2"
    assert r["te_offload"].stack_overrides == {"split_layers": 2, "split_policy": "offload_all"}
    for name in NAMES:  # every docstring says what is kept and what differs
        doc = STRATEGIES[name].build.__doc__
        assert "Keeps" in doc and "Differs" in doc, name
        assert STRATEGIES[name].paper


def _device_bytes(recipe: Recipe) -> int:
    """What an accelerator holds: device state + compiled temp - offloaded activations."""
    prep = prepare(recipe, TINY, sgd(), abstract=True)
    tok = jax.ShapeDtypeStruct((B, T), jnp.int32)
    temp = prep.step.lower(prep.state, tok, tok).compile().memory_analysis().temp_size_in_bytes
    state = sum(
        a.size * a.dtype.itemsize
        for a in jax.tree.leaves(prep.state)
        if a.sharding.memory_kind == "device"
    )
    return state + temp - offloaded_activation_bytes(prep.model_config, B, T)


@pytest.mark.parametrize("name", ["checkmate", "dtr_greedy", "capuchin"])
def test_budgeted_strategies_respect_the_budget(name):
    from jaxoff.plan import Plan, evaluate
    from jaxoff.policy import Action, get_policy

    def moved(recipe):  # names taken off the device (mlp_down: backward never reads it)
        p = get_policy(recipe.policy)
        return set(p.names_with(Action.REMAT) + p.offloaded()) - {"mlp_down"}

    assert STRATEGIES[name].budgeted
    recipe = build_recipe(name, ctx())
    policy = get_policy(recipe.policy)
    if name == "checkmate":
        assert not policy.offloaded()  # keep or recompute, nothing else
    assert moved(recipe)  # the budget forced a choice
    assert not moved(build_recipe(name, ctx(None)))  # without it everything is kept
    c = ctx()
    acts = {n: a.value for n, a in policy.actions}
    predicted = evaluate(c.profile(), c.hw(), Plan.from_actions(c.profile(), acts))
    assert predicted.device_bytes <= BUDGET
    assert _device_bytes(recipe) <= BUDGET  # measured on the compiled step


def test_budget_too_small_is_an_error_naming_the_smallest():
    with pytest.raises(ConfigError, match="smallest device budget that works"):
        build_recipe("checkmate", ctx(4 * 2**20))
    for name in ("dtr_greedy", "capuchin"):
        with pytest.raises(ConfigError, match="raise `device_mem`"):
            build_recipe(name, ctx(4 * 2**20))


@pytest.mark.parametrize("name", NAMES)
def test_placement_and_offload_show_in_cuda_export(name):
    recipe = build_recipe(name, ctx(None))
    check = export_check(recipe, "tiny", B, T, "cuda")
    assert check["ok"], check["problems"]
    rep = check["report"]
    if name in ("vdnn", "te_offload"):
        assert rep["placements_in_loops"].get("pinned_host")
    if name in ("l2l", "stronghold", "zero_infinity"):
        assert rep["placements_in_loops"]["device"] and rep["placements_in_loops"]["pinned_host"]
    if name in ("zero_offload", "l2l", "stronghold", "zero_infinity"):
        assert rep["arg_kinds"].get("pinned_host")
    if name == "zero_offload":
        assert rep["host_compute_ops"] > 0
    if name in ("chen_sqrt", "megatron_selective", "checkmate", "dtr_greedy"):
        assert rep["arg_kinds"] == {"device": rep["arg_kinds"]["device"]}
        assert not rep["placements_in_loops"]


def test_te_offload_offloads_only_the_first_layers():
    recipe = build_recipe("te_offload", ctx(None))
    n = recipe.stack_overrides["split_layers"]
    from jaxoff.strategies import model_config

    te = offloaded_activation_bytes(model_config(recipe, TINY), B, T)
    everything = offloaded_activation_bytes(model_config(Recipe(policy="offload_all"), TINY), B, T)
    assert 0 < n < TINY.num_layers
    assert te * TINY.num_layers == everything * n


def test_split_layer_scan_is_the_plain_scan_when_policies_agree():
    """Stack.split_layers: two scans, same arithmetic as one; bad values refused."""
    tokens = jnp.asarray(TOKENS[0])

    def run(cfg):
        graphdef, state = init_state(cfg, sgd(), 0)
        fn = jax.jit(jax.value_and_grad(make_loss_fn(graphdef)))
        return fn(state.params, tokens[:, :-1], tokens[:, 1:])

    loss0, grads0 = run(TINY)
    # the forward pass is bitwise; gradients of the two slices are accumulated in another
    # order (XLA fuses the two backward scans differently), so near-zero entries (~1e-11)
    # differ: 8 ulps of the largest gradient, as tests/test_policy_grads.py
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads0))
    for n in (1, 3, TINY.num_layers):
        loss, grads = run(with_stack(TINY, split_layers=n, split_policy=None))
        assert np.asarray(loss).tobytes() == np.asarray(loss0).tobytes()
        for g, g0 in zip(jax.tree.leaves(grads), jax.tree.leaves(grads0), strict=True):
            np.testing.assert_allclose(g, g0, rtol=0, atol=8 * np.finfo(np.float32).eps * scale)
    for bad in (
        dict(split_layers=6),
        dict(split_layers=-1),
        dict(split_layers=2, remat_every=2),
        dict(split_layers=2, stream_window=1),
        dict(split_layers=2, split_policy="not_a_policy"),
    ):
        with pytest.raises(ValueError):
            with_stack(TINY, **bad)


def test_unknown_strategy_errors_clearly(capsys):
    with pytest.raises(ConfigError, match="'vdn' is not known; choose one of vdnn, te_offload"):
        get_strategy("vdn")
    rc = main(["compare", "--model", "tiny", "--strategies", "vdnn,checkmat"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "'checkmat' is not known" in err and "checkmate" in err


def test_overrides_for_the_trainer_and_a_new_strategy_in_a_few_lines():
    assert strategy_overrides("zero_infinity", TINY, B, T) == {
        "policy": "full",
        "placement": "host_params_stream1",
        "store": "auto",
    }
    te = strategy_overrides("te_offload", TINY, B, T)
    assert te["stack_overrides"]["split_policy"] == "offload_all"

    @register("mlp_to_host", paper="a porting example")
    def mlp_to_host(ctx):
        """MLP activations to host, the rest recomputed."""
        return Recipe(policy="mlp_up=offload,mlp_act=offload")

    try:
        assert get_strategy("mlp_to_host").summary.startswith("MLP activations")
        assert strategy_overrides("mlp_to_host", TINY, B, T)["policy"].startswith("mlp_up")
        with pytest.raises(ConfigError, match="already registered"):
            register("mlp_to_host", paper="x")(mlp_to_host)
    finally:
        STRATEGIES.pop("mlp_to_host")


def test_compare_strategies_all_writes_table_files_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "cmp"
    rc = main(
        [
            "compare",
            "--model",
            "tiny",
            "--strategies",
            "all",
            "--batch",
            "2",
            "--seq",
            "16",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--device-mem",
            "20MiB",
            "--no-isolate",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    for word in ("strategy", "device MiB", "disk MiB", "link MiB/step", "recompute", "vdnn"):
        assert word in text
    data = json.loads((out / "compare.json").read_text())
    ran = {r["strategy"]: r for r in data["strategies"]}
    not_run = {r["strategy"]: r["status"] for r in data["not_run"]}
    assert set(ran) | set(not_run) == set(STRATEGIES)
    assert "not run: " in text and all(
        s.startswith(("does not fit", "not available", "failed")) for s in not_run.values()
    )
    assert not any(s.startswith("failed") for n, s in not_run.items() if n != "fuyou")
    for r in ran.values():
        assert r["device_bytes"] <= 20 * 2**20 and r["step_s"] > 0
    assert ran["l2l"]["host_bytes"] > 0 and ran["l2l"]["link_bytes"] > 0
    if "zero_infinity" in ran:
        assert ran["zero_infinity"]["disk_bytes"] > 0
    assert any(s.startswith("does not fit") for s in not_run.values())
    rows = list(csv.DictReader(open(out / "compare.csv")))
    assert {r["strategy"] for r in rows} == set(STRATEGIES)
    assert "not run" in (out / "compare.md").read_text()
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
