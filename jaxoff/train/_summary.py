"""How a run ends: a summary and a loss curve when it finishes, one line when it is stopped.

The summary (stdout, also with ``--no-progress``) gives the final training and validation
losses, the time, where the metrics, TensorBoard events, checkpoints and loss curve are, and
the next commands to try. The curve, ``loss.png`` in the run directory, plots the training
and validation losses of every step in ``metrics.jsonl`` (steps before a resume included).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path

import jax

from ._checkpoint import complete_steps
from ._records import read_metrics
from ._tensorboard import TB_DIR
from ._watchdog import duration

PLOT = "loss.png"


def resume_command(cfg) -> str:
    """The command that continues this run: the command line it was started with, less
    ``--overwrite``, plus ``--resume``; from Python, the ``TrainConfig`` to pass."""

    if jax.process_count() > 1:
        return "the same jaxoff launch command with --resume among train's options"
    argv = sys.argv[1:]
    if os.path.basename(sys.argv[0]) in ("jaxoff", "__main__.py") and argv[:1] == ["train"]:
        args = [a for a in argv if a not in ("--overwrite", "--resume", "--no-resume")]
        return shlex.join(["jaxoff", *args, "--resume"])
    return f"train(TrainConfig(..., out_dir={str(cfg.out_dir)!r}, resume=True))"


def last_checkpoint(out_dir: Path) -> int | None:
    """The newest checkpoint saved completely (None: none yet)."""
    steps = complete_steps(Path(out_dir) / "checkpoints")
    return steps[-1] if steps else None


def stopped_line(cfg, step: int, why: str) -> str:
    """One line for a run stopped at ``step`` (by ``why``): the last checkpoint, and the
    command that resumes from it."""
    out = Path(cfg.out_dir)
    ckpt = last_checkpoint(out)
    if ckpt is None:
        saved = "no checkpoint yet, a resume starts at step 0"
    else:
        saved = f"last checkpoint: step {ckpt} ({out / 'checkpoints' / str(ckpt)})"
    return (
        f"jaxoff train: stopped by {why} after step {step} of {cfg.steps}; {saved}; "
        f"resume with: {resume_command(cfg)}"
    )


def plot_losses(records: list[dict], path: Path, title: str = "") -> Path:
    """Training (and validation) loss against step as a PNG (matplotlib's Agg, no display)."""
    # heavy: matplotlib loads only to draw the curve
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # (the same)

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", linewidth=1)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if train or val:
        ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    tmp.replace(path)
    return path


def summary_lines(cfg, records: list[dict], run_records: list[dict], plot: Path | None):
    """The summary: ``records`` are this run's steps, ``run_records`` every step in the
    run's ``metrics.jsonl``."""
    out = Path(cfg.out_dir)
    steps = [r["step"] for r in records]
    end = steps[-1] if steps else 0
    lines = []
    if steps:
        loop_s = records[-1].get("elapsed_s", 0.0)
        compile_s = records[0].get("compile_s", 0.0)
        tokens = len(steps) * cfg.grad_accum * cfg.batch_size * cfg.seq_len
        span = f"steps {steps[0]}-{end}" if steps[0] > 1 else f"{len(steps)} steps"
        lines.append(
            f"jaxoff train: done, {span} of {cfg.model_label()} in {duration(loop_s)} "
            f"(+ {duration(compile_s)} compiling), {tokens / max(loop_s, 1e-9):,.0f} tokens/s"
        )
    last = next((r for r in reversed(run_records) if "loss" in r), None)
    val = next((r for r in reversed(run_records) if "val_loss" in r), None)
    losses = [f"final loss {last['loss']:.4f} (step {last['step']})"] if last else []
    if val is not None:
        losses.append(f"validation loss {val['val_loss']:.4f} (step {val['step']})")
    else:
        losses.append("no validation loss (--eval-every 0)")
    lines.append("  " + ", ".join(losses))
    ckpt = last_checkpoint(out)
    where = [
        ("metrics", out / "metrics.jsonl"),
        ("tensorboard", out / TB_DIR),
        ("checkpoints", f"{out / 'checkpoints'} (last: step {ckpt})" if ckpt else "none"),
        ("loss curve", plot if plot is not None else "not drawn"),
    ]
    lines += [f"  {name:<12} {path}" for name, path in where]
    if end < cfg.steps:
        lines.append(
            f"  stopped at step {end} of {cfg.steps}; continue with: {resume_command(cfg)}"
        )
    viewer = "" if importlib.util.find_spec("tensorboard") else "  (pip install tensorboard)"
    lines.append(f"next: tensorboard --logdir {out / TB_DIR}{viewer}")
    if cfg.init_from is not None:  # the way back to the checkpoint's own format
        lines.append(
            f"      jaxoff export --run {out} --out DIR   (a Hugging Face folder of the "
            f"trained model)"
        )
    else:
        lines.append(
            f"      jaxoff compare --model {cfg.model_label()}   (memory and time of the "
            f"remat/offload policies)"
        )
    return lines


def finish_run(cfg, records: list[dict]) -> list[str]:
    """At the end of a run (process 0): draws ``loss.png`` and prints the summary; returns
    its lines."""

    if jax.process_index() != 0:
        return []
    out = Path(cfg.out_dir)
    path = out / "metrics.jsonl"
    run_records = read_metrics(path) if path.exists() else list(records)
    plot = (
        plot_losses(run_records, out / PLOT, f"{cfg.model_label()}: {out}") if run_records else None
    )
    lines = summary_lines(cfg, records, run_records, plot)
    print("\n".join(lines), flush=True)
    return lines
