"""The ``Step`` protocol: every way to train is one, the trainer runs any of them through one
builder with no branch of its own, and ``--strategy fuyou`` (alias ``--fuyou``) says what it
refuses.

The runs drive each step through the protocol alone (init, compile, call, evaluate, save and
restore over a reader/writer of the test's own, no trainer) and compare with the trainer's run
of the same options bitwise: the same arithmetic, so float equality.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from test_bad_invocations import _call, check_one_line

from jaxoff.distributed import ShardedPagedStep
from jaxoff.step import PlainStep, Step
from jaxoff.strategies import STEP_BUILDERS, build_step
from jaxoff.strategies.fuyou import FuyouStep
from jaxoff.train import TrainConfig, train

COMMON = dict(
    model="tiny",
    batch_size=2,
    seq_len=16,
    steps=3,
    warmup_steps=1,
    eval_every=0,
    ckpt_every=0,
    chunk_mib=1,
    progress=False,
    compile_cache="none",
)
FUYOU = dict(strategy="fuyou", clip_norm=0.0, policy="nothing_saveable")


def _config(tmp_path, name, **over) -> TrainConfig:
    return TrainConfig(**{**COMMON, "out_dir": tmp_path / name, **over}).validate()


PROTOCOL = [n for n, v in vars(Step).items() if callable(v) and not n.startswith("_")]


@pytest.mark.parametrize("kind", ["plain", "sharded", "fuyou"])
def test_each_step_is_a_step_with_the_protocols_signatures(kind, tmp_path):
    over = {"plain": {}, "sharded": {"fsdp": 2}, "fuyou": FUYOU}[kind]
    cfg = _config(tmp_path, kind, **over)
    assert cfg.step_kind() == kind
    step = build_step(cfg)
    try:
        expected = {"plain": PlainStep, "sharded": ShardedPagedStep, "fuyou": FuyouStep}[kind]
        assert type(step) is expected
        assert isinstance(step, Step)
        assert set(PROTOCOL) >= {"init", "restore", "save", "compile", "evaluate", "close"}
        for name in [*PROTOCOL, "__call__"]:
            want = list(inspect.signature(getattr(Step, name)).parameters)[1:]
            got = list(inspect.signature(getattr(step, name)).parameters)
            assert got == want, (kind, name, got, want)
    finally:
        step.close()


def test_the_builder_is_a_table_of_every_step_kind():
    assert sorted(STEP_BUILDERS) == ["fuyou", "plain", "sharded"]


def _function(module, name: str) -> ast.FunctionDef:
    tree = ast.parse(inspect.getsource(module))
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_the_trainer_has_no_strategy_branch():
    """``_train_locked`` builds its step with one call, and neither it nor the loop names a
    strategy, tests a step's type or looks for an attribute of one."""
    from jaxoff.train import _loop

    for name in ("_train_locked", "_loop"):
        fn = _function(_loop, name)
        source = ast.unparse(fn)
        for word in ("fuyou", "Fuyou", "sharded", "Sharded", "strategy", "step_kind"):
            assert word not in source, (name, word)
        calls = [n.func for n in ast.walk(fn) if isinstance(n, ast.Call)]
        called = {c.id for c in calls if isinstance(c, ast.Name)}
        assert not called & {"getattr", "hasattr", "isinstance", "type"}, (name, called)
        branches = [n for n in ast.walk(fn) if isinstance(n, ast.If | ast.IfExp)]
        for b in branches:  # what the trainer does branch on: the run, never the step
            assert "step_fn" not in ast.unparse(b.test), (name, ast.unparse(b.test))
    builds = [
        c
        for c in ast.walk(_function(_loop, "_train_locked"))
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "build_step"
    ]
    assert len(builds) == 1


class _Checkpoints:
    """A reader and writer of the protocol's, with no trainer: orbax and a paged folder."""

    paged_in_store = False  # the paged part is a copy of the store's version

    def __init__(self, root: Path):
        self.root = root
        self.manager = ocp.CheckpointManager(root / "orbax", options=ocp.CheckpointManagerOptions())

    def paged_part(self, step: int) -> Path:
        return self.root / "paged" / str(step)

    def paged_dir(self, step: int) -> Path:
        assert self.paged_part(step).is_dir()
        return self.paged_part(step)

    def save_tree(self, step: int, tree) -> None:
        self.manager.save(step, args=ocp.args.StandardSave(tree))
        self.manager.wait_until_finished()

    def restore(self, step: int, abstract_state):
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))


