"""One GPU measurement in a process of its own: ``bench/gpu.py probe`` (driven by bench/gpu.py's
parts and tests/test_gpu.py).

Trains a GPT (GPT-2 shapes, 256-byte vocabulary, the embedded default corpus) for ``--steps``
steps under one placement, remat policy and optimizer, then prints one JSON line: the device's
``memory_stats()`` (``peak_bytes_in_use`` is this process's peak, which is why each probe has
a process of its own), the compiled step's ``memory_analysis()``, step times, tokens/s,
losses, and parameter / per-layer bytes.

    python bench/gpu.py probe --placement host_params_stream1 --layers 8 --d-model 1024
    python bench/gpu.py probe --optimizer paged --placement host_params --store-dir /nvme/x
    python bench/gpu.py probe --bench-mode fuyou-nvme --layers 48 --d-model 1024 --steps 10

It refuses to run without a GPU (``no GPU: ...``, exit 3): its figures mean nothing on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # peak = what the step used
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # models/ from a source tree

NO_GPU_EXIT = 3


def gpu_devices():
    """The GPU devices JAX sees, or exits with ``no GPU: <why>``."""
    import jax

    try:
        devices = jax.devices("gpu")
    except RuntimeError as e:
        devices, why = [], str(e).splitlines()[0]
    else:
        why = "jax.devices('gpu') is empty"
    if not devices:
        print(
            f"no GPU: {why} (JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')!r}, "
            f"backend {jax.default_backend()})",
            file=sys.stderr,
        )
        sys.exit(NO_GPU_EXIT)
    return devices


def model_config(layers: int, d_model: int, seq_len: int, policy: str | None, dtype: str):
    from jaxoff.models.gpt import GPTConfig
    from jaxoff.nn import Stack
    from jaxoff.policy import resolve_policy

    return GPTConfig(
        layers,
        d_model,
        max(1, d_model // 128),
        4 * d_model,
        max_seq_len=seq_len,
        dtype=dtype,
        param_dtype=dtype,
        stack=Stack(policy=resolve_policy(policy)),
    )


def batches(a: argparse.Namespace):
    """``(steps, batch, seq_len + 1)`` int32 tokens: windows of jaxoff's embedded default
    corpus (bytes of the Python standard library's source, which the loss can learn), or
    uniform random bytes with ``--data random`` (which it cannot)."""
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (a.steps, a.batch_size, a.seq_len + 1)
    if a.data == "random":
        return rng.integers(0, 256, shape, dtype=np.int32)
    from jaxoff.train import load_corpus

    corpus = load_corpus(None, max_bytes=64 << 20)
    starts = rng.integers(0, corpus.size - a.seq_len - 1, shape[:2])
    return corpus[starts[..., None] + np.arange(a.seq_len + 1)].astype(np.int32)


def put_leaf_by_leaf(leaves: list, treedef, shardings):
    """``jax.device_put`` of the flattened state ``leaves`` into ``shardings``, one leaf at a
    time, each source leaf dropped from ``leaves`` once it is copied (the caller holds no
    other reference, so its memory is freed before the next leaf is copied)."""
    import jax

    out = []
    for i, home in enumerate(treedef.flatten_up_to(shardings)):
        x, leaves[i] = leaves[i], None
        out.append(jax.device_put(x, home))
        out[-1].block_until_ready()
        del x
    return treedef.unflatten(out)


def step_figures(a: argparse.Namespace, dev, n_params: int, times: list, losses: list) -> dict:
    """The device's memory figures (this process's peak) and the figures of ``a.steps`` timed
    steps: the median of all but the first, tokens/s, model FLOP/s, finite, loss falling."""
    import numpy as np

    stats = dev.memory_stats() or {}
    memory = {k: int(v) for k, v in stats.items() if isinstance(v, int)}
    steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
    # 6 N per token (forward + backward) + attention 12 L T d; remat recompute not counted.
    flops = 6 * n_params + 12 * a.layers * a.seq_len * a.d_model
    return {
        "memory_stats": memory,
        "peak_bytes_in_use": memory.get("peak_bytes_in_use"),
        "step_s_median": round(steady, 5),
        "tokens_per_s": round(a.batch_size * a.seq_len / steady, 1),
        "model_flops_per_s": flops * a.batch_size * a.seq_len / steady,
        "finite": bool(np.all(np.isfinite(losses))),
        "loss_falling": len(losses) >= 2 and losses[-1] < losses[0],
    }


def memory_analysis(compiled) -> dict:
    m = compiled.memory_analysis()
    if m is None:
        return {}
    return {
        k: int(getattr(m, k))
        for k in dir(m)
        if k.endswith("_in_bytes") and isinstance(getattr(m, k), int)
    }


def run(a: argparse.Namespace) -> dict:
    import jax
    import numpy as np
    import optax

    from jaxoff.optim import paged
    from jaxoff.placement import (
        compile_placed,
        get_placement,
        jit_step,
        streamed_model,
        with_paged_optimizer,
    )
    from jaxoff.step import init_state, make_train_step

    dev = gpu_devices()[0]
    policy = None if a.policy == "none" else a.policy
    cfg = model_config(a.layers, a.d_model, a.seq_len, policy, a.dtype)
    # Warmed up linearly over --warmup steps, then constant.
    lr = optax.linear_schedule(a.lr / 10, a.lr, max(1, a.warmup))
    tx = optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1)
    placement = get_placement(a.placement)
    store = None
    if a.optimizer == "paged":
        store = new_store(a.store_dir)
        tx = paged(tx, Path(store) / "opt", chunk_bytes=a.chunk_mib << 20)
        placement = with_paged_optimizer(placement)
    rec: dict = {
        "placement": a.placement,
        "policy": a.policy,
        "optimizer": a.optimizer,
        "layers": a.layers,
        "d_model": a.d_model,
        "seq_len": a.seq_len,
        "batch_size": a.batch_size,
        "dtype": a.dtype,
        "device": dev.device_kind,
        "platform": dev.platform,
        "jax": jax.__version__,
    }
    t0 = time.perf_counter()
    # Host parameters are made on the CPU backend and put leaf by leaf into their home: a
    # model beyond the device's memory is never whole on it (nor twice in host memory).
    host_init = placement.params == "host" and a.optimizer != "paged"
    rec["init_on"] = "cpu" if host_init else "device"
    with jax.default_device(jax.devices("cpu")[0] if host_init else dev):
        graphdef, state = init_state(streamed_model(cfg, placement, None), tx, 0)
    step, shardings = jit_step(make_train_step(graphdef, tx, placement), placement, state, None)
    leaves, treedef = jax.tree.flatten(state)
    del state
    state = put_leaf_by_leaf(leaves, treedef, shardings)
    rec["init_s"] = round(time.perf_counter() - t0, 3)
    n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
    itemsize = np.dtype(a.dtype).itemsize
    rec["params"] = n_params
    rec["param_bytes"] = n_params * itemsize
    rec["layer_param_bytes"] = (12 * a.d_model * a.d_model + 13 * a.d_model) * itemsize
    tokens = batches(a)
    rec["data"] = a.data
    compiled = compile_placed(step.lower(state, tokens[0, :, :-1], tokens[0, :, 1:]), placement)
    rec["compile_s"] = round(time.perf_counter() - t0 - rec["init_s"], 3)
    rec["memory_analysis"] = memory_analysis(compiled)
    losses, times = [], []
    for i in range(a.steps):
        t = time.perf_counter()
        state, metrics = compiled(state, tokens[i, :, :-1], tokens[i, :, 1:])
        losses.append(float(metrics["loss"]))  # blocks: the step's time includes its work
        times.append(time.perf_counter() - t)
    rec["losses"] = losses
    rec["step_s"] = [round(t, 5) for t in times]
    rec.update(step_figures(a, dev, n_params, times, losses))
    if store is not None:
        import shutil

        tx.close()
        shutil.rmtree(store, ignore_errors=True)
    return rec


def new_store(under: str | None) -> str:
    """A new, empty folder for one probe's page store (under ``--store-dir`` if given): a
    probe never finds another's store, and the caller removes it when the probe ends."""
    if under:
        os.makedirs(under, exist_ok=True)
    return tempfile.mkdtemp(prefix="jaxoff-gpu-probe-", dir=under)


