"""An instrumented loop over the library's steps, for the benches that set a step against its
bounds (``bench/fuyou_capacity.py``; the GPU probes, ``_gpu/probe.py``).

It is not ``jaxoff train``: it exists for what the trainer has no configuration or counter
for. Its modes:

  plain-bf16  the compute-only baseline: bf16 parameters and gradients, fp32 masters and fp32
              ``optax.adamw`` moments, all in RAM (2 + 2 + 12 = 16 B/param); no trainer
              configuration holds them so (``--store none`` keeps bf16 moments, no masters).
  fuyou       ``jaxoff.strategies.fuyou``'s step (``make_fuyou_step``, the blocks as their bits,
              ``blocks_as_bits``) over ``jaxoff.optim.paged(optax.adamw)``.
  fuyou-nvme  the same with the block parameters in the page store (``page_params``); the
              model made and written one layer at a time.

Each step of a fuyou mode records the engine's counters (``engine``) and is sampled second by
second (``timelines``: process CPU time and the counters); every step records its process CPU
time (``cpu_s``, all threads). ``pure_io_reps``: after the steps the store is replayed without
compute (``bench/paged_step.py``'s ``replay_io``), times in ``pure_io_s``. From 10 steps the
batches make two passes over ceil(steps / 2) fixed windows, and ``loss_falling`` compares the
passes' mean losses (at batch 1 x 128 tokens one window's loss differs from another's by more
than ten steps of training move it).
"""

from __future__ import annotations

import functools
import math
import threading
import time

from _common.child import GIB, du, phase, set_phase

MODES = ("plain-bf16", "fuyou", "fuyou-nvme")
FALLING_FROM = 10  # steps from which the batches make two passes over the same windows
ENGINE_COUNTERS = (
    "take_wait_ns", "put_wait_ns", "begin_wait_ns", "io_busy_ns", "read_bytes", "write_bytes",
    "takes", "puts",
)  # fmt: skip


class _LayerInit:
    """A stacked block leaf made one layer at a time when indexed (``fuyou_init`` reads it
    so): the whole leaf never exists."""

    def __init__(self, sds, keys, std, normal):
        self.shape, self.dtype, self.size = sds.shape, sds.dtype, math.prod(sds.shape)
        self._keys, self._std, self._normal = keys, std, normal

    def __getitem__(self, j):
        return self._normal(self._keys[j], self.shape[1:], self.dtype, self._std)


def build_params(cfg, lazy_blocks: bool = False):
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


def counter_names() -> list[str]:
    """`engine_counters`' keys: ``ENGINE_COUNTERS`` with ``*_ns`` as ``*_s``."""
    return [k.removesuffix("_ns") + "_s" if k.endswith("_ns") else k for k in ENGINE_COUNTERS]


def engine_counters(table: str) -> dict[str, float]:
    """The cumulative paging counters of a Fuyou store's table (its pager's and its
    engine's, `jaxoff.aio.io_stats`): ``*_ns`` as seconds."""
    from jaxoff.aio import io_stats

    st = io_stats(table) or {}
    return {
        name: st.get(k, 0) / 1e9 if k.endswith("_ns") else st.get(k, 0)
        for k, name in zip(ENGINE_COUNTERS, counter_names(), strict=True)
    }


