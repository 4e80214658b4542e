"""Bring your own model: a model defined in this test folder (tests/byom_model.py, not in
models/) trains, compares and plans through the same commands as the shipped models, and a
model that lacks what a feature needs is refused with a line naming what is missing."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxoff import ConfigError
from jaxoff.cli import main
from jaxoff.models import load_model
from jaxoff.nn import check_model, count_params, with_stack
from jaxoff.train import TrainConfig, train
from tests.byom_model import MixerConfig

SPEC = "tests.byom_model:build"
SMALL = ["--batch-size", "4", "--seq-len", "32"]


def _cli(command: str, *args) -> int:
    """``jaxoff COMMAND --model SPEC`` at the small shape, then ``args`` (as strings)."""
    return main([command, "--model", SPEC, *SMALL, *(str(a) for a in args)])


def test_load_model_names_a_factory_and_counts_its_parameters():
    cfg = load_model(SPEC)
    assert isinstance(cfg, MixerConfig) and cfg.name == SPEC
    d, f, layers, v = 64, 256, 3, 256
    block = 2 * 2 * d + d + (d * f + f) + (f * d + d)
    assert count_params(cfg) == v * d + layers * block + 2 * d + d * v


def test_train_from_the_command_line_with_loss_falling(tmp_path):
    out = tmp_path / "run"
    options = "--steps 12 --lr 1e-2 --warmup-steps 2 --eval-every 0 --ckpt-every 0 --no-progress"
    assert (
        _cli("train", *options.split(), *"--store none --policy full".split(), "--out-dir", out)
        == 0
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 12 and np.mean(losses[-3:]) < np.mean(losses[:3])
    assert json.loads((out / "config.json").read_text())["model_options"]["model"] == SPEC


def test_train_from_python_with_a_model_object_paged_and_a_policy(tmp_path):
    cfg = TrainConfig(
        batch_size=4,
        seq_len=32,
        steps=10,
        eval_every=0,
        ckpt_every=5,
        progress=False,
        store="auto",
        chunk_mib=1,
        out_dir=tmp_path / "run",
        policy="mixed=remat,ff_act=offload,*=device",
    )
    result = train(cfg, model=MixerConfig(num_layers=2))
    assert len(result.losses) == 10 and all(np.isfinite(result.losses))
    assert any((tmp_path / "run" / "store").iterdir())  # optimizer state paged to disk


def test_policies_and_placements_act_on_the_models_own_names():
    cfg = load_model(SPEC)
    plain = with_stack(cfg, policy=None)
    from jaxoff.policy import apply_policy

    kept = apply_policy(cfg, "ff_up=device,*=remat")
    assert kept.stack.policy is not None and kept.stack.policy != plain.stack.policy
    with pytest.raises(ConfigError, match="'attn_probs' is not a residual name.*mix_norm"):
        apply_policy(cfg, "attn_probs=remat")


def test_compare_policies_placements_and_strategies(tmp_path):
    out = tmp_path / "cmp"
    policies = "none,full,mixed=remat;*=device"
    placements = "device,host_params_stream1"
    assert (
        _cli(
            "compare",
            *"--steps 1 --warmup 1 --no-isolate --policies".split(),
            policies,
            "--placements",
            placements,
            "--out-dir",
            out,
        )
        == 0
    )
    rows = json.loads((out / "compare.json").read_text())["policies"]
    assert {(r["policy"], r["placement"]) for r in rows} >= {
        ("none", "device"),
        ("full", "device"),
        ("full", "host_params_stream1"),
    }
    out = tmp_path / "strat"
    strategies = "vdnn,chen_sqrt,l2l,zero_infinity,fuyou"
    assert (
        _cli(
            "compare",
            *"--steps 1 --warmup 1 --no-isolate --device-mem 64MiB --strategies".split(),
            strategies,
            "--out-dir",
            out,
        )
        == 0
    )
    record = json.loads((out / "compare.json").read_text())
    assert {r["strategy"] for r in record["strategies"]} == set(strategies.split(",")), record[
        "not_run"
    ]


@pytest.mark.subprocess
def test_compare_measures_a_strategy_in_its_own_process(tmp_path):
    """The default (isolated) path: the strategy runs in a child process that imports the
    user's model by its spec, and its row comes back with that process's own peak RSS."""
    out = tmp_path / "iso"
    args = "--steps 1 --warmup 0 --device-mem 64MiB --strategies zero_infinity --out-dir"
    assert _cli("compare", *args.split(), out) == 0
    (row,) = json.loads((out / "compare.json").read_text())["strategies"]
    assert row["strategy"] == "zero_infinity" and row["step_s"] > 0 and row["disk_bytes"] > 0
    assert row["peak_rss_bytes"] > 0


def test_plan_then_train_the_plan(tmp_path):
    plan = tmp_path / "plan.json"
    assert _cli("plan", "--device-mem", "8MiB", "--out", plan) == 0
    assert json.loads(plan.read_text())["model"] == SPEC
    train_args = "--steps 2 --eval-every 0 --ckpt-every 0 --no-progress".split()
    assert _cli("train", *train_args, "--plan", plan, "--out-dir", tmp_path / "run") == 0


@pytest.mark.parametrize(
    "args, fix",
    [
        (["--model", "tests.byom_model:not_a_model"], "is not a model config"),
        (["--model", "tests.no_such_module:build"], "cannot import 'tests.no_such_module'"),
        (["--model", "tests.byom_model:nothing"], "has no 'nothing'"),
        (
            ["--model", "tests.byom_model:Unnamed", "--policy", "mixed=remat"],
            "has no residual_names",
        ),
        (["--model", SPEC, "--positions", "rotary"], "has no positions field"),
    ],
)
def test_a_model_that_lacks_something_is_one_clear_line(args, fix, capsys, tmp_path):
    code = main(["train", *args, "--out-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and fix in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_check_model_names_what_a_feature_needs():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class NoBlocks(MixerConfig):
        def build(self, rngs):
            model = super().build(rngs)
            del model.blocks
            return model

    with pytest.raises(ConfigError, match="stacked blocks at .blocks.*which streaming needs"):
        check_model(NoBlocks(), needs=["streaming"])
    assert jnp.dtype(MixerConfig().dtype) == jnp.float32


def test_train_on_a_token_file_and_refuse_ids_beyond_the_vocabulary(tmp_path):
    from jaxoff.train._data import load_corpus

    ids = load_corpus(max_bytes=1 << 16).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")  # nanoGPT's prepare.py format
    args = dict(
        model="tiny",
        batch_size=2,
        seq_len=32,
        steps=3,
        eval_every=0,
        ckpt_every=0,
        progress=False,
        store="none",
        data=tmp_path / "train.bin",
    )
    result = train(TrainConfig(**args, out_dir=tmp_path / "a"))
    assert len(result.losses) == 3 and all(np.isfinite(result.losses))
    big = ids.copy()
    big[5] = 300  # an id the 256-token model cannot embed
    big.tofile(tmp_path / "big.bin")
    with pytest.raises(ConfigError, match="vocab_size 256"):
        train(TrainConfig(**{**args, "data": tmp_path / "big.bin"}, out_dir=tmp_path / "b"))
