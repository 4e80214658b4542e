"""TrainConfig is composed of frozen groups of options, the only place an option is defined:
its flat names, its command line and the ``config.json`` a run writes (by group) all follow
from the groups, and the ``config.json`` of a run written when TrainConfig was one flat
dataclass reads (and resumes) as it did."""

import dataclasses
import json
from pathlib import Path

import pytest

from jaxoff import ConfigError
from jaxoff.strategies.fuyou import FuyouOptions
from jaxoff.train import TrainConfig
from jaxoff.train._options import (
    FLAT_NAMES,
    GROUP_OF,
    GROUPS,
    DataOptions,
    ModelOptions,
    OptimOptions,
    RunOptions,
    StoreOptions,
    StrategyOptions,
    flat_options,
    nest,
)

# three configs, and ``json.dumps(cfg.to_json(), indent=2, sort_keys=True)`` of each as the
# flat TrainConfig wrote it (an older run's config.json, flat: it must still read the same), with
# ``paged_checkpoint`` and ``host_mem`` added since (options that may change on --resume) and
# ``init_from`` (null in a run that has none: such a run's older config.json, without the
# key, still resumes, as a missing key reads as None) and ``grad_accum`` (1 in a run that
# has none: an older config.json without the key resumes as 1, see check_resumable)
CONFIGS = {
    "default": {},
    "tiny": dict(
        model="tiny",
        steps=6,
        store="auto",
        out_dir=Path("/tmp/run"),
        chunk_mib=1,
        store_slots=1,
        lr=1e-3,
        clip_norm=0.0,
        data=Path("corpus.bin"),
        token_dtype="uint32",
        stop_at=3,
        progress=False,
    ),
    "fuyou": dict(
        model="llama-tiny",
        strategy="fuyou",
        fuyou=True,
        page_params=True,
        fuyou_read_ahead_mib=4,
        policy="full",
        positions="rotary",
        dtype="bfloat16",
        param_dtype="float32",
        optimizer="lion",
        weight_decay=0.0,
        resume=True,
        resume_fallback=True,
        resume_unverified=True,
        overwrite=True,
        compile_cache="none",
        plan=Path("p.json"),
        tokenizer=Path("t.json"),
        fsdp=1,
        placement="device",
        seed=7,
        eval_every=0,
        eval_batches=2,
        ckpt_every=5,
        keep_checkpoints=3,
        val_fraction=0.1,
        batch_size=4,
        seq_len=32,
        warmup_steps=2,
        store="/tmp/st",
    ),
}
EXPECTED_JSON = {
    "default": json.dumps(
        {
            "batch_size": 16,
            "grad_accum": 1,
            "chunk_mib": 16,
            "ckpt_every": 100,
            "clip_norm": 1.0,
            "compile_cache": "auto",
            "data": None,
            "dtype": None,
            "eval_batches": 4,
            "eval_every": 50,
            "fsdp": 1,
            "fuyou": False,
            "fuyou_read_ahead_mib": None,
            "init_from": None,
            "keep_checkpoints": 2,
            "lr": 0.003,
            "model": "mini",
            "optimizer": "adamw",
            "out_dir": "runs/default",
            "overwrite": False,
            "page_params": False,
            "param_dtype": None,
            "placement": "device",
            "plan": None,
            "policy": "none",
            "positions": None,
            "processes": 1,
            "progress": True,
            "resume": False,
            "resume_fallback": False,
            "resume_unverified": False,
            "seed": 0,
            "seq_len": 128,
            "steps": 150,  # the main job's default (300 before it had to fit 3 minutes)
            "stop_at": 0,
            "store": "auto",
            "store_slots": 2,
            "paged_checkpoint": "copy",
            "host_mem": "0",
            "strategy": "plain",
            "token_dtype": "auto",
            "tokenizer": None,
            "val_fraction": 0.05,
            "warmup_steps": 30,
            "weight_decay": 0.1,
        },
        indent=2,
        sort_keys=True,
    ),
    "tiny": json.dumps(
        {
            "batch_size": 16,
            "grad_accum": 1,
            "chunk_mib": 1,
            "ckpt_every": 100,
            "clip_norm": 0.0,
            "compile_cache": "auto",
            "data": "corpus.bin",
            "dtype": None,
            "eval_batches": 4,
            "eval_every": 50,
            "fsdp": 1,
            "fuyou": False,
            "fuyou_read_ahead_mib": None,
            "init_from": None,
            "keep_checkpoints": 2,
            "lr": 0.001,
            "model": "tiny",
            "optimizer": "adamw",
            "out_dir": "/tmp/run",
            "overwrite": False,
            "page_params": False,
            "param_dtype": None,
            "placement": "device",
            "plan": None,
            "policy": "none",
            "positions": None,
            "processes": 1,
            "progress": False,
            "resume": False,
            "resume_fallback": False,
            "resume_unverified": False,
            "seed": 0,
            "seq_len": 128,
            "steps": 6,
            "stop_at": 3,
            "store": "auto",
            "store_slots": 1,
            "paged_checkpoint": "copy",
            "host_mem": "0",
            "strategy": "plain",
            "token_dtype": "uint32",
            "tokenizer": None,
            "val_fraction": 0.05,
            "warmup_steps": 30,
            "weight_decay": 0.1,
        },
        indent=2,
        sort_keys=True,
    ),
    "fuyou": json.dumps(
        {
            "batch_size": 4,
            "grad_accum": 1,
            "chunk_mib": 16,
            "ckpt_every": 5,
            "clip_norm": 1.0,
            "compile_cache": "none",
            "data": None,
            "dtype": "bfloat16",
            "eval_batches": 2,
            "eval_every": 0,
            "fsdp": 1,
            "fuyou": True,
            "fuyou_read_ahead_mib": 4,
            "init_from": None,
            "keep_checkpoints": 3,
            "lr": 0.003,
            "model": "llama-tiny",
            "optimizer": "lion",
            "out_dir": "runs/default",
            "overwrite": True,
            "page_params": True,
            "param_dtype": "float32",
            "placement": "device",
            "plan": "p.json",
            "policy": "full",
            "positions": "rotary",
            "processes": 1,
            "progress": True,
            "resume": True,
            "resume_fallback": True,
            "resume_unverified": True,
            "seed": 7,
            "seq_len": 32,
            "steps": 150,
            "stop_at": 0,
            "store": "/tmp/st",
            "store_slots": 2,
            "paged_checkpoint": "copy",
            "host_mem": "0",
            "strategy": "fuyou",
            "token_dtype": "auto",
            "tokenizer": "t.json",
            "val_fraction": 0.1,
            "warmup_steps": 2,
            "weight_decay": 0.0,
        },
        indent=2,
        sort_keys=True,
    ),
}

