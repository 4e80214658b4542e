"""A run can grow: ``--resume --steps N`` with a larger N continues a finished (or stopped)
run, its learning-rate schedule over the new total, said in one line; a kill in the grown part
resumes bitwise; fewer steps than its newest checkpoint are refused in one line."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _limits import HANG_S

from jaxoff._errors import ConfigError
from jaxoff.train._options import flat_options

TINY = dict(
    model="tiny",
    batch_size=2,
    seq_len=16,
    lr=3e-3,
    warmup_steps=1,
    eval_every=0,
    ckpt_every=1,
    chunk_mib=1,
    progress=False,
    compile_cache="none",
)


def _config(out: Path, **over):
    from jaxoff.train import TrainConfig

    return TrainConfig(**{**TINY, "out_dir": out, **over})


def _final(out: Path):
    import orbax.checkpoint as ocp

    last = max(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    params = ocp.StandardCheckpointer().restore(out / "checkpoints" / str(last) / "default")
    return last, params["params"]


def _losses(out: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_finished_run_grows_and_a_kill_in_the_grown_part_resumes_bitwise(tmp_path, capsys):
    from test_paged import assert_trees_equal

    from jaxoff.train import train

    grown, killed = tmp_path / "grown", tmp_path / "killed"
    for out in (grown, killed):
        train(_config(out, steps=4))
    capsys.readouterr()
    result = train(_config(grown, steps=6, resume=True))
    err = capsys.readouterr().err
    assert result.first_step == 4 and len(result.losses) == 2
    lines = [line for line in err.splitlines() if "grows" in line]
    assert lines == [
        "jaxoff train: the run grows from 4 to 6 steps: its learning-rate schedule warms up and "
        "decays over 6 steps from here on (steps before 5 were trained under the 4-step "
        "schedule)"
    ]
    assert flat_options(json.loads((grown / "config.json").read_text()))["steps"] == 6
    # the learning rate of steps 5 and 6 is the 6-step schedule's, not the 4-step's end
    sched_4, sched_6 = _config(grown, steps=4).schedule(), _config(grown, steps=6).schedule()
    assert float(sched_6(4)) != float(sched_4(4))

    # the same growth, killed (SIGKILL) after step 5, then resumed: bitwise the same run
    env = {**os.environ, "JAXOFF_FAULT": "train.step:1"}
    argv = [sys.executable, "-m", "jaxoff", "train", "--resume", "--steps", "6"]
    argv += ["--model", "tiny", "--batch-size", "2", "--seq-len", "16", "--lr", "3e-3"]
    argv += ["--warmup-steps", "1", "--eval-every", "0", "--ckpt-every", "1", "--chunk-mib", "1"]
    argv += ["--no-progress", "--compile-cache", "none", "--out-dir", str(killed)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=HANG_S)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert flat_options(json.loads((killed / "config.json").read_text()))["steps"] == 6
    train(_config(killed, steps=6, resume=True))
    want, got = _final(grown), _final(killed)
    assert want[0] == got[0] == 6
    assert_trees_equal(got[1], want[1])
    assert _losses(killed) == _losses(grown)


def test_fewer_steps_than_the_newest_checkpoint_are_refused_and_nothing_changes(tmp_path):
    from jaxoff.train import train

    out = tmp_path / "run"
    train(_config(out, steps=4))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError) as e:
        train(dataclasses.replace(_config(out, steps=3, resume=True)))
    msg = str(e.value)
    assert "\n" not in msg and "checkpoint at step 4" in msg and "--steps 4 or more" in msg
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after.keys() == before.keys()
    assert all(after[p] == before[p] for p in before if p.name != "run.lock")
