"""One capacity probe: a ``jaxoff train`` run of one size, in a child process of its own.

The parent (`probe`) counts the size's bytes, skips a paged size whose store and checkpoint
would not fit the free disk ("disk-bound"), runs `run_train_probe` in a child
(``_common/child.py``: its own peak RSS, a memory watchdog) and judges the record
(`judge`). The child (`run_train_probe`) runs ``jaxoff.train.train`` of `train_options`:
the trainer's model init, its step (Fuyou's holds 16-bit blocks as their bits), its data and
its final checkpoint; the record holds the run's losses, its validation losses, its step
times and the peak RSS the trainer recorded each step.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path

from _common.child import du, run_child, set_phase

from _capacity.sizes import (
    GIB,
    MODES,
    PAGED_MODES,
    checkpoint_bytes,
    model_config,
    num_params,
    state_bytes_per_param,
    store_bytes,
)

FALLING_FROM = 10  # steps from which a probe must show a falling loss to fit


def train_options(
    mode: str,
    num_layers: int,
    d_model: int,
    seq_len: int,
    batch_size: int,
    steps: int,
    out_dir: Path,
    store_dir: str | Path | None,
    *,
    lr: float = 1e-4,
    slots: int = 2,
    warmup_steps: int = 3,
    data: Path | None = None,
    read_ahead_mib: int | None = None,
    paged_checkpoint: str = "copy",
) -> dict:
    """The ``jaxoff train`` options (``jaxoff.train.TrainConfig``'s flat names) of a probe
    of ``mode``: ``plain`` keeps the AdamW state in RAM (``--store none``, fp32), ``paged``
    pages it (``--store``, bf16 parameters), ``fuyou`` runs ``--strategy fuyou`` (the blocks
    as their bits, updated in place), ``fuyou-nvme`` adds ``--page-params``. No clipping
    (Fuyou updates each layer before the global norm exists); with ``steps`` >=
    ``FALLING_FROM`` the validation loss is taken at half the steps and at the end
    (`train_loss_falling`)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not a jaxoff train run of this bench (one of {MODES})")
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
        eval_every=steps // 2 if steps >= FALLING_FROM else 0,
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
    val = [r["val_loss"] for r in records if "val_loss" in r]
    losses = [r["loss"] for r in records]
    half = len(losses) // 2
    return (
        len(val) == 2
        and val[1] < val[0]
        and sum(losses[half:]) / (len(losses) - half) < sum(losses[:half]) / max(half, 1)
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
    read_ahead_mib: int | None = None,
    paged_checkpoint: str = "copy",
) -> dict:
    """The child's side: ``jaxoff.train.train`` of `train_options`, in this process; the
    record from its result and ``metrics.jsonl`` (peak RSS as the trainer records it each
    step, ``peak_rss_steps``; the parent adds the whole process's). ``data="random"``: a
    file of uniform random bytes (the loss cannot fall); ``corpus``: the trainer's default,
    jaxoff's embedded byte corpus."""
    import numpy as np

    from jaxoff.train import TrainConfig, train

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
    set_phase("jaxoff train")
    t0 = time.perf_counter()
    records = train(TrainConfig(**options)).records
    train_s = time.perf_counter() - t0
    set_phase("done")
    losses = [r["loss"] for r in records]
    rec = {
        "train_s": train_s,
        "losses": losses,
        "val_losses": [r["val_loss"] for r in records if "val_loss" in r],
        "step_s": [r["step_time_s"] for r in records],
        "compile_s": records[0].get("compile_s", 0.0) if records else 0.0,
        "peak_rss_steps": max((r["peak_rss_gib"] for r in records), default=0.0) * GIB,
        "loss_finite": all(map(math.isfinite, losses)),
        "data": data,
        "lr": lr,
        "warmup_steps": warmup_steps,
        "store_bytes_on_disk": du(store_dir) if mode != "plain" else 0,
        # the trainer's own split of each paged step (its engine's counters)
        "io_s": [r.get("io_s") for r in records],
        "io_hidden": [r.get("io_hidden") for r in records],
        "train_options": {
            k: repr(v) if k == "model" else str(v) if isinstance(v, Path) else v
            for k, v in options.items()
        },
    }
    if steps >= FALLING_FROM and len(losses) == steps:
        rec["loss_falling"] = train_loss_falling(records)
    return rec


def judge(rec: dict, steps: int, mem_limit_gib: float) -> dict:
    """``rec`` with its verdict: ``fits`` when the child finished with finite losses, its
    peak RSS within the limit and (from ``FALLING_FROM`` steps) its loss falling; ``why``
    says "fits" or why not."""
    ok = rec.get("status") == "ok"
    fits = ok and rec.get("loss_finite", False)
    if ok and not fits:
        rec["why"] = "non-finite loss"
    if fits and rec["peak_rss"] > mem_limit_gib * GIB:
        fits, rec["why"] = False, "peak RSS over the limit"
    if fits and steps >= FALLING_FROM and not rec.get("loss_falling"):
        fits, rec["why"] = False, "the loss did not fall"
    rec["fits"] = fits
    if fits:
        rec["why"] = "fits"
    return rec


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
    read_ahead_mib: int | None = None,
    paged_checkpoint: str = "copy",
) -> dict:
    """Runs one probe (``jaxoff train`` of ``num_layers`` layers in ``mode``) in a child
    process and returns its record, judged (`judge`). The run's store, checkpoint and
    scratch files are removed afterwards."""
    import psutil

    if mem_limit_gib is None:
        mem_limit_gib = psutil.virtual_memory().total / GIB - 1.0
    n_params = num_params(num_layers, d_model, seq_len)
    per = state_bytes_per_param(mode)
    rec: dict = {
        "mode": mode,
        "via": "train",
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
        "paged_checkpoint": paged_checkpoint,
        # the run ends on a checkpoint (with --paged-checkpoint copy, a copy of the store)
        "checkpoint_bytes_needed": checkpoint_bytes(n_params, mode, paged_checkpoint),
    }
    root = Path(store_dir or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    if mode in PAGED_MODES:
        free = shutil.disk_usage(root).free
        rec["disk_free"] = free
        needed = rec["store_bytes_needed"] + rec["checkpoint_bytes_needed"]
        if needed > free - disk_reserve_gib * GIB:
            rec.update(
                fits=False,
                status="skipped",
                why=f"disk-bound (store {needed / 1e9:.1f} GB > "
                f"{free / 1e9:.1f} GB free - {disk_reserve_gib:g} GiB reserve)",
            )
            return rec
    work = Path(tempfile.mkdtemp(prefix="capacity-probe-", dir=root))
    kwargs = dict(
        mode=mode, num_layers=num_layers, d_model=d_model, seq_len=seq_len,
        batch_size=batch_size, steps=steps, store_dir=str(work / "store"), lr=lr, slots=slots,
        warmup_steps=warmup_steps, data=data, read_ahead_mib=read_ahead_mib,
        paged_checkpoint=paged_checkpoint,
    )  # fmt: skip
    try:
        got = run_child(
            "_capacity.probe:run_train_probe",
            kwargs,
            work=work,
            mem_limit_gib=mem_limit_gib,
            min_available_gib=min_available_gib,
            timeout_s=timeout_s,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rec.update(got)
    judge(rec, steps, mem_limit_gib)
    rec["rss_over_state"] = rec["peak_rss"] / rec["state_bytes"]
    return rec