# every option of `jaxoff train` on one command line, and what the flat TrainConfig it
# parsed into wrote as config.json
ARGV = [
    "--model",
    "llama-tiny",
    "--init-from",
    "/tmp/cc/SmolLM2-135M",
    "--policy",
    "full",
    "--positions",
    "rotary",
    "--dtype",
    "bfloat16",
    "--param-dtype",
    "float32",
    "--batch-size",
    "4",
    "--grad-accum",
    "2",
    "--seq-len",
    "32",
    "--steps",
    "9",
    "--optimizer",
    "lion",
    "--lr",
    "0.002",
    "--warmup-steps",
    "2",
    "--weight-decay",
    "0.0",
    "--clip-norm",
    "0.0",
    "--seed",
    "7",
    "--data",
    "corpus.bin",
    "--tokenizer",
    "tok.json",
    "--token-dtype",
    "uint32",
    "--val-fraction",
    "0.1",
    "--eval-every",
    "0",
    "--eval-batches",
    "2",
    "--out-dir",
    "/tmp/cc/run",
    "--ckpt-every",
    "5",
    "--keep-checkpoints",
    "3",
    "--resume",
    "--resume-fallback",
    "--resume-unverified",
    "--overwrite",
    "--stop-at",
    "4",
    "--no-progress",
    "--plan",
    "plan.json",
    "--store",
    "/tmp/cc/st",
    "--chunk-mib",
    "2",
    "--store-slots",
    "1",
    "--host-mem",
    "64MiB",
    "--paged-checkpoint",
    "store",
    "--placement",
    "host_opt",
    "--fsdp",
    "1",
    "--strategy",
    "fuyou",
    "--fuyou",
    "--page-params",
    "--fuyou-read-ahead-mib",
    "3",
    "--compile-cache",
    "none",
]
ARGV_JSON = json.dumps(
    {
        "batch_size": 4,
        "grad_accum": 2,
        "chunk_mib": 2,
        "ckpt_every": 5,
        "clip_norm": 0.0,
        "compile_cache": "none",
        "data": "corpus.bin",
        "dtype": "bfloat16",
        "eval_batches": 2,
        "eval_every": 0,
        "fsdp": 1,
        "fuyou": True,
        "fuyou_read_ahead_mib": 3,
        "init_from": "/tmp/cc/SmolLM2-135M",
        "keep_checkpoints": 3,
        "lr": 0.002,
        "model": "hf:SmolLM2-135M",  # the checkpoint's (validation refuses another --model)
        "optimizer": "lion",
        "out_dir": "/tmp/cc/run",
        "overwrite": True,
        "page_params": True,
        "param_dtype": "float32",
        "placement": "host_opt",
        "plan": "plan.json",
        "policy": "full",
        "positions": "rotary",
        "processes": 1,
        "progress": False,
        "resume": True,
        "resume_fallback": True,
        "resume_unverified": True,
        "seed": 7,
        "seq_len": 32,
        "steps": 9,
        "stop_at": 4,
        "store": "/tmp/cc/st",
        "store_slots": 1,
        "paged_checkpoint": "store",
        "host_mem": "64MiB",
        "strategy": "fuyou",
        "token_dtype": "uint32",
        "tokenizer": "tok.json",
        "val_fraction": 0.1,
        "warmup_steps": 2,
        "weight_decay": 0.0,
    },
    indent=2,
    sort_keys=True,
)


