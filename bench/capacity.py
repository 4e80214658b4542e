"""Largest GPT that trains on this machine: paged AdamW (jaxoff) versus plain flax + optax AdamW.

Every probe runs in a child process of its own (``python bench/capacity.py --child ...``), so
each has its own peak RSS and an OOM kill never takes down the search. A probe builds the
model, runs ``--steps`` real training steps (batch ``--batch-size`` x ``--seq-len`` random
byte tokens, full remat ``nothing_saveable``, layers scanned, state donated) and reports
parameters, peak RSS (``ru_maxrss`` of the child from ``os.wait4``), step times, whether the
losses were finite, the bytes of the page store on disk and the training-state bytes
(parameters + gradients + optimizer moments + master weights, at their dtypes).

Modes:
  plain       flax NNX GPT, fp32 parameters, ``optax.adamw``: all in RAM (16 B/param).
  plain-bf16  bf16 parameters and gradients in RAM, fp32 masters and fp32 moments in RAM
              (mixed precision without paging: 2 + 2 + 12 = 16 B/param).
  paged       bf16 parameters and gradients in RAM, ``jaxoff.optim.paged(optax.adamw)`` with
              fp32 masters and moments in a page store under ``--store-dir`` (``--slots`` x
              12 B/param on disk), stepped with ``jaxoff.optim.update_and_apply``.
  fuyou       the same paged AdamW, run inside the backward layer scan
              (``jaxoff.strategies`` fuyou: layer j's update as soon as its gradients exist,
              so only one layer's gradients are ever in RAM), with the stacked blocks kept as
              their bits and updated in place (``blocks_as_bits``): ~2 B/param in RAM.
  fuyou-nvme  fuyou with the stacked block parameters in the page store too (ZeRO-Infinity's
              parameter offload, ``page_params=True``): each layer's bf16 parameters are
              read a layer ahead in forward and backward and written by its update; the
              model is made and written one layer at a time, so it is never whole in RAM
              (``--slots`` x 14 B/param on disk).

Training data: ``--data corpus`` (default) samples windows of jaxoff's embedded byte corpus,
so the loss can fall; ``--data random`` gives uniform random bytes (the loss cannot). The
learning rate warms up linearly from 0 over ``--warmup-steps`` steps to ``--lr`` (0: a
constant rate). A probe fits only when every loss is finite, and with ``--steps`` >= 10 also
when the loss fell: its steps then make two passes over ceil(steps / 2) fixed windows (step i
trains on window i mod ceil(steps / 2)), and the mean loss of the second pass must be below
that of the first pass over the same windows (``pass_losses``). At batch 1 x 128 tokens one
window's loss differs from another's by more than ten steps of training move it, so losses of
different windows cannot tell a falling loss from easier windows.

Sizes: GPT-2 shapes (``d_ff = 4 d_model``, head dim 128, learned positions, 256-byte vocab)
at a fixed width ``--d-model`` (default 2048, as in the 1.21B baseline of
shared/JAX-ON-CPU.md); a size is its number of layers, so sizes step by one block
(12 d^2 + 13 d parameters, 50.4M at d = 2048). The search per mode starts at ``--start``
(a parameter count, rounded to layers), walks up or down by ``--grow`` until it has a fitting
and a failing size, then bisects on layers. A probe fits when it finishes its steps with
finite losses and its RSS stays below ``--mem-limit-gib`` (enforced in the child by a psutil
watchdog thread that also stops it when the machine has under ``--min-available-gib`` left,
so it never gets to the kernel OOM killer). Paged sizes whose store would not fit the free
disk of ``--store-dir`` (minus ``--disk-reserve-gib``) are not run: they are "disk-bound".

Through the product: by default (``--via train``) a probe of the modes plain, paged, fuyou and
fuyou-nvme is a ``jaxoff train`` run (``jaxoff.train.train`` of `train_options`: the trainer's
model init, its Fuyou step, which holds 16-bit blocks as their bits, its data, its final
checkpoint, whose disk counts toward the disk cap), and the record holds its losses, the
validation losses at half the steps and at the end (the loss falls when the last is below
the first and the second half of the steps' losses is below the first on average) and the
peak RSS the trainer recorded each step (``peak_rss_steps``) beside the child's whole-process
peak (``peak_rss``). ``--via loop`` (and plain-bf16 always) runs this bench's own loop above,
instrumented with the engine's counters (``bench/fuyou_capacity.py``). Results are written in
``bench/_common/results.py``'s schema; ``bench/report.py`` computes the ratios from them.

    python bench/capacity.py --modes plain paged --out capacity.json
    python bench/capacity.py --mem-limit-gib 3 --d-model 1024 --steps 2   # quick validation
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GIB = 1 << 30
MODES = ("plain", "plain-bf16", "paged", "fuyou", "fuyou-nvme")
PAGED_MODES = ("paged", "fuyou", "fuyou-nvme")
STORE_BYTES_PER_PARAM = 12  # fp32 master + mu + nu, per slot
PARAM_STORE_BYTES = 2  # bf16 block parameters, per slot, with fuyou-nvme
FALLING_FROM = 10  # steps from which a probe must show a falling loss to fit
_PHASE = ["start"]  # what the child is doing, for the watchdog's verdict


# ----------------------------------------------------------------------------- sizes


def model_config(num_layers: int, d_model: int, seq_len: int, mode: str):
    """GPT-2-shaped config of ``num_layers`` blocks of width ``d_model`` for ``mode``."""
    from jaxoff.models.gpt import GPTConfig
    from jaxoff.nn import Stack

    bf16 = mode != "plain"
    dtype = "bfloat16" if bf16 else "float32"
    return GPTConfig(
        num_layers=num_layers,
        d_model=d_model,
        num_heads=max(1, d_model // 128),
        d_ff=4 * d_model,
        max_seq_len=max(seq_len, 1024),
        dtype=dtype,
        param_dtype=dtype,
        stack=Stack(policy="nothing_saveable"),
    )


def num_params(num_layers: int, d_model: int, seq_len: int) -> int:
    return model_config(num_layers, d_model, seq_len, "plain").num_params()


def layers_for(params: float, d_model: int, seq_len: int) -> int:
    """Fewest layers whose model has at least ``params`` parameters (at least 1)."""
    base = num_params(1, d_model, seq_len)
    per_layer = num_params(2, d_model, seq_len) - base
    return max(1, math.ceil((params - base) / per_layer) + 1)


def state_bytes_per_param(mode: str) -> dict[str, int]:
    """Training-state bytes per parameter, by part."""
    if mode == "plain":
        return {"params": 4, "grads": 4, "moments": 8, "masters": 0}
    return {"params": 2, "grads": 2, "moments": 8, "masters": 4}


def store_bytes_per_param(mode: str) -> int:
    """Page-store bytes per parameter and slot."""
    if mode not in PAGED_MODES:
        return 0
    return STORE_BYTES_PER_PARAM + (PARAM_STORE_BYTES if mode == "fuyou-nvme" else 0)


def checkpoint_bytes(n_params: int, mode: str, paged_checkpoint: str = "copy") -> int:
    """Disk a ``jaxoff train`` checkpoint of ``mode`` needs: the store's committed version
    (one slot; none with ``--paged-checkpoint store``, whose checkpoint names the store's
    version instead) and the parameters orbax holds: bf16 with ``paged``; none of the blocks
    with the fuyou modes (with ``fuyou`` they are the casts of the store's fp32 masters,
    with ``fuyou-nvme`` in the store; the embeddings and head left are not counted); fp32
    parameters and moments with ``plain``."""
    if mode == "plain":
        return 12 * n_params
    copy = 0 if paged_checkpoint == "store" else store_bytes_per_param(mode) * n_params
    return copy + (2 * n_params if mode == "paged" else 0)


def store_bytes(n_params: int, mode: str, slots: int = 2) -> int:
    """Disk the page store needs (every slot, chunk padding ignored)."""
    return slots * store_bytes_per_param(mode) * n_params


# ----------------------------------------------------------------------------- child


def _rss_watchdog(
    limit: int, min_available: int, result_path: Path, peak: list[int], by_phase: dict[str, float]
):
    """Polls RSS every 20 ms; over the limit (or the machine nearly out of memory) it writes
    the verdict to ``result_path`` and ends the process with exit status 3."""
    import psutil

    proc = psutil.Process()
    while True:
        rss = proc.memory_info().rss
        peak[0] = max(peak[0], rss)
        by_phase[_PHASE[0]] = max(by_phase.get(_PHASE[0], 0.0), round(rss / GIB, 3))
        avail = psutil.virtual_memory().available
        why = None
        if rss > limit:
            why = f"over-limit (RSS {rss / GIB:.2f} GiB > {limit / GIB:.2f} GiB, in {_PHASE[0]})"
        elif avail < min_available:
            why = (
                f"machine out of memory ({avail / GIB:.2f} GiB available, RSS "
                f"{rss / GIB:.2f} GiB, in {_PHASE[0]})"
            )
        if why:
            try:
                result_path.write_text(
                    json.dumps(
                        {
                            "status": "killed",
                            "why": why,
                            "watchdog_peak_rss": peak[0],
                            "peak_rss_gib_in": by_phase,
                        }
                    )
                )
            finally:
                os._exit(3)
        time.sleep(0.02)


class _LayerInit:
    """A stacked block leaf made one layer at a time when indexed (``fuyou_init`` reads it
    so): the whole leaf never exists."""

    def __init__(self, sds, keys, std, normal):
        self.shape, self.dtype, self.size = sds.shape, sds.dtype, math.prod(sds.shape)
        self._keys, self._std, self._normal = keys, std, normal

    def __getitem__(self, j):
        return self._normal(self._keys[j], self.shape[1:], self.dtype, self._std)


def _build_params(cfg, lazy_blocks: bool = False):
    """``(graphdef, params)`` with GPT-2 initialisation done leaf by leaf, and stacked block
    leaves one layer at a time into a donated buffer: init temporaries stay one layer's size
    (a whole-model jitted init peaks far above the parameters and would be measured).
    ``lazy_blocks``: the stacked leaves are `_LayerInit` (each layer made when read)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0))), nnx.Param)
    out_std = 0.02 / math.sqrt(2 * cfg.num_layers)
    keys = iter(jax.random.split(jax.random.key(0), 4096))

    @functools.partial(jax.jit, static_argnums=(1, 2, 3))
    def normal(key, shape, dtype, std):
        return (jax.random.normal(key, shape, jnp.float32) * std).astype(dtype)

    @functools.partial(jax.jit, static_argnums=(3,), donate_argnums=0)
    def set_layer(buf, i, key, std):
        x = normal(key, buf.shape[1:], buf.dtype, std)
        return jax.lax.dynamic_update_index_in_dim(buf, x, i, 0)

    def fill(path, sds):
        name = jax.tree_util.keystr(path)
        if "['scale']" in name:
            return jnp.ones(sds.shape, sds.dtype)
        if "['bias']" in name:
            return jnp.zeros(sds.shape, sds.dtype)
        std = out_std if ("['out']" in name or "['down']" in name) else 0.02
        if "['blocks']" not in name:
            return normal(next(keys), sds.shape, sds.dtype, std)
        if lazy_blocks:
            return _LayerInit(sds, [next(keys) for _ in range(sds.shape[0])], std, normal)
        buf = jnp.zeros(sds.shape, sds.dtype)
        for i in range(sds.shape[0]):
            buf = set_layer(buf, i, next(keys), std)
        return buf

    return graphdef, jax.tree_util.tree_map_with_path(fill, abstract)


