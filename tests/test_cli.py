import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _limits import HANG_S

from jaxoff import cli
from jaxoff.cli import main
from jaxoff.train import TrainConfig, load_config_file
from jaxoff.train._options import flat_options

ROOT = Path(__file__).resolve().parents[1]
CONFIG_FILES = sorted((ROOT / "configs").glob("*.toml"))


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """Every command here runs in its own folder: a default --out-dir (runs/default) or
    --out lands in tmp_path, never in the working tree."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_shipped_config_parses_and_builds(path, tmp_path):
    values = load_config_file(path)
    cfg = TrainConfig(**{**values, "out_dir": tmp_path / "out"}).validate()
    model_cfg = cfg.model_config()
    assert model_cfg.num_params() > 0
    cfg.build_optimizer()  # every optimizer name resolves


def test_shipped_configs_exist():
    assert {p.name for p in CONFIG_FILES} >= {"default.toml", "tiny-debug.toml"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [sys.executable, "-m", "jaxoff.cli", *args],
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"jaxoff {' '.join(args)} hung: no exit after {HANG_S:.0f} s (a bound on hangs "
            f"only, not on speed; JAXOFF_TEST_TIMEOUT_SCALE scales it)"
        )


def test_help_documents_every_option():
    out = run_cli("train", "--help")
    assert out.returncode == 0
    from jaxoff.train._config import FLAT_NAMES  # every option, by its flat name

    for field in FLAT_NAMES:
        assert "--" + field.replace("_", "-") in out.stdout, field


def test_help_names_the_config_file_and_what_ckpt_every_0_does():
    out = run_cli("train", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.replace("│", " ").split())  # rich's box, unwrapped
    assert "--config FILE.toml" in text and "[train] table" in text
    assert "0: only the last step's" in text


@pytest.mark.parametrize(
    "args, fix",
    [
        (["--model", "huge"], "choose one of tiny"),
        (["--steps", "-3"], "--steps must be at least 1"),
        (["--data", "/no/such/corpus"], "no such file or directory"),
        (["--out-dir", "/proc/nope"], "choose another --out-dir"),
        (["--seq-len", "4096", "--model", "tiny"], "use a shorter --seq-len"),
        (["--policy", "sometimes"], "not a known policy"),
        (["--lr", "0"], "--lr must be positive"),
        (["--store-slots", "3"], "--store-slots must be 2 (crash-safe) or 1"),
    ],
)
def test_bad_input_is_one_clear_line(args, fix, capsys):
    code = main(["train", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert fix in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_bad_config_file_key(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[train]\nmodle = "tiny"\n')
    assert main(["train", "--config", str(bad)]) == 2
    assert "unknown keys ['modle']" in capsys.readouterr().err


def test_unknown_command(capsys):
    assert main(["trian"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_config_file_with_overrides_trains(tmp_path):
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--config",
            str(ROOT / "configs" / "tiny-debug.toml"),
            "--steps",
            "3",
            "--out-dir",
            str(out),
            "--no-progress",
            "--batch-size",
            "2",
        ]
    )
    assert code == 0
    saved = flat_options(json.loads((out / "config.json").read_text()))
    assert saved["model"] == "tiny" and saved["steps"] == 3 and saved["batch_size"] == 2
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "argv",
    [
        ["--debug", "train", "--model", "huge"],
        ["train", "--model", "huge", "--debug"],
    ],
)
def test_debug_prints_the_traceback_before_the_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ConfigError" in err
    assert _lines(err)[-1].startswith("jaxoff train: error: --model huge is not a known size")


def test_debug_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("JAXOFF_DEBUG", "1")
    assert main(["train", "--model", "huge"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_debug_shows_tyros_own_report_of_a_bad_option(capsys):
    assert main(["--debug", "train", "--steps", "many"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Argument helptext" in err  # tyro's box, in full
    assert _lines(err)[-1] == (
        "jaxoff train: error: --steps: 'many' is not an integer; see jaxoff train --help"
    )


def _failing_command(monkeypatch, error: BaseException) -> None:
    """``jaxoff io-bench`` parses its options as usual, then its run raises ``error``."""
    from jaxoff._iobench import IOBenchConfig

    def run(config):
        raise error

    command = cli.Command(IOBenchConfig, run, "fails")
    monkeypatch.setitem(cli.COMMANDS, "io-bench", lambda: command)
    monkeypatch.setattr(IOBenchConfig, "validate", lambda self: self)


def test_a_bug_is_one_line_that_says_so(monkeypatch, capsys):
    _failing_command(monkeypatch, RuntimeError("the frobnicator\nbroke"))
    assert main(["io-bench"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = _lines(err)
    assert line.startswith("jaxoff io-bench: error: internal error, a bug in jaxoff: ")
    assert "RuntimeError: the frobnicator broke" in line and "rerun with --debug" in line


def test_a_bug_with_debug_shows_the_traceback(monkeypatch, capsys):
    _failing_command(monkeypatch, RuntimeError("boom"))
    assert main(["io-bench", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "raise error" in err
    assert "a bug in jaxoff: RuntimeError: boom" in _lines(err)[-1]


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.ENOSPC, ["No space left on device (ENOSPC)", "the disk is full"]),
        (errno.EFBIG, ["(EFBIG)", "another filesystem"]),
        (errno.EACCES, ["Permission denied (EACCES)", "choose a directory you can write"]),
        (errno.ENOENT, ["(ENOENT)", "check the path"]),
        (errno.EROFS, ["Read-only file system (EROFS)", "writable filesystem"]),
    ],
)
def test_a_failing_file_system_is_one_line_naming_the_path(code, words, monkeypatch, capsys):
    path = "/nvme/run/store/opt.0003"
    _failing_command(monkeypatch, OSError(code, os.strerror(code), path))
    assert main(["io-bench"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = _lines(err)
    assert line.startswith(f"jaxoff io-bench: error: {path}: ")
    for w in words:
        assert w in line, (w, line)


def test_an_os_error_behind_another_error_is_found(monkeypatch, capsys):
    try:
        raise OSError(errno.ENOSPC, "No space left on device", "/nvme/x")
    except OSError as e:
        try:
            raise RuntimeError("checkpoint save failed") from e
        except RuntimeError as wrapped:
            error = wrapped
    _failing_command(monkeypatch, error)
    assert main(["io-bench"]) == 1
    (line,) = _lines(capsys.readouterr().err)
    assert line.startswith("jaxoff io-bench: error: /nvme/x: No space left on device (ENOSPC)")


def test_help_still_works_in_process(capsys):
    assert main(["io-bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--block-sizes" in out and "--ops" in out


def test_plan_report_in_a_log_keeps_every_name_whole(capsys):
    """Printed to a file or pipe (capsys is not a terminal), the plan's tables are as wide as
    their content: no name is cut to ``preset offlo…``."""
    from jaxoff.models.gpt import CONFIGS
    from jaxoff.plan import evaluate, preset, profile, solve
    from jaxoff.plan._config import compared_presets, preset_plan
    from jaxoff.plan._report import print_plan

    prof = profile(CONFIGS["tiny"], 2, 16, model="tiny", calibrate=False)
    hw = preset("a100-40")
    plan = solve(prof, hw)
    others = [
        (
            f"preset {name} (does not fit, a label longer than 80 columns allow)",
            p,
            evaluate(prof, hw, p),
        )
        for name in compared_presets()
        for p in [preset_plan(prof, name)]
    ]
    capsys.readouterr()
    print_plan(prof, hw, plan, evaluate(prof, hw, plan), others)
    out = capsys.readouterr().out
    assert "…" not in out
    for name in compared_presets():
        assert f"preset {name} (does not fit, a label longer than 80 columns allow)" in out
    assert max(len(line) for line in out.splitlines()) > 80  # full width, not wrapped


def test_compare_table_in_a_log_keeps_every_name_whole(capsys):
    from jaxoff import _output
    from jaxoff.compare import _report

    policies = ["attn_probs=remat,mlp_act=offload,*=device", "offload_dots", "none"]
    rows = [
        dict(
            policy=p,
            placement="host_params_stream2",
            remat_every=1,
            temp_bytes=1 << 20,
            host_bytes=0,
            recompute_overhead=0.1,
            step_s=0.5,
            peak_rss_bytes=1 << 30,
            pareto=True,
        )
        for p in policies
    ]
    _output.console().print(_report.table(rows, "a title " * 20))
    out = capsys.readouterr().out
    assert "…" not in out
    for p in policies:
        assert p in out
    assert "host_params_stream2" in out