GROUP_TYPES = (
    ModelOptions,
    DataOptions,
    OptimOptions,
    RunOptions,
    StoreOptions,
    StrategyOptions,
    FuyouOptions,
)


def test_groups_are_frozen_and_disjoint():
    cfg = TrainConfig()
    for name, group in GROUPS.items():
        value = getattr(cfg, name)
        assert type(value) is group and value == group()
        field = dataclasses.fields(group)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model_options = ModelOptions()  # type: ignore[misc]
    assert tuple(GROUPS.values()) == GROUP_TYPES
    names = [f.name for g in GROUP_TYPES for f in dataclasses.fields(g)]
    # the flat names are the groups' fields, in order: written nowhere else
    assert len(names) == len(set(names)) == 44 and tuple(names) == FLAT_NAMES
    assert list(GROUP_OF) == names
    # each flat name reads its group's option
    cfg = TrainConfig(**CONFIGS["fuyou"])
    for name in FLAT_NAMES:
        assert getattr(cfg, name) == getattr(getattr(cfg, GROUP_OF[name]), name), name
    with pytest.raises(AttributeError, match="no attribute 'stpes'"):
        cfg.stpes  # noqa: B018


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_flat_construction_is_grouped_construction(name):
    flat = TrainConfig(**CONFIGS[name])
    groups = {
        g: cls(**{k: v for k, v in CONFIGS[name].items() if GROUP_OF[k] == g})
        for g, cls in GROUPS.items()
    }
    grouped = TrainConfig(**groups)
    assert flat == grouped and hash(flat) == hash(grouped)
    for key, value in CONFIGS[name].items():
        assert getattr(flat, key) == value == getattr(getattr(flat, GROUP_OF[key]), key)
    assert TrainConfig(**flat.options()) == flat
    # a flat name given with its group replaces that option of the group
    mixed = TrainConfig(optim_options=groups["optim_options"], lr=0.5, seed=3)
    assert mixed.lr == 0.5 and mixed.seed == 3 and mixed.steps == flat.steps