def _batches(cfg: TrainConfig):
    """The trainer's training and validation batches of ``cfg``."""
    from jaxoff.train import Batches
    from jaxoff.train._data import load_tokens, split

    tokens, _ = load_tokens(cfg.data, cfg.tokenizer, cfg.token_dtype)
    train_tokens, val_tokens = split(tokens, cfg.val_fraction)
    return (
        Batches(train_tokens, cfg.batch_size, cfg.seq_len, cfg.seed),
        Batches(val_tokens, cfg.batch_size, cfg.seq_len, cfg.seed + 1),
    )


def _drive(cfg: TrainConfig, tmp_path: Path) -> tuple[list[float], float]:
    """Trains ``cfg`` through the protocol alone: two steps, a checkpoint, a new step object
    restored from it, the last step; ``(losses, validation loss at the end)``."""
    batches, val = _batches(cfg)
    ckpts = _Checkpoints(tmp_path / "ckpts")
    losses = []
    step = build_step(cfg)
    try:
        state = step.compile(step.init(), *batches(0))
        for i in range(2):
            state, metrics = step(state, *batches(i))
            losses.append(float(metrics["loss"]))
        step.save(ckpts, 2, state)
    finally:
        step.close()
    never = lambda *a: pytest.fail(f"fell back: {a}")  # noqa: E731
    step = build_step(cfg)  # a new process would do the same: the store is written back
    try:
        start, state = step.restore(ckpts, 2, never)
        assert start == 2 and int(state.step) == 2
        state = step.compile(state, *batches(2))
        state, metrics = step(state, *batches(2))
        losses.append(float(metrics["loss"]))
        return losses, float(step.evaluate(state, *val(0)))
    finally:
        step.close()


@pytest.mark.parametrize("over", [{}, FUYOU], ids=["plain", "fuyou"])
def test_a_run_through_the_builder_is_the_trainers_run(over, tmp_path):
    cfg = _config(tmp_path, "run", **over, eval_every=3, eval_batches=1)
    ref = train(cfg)
    driven = _config(tmp_path, "driven", **over)  # its own store
    losses, val = _drive(driven, tmp_path)
    assert losses == ref.losses  # bitwise
    assert val == ref.records[-1]["val_loss"]
    assert np.isfinite(losses).all()


# --- --strategy fuyou and its alias --fuyou ------------------------------------------------


def test_fuyou_alias_is_strategy_fuyou(tmp_path):
    by_alias = TrainConfig(**COMMON, fuyou=True, clip_norm=0.0, out_dir=tmp_path).validate()
    by_name = TrainConfig(**COMMON, strategy="fuyou", clip_norm=0.0, out_dir=tmp_path).validate()
    assert by_alias == by_name
    assert (by_name.strategy, by_name.fuyou, by_name.step_kind()) == ("fuyou", True, "fuyou")
    # a run saved before --strategy existed resumes with the same options
    plain = TrainConfig(**COMMON, out_dir=tmp_path).validate()
    assert (plain.strategy, plain.fuyou, plain.step_kind()) == ("plain", False, "plain")
    assert dataclasses.replace(plain, fsdp=2).step_kind() == "sharded"


@pytest.mark.parametrize("policy", ["full", "nothing_saveable"])
def test_fuyou_takes_the_policies_it_runs(policy, tmp_path):
    cfg = TrainConfig(**{**COMMON, **FUYOU, "policy": policy, "out_dir": tmp_path}).validate()
    assert cfg.policy == policy


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["--strategy", "fuyou", "--clip-norm", "0", "--policy", "selective"],
            ["--policy selective does not apply to --strategy fuyou", "--policy full"],
        ),
        (
            ["--fuyou", "--clip-norm", "0", "--policy", "offload_all"],
            ["--policy offload_all does not apply to --strategy fuyou"],
        ),
        (["--strategy", "fuyou"], ["global gradient norm", "--clip-norm 0"]),
        (["--strategy", "zero"], ["--strategy", "'zero'"]),
    ],
)
def test_bad_strategy_options_fail_with_one_line(argv, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--model", "tiny", *argv]
    code = _call(argv)
    out, err = capsys.readouterr()
    assert code not in (0, None), (out, err)
    check_one_line(err, argv, words)
    assert list(tmp_path.iterdir()) == []  # nothing written
