"""Bad command lines of every jaxoff command: each fails with one line that names the fix.

Each case runs ``jaxoff.cli.main(argv)`` in-process, in a scratch working directory that holds
a few fixtures (a finished-looking run, TOML files, a regular file), and checks that the exit
status is not 0, that stderr is one line, ``jaxoff <command>: error: ...`` with the expected
words and no traceback, and that no file was written, changed or removed. Two cases go
through a real ``python -m jaxoff.cli`` process as well.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _limits import HANG_S

from jaxoff.cli import COMMANDS, main

# A case whose fix lands with the train/store changes (the --chunk-mib range checked before
# anything is written): marked until then.

TINY = ["--model", "tiny", "--batch-size", "2", "--seq-len", "16", "--steps", "2"]

# (argv, words the error line must hold); paths are relative to the scratch directory
CASES = [
    # the command line itself
    (["trian"], ["unknown command 'trian'", "did you mean train"]),
    (["--stpes"], ["unknown option '--stpes' before the command"]),
    (["train", "--stpes", "3"], ["unrecognized arguments", "did you mean --steps"]),
    (["train", "extra"], ["unrecognized arguments: extra"]),
    (["train", "--steps", "many"], ["--steps", "'many' is not an integer"]),
    (["train", "--lr", "fast"], ["--lr", "'fast' is not a number"]),
    (["train", "--steps"], ["--steps needs a value"]),
    (["train", "--optimizer", "foo"], ["--optimizer 'foo' is not a choice", "adamw"]),
    (["train", "--positions", "sideways"], ["--positions 'sideways' is not a choice"]),
    (["train", "--config"], ["--config needs a file"]),
    # train: values
    (["train", "--model", "huge"], ["--model huge is not a known size", "choose one of"]),
    (["train", "--model", "no_such_pkg.mod:build"], ["cannot import 'no_such_pkg.mod'"]),
    (["train", "--model", "jaxoff.models.gpt:nope"], ["has no 'nope'"]),
    (["train", "--model", "tiny", "--policy", "sometimes"], ["not a known policy"]),
    (["train", "--model", "tiny", "--policy", "mlp_act=sometimes"], ["sometimes"]),
    (["train", "--model", "tiny", "--policy", "no_such_name=remat"], ["no_such_name"]),
    (["train", "--model", "tiny", "--steps", "0"], ["--steps must be at least 1"]),
    (["train", "--model", "tiny", "--steps", "-3"], ["--steps must be at least 1"]),
    (["train", "--model", "tiny", "--batch-size", "0"], ["--batch-size must be at least 1"]),
    (["train", "--model", "tiny", "--seq-len", "4096"], ["use a shorter --seq-len"]),
    (["train", "--model", "tiny", "--lr", "0"], ["--lr must be positive"]),
    (["train", "--model", "tiny", "--val-fraction", "0.9"], ["--val-fraction"]),
    (["train", "--model", "tiny", "--dtype", "float8"], ["float8", "float32"]),
    (["train", "--model", "tiny", "--placement", "nowhere"], ["nowhere"]),
    (["train", "--model", "tiny", "--fsdp", "64"], ["--fsdp 64"]),
    (["train", "--model", "tiny", "--plan", "no_plan.json"], ["--plan no_plan.json", "no such"]),
    (["train", "--model", "tiny", "--data", "no_corpus"], ["--data no_corpus", "no such file"]),
    (["train", "--model", "tiny", "--tokenizer", "no_tok.json"], ["--tokenizer", "no such"]),
    (["train", "--model", "tiny", "--token-dtype", "uint7"], ["--token-dtype"]),
    (["train", "--model", "tiny", "--store-slots", "3"], ["--store-slots must be 2"]),
    (["train", "--model", "tiny", "--grad-accum", "0"], ["--grad-accum must be at least 1"]),
    (["train", "--model", "tiny", "--grad-accum", "-2"], ["--grad-accum must be at least 1"]),
    (["train", "--model", "tiny", "--grad-accum", "two"], ["--grad-accum", "not an integer"]),
    (
        ["train", "--model", "tiny", "--fuyou", "--clip-norm", "0", "--grad-accum", "4"],
        ["--grad-accum 4 does not apply to --strategy fuyou", "--strategy plain"],
    ),
    (
        ["train", "--model", "tiny", "--policy", "full", "--placement", "host_params_stream1"]
        + ["--grad-accum", "2"],
        ["--grad-accum 2 with --placement host_params_stream1", "host_params or device"],
    ),
    (["train", "--model", "tiny", "--page-params"], ["--page-params", "add --fuyou"]),
    (
        ["train", "--model", "tiny", "--fuyou-read-ahead-mib", "4"],
        ["--fuyou-read-ahead-mib", "add --fuyou"],
    ),
    (
        ["train", "--model", "tiny", "--fuyou", "--clip-norm", "0", "--fuyou-read-ahead-mib", "-1"],
        ["--fuyou-read-ahead-mib must be >= 0", "got -1"],
    ),
    (["train", "--model", "tiny", "--fuyou"], ["--fuyou", "global gradient norm", "--clip-norm 0"]),
    (
        ["train", "--model", "tiny", "--fuyou", "--clip-norm", "0", "--store", "none"],
        ["--fuyou", "needs a page store", "--store none"],
    ),
    (
        ["train", "--model", "tiny", "--fuyou", "--clip-norm", "0", "--fsdp", "2"],
        ["--fuyou runs on one device", "--fsdp 1"],
    ),
    (
        ["train", "--model", "tiny", "--fuyou", "--clip-norm", "0", "--placement", "host_opt"],
        ["--placement host_opt does not apply", "--placement device"],
    ),
    (["train", "--config", "no_such.toml"], ["--config no_such.toml", "no such file"]),
    (["train", "--config", "bad_syntax.toml"], ["not valid TOML"]),
    (["train", "--config", "unknown_key.toml"], ["unknown keys ['modle']"]),
    pytest.param(
        ["train", "--config", "wrong_type.toml"],
        ["--config wrong_type.toml", "steps", "'many'"],
        id="train --config wrong_type.toml",
    ),
    pytest.param(
        ["train", *TINY, "--store", "a_file", "--out-dir", "new_run"],
        ["--store a_file", "not a directory"],
        id="train --store a_file",
    ),
    pytest.param(
        ["train", *TINY, "--chunk-mib", "0", "--out-dir", "new_run"],
        ["--chunk-mib"],
        id="train --chunk-mib 0",
    ),
    pytest.param(
        ["train", *TINY, "--chunk-mib", "100000000", "--out-dir", "new_run"],
        ["--chunk-mib"],
        id="train --chunk-mib 100000000",
    ),
    # train: shapes no machine holds, refused from their shapes before anything is allocated
    pytest.param(
        ["train", "--model", "tests.absurd_models:layers", "--out-dir", "new_run"],
        ["needs at least", "GiB", "smaller model"],
        id="train 10**12 layers",
    ),
    pytest.param(
        ["train", "--model", "tests.absurd_models:width", "--out-dir", "new_run"],
        ["needs at least", "GiB", "smaller model"],
        id="train d_model 2**20",
    ),
    pytest.param(
        ["train", "--model", "tiny", "--batch-size", "1000000000", "--out-dir", "new_run"],
        ["needs at least", "--batch-size"],
        id="train --batch-size 10**9",
    ),
    # train: data that cannot make a batch (refused before config.json is written)
    pytest.param(
        ["train", *TINY, "--data", "short.txt", "--out-dir", "new_run"],
        ["--data short.txt", "pass a larger file"],
        id="train --data short.txt",
    ),
    pytest.param(
        ["train", *TINY, "--data", "short.txt", "--out-dir", "run", "--overwrite"],
        ["--data short.txt", "pass a larger file"],
        id="train --data short.txt --overwrite",
    ),
    # train: the page store owns its folder and never nests with a run
    pytest.param(
        ["train", *TINY, "--store", "mine", "--out-dir", "new_run"],
        ["--store mine is not empty", "holds no jaxoff page store", "notes.txt"],
        id="train --store folder of the user's",
    ),
    pytest.param(
        ["train", *TINY, "--store", "run", "--out-dir", "new_run"],
        ["--store run is not empty", "holds no jaxoff page store"],
        id="train --store another run",
    ),
    pytest.param(
        ["train", *TINY, "--store", "new_run", "--out-dir", "new_run"],
        ["--store new_run is the --out-dir itself"],
        id="train --store = --out-dir",
    ),
    pytest.param(
        ["train", *TINY, "--store", ".", "--out-dir", "new_run"],
        ["--store . holds --out-dir new_run"],
        id="train --store above --out-dir",
    ),
    pytest.param(
        ["train", *TINY, "--store", "run", "--out-dir", "run/exp1"],
        ["--store run holds --out-dir run/exp1"],
        id="train --store runs --out-dir runs/exp1",
    ),
    pytest.param(
        ["train", *TINY, "--store", "new_run/opt", "--out-dir", "new_run"],
        ["--store new_run/opt lies inside --out-dir new_run"],
        id="train --store inside --out-dir",
    ),
    pytest.param(
        ["train", *TINY, "--store", "run/opt", "--out-dir", "new_run"],
        ["--store run/opt lies inside the run directory", "another run"],
        id="train --store inside another run",
    ),
    pytest.param(
        ["train", *TINY, "--out-dir", "ours"],
        ["the run's store", "is not empty", "holds no jaxoff page store", "data.csv"],
        id="train --out-dir whose store folder is the user's",
    ),
    # train: the run directory
    (["train", *TINY, "--out-dir", "run"], ["already holds a run", "--resume", "--overwrite"]),
    pytest.param(
        ["train", *TINY, "--out-dir", "unverified", "--resume"],
        ["checkpoints 2, 4", "no checksums.json", "unverified", "--overwrite"],
        id="train --resume of checkpoints without checksums",
    ),
    (["train", *TINY, "--out-dir", "run", "--resume", "--batch-size", "4"], ["batch_size"]),
    (
        ["train", *TINY, "--out-dir", "run", "--resume", "--grad-accum", "4"],
        ["--resume --grad-accum 4", "started with --grad-accum 1", "resume with --grad-accum 1"],
    ),
    pytest.param(
        ["train", *TINY, "--out-dir", "empty", "--resume"],
        ["--resume", "no run to resume"],
        id="train --resume on an empty dir",
    ),
    # compare
    (["compare", "--model", "huge"], ["--model huge is not a known size"]),
    (["compare", "--model", "tiny", "--policies", "none,selectiv"], ["'selectiv'", "selective"]),
    (["compare", "--model", "tiny", "--policies", "none,none"], ["twice"]),
    (["compare", "--model", "tiny", "--strategies", "no_such"], ["no_such"]),
    (["compare", "--model", "tiny", "--placements", "nowhere"], ["nowhere"]),
    (["compare", "--model", "tiny", "--batch", "0"], ["--batch-size must be at least 1"]),
    (["compare", "--model", "tiny", "--grad-accum", "0"], ["--grad-accum must be at least 1"]),
    (
        ["compare", "--model", "tiny", "--policies", "full", "--grad-accum", "2"]
        + ["--placements", "host_params_stream1"],
        ["--grad-accum 2 with --placements host_params_stream1"],
    ),
    (["compare", "--model", "tiny", "--seq", "4096"], ["--seq-len 4096 exceeds"]),
    (
        ["compare", "--model", "tiny", "--strategies", "all", "--device-mem", "lots"],
        ["--device-mem 'lots' is not a positive size"],
    ),
    (
        ["compare", "--model", "tiny", "--strategies", "all", "--hardware", "abacus"],
        ["--hardware 'abacus'"],
    ),
    (["compare", "--steps", "x"], ["--steps", "'x' is not an integer"]),
    (["compare", "--config", "unknown_key.toml"], ["--config is an option of jaxoff train"]),
    # launch
    (["launch", "--processes", "0", "--", "train"], ["--processes must be at least 1, got 0"]),
    (["launch", "--processes", "2"], ["nothing to launch", "--"]),
    (["launch", "--foo", "--", "train"], ["unknown option --foo for launch"]),
    (["launch", "--", "launch", "--", "train"], ["launch"]),
    (["launch", "--devices-per-process", "x", "--", "train"], ["--devices-per-process"]),
    # plan
    (["plan", "--model", "huge"], ["--model huge is not a known size"]),
    (["plan", "--model", "tiny", "--hardware", "abacus"], ["--hardware 'abacus'"]),
    (["plan", "--model", "tiny", "--device-mem", "lots"], ["'lots' is not a size"]),
    (["plan", "--model", "tiny", "--device-mem", "-1GiB"], ["'-1GiB' is not a size"]),
    (["plan", "--model", "tiny", "--dtype", "int8"], ["--dtype must be one of"]),
    (["plan", "--model", "tiny", "--batch", "0"], ["--batch-size must be at least 1"]),
    (["plan", "--model", "tiny", "--grad-accum", "-1"], ["--grad-accum must be at least 1"]),
    (
        ["plan", "--model", "tiny", "--io-bench", "no_bench.jsonl"],
        ["--io-bench no_bench.jsonl", "no such file"],
    ),
    (
        # the only case that profiles (compiles) the model: no plan fits the budget
        ["plan", "--model", "tiny", "--hardware", "a100-40", "--device-mem", "1KiB"]
        + ["--batch", "2", "--seq", "16"],
        ["no plan", "fits", "Raise --device-mem"],
    ),
    (["train", "--init-from", "no_dir"], ["no_dir/config.json does not exist"]),
    # export
    (["export"], ["needs --run RUN_DIR and --out HF_DIR"]),
    (["export", "--run", "empty", "--out", "hf"], ["--run empty holds no jaxoff run"]),
    (["export", "--run", "run", "--out", "hf"], ["has no complete checkpoint yet"]),
    (["export", "--run", "run", "--out", "mine"], ["--out mine exists and is not an empty"]),
    (["export", "--run", "run", "--out", "hf", "--dtype", "float16"], ["'float16'", "choice"]),
    # io-bench
    (["io-bench", "--dir", "no_dir"], ["--dir no_dir: no such directory"]),
    (["io-bench", "--dir", "a_file"], ["--dir a_file is a file, not a directory"]),
    (["io-bench", "--backends", "carrier_pigeon"], ["--backends 'carrier_pigeon'", "posix"]),
    (["io-bench", "--block-sizes", "0"], ["--block-sizes '0' must be a positive multiple"]),
    (["io-bench", "--block-sizes", "1000"], ["--block-sizes '1000'", "multiple of 4K"]),
    (["io-bench", "--ops", "rw"], ["--ops 'rw' is not one of read, write"]),
    (["io-bench", "--ops", "read,read"], ["--ops", "read twice"]),
    (["io-bench", "--sizes", "-64M"], ["--sizes '-64M' must be a positive"]),
    (["io-bench", "--sizes", "lots"], ["--sizes 'lots' is not a size"]),
    (["io-bench", "--queue-depths", "0"], ["--queue-depths 0 must be between 1 and 4096"]),
    (["io-bench", "--threads", "x"], ["--threads 'x' is not an integer"]),
    (["io-bench", "--pool-bytes", "0"], ["--pool-bytes '0' must be positive"]),
    (["io-bench", "--reps", "0"], ["--reps must be at least 1"]),
    (["io-bench", "--fio", "maybe"], ["--fio must be auto, on or off"]),
    (["io-bench", "--tune", "--out", "engine.txt"], ["--out engine.txt", ".json or .toml"]),
    (["io-bench", "--json", "no_dir/r.jsonl"], ["--json no_dir/r.jsonl", "create it"]),
]


def _id(case) -> str:
    if hasattr(case, "id"):  # a pytest.param
        return case.id
    return " ".join(case[0])


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A working directory with the files the cases name; nothing else is there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("not a directory\n")
    (tmp_path / "bad_syntax.toml").write_text("[train]\nsteps = \n")
    (tmp_path / "unknown_key.toml").write_text('[train]\nmodle = "tiny"\n')
    (tmp_path / "wrong_type.toml").write_text('[train]\nmodel = "tiny"\nsteps = "many"\n')
    (tmp_path / "empty").mkdir()
    run = tmp_path / "run"  # what a finished run leaves (its config, metrics, a checkpoint)
    from jaxoff.train import TrainConfig

    config = TrainConfig(
        model="tiny", batch_size=2, seq_len=16, steps=2, out_dir=Path("run")
    ).to_json()
    (run / "checkpoints" / "2").mkdir(parents=True)
    (run / "checkpoints" / "2" / "state").write_bytes(b"\0" * 64)
    (run / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.5}\n{"step": 2, "loss": 5.4}\n')
    (run / "run.lock").write_text("pid 1 on host elsewhere since long ago\n")  # not held
    unverified = tmp_path / "unverified"  # a run whose checksums.json files were all deleted
    for step in (2, 4):
        (unverified / "checkpoints" / str(step)).mkdir(parents=True)
    (unverified / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (unverified / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text())
    (tmp_path / "mine").mkdir()  # a folder of the user's
    (tmp_path / "mine" / "notes.txt").write_text("the user's own\n")
    (tmp_path / "short.txt").write_text("too short")
    (tmp_path / "ours" / "store").mkdir(parents=True)  # the run's store folder: the user's
    (tmp_path / "ours" / "store" / "data.csv").write_text("1,2\n")
    return tmp_path


def _files(root: Path) -> dict[str, bytes | None]:
    """Every file under ``root`` and its bytes, and every folder (None): a refused command
    leaves the tree as it found it, a run's lock file included."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