def test_dataclasses_replace_takes_flat_names():
    cfg = TrainConfig(**CONFIGS["tiny"])
    again = dataclasses.replace(cfg, stop_at=0, resume=True, lr=0.25)
    assert (again.stop_at, again.resume, again.lr) == (0, True, 0.25)
    assert again.steps == 6 and again.store_slots == 1 and again.data == Path("corpus.bin")
    assert dataclasses.replace(again, stop_at=3, resume=False, lr=1e-3) == cfg
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['stpes'\\]"):
        TrainConfig(stpes=6)
    with pytest.raises(TypeError, match="must be a OptimOptions"):
        TrainConfig(optim_options=RunOptions())  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_to_json_holds_the_groups_and_the_flat_config_reads_the_same(name):
    """config.json holds the options by group, the same values the flat TrainConfig wrote;
    a config.json written by it (flat) reads through the converter as the same config."""
    cfg = TrainConfig(**CONFIGS[name])
    out = cfg.to_json()
    assert list(out) == [*GROUPS, "processes"]
    for group in GROUPS:
        assert set(out[group]) == {f.name for f in dataclasses.fields(GROUPS[group])}
    old = json.loads(EXPECTED_JSON[name])
    assert flat_options(json.loads(json.dumps(out))) == old  # the same options and values
    assert TrainConfig(**flat_options(old, extra=())) == TrainConfig(
        **flat_options(json.loads(json.dumps(out)), extra=())
    )


def test_nest_is_the_one_converter_from_flat_names():
    assert nest({"lr": 0.5, "seed": 2, "fuyou": True}) == {
        **{g: {} for g in GROUPS},
        "optim_options": {"lr": 0.5},
        "run_options": {"seed": 2},
        "fuyou_options": {"fuyou": True},
    }
    mixed = nest({"optim_options": {"steps": 3}, "lr": 0.5})
    assert mixed["optim_options"] == {"steps": 3, "lr": 0.5}
    with pytest.raises(ConfigError, match=r"unknown keys \['stpes'\]"):
        nest({"stpes": 3})
    with pytest.raises(ConfigError, match=r"optim_options has no options \['seed'\]"):
        nest({"optim_options": {"seed": 3}})


def test_every_cli_option_maps_to_the_same_option(monkeypatch):
    import jaxoff.train
    from jaxoff import cli

    got = []
    monkeypatch.setattr(jaxoff.train, "train", got.append)
    assert cli.main(["train", *ARGV]) == 0
    (cfg,) = got
    assert isinstance(cfg, TrainConfig)
    assert flat_options(cfg.to_json()) == json.loads(ARGV_JSON)
    flags = {a[2:].replace("-", "_") for a in ARGV if a.startswith("--")} - {"no_progress"}
    assert flags | {"progress"} == set(FLAT_NAMES)  # the command line names every option


def test_toml_file_takes_flat_names(tmp_path):
    from jaxoff.train import load_config_file

    (tmp_path / "run.toml").write_text('[train]\nlr = 0.5\nstore = "none"\nout_dir = "x"\n')
    cfg = TrainConfig(**load_config_file(tmp_path / "run.toml"))
    assert (cfg.optim_options.lr, cfg.store_options.store, cfg.out_dir) == (0.5, "none", Path("x"))


def test_toml_file_takes_groups_too(tmp_path):
    from jaxoff.train import load_config_file

    (tmp_path / "run.toml").write_text(
        "[train]\nseed = 4\n[train.optim_options]\nlr = 0.25\nsteps = 7\n"
    )
    cfg = TrainConfig(**load_config_file(tmp_path / "run.toml"))
    assert (cfg.lr, cfg.steps, cfg.seed) == (0.25, 7, 4)
    (tmp_path / "bad.toml").write_text('[train.optim_options]\nlr = "fast"\n')
    with pytest.raises(ConfigError, match="lr must be a number"):
        load_config_file(tmp_path / "bad.toml")


def test_a_run_whose_config_json_is_flat_still_resumes_bitwise(tmp_path):
    """A run started before the options had groups wrote config.json flat: --resume reads it
    through the converter, continues, and ends as an uninterrupted run does."""
    from jaxoff.train import train

    common = dict(
        model="tiny", steps=4, batch_size=2, seq_len=16, warmup_steps=1, eval_every=0,
        ckpt_every=2, chunk_mib=1, progress=False, compile_cache="none",
    )  # fmt: skip
    full = train(TrainConfig(**common, out_dir=tmp_path / "full"))
    run = tmp_path / "part"
    train(TrainConfig(**common, out_dir=run, stop_at=2))
    path = run / "config.json"
    grouped = json.loads(path.read_text())
    flat = flat_options(grouped)
    assert "optim_options" in grouped and "optim_options" not in flat
    path.write_text(json.dumps(flat, indent=2, sort_keys=True))  # as the flat TrainConfig wrote
    rest = train(TrainConfig(**common, out_dir=run, resume=True))
    assert rest.first_step == 2 and rest.losses == full.losses[2:]