ENGINE_COUNTERS = (
    "take_wait_ns", "put_wait_ns", "begin_wait_ns", "io_busy_ns", "read_bytes", "write_bytes",
    "takes", "puts",
)  # fmt: skip


def _counter_names() -> list[str]:
    """`_engine_counters`' keys: ``ENGINE_COUNTERS`` with ``*_ns`` as ``*_s``."""
    return [k.removesuffix("_ns") + "_s" if k.endswith("_ns") else k for k in ENGINE_COUNTERS]


def _engine_counters(table: str) -> dict[str, float]:
    """The cumulative paging counters of a Fuyou store's table (its pager's and its
    engine's, `jaxoff.aio.io_stats`): ``*_ns`` as seconds."""
    from jaxoff.aio import io_stats

    st = io_stats(table) or {}
    return {
        name: st.get(k, 0) / 1e9 if k.endswith("_ns") else st.get(k, 0)
        for k, name in zip(ENGINE_COUNTERS, _counter_names(), strict=True)
    }


class _Sampler:
    """Samples, every ``period`` seconds of one step, the process CPU time and the engine
    counters, to show where in the step the cores sit idle and what the step waits on."""

    def __init__(self, table: str, period: float = 1.0):
        import threading

        self.table, self.period = table, period
        self.t0 = time.perf_counter()
        self.rows = [self._row()]  # before the step starts
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _row(self) -> dict[str, float]:
        return {"t": time.perf_counter() - self.t0, "cpu_s": time.process_time()} | (
            _engine_counters(self.table)
        )

    def _run(self) -> None:
        while not self.done.wait(self.period):
            self.rows.append(self._row())

    def stop(self) -> list[dict]:
        """The rows, counters relative to the first (taken as the step started)."""
        self.done.set()
        self.thread.join()
        self.rows.append(self._row())
        first = self.rows[0]
        return [
            {k: round(v if k == "t" else v - first[k], 4) for k, v in r.items()} for r in self.rows
        ]


