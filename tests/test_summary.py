"""The end of a run: the summary (also with --no-progress) and loss.png."""

from __future__ import annotations

import dataclasses

from jaxoff.train import TrainConfig, train
from jaxoff.train._metrics import read_metrics
from jaxoff.train._summary import PLOT, plot_losses, resume_command, stopped_line

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_summary_and_loss_curve_after_a_tiny_run(tiny_train_args, capsys):
    cfg = TrainConfig(**{**tiny_train_args, "steps": 6, "eval_every": 3})
    assert cfg.progress is False  # --no-progress: the summary is still printed
    train(cfg)
    out = cfg.out_dir
    lines = capsys.readouterr().out.splitlines()
    records = read_metrics(out / "metrics.jsonl")
    summary = "\n".join(lines)
    assert lines[0].startswith("jaxoff train: done, 6 steps of tiny in "), lines
    assert f"final loss {records[-1]['loss']:.4f} (step 6)" in summary
    assert f"validation loss {records[-1]['val_loss']:.4f} (step 6)" in summary
    assert f"  metrics      {out / 'metrics.jsonl'}" in lines
    assert f"  tensorboard  {out / 'tb'}" in lines
    assert f"  checkpoints  {out / 'checkpoints'} (last: step 6)" in lines
    assert f"  loss curve   {out / PLOT}" in lines
    assert any(line.startswith(f"next: tensorboard --logdir {out / 'tb'}") for line in lines)
    assert any("jaxoff compare --model tiny" in line for line in lines)

    png = (out / PLOT).read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    import matplotlib.image

    pixels = matplotlib.image.imread(out / PLOT)
    assert pixels.shape[:2] == (400, 700) and pixels.std() > 0  # something is drawn


def test_stopped_run_summary_says_how_to_continue(tiny_train_args, capsys):
    cfg = TrainConfig(**{**tiny_train_args, "steps": 8, "stop_at": 3})
    train(cfg)
    text = capsys.readouterr().out
    assert "3 steps of tiny" in text
    assert "stopped at step 3 of 8; continue with: " in text
    assert "resume=True" in text  # from Python: the TrainConfig to pass
    assert "no validation loss (--eval-every 0)" in text


def test_resume_command_from_the_command_line(monkeypatch, tmp_path):
    cfg = TrainConfig(out_dir=tmp_path)
    argv = ["/venv/bin/jaxoff", "train", "--steps", "50", "--overwrite", "--out-dir", "r b"]
    monkeypatch.setattr("sys.argv", argv)
    assert resume_command(cfg) == "jaxoff train --steps 50 --out-dir 'r b' --resume"
    line = stopped_line(dataclasses.replace(cfg, steps=50), 7, "SIGTERM")
    assert line == (
        "jaxoff train: stopped by SIGTERM after step 7 of 50; no checkpoint yet, a resume "
        "starts at step 0; resume with: jaxoff train --steps 50 --out-dir 'r b' --resume"
    )


def test_plot_without_validation(tmp_path):
    path = plot_losses([{"step": s, "loss": 3.0 / s} for s in range(1, 5)], tmp_path / "l.png")
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert not list(tmp_path.glob("*.tmp.png"))
