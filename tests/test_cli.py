import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxoff.cli import main
from jaxoff.train import TrainConfig, load_config_file

ROOT = Path(__file__).resolve().parents[1]
CONFIG_FILES = sorted((ROOT / "configs").glob("*.toml"))


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
    return subprocess.run(
        [sys.executable, "-m", "jaxoff.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_help_documents_every_option():
    out = run_cli("train", "--help")
    assert out.returncode == 0
    for field in TrainConfig.__dataclass_fields__:
        assert "--" + field.replace("_", "-") in out.stdout, field


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
    saved = json.loads((out / "config.json").read_text())
    assert saved["model"] == "tiny" and saved["steps"] == 3 and saved["batch_size"] == 2
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
