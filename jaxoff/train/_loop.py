"""The training loop: data, state, compiled step, metrics, checkpoints, exact resume."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .._errors import ConfigError
from ..placement import (
    abstract_with,
    fetch_params,
    jit_step,
    state_shardings,
    streamed_model,
)
from ..step import abstract_state, init_state, make_loss_fn, make_train_step
from ._checkpoint import Checkpoints, check_resumable
from ._config import RESUMABLE_CHANGES, TrainConfig
from ._data import Batches, check_vocab, load_tokens, split
from ._metrics import (
    GIB,
    MetricsLog,
    ProgressBar,
    disk_io_bytes,
    peak_rss_bytes,
    read_metrics,
    rss_bytes,
)


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a run did: the steps it ran and their metrics records."""

    first_step: int
    last_step: int
    records: list[dict]

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records if "loss" in r]


def _prepare_out_dir(cfg: TrainConfig, ckpts: Checkpoints) -> None:
    out = Path(cfg.out_dir)
    config_path = out / "config.json"
    if cfg.resume:
        check_resumable(out, cfg.to_json(), RESUMABLE_CHANGES)
        if ckpts.latest_step() is None:
            raise ConfigError(
                f"--resume: no checkpoint in {ckpts.directory}; the run stopped before its first "
                f"checkpoint (start again without --resume, or lower --ckpt-every)"
            )
        return
    if config_path.exists() or (out / "metrics.jsonl").exists():
        if not cfg.overwrite:
            raise ConfigError(
                f"--out-dir {out} already holds a run; pass --resume to continue it, "
                f"--overwrite to replace it, or choose another --out-dir"
            )
        for name in ("metrics.jsonl", "config.json"):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(ckpts.directory, ignore_errors=True)
        shutil.rmtree(ckpts.paged_directory, ignore_errors=True)
        if cfg.store == "auto":  # the run's own store goes with it
            shutil.rmtree(cfg.store_dir(), ignore_errors=True)
        ckpts.directory.mkdir(parents=True)
    config_path.write_text(json.dumps(cfg.to_json(), indent=2, sort_keys=True))


def _trim_metrics(path: Path, last_step: int) -> None:
    """On resume, drops log lines of steps after the checkpoint (they are re-run)."""
    if path.exists():
        kept = [r for r in read_metrics(path) if r.get("step", 0) <= last_step]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        tmp.replace(path)


def train(cfg: TrainConfig, model: Any = None) -> TrainResult:
    """Trains ``cfg.model`` for ``cfg.steps`` steps (or resumes); returns the metrics.

    ``model``, a model config object (a :class:`jaxoff.nn.LayeredModel`), replaces
    ``cfg.model``: train your own model from Python without a ``package.module:factory``.

    Example:
        >>> from jaxoff.train import TrainConfig, train
        >>> result = train(TrainConfig(model="tiny", steps=3, batch_size=2, seq_len=32,
        ...                            out_dir=tmp_path, progress=False, eval_every=0))
        >>> len(result.losses)
        3
    """
    if model is not None:
        cfg = dataclasses.replace(cfg, model=model)
    cfg = cfg.validate()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokens, vocab = load_tokens(cfg.data, cfg.tokenizer, cfg.token_dtype)
    check_vocab(vocab, cfg.model_config().vocab_size, f"model {cfg.model_label()}")
    train_tokens, val_tokens = split(tokens, cfg.val_fraction)
    batches = Batches(train_tokens, cfg.batch_size, cfg.seq_len, cfg.seed)
    val_batches = Batches(val_tokens, cfg.batch_size, cfg.seq_len, cfg.seed + 1)

    tx = cfg.build_optimizer()
    mesh = cfg.mesh()
    placement = cfg.resolved_placement()
    model_cfg = streamed_model(cfg.model_config(), placement, mesh)
    ckpts = Checkpoints(out, cfg.keep_checkpoints, tx)
    _prepare_out_dir(cfg, ckpts)
    if cfg.resume:
        start = ckpts.latest_step()
        graphdef, abstract = abstract_state(model_cfg, tx)
        shardings = state_shardings(placement, abstract, mesh)
        state = ckpts.restore(start, abstract_with(abstract, shardings))
        if ckpts.paged:
            # the store may be ahead of (or elsewhere than) the checkpoint: write it back
            state = state._replace(opt_state=ckpts.restore_paged(tx, start, state.params))
        _trim_metrics(out / "metrics.jsonl", start)
    else:
        start = 0
        graphdef, state = init_state(model_cfg, tx, cfg.seed)

    t0 = time.perf_counter()
    step_fn, shardings = jit_step(make_train_step(graphdef, tx, placement), placement, state, mesh)
    state = jax.device_put(state, shardings)
    step_fn = step_fn.lower(state, *batches(start)).compile()
    compile_s = time.perf_counter() - t0
    eval_fn = jax.jit(make_loss_fn(graphdef, fetch_params(placement)))

    end = min(cfg.steps, cfg.stop_at) if cfg.stop_at else cfg.steps
    log = MetricsLog(out / "metrics.jsonl")
    records: list[dict] = []
    tokens_per_step = cfg.batch_size * cfg.seq_len
    loop_start = time.perf_counter()
    try:
        with ProgressBar(cfg.steps, start, cfg.progress) as bar:
            for step in range(start + 1, end + 1):
                inputs, targets = batches(step - 1)
                t = time.perf_counter()
                io0 = disk_io_bytes()
                state, metrics = step_fn(state, inputs, targets)
                loss = float(metrics["loss"])  # waits for the step
                dt = time.perf_counter() - t
                io1 = disk_io_bytes()
                record = {
                    "step": step,
                    "loss": loss,
                    "grad_norm": float(metrics["grad_norm"]),
                    "step_time_s": dt,
                    "tokens_per_s": tokens_per_step / dt,
                    "rss_gib": rss_bytes() / GIB,
                    "peak_rss_gib": peak_rss_bytes() / GIB,
                    "elapsed_s": time.perf_counter() - loop_start,
                    "disk_read_gbps": (io1[0] - io0[0]) / dt / 1e9,
                    "disk_write_gbps": (io1[1] - io0[1]) / dt / 1e9,
                }
                if step == start + 1:
                    record["compile_s"] = compile_s
                if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
                    record["val_loss"] = _evaluate(eval_fn, state.params, val_batches, cfg)
                if (cfg.ckpt_every and step % cfg.ckpt_every == 0) or step == end:
                    ckpts.save(step, state)
                log.write(record)
                records.append(record)
                bar.update(step, _bar_stats(record, records))
    finally:
        log.close()
        ckpts.close()
        if hasattr(tx, "close"):
            tx.close()  # releases the page store's lock
    return TrainResult(start, end, records)


def _evaluate(eval_fn, params, val_batches: Batches, cfg: TrainConfig) -> float:
    losses = [float(eval_fn(params, *val_batches(i))) for i in range(cfg.eval_batches)]
    return float(np.mean(losses))


def _bar_stats(record: dict, records: list[dict]) -> dict:
    val = next((r["val_loss"] for r in reversed(records) if "val_loss" in r), None)
    stats = {"loss": f"{record['loss']:.3f}"}
    if val is not None:
        stats["val"] = f"{val:.3f}"
    stats["tok/s"] = f"{record['tokens_per_s']:,.0f}"
    if record["disk_read_gbps"] or record["disk_write_gbps"]:
        stats["disk r/w"] = f"{record['disk_read_gbps']:.2f}/{record['disk_write_gbps']:.2f}GB/s"
    stats["rss"] = f"{record['rss_gib']:.2f}GiB"
    return stats