def run_bench_mode(a: argparse.Namespace) -> dict:
    """One probe of the benches' instrumented loop (``_common/step_loop.py``) in
    ``--bench-mode`` (``plain-bf16``: bf16 parameters with fp32 masters and moments, all on the
    device; ``fuyou-nvme``: the same AdamW paged, and the block parameters in the page store,
    read a layer ahead through the CUDA paging calls) at bench/capacity.py's GPT shape, run on
    the GPU with its device-memory figures added."""
    import jax

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/
    from _capacity.sizes import model_config as capacity_model
    from _common.step_loop import run_probe

    dev = gpu_devices()[0]
    store = new_store(a.store_dir)
    cfg = capacity_model(a.layers, a.d_model, a.seq_len, a.bench_mode)
    try:
        with jax.default_device(dev):
            rec = run_probe(
                a.bench_mode,
                cfg,
                a.seq_len,
                a.batch_size,
                a.steps,
                store,
                lr=a.lr,
                slots=a.slots,
                warmup_steps=a.warmup,
                data=a.data,
            )
    finally:
        import shutil

        shutil.rmtree(store, ignore_errors=True)
    rec.update(
        placement=f"bench:{a.bench_mode}",
        optimizer=a.bench_mode,
        layers=a.layers,
        dtype="bfloat16",
        device=dev.device_kind,
        platform=dev.platform,
        jax=jax.__version__,
    )
    figures = step_figures(a, dev, rec["params"], rec["step_s"], rec["losses"])
    # run_probe judges a falling loss over two passes of the same windows (>= 10 steps);
    # below that, step_figures' last loss under the first
    if "loss_falling" in rec:
        del figures["loss_falling"]
    rec.update(figures)
    return rec


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="bench/gpu.py probe", description=__doc__.splitlines()[0])
    p.add_argument("--placement", default="device")
    p.add_argument("--policy", default="full", help="remat preset (jaxoff.policy.PRESETS)")
    p.add_argument("--optimizer", choices=("adamw", "paged"), default="adamw")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=3, help="steps of linear warm-up to --lr")
    p.add_argument("--data", choices=("corpus", "random"), default="corpus")
    p.add_argument("--chunk-mib", type=int, default=64)
    p.add_argument("--store-dir", default=None)
    p.add_argument(
        "--bench-mode",
        choices=("plain-bf16", "fuyou-nvme"),
        default=None,
        help="run the instrumented loop (_common/step_loop.py) in this mode instead (bf16 "
        "parameters, fp32 masters and moments; --placement, --policy and --optimizer are then "
        "ignored)",
    )
    p.add_argument("--slots", type=int, default=1, help="page store slots (--bench-mode)")
    p.add_argument("--out", default=None, help="also write the JSON record here")
    a = p.parse_args(argv)
    try:
        rec = run_bench_mode(a) if a.bench_mode else run(a)
        rec["ok"] = rec["finite"]
    except SystemExit:
        raise
    except Exception as e:  # an OOM is a result (capacity), not a crash of the driver
        rec = {
            **{k: v for k, v in vars(a).items() if k != "out"},
            "ok": False,
            "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500],
            "oom": "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower(),
        }
    line = json.dumps(rec)
    if a.out:
        Path(a.out).write_text(line + "\n")
    print(line)