class Sampler:
    """Samples, every ``period`` seconds of one step, the process CPU time and the engine
    counters, to show where in the step the cores sit idle and what the step waits on."""

    def __init__(self, table: str, period: float = 1.0):
        self.table, self.period = table, period
        self.t0 = time.perf_counter()
        self.rows = [self._row()]  # before the step starts
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _row(self) -> dict[str, float]:
        return {"t": time.perf_counter() - self.t0, "cpu_s": time.process_time()} | (
            engine_counters(self.table)
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


def _state_and_step(mode, cfg, graphdef, params, tx, read_ahead, rec):
    """The initial state of ``mode`` and its step ``(state, x, y) -> (state, loss)``."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    if mode == "plain-bf16":

        def loss_fn(p, x, y):
            logits = nnx.merge(graphdef, p)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        masters = jax.jit(lambda p: jax.tree.map(lambda a: a.astype(jnp.float32), p))(params)

        def step(state, x, y):
            p, m, s = state
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            g = jax.tree.map(lambda a: a.astype(jnp.float32), g)
            u, s = tx.update(g, s, m)
            m = optax.apply_updates(m, u)
            return (jax.tree.map(lambda a, b: a.astype(b.dtype), m, p), m, s), loss

        return (params, masters, tx.init(masters)), step

    from jaxoff.step import TrainState
    from jaxoff.strategies.fuyou import (
        blocks_to_bits,
        default_read_ahead_bytes,
        fuyou_init,
        fuyou_resident,
        make_fuyou_step,
    )

    nvme = mode == "fuyou-nvme"
    opt = fuyou_init(cfg, tx, params, page_params=nvme, read_ahead_bytes=read_ahead)
    rec["read_ahead_bytes"] = default_read_ahead_bytes() if read_ahead is None else read_ahead
    # in place (the arrays are donated); with page_params the blocks are in the store
    params = fuyou_resident(params) if nvme else blocks_to_bits(params)
    state = TrainState(jnp.zeros((), jnp.int32), params, opt)
    if nvme:
        fuyou_step = make_fuyou_step(graphdef, cfg, tx, page_params=True)
    else:
        fuyou_step = make_fuyou_step(graphdef, cfg, tx, blocks_as_bits=True)

    def step(state, x, y):
        state, metrics = fuyou_step(state, x, y)
        return state, metrics["loss"]

    return state, step


def run_probe(
    mode: str,
    cfg,
    seq_len: int,
    batch_size: int,
    steps: int,
    store_dir: str | None,
    *,
    lr: float = 1e-4,
    slots: int = 2,
    warmup_steps: int = 3,
    data: str = "corpus",
    pure_io_reps: int = 0,
    read_ahead_mib: int | None = None,
) -> dict:
    """Builds ``cfg``'s model, runs ``steps`` steps of ``mode`` in this process; returns the
    record (without peak RSS, which the parent of a child takes from ``wait4``).
    ``read_ahead_mib``: the fuyou modes' ``read_ahead_bytes`` (None: the library's default)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import psutil

    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: the instrumented loop runs {MODES}")
    rec: dict = {"mode": mode, "num_layers": cfg.num_layers, "d_model": cfg.d_model}
    rec |= {"seq_len": seq_len, "batch_size": batch_size, "params": cfg.num_params()}
    rss_at: dict[str, float] = {}
    rec["rss_gib_after"] = rss_at

    def next_phase(name: str) -> None:  # RSS at the end of the previous phase
        rss_at[phase()] = round(psutil.Process().memory_info().rss / GIB, 3)
        set_phase(name)

    t0 = time.perf_counter()
    next_phase("model init")
    graphdef, params = build_params(cfg, lazy_blocks=mode == "fuyou-nvme")
    next_phase("optimizer init")
    n = sum(x.size for x in jax.tree.leaves(params))
    assert n == rec["params"], (n, rec["params"])
    flat = optax.constant_schedule(lr)
    sched = optax.linear_schedule(0.0, lr, warmup_steps) if warmup_steps else flat
    tx = optax.adamw(sched)
    if mode != "plain-bf16":
        from jaxoff.optim import paged

        tx = paged(tx, store_dir, slots=slots)
    read_ahead = None if read_ahead_mib is None else read_ahead_mib << 20
    state, step = _state_and_step(mode, cfg, graphdef, params, tx, read_ahead, rec)
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

    # from FALLING_FROM steps, step i trains on window i mod ceil(steps / 2)
    passes = steps >= FALLING_FROM
    windows = [new_batch() for _ in range(-(-steps // 2))] if passes else None

    def batch(i=0):
        return windows[i % len(windows)] if passes else new_batch()

    next_phase("compile")
    t0 = time.perf_counter()
    step_fn = jax.jit(step, donate_argnums=0).lower(state, *batch()).compile()
    rec["compile_s"] = time.perf_counter() - t0
    losses, times, cpu = [], [], []
    table = None
    if mode != "plain-bf16":
        from jaxoff.strategies.fuyou import fuyou_table

        table = fuyou_table(tx)
        rec["engine"] = []  # a step's engine counters (seconds, bytes), one dict a step
        rec["timelines"] = []  # each step's, second by second (`Sampler`)
    try:
        for i in range(steps):
            next_phase(f"step {i + 1}")
            x, y = batch(i)
            sampler = Sampler(table) if table else None
            t, c = time.perf_counter(), time.process_time()
            state, loss = step_fn(state, x, y)
            losses.append(float(loss))
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)  # every thread of the process: XLA's, the engine's
            if sampler:  # the step's counters: its last sample's, taken as it ended
                timeline = sampler.stop()
                rec["timelines"].append(timeline)
                rec["engine"].append({k: timeline[-1][k] for k in counter_names()})
        next_phase("done")
        rec["store_bytes_on_disk"] = du(store_dir) if table else 0
    finally:
        if hasattr(tx, "close"):
            tx.close()
    if pure_io_reps and table and len(times) == steps:
        from paged_step import replay_io

        next_phase("pure I/O")
        replays = [replay_io(store_dir, 4) for _ in range(pure_io_reps)]
        rec["pure_io_s"] = [r["io_s"] for r in replays]
        rec["pure_io_cpu_s"] = [r["cpu_s"] for r in replays]
        rec["pure_io_read_gb"] = replays[0]["read_gb"]
    rec.update(losses=losses, step_s=times, cpu_s=cpu, loss_finite=all(map(math.isfinite, losses)))
    rec.update(data=data, lr=float(sched(steps)), warmup_steps=warmup_steps)
    if passes and len(losses) == steps:
        k = len(windows)  # the second pass: windows 0 .. steps - k - 1 again
        first, second = losses[: steps - k], losses[k:]
        rec["pass_losses"] = [float(np.mean(first)), float(np.mean(second))]
        rec["loss_falling"] = rec["pass_losses"][1] < rec["pass_losses"][0]
    return rec