def run_probe(
    mode: str,
    num_layers: int,
    d_model: int,
    seq_len: int,
    batch_size: int,
    steps: int,
    store_dir: str | None,
    lr: float = 1e-4,
    slots: int = 2,
    warmup_steps: int = 3,
    data: str = "corpus",
    pure_io_reps: int = 0,
    read_ahead_mib: int | None = None,
) -> dict:
    """Builds the model of ``mode``, runs ``steps`` train steps in this process; returns the
    record (without peak RSS, which the parent takes from ``wait4``). ``pure_io_reps``: a
    paged mode's store is then replayed that many times without compute (every chunk read
    and written back, ``bench/paged_step.py``'s ``replay_io``), times in ``pure_io_s``.
    ``read_ahead_mib``: the fuyou modes' ``read_ahead_bytes`` (None: the library's default)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    cfg = model_config(num_layers, d_model, seq_len, mode)
    rec: dict = {
        "mode": mode,
        "num_layers": num_layers,
        "d_model": d_model,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "params": cfg.num_params(),
    }
    import psutil

    rss_at: dict[str, float] = {}
    rec["rss_gib_after"] = rss_at

    def phase(name: str) -> None:  # RSS at the end of the previous phase
        rss_at[_PHASE[0]] = round(psutil.Process().memory_info().rss / GIB, 3)
        _PHASE[0] = name

    t0 = time.perf_counter()
    phase("model init")
    graphdef, params = _build_params(cfg, lazy_blocks=mode == "fuyou-nvme")
    phase("optimizer init")
    lr = (
        optax.linear_schedule(0.0, lr, warmup_steps)
        if warmup_steps
        else optax.constant_schedule(lr)
    )
    read_ahead = None if read_ahead_mib is None else read_ahead_mib << 20
    n = sum(x.size for x in jax.tree.leaves(params))
    assert n == rec["params"], (n, rec["params"])

    def loss_fn(p, x, y):
        logits = nnx.merge(graphdef, p)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    tx = None
    if mode == "plain":
        tx = optax.adamw(lr)
        state = (params, tx.init(params))

        def step(state, x, y):
            p, s = state
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            u, s = tx.update(g, s, p)
            return (optax.apply_updates(p, u), s), loss

    elif mode == "plain-bf16":
        tx = optax.adamw(lr)
        masters = jax.jit(lambda p: jax.tree.map(lambda a: a.astype(jnp.float32), p))(params)
        state = (params, masters, tx.init(masters))

        def step(state, x, y):
            p, m, s = state
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            g = jax.tree.map(lambda a: a.astype(jnp.float32), g)
            u, s = tx.update(g, s, m)
            m = optax.apply_updates(m, u)
            return (jax.tree.map(lambda a, b: a.astype(b.dtype), m, p), m, s), loss

    elif mode == "paged":
        from jaxoff.optim import paged, update_and_apply

        tx = paged(optax.adamw(lr), store_dir, slots=slots)
        state = (params, tx.init(params))

        def step(state, x, y):
            p, s = state
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            return update_and_apply(tx, g, s, p), loss

    elif mode == "fuyou":
        from jaxoff.optim import paged
        from jaxoff.step import TrainState
        from jaxoff.strategies.fuyou import (
            blocks_to_bits,
            default_read_ahead_bytes,
            fuyou_init,
            make_fuyou_step,
        )

        tx = paged(optax.adamw(lr), store_dir, slots=slots)
        opt = fuyou_init(cfg, tx, params, read_ahead_bytes=read_ahead)
        rec["read_ahead_bytes"] = default_read_ahead_bytes() if read_ahead is None else read_ahead
        params = blocks_to_bits(params)  # in place: the arrays are donated
        state = TrainState(jnp.zeros((), jnp.int32), params, opt)
        fuyou_step = make_fuyou_step(graphdef, cfg, tx, blocks_as_bits=True)

        def step(state, x, y):
            state, metrics = fuyou_step(state, x, y)
            return state, metrics["loss"]

    elif mode == "fuyou-nvme":
        from jaxoff.optim import paged
        from jaxoff.step import TrainState
        from jaxoff.strategies.fuyou import fuyou_init, fuyou_resident, make_fuyou_step

        tx = paged(optax.adamw(lr), store_dir, slots=slots)
        opt = fuyou_init(cfg, tx, params, page_params=True, read_ahead_bytes=read_ahead)
        state = TrainState(jnp.zeros((), jnp.int32), fuyou_resident(params), opt)
        fuyou_step = make_fuyou_step(graphdef, cfg, tx, page_params=True)

        def step(state, x, y):
            state, metrics = fuyou_step(state, x, y)
            return state, metrics["loss"]

    else:
        raise ValueError(f"unknown mode {mode!r}")
    del params
    rec["init_s"] = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    if data == "corpus":
        from jaxoff.train import load_tokens

        corpus = load_tokens()[0].astype(np.int32)

    def new_batch():
        if data == "corpus":
            starts = rng.integers(0, corpus.size - seq_len - 1, batch_size)
            toks = np.stack([corpus[s : s + seq_len + 1] for s in starts])
        else:
            toks = rng.integers(0, 256, (batch_size, seq_len + 1), dtype=np.int32)
        return jnp.asarray(toks[:, :-1]), jnp.asarray(toks[:, 1:])

    # From FALLING_FROM steps the batches come in two passes over the same windows (step i
    # trains on window i mod ceil(steps / 2)), so that the loss of each window is seen before
    # and after training on it: at batch 1 x 128 tokens, one window's loss differs from the
    # next by more than ten steps of training move it, and a falling loss is told apart from
    # easier windows only on the same windows.
    passes = steps >= FALLING_FROM
    windows = [new_batch() for _ in range(-(-steps // 2))] if passes else None

    def batch(i=0):
        return windows[i % len(windows)] if passes else new_batch()

    phase("compile")
    t0 = time.perf_counter()
    # the paged mode compiles as jaxoff train does (jaxoff.compiler_options: on CPU, no
    # float32 copy of the stacked bf16 blocks); plain modes as a plain jit; the fuyou modes
    # scan their blocks' bits and need none
    from jaxoff import compiler_options

    options = compiler_options(state) if mode == "paged" else {}
    rec["compiler_options"] = options
    step_fn = jax.jit(step, donate_argnums=0).lower(state, *batch()).compile(options or None)
    rec["compile_s"] = time.perf_counter() - t0
    losses, times, cpu = [], [], []
    table = None
    if mode in ("fuyou", "fuyou-nvme"):
        from jaxoff.strategies.fuyou import fuyou_table

        table = fuyou_table(tx)
        rec["engine"] = []  # a step's engine counters (seconds, bytes), one dict a step
        rec["timelines"] = []  # each step's, second by second (`_Sampler`)
    try:
        for i in range(steps):
            phase(f"step {i + 1}")
            x, y = batch(i)
            sampler = _Sampler(table) if table else None
            t, c = time.perf_counter(), time.process_time()
            state, loss = step_fn(state, x, y)
            losses.append(float(loss))
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)  # every thread of the process: XLA's, the engine's
            if sampler:  # the step's counters: its last sample's, taken as it ended
                timeline = sampler.stop()
                rec["timelines"].append(timeline)
                rec["engine"].append({k: timeline[-1][k] for k in _counter_names()})
        phase("done")
        rec["store_bytes_on_disk"] = _du(store_dir) if mode in PAGED_MODES else 0
    finally:
        if hasattr(tx, "close"):
            tx.close()
    if pure_io_reps and mode in PAGED_MODES and len(times) == steps:
        from paged_step import replay_io

        phase("pure I/O")
        replays = [replay_io(store_dir, 4) for _ in range(pure_io_reps)]
        rec["pure_io_s"] = [r["io_s"] for r in replays]
        rec["pure_io_cpu_s"] = [r["cpu_s"] for r in replays]
        rec["pure_io_read_gb"] = replays[0]["read_gb"]
    rec.update(losses=losses, step_s=times, cpu_s=cpu, loss_finite=all(map(math.isfinite, losses)))
    rec.update(data=data, lr=float(lr(steps)), warmup_steps=warmup_steps)
    if passes and len(losses) == steps:
        k = len(windows)  # the second pass: windows 0 .. steps - k - 1 again
        first, second = losses[: steps - k], losses[k:]
        rec["pass_losses"] = [float(np.mean(first)), float(np.mean(second))]
        rec["loss_falling"] = rec["pass_losses"][1] < rec["pass_losses"][0]
    return rec


TRAIN_MODES = ("plain", "paged", "fuyou", "fuyou-nvme")  # what `jaxoff train` runs


def train_options(
    mode: str,
    num_layers: int,
    d_model: int,
    seq_len: int,
    batch_size: int,
    steps: int,
    out_dir: Path,
    store_dir: str | None,
    *,
    lr: float = 1e-4,
    slots: int = 2,
    warmup_steps: int = 3,
    data: Path | None = None,
    read_ahead_mib: int | None = None,
    paged_checkpoint: str = "copy",
) -> dict:
    """The ``jaxoff train`` options (``jaxoff.train.TrainConfig``'s flat fields) of a probe
    of ``mode``:
    ``plain`` keeps the AdamW state in RAM (fp32), ``paged`` pages it (``--store``, bf16
    parameters), ``fuyou`` runs ``--strategy fuyou`` (the blocks as their bits, updated in
    place), ``fuyou-nvme`` adds ``--page-params``. No clipping (Fuyou updates each layer
    before the global norm exists); with ``steps`` >= ``FALLING_FROM`` the validation loss is
    taken at half the steps and at the end (`train_loss_falling`)."""
    if mode not in TRAIN_MODES:
        raise ValueError(f"mode {mode!r} is not a jaxoff train run (one of {TRAIN_MODES})")
    half = steps // 2 if steps >= FALLING_FROM else 0
    return dict(
        model=model_config(num_layers, d_model, seq_len, mode),
        policy="nothing_saveable",
        batch_size=batch_size,
        seq_len=seq_len,
        steps=steps,
        lr=lr,
        warmup_steps=warmup_steps,
        clip_norm=0.0,
        data=data,
        eval_every=half,
        eval_batches=1,
        out_dir=out_dir,
        ckpt_every=0,
        keep_checkpoints=1,
        progress=False,
        store="none" if mode == "plain" else str(store_dir),
        store_slots=slots,
        paged_checkpoint="copy" if mode == "plain" else paged_checkpoint,
        strategy="fuyou" if mode.startswith("fuyou") else "plain",
        page_params=mode == "fuyou-nvme",
        fuyou_read_ahead_mib=read_ahead_mib,
        compile_cache="none",
    )


def train_loss_falling(records: list[dict]) -> bool:
    """A `jaxoff train` probe's loss fell: the validation loss (the same held-out batch)
    at the end is below the one at half the steps, and the training steps' mean loss of the
    second half below that of the first."""
    import numpy as np

    val = [r["val_loss"] for r in records if "val_loss" in r]
    losses = [r["loss"] for r in records]
    half = len(losses) // 2
    return (
        len(val) == 2
        and val[1] < val[0]
        and float(np.mean(losses[half:])) < float(np.mean(losses[:half]))
    )


def run_train_probe(
    mode: str,
    num_layers: int,
    d_model: int,
    seq_len: int,
    batch_size: int,
    steps: int,
    store_dir: str | None,
    lr: float = 1e-4,
    slots: int = 2,
    warmup_steps: int = 3,
    data: str = "corpus",
    pure_io_reps: int = 0,
    read_ahead_mib: int | None = None,
    paged_checkpoint: str = "copy",
) -> dict:
    """`run_probe` through the public trainer: ``jaxoff.train.train`` of `train_options`,
    in this process; the record from its result and ``metrics.jsonl`` (peak RSS as the
    trainer records it each step, ``peak_rss_steps``; the parent adds the whole process's).
    ``data="random"``: a file of uniform random bytes (the loss cannot fall)."""
    import numpy as np

    from jaxoff.train import TrainConfig, train

    if pure_io_reps:
        raise ValueError("pure_io_reps needs the instrumented loop (via='loop')")
    work = Path(store_dir or tempfile.mkdtemp()).parent
    path = None
    if data == "random":
        path = work / "random.bin.txt"
        rng = np.random.default_rng(0)
        path.write_bytes(rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
    options = train_options(
        mode, num_layers, d_model, seq_len, batch_size, steps, work / "run", store_dir,
        lr=lr, slots=slots, warmup_steps=warmup_steps, data=path, read_ahead_mib=read_ahead_mib,
        paged_checkpoint=paged_checkpoint,
    )  # fmt: skip
    cfg = TrainConfig(**options)
    rec: dict = {
        "mode": mode,
        "via": "train",
        "num_layers": num_layers,
        "d_model": d_model,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "params": cfg.model_config().num_params(),
    }
    _PHASE[0] = "jaxoff train"
    t0 = time.perf_counter()
    result = train(cfg)
    rec["train_s"] = time.perf_counter() - t0
    _PHASE[0] = "done"
    records = result.records
    losses = [r["loss"] for r in records]
    rec.update(
        losses=losses,
        val_losses=[r["val_loss"] for r in records if "val_loss" in r],
        step_s=[r["step_time_s"] for r in records],
        compile_s=records[0].get("compile_s", 0.0) if records else 0.0,
        peak_rss_steps=max((r["peak_rss_gib"] for r in records), default=0.0) * GIB,
        loss_finite=all(map(math.isfinite, losses)),
        data=data,
        lr=lr,
        warmup_steps=warmup_steps,
        store_bytes_on_disk=_du(store_dir) if mode != "plain" else 0,
        train_options={
            k: repr(v) if k == "model" else str(v) if isinstance(v, Path) else v
            for k, v in options.items()
        },
    )
    if steps >= FALLING_FROM and len(losses) == steps:
        rec["loss_falling"] = train_loss_falling(records)
    return rec


def _du(path: str | None) -> int:
    """Bytes allocated on disk under ``path`` (blocks, not apparent sizes)."""
    total = 0
    for root, _, files in os.walk(path or "."):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def child_main(a: argparse.Namespace) -> None:
    result_path = Path(a.result)
    peak, by_phase = [0], {}
    threading.Thread(
        target=_rss_watchdog,
        daemon=True,
        args=(
            int(a.mem_limit_gib * GIB),
            int(a.min_available_gib * GIB),
            result_path,
            peak,
            by_phase,
        ),
    ).start()
    try:
        run = run_train_probe if a.via == "train" else run_probe
        extra = {"paged_checkpoint": a.paged_checkpoint} if a.via == "train" else {}
        rec = run(
            a.mode,
            a.layers,
            a.d_model,
            a.seq_len,
            a.batch_size,
            a.steps,
            a.store_dir,
            lr=a.lr,
            slots=a.slots,
            warmup_steps=a.warmup_steps,
            data=a.data,
            pure_io_reps=a.pure_io_reps,
            read_ahead_mib=a.read_ahead_mib,
            **extra,
        )
        rec["status"] = "ok"
    except BaseException as e:  # report any crash as the probe's outcome
        rec = {"status": "error", "why": f"{type(e).__name__}: {str(e)[:300]}"}
    rec["watchdog_peak_rss"] = peak[0]
    rec["peak_rss_gib_in"] = by_phase
    result_path.write_text(json.dumps(rec))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of a large JAX state


# ----------------------------------------------------------------------------- parent


def probe(
    mode: str,
    num_layers: int,
    *,
    d_model: int = 2048,
    seq_len: int = 128,
    batch_size: int = 1,
    steps: int = 3,
    mem_limit_gib: float | None = None,
    min_available_gib: float = 0.75,
    store_dir: str | None = None,
    disk_reserve_gib: float = 4.0,
    timeout_s: float = 1800.0,
    slots: int = 2,
    lr: float = 1e-4,
    warmup_steps: int = 3,
    data: str = "corpus",
    pure_io_reps: int = 0,
    read_ahead_mib: int | None = None,
    via: str = "loop",
    paged_checkpoint: str = "copy",
) -> dict:
    """Runs one probe in a child process and returns its record (see the module doc).

    ``fits`` is True when the child finished every step with finite losses within the
    memory limit; ``why`` says otherwise. Paged store files are removed afterwards.
    ``via``: ``train`` runs the probe as a ``jaxoff train`` run (`run_train_probe`: what the
    command line's search does), ``loop`` in this bench's own instrumented loop
    (`run_probe`: every mode, the engine's counters, ``pure_io_reps``).
    """
    import psutil

    if mem_limit_gib is None:
        mem_limit_gib = psutil.virtual_memory().total / GIB - 1.0
    n_params = num_params(num_layers, d_model, seq_len)
    per = state_bytes_per_param(mode)
    rec: dict = {
        "mode": mode,
        "num_layers": num_layers,
        "d_model": d_model,
        "params": n_params,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "steps": steps,
        "mem_limit_gib": mem_limit_gib,
        "state_bytes": sum(per.values()) * n_params,
        "state_bytes_by_part": {k: v * n_params for k, v in per.items()},
        "store_bytes_needed": store_bytes(n_params, mode, slots),
        "slots": slots if mode in PAGED_MODES else None,
        "via": via,
    }
    if via == "train":  # the run ends on a checkpoint (with a copy of the store's version)
        rec["paged_checkpoint"] = paged_checkpoint
        rec["checkpoint_bytes_needed"] = checkpoint_bytes(n_params, mode, paged_checkpoint)
    root = Path(store_dir or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    if mode in PAGED_MODES:
        free = shutil.disk_usage(root).free
        rec["disk_free"] = free
        needed = rec["store_bytes_needed"] + rec.get("checkpoint_bytes_needed", 0)
        if needed > free - disk_reserve_gib * GIB:
            rec.update(
                fits=False,
                status="skipped",
                why=f"disk-bound (store {needed / 1e9:.1f} GB > "
                f"{free / 1e9:.1f} GB free - {disk_reserve_gib:g} GiB reserve)",
            )
            return rec
    work = Path(tempfile.mkdtemp(prefix="capacity-probe-", dir=root))
    result = work / "result.json"
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--mode",
        mode,
        "--layers",
        str(num_layers),
        "--d-model",
        str(d_model),
        "--seq-len",
        str(seq_len),
        "--batch-size",
        str(batch_size),
        "--steps",
        str(steps),
        "--mem-limit-gib",
        str(mem_limit_gib),
        "--min-available-gib",
        str(min_available_gib),
        "--store-dir",
        str(work / "store"),
        "--result",
        str(result),
        "--slots",
        str(slots),
        "--lr",
        str(lr),
        "--warmup-steps",
        str(warmup_steps),
        "--data",
        data,
        "--pure-io-reps",
        str(pure_io_reps),
        "--via",
        via,
        "--paged-checkpoint",
        paged_checkpoint,
    ] + ([] if read_ahead_mib is None else ["--read-ahead-mib", str(read_ahead_mib)])
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    t0 = time.perf_counter()
    log = work / "child.log"
    try:
        with open(log, "w") as out:
            child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
            deadline = time.monotonic() + timeout_s
            while True:
                pid, status, usage = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    child.kill()
                    pid, status, usage = os.wait4(child.pid, 0)
                    break
                time.sleep(0.2)
            child.returncode = os.waitstatus_to_exitcode(status)
        rec["wall_s"] = time.perf_counter() - t0
        rec["returncode"] = child.returncode
        rec["peak_rss"] = usage.ru_maxrss * 1024  # KiB on Linux
        got = json.loads(result.read_text()) if result.exists() else {}
        for k in ("params", "mode", "num_layers"):
            got.pop(k, None)
        rec.update(got)
        rec["peak_rss"] = max(rec["peak_rss"], got.get("watchdog_peak_rss", 0))
        if child.returncode < 0 and not got:
            rec["status"] = "killed"
            rec["why"] = (
                "timeout"
                if rec["wall_s"] >= timeout_s
                else f"killed by signal {-child.returncode} (OOM killer?)"
            )
        elif not got:
            tail = log.read_text()[-400:] if log.exists() else ""
            rec.update(status="error", why=f"exit {child.returncode}: {tail}")
        fits = rec.get("status") == "ok" and rec.get("loss_finite", False)
        if rec.get("status") == "ok" and not rec.get("loss_finite", False):
            rec["why"] = "non-finite loss"
        if fits and rec["peak_rss"] > mem_limit_gib * GIB:
            fits, rec["why"] = False, "peak RSS over the limit"
        if fits and steps >= FALLING_FROM and not rec.get("loss_falling"):
            fits, rec["why"] = False, "the loss did not fall"
        rec["fits"] = fits
        if fits:
            rec["why"] = "fits"
        rec["rss_over_state"] = rec["peak_rss"] / rec["state_bytes"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rec


def disk_cap_layers(
    root: str,
    mode: str,
    slots: int,
    d_model: int,
    seq_len: int,
    reserve_gib: float,
    via: str = "loop",
    paged_checkpoint: str = "copy",
) -> int:
    """Most layers (at least 1) whose ``mode`` store of ``slots`` slots (and with ``via``
    ``train`` its last checkpoint) fits the free disk under ``root`` less ``reserve_gib``."""
    free = shutil.disk_usage(root).free - reserve_gib * GIB

    def need(n: int) -> int:
        ckpt = checkpoint_bytes(n, mode, paged_checkpoint) if via == "train" else 0
        return store_bytes(n, mode, slots) + ckpt

    per = need(1 << 30) / (1 << 30)
    cap = layers_for(free / per, d_model, seq_len)
    while cap > 1 and need(num_params(cap, d_model, seq_len)) > free:
        cap -= 1
    return cap


def search(
    mode: str,
    start_params: float,
    *,
    max_probes: int,
    grow: float,
    d_model: int,
    seq_len: int,
    on_probe,
    **kw,
) -> list[dict]:
    """Largest fitting size of ``mode``: walk from ``start_params`` by ``grow`` to bracket it,
    then bisect on layers. Paged sizes above the disk's capacity are clipped to it."""
    records: dict[int, dict] = {}

    def run(layers: int) -> bool:
        if layers not in records:
            records[layers] = probe(mode, layers, d_model=d_model, seq_len=seq_len, **kw)
            on_probe(records[layers])
        return records[layers]["fits"]

    lo, hi = 0, None  # largest known fit, smallest known failure (layers)
    if mode in PAGED_MODES:  # the disk caps the size: never probe (or bracket) above it
        root = kw.get("store_dir") or tempfile.gettempdir()
        reserve = kw.get("disk_reserve_gib", 4.0)
        via = kw.get("via", "loop")
        in_store = kw.get("paged_checkpoint", "copy")
        hi = (
            disk_cap_layers(
                root, mode, kw.get("slots", 2), d_model, seq_len, reserve, via, in_store
            )
            + 1
        )
        run(hi)  # recorded as skipped: "disk-bound"
        if records[hi]["fits"]:  # free disk changed under us; fall back to walking
            hi = None
    layers = layers_for(start_params, d_model, seq_len)
    if hi is not None:
        layers = min(layers, hi - 1)
    probes = 0
    while probes < max_probes:
        if hi is not None and hi - lo <= 1:
            break
        if lo and hi is not None:
            layers = (lo + hi) // 2
        probes += 1
        if run(layers):
            lo = layers
            nxt = max(layers + 1, int(layers * grow))
            layers = nxt if hi is None else min(nxt, hi - 1)
        else:
            hi = layers
            if layers == 1:
                break
            layers = max(1, min(layers - 1, int(layers / grow))) if not lo else layers
    return sorted(records.values(), key=lambda r: r["num_layers"])


def _fmt_gib(b) -> str:
    return "-" if b is None else f"{b / GIB:.2f}"


def render(records: list[dict], console) -> None:
    from rich.table import Table

    t = Table(
        title="GPT capacity probes (peak RSS of each child; state = params + grads + "
        "moments + masters)"
    )
    for col in (
        "mode",
        "layers",
        "params",
        "peak RSS GiB",
        "state GiB",
        "RSS/state",
        "store GB (disk)",
        "init s",
        "compile s",
        "step s",
        "loss",
        "fits / why not",
    ):
        t.add_column(col, justify="left" if col in ("mode", "fits / why not") else "right")
    for r in records:
        steps = r.get("step_s") or []
        t.add_row(
            r["mode"],
            str(r["num_layers"]),
            f"{r['params'] / 1e9:.3f}B",
            _fmt_gib(r.get("peak_rss")),
            _fmt_gib(r["state_bytes"]),
            f"{r['rss_over_state']:.3f}" if "rss_over_state" in r else "-",
            (
                f"{r['store_bytes_on_disk'] / 1e9:.1f}"
                if r.get("store_bytes_on_disk")
                else (f"({r['store_bytes_needed'] / 1e9:.1f})" if r["store_bytes_needed"] else "-")
            ),
            f"{r['init_s']:.0f}" if "init_s" in r else "-",
            f"{r['compile_s']:.0f}" if "compile_s" in r else "-",
            " ".join(f"{s:.1f}" for s in steps) or "-",
            f"{r['losses'][-1]:.3f}" if r.get("losses") else "-",
            "fits" if r["fits"] else r.get("why", "?"),
        )
    console.print(t)


def summarize(records: list[dict]) -> dict:
    best = {}
    for m in MODES:
        fit = [r for r in records if r["mode"] == m and r["fits"]]
        if fit:
            best[m] = max(fit, key=lambda r: r["params"])
    out: dict = {
        "largest": {
            m: {
                k: r.get(k)
                for k in ("num_layers", "params", "peak_rss", "state_bytes", "rss_over_state")
            }
            for m, r in best.items()
        }
    }
    for m in PAGED_MODES:
        if m in best:
            out[f"{m}_rss_over_state"] = best[m]["rss_over_state"]
            for base in ("plain", "plain-bf16"):
                if base in best:
                    out[f"{m}_over_{base}_params"] = best[m]["params"] / best[base]["params"]
    return out


def main(argv=None) -> None:
    import psutil

    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--modes", nargs="+", choices=MODES, default=["plain", "paged"])
    p.add_argument("--d-model", type=int, default=2048, help="width; sizes vary by layers")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate of AdamW")
    p.add_argument("--warmup-steps", type=int, default=3, help="linear warm-up from 0")
    p.add_argument("--data", choices=("corpus", "random"), default="corpus")
    p.add_argument(
        "--mem-limit-gib",
        type=float,
        default=None,
        help="RSS limit of a probe (default: total RAM - 1 GiB)",
    )
    p.add_argument(
        "--min-available-gib",
        type=float,
        default=0.75,
        help="stop a probe when the machine has less available than this",
    )
    p.add_argument("--store-dir", default=None, help="where paged probes put their store")
    p.add_argument("--disk-reserve-gib", type=float, default=4.0)
    p.add_argument(
        "--slots",
        type=int,
        choices=(1, 2),
        default=2,
        help="page store slots of the paged modes: 2 (crash-safe) or 1 (in place, half the disk)",
    )
    p.add_argument(
        "--start",
        type=float,
        nargs="+",
        default=None,
        help="start size per mode in parameters, e.g. 1.21e9 3e9 (default: "
        "1.21e9 for plain modes, the disk cap for paged)",
    )
    p.add_argument("--grow", type=float, default=1.25, help="ladder factor before bisecting")
    p.add_argument(
        "--max-probes",
        type=int,
        nargs="+",
        default=[4],
        help="probes per mode (one value, or one per mode)",
    )
    p.add_argument("--timeout-s", type=float, default=1200.0, help="per probe")
    p.add_argument("--out", default="capacity.json")
    # child side
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--pure-io-reps", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--read-ahead-mib", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--via",
        choices=("train", "loop"),
        default="train",
        help="train: each probe is a `jaxoff train` run (modes plain, paged, fuyou, "
        "fuyou-nvme); loop: this bench's instrumented loop (plain-bf16 always runs in it)",
    )
    p.add_argument(
        "--paged-checkpoint",
        choices=("copy", "store"),
        default="copy",
        help="with --via train: what the run's checkpoints hold of the page store (`jaxoff "
        "train --paged-checkpoint`): copy (the disk holds the state twice) or store (its "
        "version, named; no copy)",
    )
    a = p.parse_args(argv)
    if a.child:
        return child_main(a)

    from rich.console import Console

    console = Console(width=max(Console().width, 180))
    if a.mem_limit_gib is None:
        a.mem_limit_gib = psutil.virtual_memory().total / GIB - 1.0
    starts = a.start or [1.21e9 if m not in PAGED_MODES else 1e15 for m in a.modes]
    if len(starts) == 1:
        starts = starts * len(a.modes)
    max_probes = a.max_probes * len(a.modes) if len(a.max_probes) == 1 else a.max_probes
    if a.store_dir:
        os.makedirs(a.store_dir, exist_ok=True)  # the disk cap is read from its file system
    vm = psutil.virtual_memory()
    console.print(
        f"machine: {vm.total / GIB:.1f} GiB RAM, {vm.available / GIB:.1f} GiB "
        f"available; limit per probe {a.mem_limit_gib:.1f} GiB; disk free "
        f"{shutil.disk_usage(a.store_dir or tempfile.gettempdir()).free / 1e9:.0f} GB"
    )
    records: list[dict] = []
    t_start = time.perf_counter()
    kw = dict(
        batch_size=a.batch_size,
        steps=a.steps,
        mem_limit_gib=a.mem_limit_gib,
        min_available_gib=a.min_available_gib,
        store_dir=a.store_dir,
        disk_reserve_gib=a.disk_reserve_gib,
        timeout_s=a.timeout_s,
        slots=a.slots,
        lr=a.lr,
        warmup_steps=a.warmup_steps,
        data=a.data,
    )
    with console.status("probing...") as status:
        for mode, start, n_probes in zip(a.modes, starts, max_probes, strict=True):

            def on_probe(r, mode=mode):
                records.append(r)
                console.print(
                    f"  {r['mode']:10s} {r['num_layers']:3d} layers "
                    f"{r['params'] / 1e9:6.3f}B  peak RSS {_fmt_gib(r.get('peak_rss'))}"
                    f" GiB  {r.get('why')}  ({r.get('wall_s', 0):.0f} s)"
                )
                Path(a.out).write_text(json.dumps({"records": records}, indent=1))
                status.update(f"probing {mode}... {time.perf_counter() - t_start:.0f} s")

            status.update(f"probing {mode}...")
            search(
                mode,
                start,
                max_probes=n_probes,
                grow=a.grow,
                d_model=a.d_model,
                seq_len=a.seq_len,
                on_probe=on_probe,
                via=a.via if mode in TRAIN_MODES else "loop",
                paged_checkpoint=a.paged_checkpoint,
                **kw,
            )
    render(records, console)
    summary = summarize(records)
    for m, r in summary["largest"].items():
        console.print(
            f"largest {m}: {r['params'] / 1e9:.3f}B params ({r['num_layers']} layers), "
            f"peak RSS {_fmt_gib(r['peak_rss'])} GiB, RSS/state "
            f"{r['rss_over_state']:.3f}"
        )
    for k, v in summary.items():
        if k != "largest":
            console.print(f"{k}: {v:.3f}")
    args = {k: v for k, v in vars(a).items() if k not in ("child", "mode", "layers", "result")}
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/
    from _common.results import write_result

    out = write_result(
        "capacity",
        args=args,
        summary=summary,
        records=records,
        path=a.out,
        command="python bench/capacity.py " + " ".join(sys.argv[1:] if argv is None else argv),
        disk_path=a.store_dir or tempfile.gettempdir(),
        wall_s=time.perf_counter() - t_start,
    )
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
