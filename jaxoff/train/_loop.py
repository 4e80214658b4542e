"""The training loop: data, state, compiled step, metrics, checkpoints, exact resume."""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

from .. import _faults
from .._errors import ConfigError, JaxoffError
from ..aio import WAIT_COUNTERS, PageStoreCorruptError, io_stats, store_error_from
from ..distributed import barrier, broadcast_int, from_host
from ..placement import batch_sharding
from ..step import Step
from ..strategies import build_step
from ._checkpoint import Checkpoints
from ._checksums import CheckpointDamagedError
from ._config import TrainConfig
from ._data import Batches, data_batches
from ._metrics import (
    GIB,
    MetricsLog,
    disk_io_bytes,
    peak_rss_bytes,
    progress_display,
    rss_bytes,
    trim_metrics,
)
from ._preflight import missing_dirs, preflight, remove_if_empty
from ._resume import heal_store, pick_step, prepare_out_dir, reject, say
from ._rundir import RunLock
from ._summary import finish_run


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a run did: the steps it ran and their metrics records."""

    first_step: int
    last_step: int
    records: list[dict]

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records if "loss" in r]


def train(cfg: TrainConfig, model: Any = None) -> TrainResult:
    """Trains ``cfg.model`` for ``cfg.steps`` steps (or resumes); returns the metrics.

    ``model``, a model config object (a :class:`jaxoff.nn.LayeredModel`), replaces
    ``cfg.model``: train your own model from Python without a ``package.module:factory``.

    Example:
        >>> from jaxoff.train import TrainConfig, train
        >>> result = train(TrainConfig(model="tiny", steps=3, batch_size=2, seq_len=32,
        ...                            out_dir=tmp_path, progress=False, eval_every=0))
        ... # doctest: +ELLIPSIS
        jaxoff train: done, 3 steps of tiny in ...
        >>> len(result.losses)
        3
    """
    if model is not None:
        cfg = dataclasses.replace(cfg, model=model)
    made = missing_dirs(cfg)  # validation makes these folders: a refusal removes them
    try:
        cfg = cfg.validate()
        preflight(cfg)  # data, places, run directory, memory: all before a file is written
    except JaxoffError:
        remove_if_empty(made)
        raise
    use_compile_cache(cfg)
    if jax.process_index() != 0:  # process 0 holds the run's lock and prepares its directory
        cfg = dataclasses.replace(cfg, progress=False)
        return _train_locked(cfg)
    with RunLock(cfg.out_dir) as lock:  # before anything in the run directory is deleted
        try:
            return _train_locked(cfg)
        except (ConfigError, CheckpointDamagedError):
            lock.refused()  # a refusal under the lock leaves run.lock as it was
            raise


_compile_cache_set: str | None = None  # the directory use_compile_cache last set


def use_compile_cache(cfg: TrainConfig) -> str | None:
    """Points JAX's persistent compilation cache where ``cfg.compile_cache`` says; returns the
    directory in use (None: none configured).

    A directory configured outside jaxoff (``JAX_COMPILATION_CACHE_DIR``, ``jax.config``) is
    kept by ``auto`` and ``none``. One this function set for an earlier run of the same
    process is not: the next run's ``auto`` moves to its own ``<out_dir>/compile-cache``,
    and ``none`` turns it off, so that no run keeps writing into another run's directory
    (which may be gone). JAX fixes its cache at a process's first compilation; it is reset
    here whenever the directory changes, so the new one applies from the next compilation.
    """

    global _compile_cache_set
    # a flag jax.config holds at run time; its stubs do not declare it
    current = jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue]
    ours = current is not None and current == _compile_cache_set
    if cfg.compile_cache == "none":
        path = None if ours else current
    elif cfg.compile_cache == "auto":
        if current and not ours:
            return current
        path = str((Path(cfg.out_dir) / "compile-cache").absolute())
    else:
        path = str(Path(cfg.compile_cache).expanduser().absolute())
    if path != current:
        jax.config.update("jax_compilation_cache_dir", path)
        compilation_cache.reset_cache()
    _compile_cache_set = path if cfg.compile_cache != "none" else None
    return path


def _prepare(cfg: TrainConfig) -> int | None:
    """`prepare_out_dir` in process 0; every process gets its answer (the step to resume
    from), once process 0 is done with the run directory."""

    step = prepare_out_dir(cfg) if jax.process_index() == 0 else None
    if jax.process_count() == 1:
        return step
    barrier("jaxoff-prepared")
    step = broadcast_int(-1 if step is None else step)
    return None if step < 0 else step


def _train_locked(cfg: TrainConfig) -> TrainResult:
    out = Path(cfg.out_dir)
    restore_from = _prepare(cfg)
    if restore_from is not None and restore_from >= cfg.steps:  # before anything is built
        say(
            f"the run in {out} is complete at step {restore_from} of {cfg.steps}; nothing to "
            f"resume (to train longer, start a new run with more --steps)"
        )
        return TrainResult(restore_from, restore_from, [])
    _faults.point("train.init")
    batches, val_batches = data_batches(
        cfg.data_options, cfg.seed, cfg.model_config().vocab_size, f"model {cfg.model_label()}"
    )

    step_fn = build_step(cfg)  # the plain, sharded or Fuyou step, with its optimizer
    try:
        ckpts = Checkpoints(
            out, cfg.keep_checkpoints, step_fn, paged_in_store=cfg.paged_checkpoint == "store"
        )
        try:
            if cfg.resume and cfg.store_dir() is not None:
                heal_store(cfg, restore_from)
            if restore_from is None:
                start, state = 0, step_fn.init()
            else:
                fall_back = functools.partial(_fall_back, cfg, ckpts)
                start, state = step_fn.restore(ckpts, restore_from, fall_back)
            trim_metrics(metrics_path(out), start)
            records = _loop(cfg, ckpts, step_fn, state, start, batches, val_batches)
        finally:
            _close_quietly(ckpts.close)
    finally:
        _close_quietly(step_fn.close)  # releases the page store's lock
    end = min(cfg.steps, cfg.stop_at) if cfg.stop_at else cfg.steps
    finish_run(cfg, records)  # the summary and loss.png (process 0)
    return TrainResult(start, end, records)


def _fall_back(cfg, ckpts: Checkpoints, step: int, error, damaged: list[int]) -> int:
    """Checkpoint ``step`` has a damaged paged part in processes ``damaged``: refused (one
    line), or with ``--resume-fallback`` removed, all processes going back together to the
    newest intact checkpoint before it (chosen by process 0); returns that step. In one
    process, ``error`` is the damage found (the step's ``PageStoreCorruptError``).

    The steps call it (`jaxoff.step.FallBack`) from their ``restore``."""

    if isinstance(error, PageStoreCorruptError):  # the working store was checked before: the copy
        error = CheckpointDamagedError(str(error).removeprefix("restore_paged: "))
    damaged_step = step
    if jax.process_count() == 1:
        reject(cfg, step, error)
        ckpts.discard(step)
        return pick_step(cfg)
    if not cfg.resume_fallback:
        if error is None:  # the damaged process says which file
            raise JaxoffError(
                f"--resume: checkpoint {step}: the paged part of process(es) "
                f"{', '.join(map(str, damaged))} is damaged (see their message); pass "
                f"--resume-fallback to resume every process from the checkpoint before it"
            )
        reject(cfg, step, error)  # raises, naming the file
    if jax.process_index() == 0:
        say(
            f"checkpoint {step}: the paged part of process(es) "
            f"{', '.join(map(str, damaged))} is damaged; removed it, every process falls "
            f"back to the checkpoint before it"
        )
        ckpts.discard(step)
        step = pick_step(cfg)
    barrier(f"jaxoff-fallback-{damaged_step}")
    ckpts.reload()  # orbax's list of steps, in every process
    return broadcast_int(step if jax.process_index() == 0 else -1)


def metrics_path(out: Path) -> Path:
    """The metrics log of this process: ``metrics.jsonl`` (process 0) or
    ``metrics.process-<i>.jsonl``."""
    p = jax.process_index()
    return out / ("metrics.jsonl" if p == 0 else f"metrics.process-{p}.jsonl")


def _global_batches(batches: Batches, mesh):
    """``batches`` as global token arrays when several processes feed one mesh (each holds
    the whole batch, as the data is the same everywhere, and gives its devices' rows)."""
    if jax.process_count() == 1:
        return batches

    sharding = batch_sharding(mesh)
    return lambda i: tuple(from_host(x, sharding) for x in batches(i))


def _loop(cfg, ckpts, step_fn: Step, state, start, batches, val_batches):
    t0 = time.perf_counter()
    mesh = cfg.mesh()  # the batches are global arrays over it when processes share it
    batches = _global_batches(batches, mesh)
    val_batches = _global_batches(val_batches, mesh)
    io_split = IoSplit(step_fn.io_table())
    state = step_fn.compile(state, *batches(start))
    compile_s = time.perf_counter() - t0

    end = min(cfg.steps, cfg.stop_at) if cfg.stop_at else cfg.steps
    log = MetricsLog(metrics_path(Path(cfg.out_dir)), run=cfg)  # + lr, TensorBoard
    records: list[dict] = []
    data = cfg.data_options
    tokens_per_step = data.grad_accum * data.batch_size * data.seq_len  # every micro-batch
    loop_start = time.perf_counter()
    try:
        display = progress_display(cfg.steps, start, cfg.progress, cfg, io_split.snapshot)
        with display as bar:  # also: the stall watchdog, one line on SIGINT/SIGTERM
            for step in range(start + 1, end + 1):
                inputs, targets = batches(step - 1)
                bar.step_started(step)
                t = time.perf_counter()
                io0 = disk_io_bytes()
                split0 = io_split.snapshot()
                try:
                    state, metrics = step_fn(state, inputs, targets)
                    loss = float(metrics["loss"])  # waits for the step
                except jax.errors.JaxRuntimeError as e:
                    raise _step_error(e, step) from None
                dt = time.perf_counter() - t
                bar.step_finished()
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
                    "disk_read_mbps": (io1[0] - io0[0]) / dt / 1e6,
                    "disk_write_mbps": (io1[1] - io0[1]) / dt / 1e6,
                    "disk_read_gbps": (io1[0] - io0[0]) / dt / 1e9,
                    "disk_write_gbps": (io1[1] - io0[1]) / dt / 1e9,
                    **io_split.record(split0, dt),
                    **step_fn.phase_times(),  # FSDP with a paged optimizer: its phases
                }
                if step == start + 1:
                    record["compile_s"] = compile_s
                if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
                    record["val_loss"] = _evaluate(
                        step_fn.evaluate, state, val_batches, cfg.eval_batches
                    )
                _faults.point("train.step")
                # the line goes first: a step that counts as checkpointed always has its line
                log.write(record)
                _faults.point("train.metrics")
                records.append(record)
                # the step counts as done before its checkpoint is written: a stop during the
                # save says "after step N" with checkpoint N, never after N - 1
                bar.update(step, _bar_stats(record, records))
                if (cfg.ckpt_every and step % cfg.ckpt_every == 0) or step == end:
                    ckpts.save(step, state)
    finally:
        log.close()
    return records


def _step_error(e: Exception, step: int) -> Exception:
    """The page store's own message when a step died in it (e.g. a full disk); the store
    raised it inside a host callback or an FFI call, which XLA reports wrapped in a long
    runtime error."""

    found = store_error_from(e)
    return e if found is None else JaxoffError(f"step {step}: {found}")


def _close_quietly(close) -> None:
    """Runs ``close`` in a ``finally``: its own error must not replace the one that is
    propagating (a failed checkpoint leaves orbax's manager in a state it complains about)."""
    if sys.exc_info()[0] is None:
        close()
        return
    try:
        close()
    except Exception:  # noqa: BLE001 - the propagating error says what happened
        pass


def _evaluate(evaluate, state, val_batches, eval_batches: int) -> float:
    losses = [float(evaluate(state, *val_batches(i))) for i in range(eval_batches)]
    return float(np.mean(losses))


class IoSplit:
    """A paged step's time split, from the counters of the optimizer's file table (its
    engine and its pager: `jaxoff.aio.io_stats`).

    Per step: ``io_s``, the wall time the engine had reads or writes in flight;
    ``io_wait_s``, the time the step's paging calls spent blocked on them (takes waiting for
    their reads, puts for a free write slot, the begin for the previous step's commit);
    ``compute_s`` =
    step time - ``io_wait_s``; ``io_hidden`` = 1 - ``io_wait_s`` / ``io_s`` (at least 0),
    the share of the paging I/O that ran behind compute. Nothing when the optimizer is not
    paged.
    """

    def __init__(self, table: str | None):
        """``table``: the file table the step pages through (`jaxoff.step.Step.io_table`;
        None: it pages nothing)."""
        self._table = table

    def snapshot(self) -> dict | None:
        return io_stats(self._table) if self._table else None

    def record(self, before: dict | None, step_s: float) -> dict:
        after = self.snapshot()
        if before is None or after is None:  # not paged, or the table was registered now
            return {}
        io = (after["io_busy_ns"] - before["io_busy_ns"]) / 1e9
        wait = sum(after[k] - before[k] for k in WAIT_COUNTERS) / 1e9
        return {
            "io_s": io,
            "io_wait_s": wait,
            "compute_s": step_s - wait,
            "io_hidden": max(0.0, 1.0 - wait / io) if io > 0 else None,
        }


def _bar_stats(record: dict, records: list[dict]) -> dict:
    val = next((r["val_loss"] for r in reversed(records) if "val_loss" in r), None)
    stats = {"loss": f"{record['loss']:.3f}"}
    if val is not None:
        stats["val"] = f"{val:.3f}"
    stats["tok/s"] = f"{record['tokens_per_s']:,.0f}"
    if record["disk_read_mbps"] or record["disk_write_mbps"]:
        r, w = record["disk_read_mbps"], record["disk_write_mbps"]
        stats["disk r/w"] = f"{r:,.0f}/{w:,.0f} MB/s"
    if record.get("io_hidden") is not None:
        stats["io hidden"] = f"{100 * record['io_hidden']:.0f}%"
    stats["rss"] = f"{record['rss_gib']:.2f} GiB"
    return stats