def _call(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # tyro exits by itself (it must not: main returns a status)
        return e.code if isinstance(e.code, int) else 1


def check_one_line(err: str, argv: list[str], words: list[str]) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    command = argv[0]
    prefix = f"jaxoff {command}: error: " if command in COMMANDS else "jaxoff: error: "
    assert lines[0].startswith(prefix), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.mark.parametrize("argv, words", CASES, ids=[_id(c) for c in CASES])
def test_bad_invocation_fails_with_one_line_and_writes_nothing(argv, words, scratch, capsys):
    before = _files(scratch)
    code = _call(argv)
    out, err = capsys.readouterr()
    assert code not in (0, None), (out, err)
    assert "Traceback" not in out
    check_one_line(err, argv, words)
    assert _files(scratch) == before  # nothing written, changed or removed


def test_there_are_enough_cases_for_every_command():
    commands = [(c.values[0] if hasattr(c, "values") else c[0])[0] for c in CASES]
    assert len(commands) >= 40
    for name in COMMANDS:
        assert commands.count(name) >= 5, name


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "--optimizer", "foo"], ["--optimizer 'foo' is not a choice"]),
        (["io-bench", "--ops", "rw"], ["--ops 'rw' is not one of read, write"]),
    ],
)
def test_bad_invocation_end_to_end(argv, words, tmp_path):
    try:
        p = subprocess.run(
            [sys.executable, "-m", "jaxoff.cli", *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=HANG_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"jaxoff {' '.join(argv)} hung: no exit after {HANG_S:.0f} s (a bound on hangs "
            f"only; JAXOFF_TEST_TIMEOUT_SCALE scales it)"
        )
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    check_one_line(p.stderr, argv, words)
    assert list(tmp_path.iterdir()) == []
