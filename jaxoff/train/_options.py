"""The groups of options that make up a :class:`~jaxoff.train.TrainConfig`.

Each group is a frozen dataclass of the options one part of training reads: the optimizer
builder takes :class:`OptimOptions`, the data checks take :class:`DataOptions`, and so on.
``TrainConfig`` holds one of each (``cfg.optim_options``, ...) and reads each option by its
flat name too (``cfg.lr`` is ``cfg.optim_options.lr``); the command line and ``config.json``
use the flat names. No two groups share an option name.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Literal

from .._errors import ConfigError

Optimizer = Literal["adamw", "adam", "lion", "sgd", "rmsprop"]
Strategy = Literal["plain", "fuyou"]
PagedCheckpoint = Literal["copy", "store"]
DEFAULT_MODEL = "mini"  # --model when not given (--init-from then names the model)


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """What is trained: the model, its dtypes and its remat/offload policy.

    Attributes:
        model: the model: a size name (GPT: tiny, mini, small, medium, large, xl, ...; Llama:
            llama-tiny, llama-mini, ...), ``package.module:factory`` naming a model config of
            your own (see ``jaxoff.nn``), or, from Python, a model config object.
        policy: remat/offload policy of the scanned layers: a preset (none, full, selective,
            offload_all, offload_dots, sqrt, ...), a ``jax.checkpoint_policies`` name, or
            ``name=action`` pairs over the model's residual names, separated by commas, such as
            ``attn_probs=remat,mlp_act=offload,*=device``.
        positions: ``learned`` or ``rotary`` position encoding (models with a ``positions``
            field, such as the GPT); default: the model's own.
        dtype: compute dtype (float32 or bfloat16); default: the model's own.
        param_dtype: parameter dtype (float32 or bfloat16); default: the model's own.
        plan: a plan file from ``jaxoff plan``: its remat/offload policy replaces --policy
            (the plan must be for this model and batch shape).
        init_from: a Hugging Face checkpoint folder (config.json, *.safetensors; Llama,
            Mistral, Qwen2, Qwen3 or GPT-2): the model is the folder's (leave --model out)
            and its parameters start from the checkpoint's instead of a random init; with
            --strategy fuyou --page-params the blocks are read into the page store one layer
            at a time. Its tokenizer.json encodes a text --data when --tokenizer is not given.
            A --resume continues from the run's checkpoint (pass the same --init-from).
            See ``docs/guide/pretrained.md``.
    """

    model: str = DEFAULT_MODEL
    policy: str = "none"
    positions: Literal["learned", "rotary"] | None = None
    dtype: str | None = None
    param_dtype: str | None = None
    plan: Path | None = None
    init_from: Path | None = None


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """What it is trained on: the corpus, how it is read, and the batch shape.

    ``jaxoff.train`` reads the tokens with ``load_tokens(data, tokenizer, token_dtype)``
    and holds ``val_fraction`` of them out (see :meth:`check`).

    Attributes:
        batch_size: sequences per micro-batch: per step without --grad-accum, and the
            batch of each validation loss.
        grad_accum: micro-batches per optimizer step (gradient accumulation, N): a step
            reads N times --batch-size sequences and runs them one micro-batch at a time
            (micro-batch i: rows i, i + N, i + 2N, ... of the step's batch), adding their
            float32 gradients in order; the optimizer updates once with their mean (clipped
            by --clip-norm), and the step's loss is the mean of theirs. Memory: one
            micro-batch's activations plus a float32 gradient accumulator. Steps (those of
            the schedule, of --steps) are optimizer steps; a run resumes only with the
            same --grad-accum. Not with --strategy fuyou, nor with a streamed placement.
            See docs/guide/training.md#gradient-accumulation.
        seq_len: tokens per sequence.
        data: a text file or folder (bytes, or text for --tokenizer); a ``.bin`` token file
            (raw little-endian uint16 ids as nanoGPT's ``prepare.py`` writes, or uint32: see
            --token-dtype) or a ``.npy`` token file, memory-mapped; default: this Python's
            standard-library source. See ``docs/guide/your-model.md``.
        tokenizer: a Hugging Face ``tokenizers`` JSON file that encodes the --data text
            (needs ``pip install 'jaxoff[data]'``); the model's vocab_size must cover its
            vocabulary.
        token_dtype: element type of a ``.bin`` token file: ``auto`` (the ``dtype`` of a
            ``<file>.json`` or ``meta.json`` sidecar, else uint16), ``uint16`` or ``uint32``.
        val_fraction: share of the corpus held out for validation.
    """

    batch_size: int = 16
    grad_accum: int = 1
    seq_len: int = 128
    data: Path | None = None
    tokenizer: Path | None = None
    token_dtype: str = "auto"
    val_fraction: float = 0.05

    def check_files(self) -> None:
        """--data exists, and --tokenizer and --token-dtype fit it (raises ConfigError)."""
        if self.data is not None and not Path(self.data).exists():
            raise ConfigError(f"--data {self.data}: no such file or directory")
        check_data_options(self.data, self.tokenizer, self.token_dtype)


@dataclasses.dataclass(frozen=True)
class OptimOptions:
    """The optimizer and its learning-rate schedule (built by
    :func:`jaxoff.train._optimizers.build_optimizer_parts`).

    Attributes:
        steps: total optimizer steps of the run (the schedule spans them).
        optimizer: adamw, adam, lion, sgd (with momentum) or rmsprop.
        lr: peak learning rate (linear warm-up, then cosine decay to 10%).
        warmup_steps: steps of linear warm-up.
        weight_decay: decoupled weight decay (adamw and lion).
        clip_norm: global gradient-norm clipping; 0 disables it.
    """

    steps: int = 150
    optimizer: Optimizer = "adamw"
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    clip_norm: float = 1.0


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How the run is driven: its folder, checkpoints, evaluation, resumption, seed.

    Attributes:
        seed: seeds parameter init and the batch order.
        eval_every: steps between validation losses; 0 disables them.
        eval_batches: batches per validation loss.
        out_dir: run folder: metrics.jsonl, config.json, checkpoints/.
        ckpt_every: steps between orbax checkpoints; 0: only the last step's (a run ends on one).
        keep_checkpoints: checkpoints kept on disk.
        resume: continue from the latest checkpoint in out_dir (a run stopped before its
            first checkpoint starts again from step 0).
        resume_fallback: with --resume, when the latest checkpoint fails its checksums, remove
            it and continue from the newest one that passes (said in one line); without it a
            damaged checkpoint is an error.
        resume_unverified: with --resume, admit checkpoints none of which has a
            ``checksums.json`` (all deleted, or written by a jaxoff that did not checksum),
            unverified; without it such a run is refused.
        overwrite: replace a previous run in out_dir (its metrics and checkpoints are deleted).
        stop_at: stop after this step (as if interrupted), checkpointing first; 0 runs to the end.
        progress: show progress: a live bar where stderr is a terminal, else a plain line
            every few steps; False (--no-progress) shows none.
        compile_cache: JAX's persistent compilation cache for this run, so that a resumed run
            loads its compiled step instead of compiling it again: ``auto`` keeps the cache
            already configured (``JAX_COMPILATION_CACHE_DIR``), else uses
            ``<out_dir>/compile-cache``; a directory uses it; ``none`` leaves a cache
            configured outside jaxoff as it is. In a process that trains several runs
            (``jaxoff.train.train``), each run's ``auto`` uses its own out_dir, and ``none``
            turns off a cache an earlier run set.
    """

    seed: int = 0
    eval_every: int = 50
    eval_batches: int = 4
    out_dir: Path = Path("runs/default")
    ckpt_every: int = 100
    keep_checkpoints: int = 2
    resume: bool = False
    resume_fallback: bool = False
    resume_unverified: bool = False
    overwrite: bool = False
    stop_at: int = 0
    progress: bool = True
    compile_cache: str = "auto"


@dataclasses.dataclass(frozen=True)
class StoreOptions:
    """Where the optimizer state lives: RAM, or a page store on disk.

    Attributes:
        store: where the optimizer state lives (with 16-bit parameters also the fp32 master
            weights; float32 parameters are their own masters): ``auto`` pages it to
            ``<out_dir>/store`` (``jaxoff.paged``: streamed chunk by chunk through the async
            I/O engine), a directory pages it there, ``none`` keeps it in RAM.
        chunk_mib: MiB per chunk of the paged optimizer state (with --store).
        store_slots: 2 keeps the last committed optimizer step on disk while the next one is
            written (a crash mid-step loses nothing); 1 updates the store in place with half
            the disk (12 instead of 24 bytes/parameter with AdamW), and a crash mid-step is
            then recovered from the last checkpoint (--resume).
        paged_checkpoint: what a checkpoint holds of the paged state: ``copy`` streams the
            store's committed version into it (the disk then holds the state twice; the
            checkpoint stays restorable whatever the store does next); ``store`` records that
            version of the store by its checksums, without a copy (no extra disk, for a store
            as large as the disk). A ``store`` checkpoint restores only from the same --store
            and only while the store still holds that version: the next step overwrites it
            (with --store-slots 2, the step after), so it suits a run's last checkpoint;
            --resume then falls back to an older checkpoint (--resume-fallback) or says so.
        host_mem: host memory for the page store's RAM tier (e.g. 4GiB; 0: none): its first
            entries, as many as fit, live in RAM (a tmpfs: /dev/shm, or $JAXOFF_HOST_MEM_DIR)
            and the rest on disk, in one store with the same checksums and commits. Checked
            against MemAvailable and the cgroup limit before anything is written; the RAM
            files do not survive a reboot (--resume then rebuilds the store from the last
            checkpoint).
    """

    store: str = "auto"
    chunk_mib: int = 16
    store_slots: int = 2
    paged_checkpoint: PagedCheckpoint = "copy"
    host_mem: str = "0"


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """How each step is trained: the placement, the FSDP mesh and the strategy
    (with Fuyou's own options).

    Attributes:
        placement: where parameters and optimizer states live (jaxoff.placement presets):
            device, host_opt, host_opt_xfer, host_params, host_params_stream<N> (layers
            streamed from host memory N layers ahead; needs --policy full).
        fsdp: devices of the FSDP mesh axis: parameters, gradients and optimizer states
            sharded over them, the batch split over them; 1 runs on one device.
        strategy: how each step is trained: ``plain`` (gradients, then the optimizer update;
            with --fsdp > 1 and --store, FSDP with each process paging its own blocks) or
            ``fuyou`` (``jaxoff.strategies.fuyou``): the paged optimizer update of each layer
            inside the backward layer scan, pipelined with the next layer's gradients. Fuyou
            needs a page store (--store), --clip-norm 0 (each layer is updated before the
            global gradient norm exists), one device (--fsdp 1, --placement device); it
            recomputes each block in backward, so its --policy is none (the default) or one
            that recomputes everything (full, nothing_saveable).
        fuyou: the same as --strategy fuyou (an alias).
        page_params: with --strategy fuyou, the stacked block parameters live in the page
            store too (ZeRO-Infinity's parameter offload): each layer's are read one layer
            ahead in forward and in backward and written by its update, so RAM holds the
            embeddings, the head and a window of two layers instead of the model. Evaluation
            reads them from the store the same way.
        fuyou_read_ahead_mib: with --strategy fuyou, MiB of optimizer state read ahead of
            each layer's update while the layer above it is differentiated: the whole layer
            when its state fits, else the leading chunks of each of its tensors (the rest is
            read by the update itself, not hidden). Staging may hold four times this; 0 reads
            each tensor's first chunk only. Default: 128 MiB or 1/32 of RAM, the larger.
    """

    placement: str = "device"
    fsdp: int = 1
    strategy: Strategy = "plain"
    fuyou: bool = False
    page_params: bool = False
    fuyou_read_ahead_mib: int | None = None


GROUPS: dict[str, type] = {
    "model_options": ModelOptions,
    "data_options": DataOptions,
    "optim_options": OptimOptions,
    "run_options": RunOptions,
    "store_options": StoreOptions,
    "strategy_options": StrategyOptions,
}
"""``TrainConfig``'s field name -> the group's type, in field order."""

GROUP_OF: dict[str, str] = {
    f.name: name for name, group in GROUPS.items() for f in dataclasses.fields(group)
}
"""Flat option name -> the ``TrainConfig`` field of the group that holds it."""

FLAT_NAMES: tuple[str, ...] = (
    "model",
    "init_from",
    "policy",
    "positions",
    "dtype",
    "param_dtype",
    "batch_size",
    "grad_accum",
    "seq_len",
    "steps",
    "optimizer",
    "lr",
    "warmup_steps",
    "weight_decay",
    "clip_norm",
    "seed",
    "data",
    "tokenizer",
    "token_dtype",
    "val_fraction",
    "eval_every",
    "eval_batches",
    "out_dir",
    "ckpt_every",
    "keep_checkpoints",
    "resume",
    "resume_fallback",
    "resume_unverified",
    "overwrite",
    "stop_at",
    "progress",
    "plan",
    "store",
    "chunk_mib",
    "store_slots",
    "paged_checkpoint",
    "host_mem",
    "placement",
    "fsdp",
    "strategy",
    "fuyou",
    "page_params",
    "fuyou_read_ahead_mib",
    "compile_cache",
)
"""Every option's flat name, in the order of ``jaxoff train --help`` (and of the
flat dataclass ``TrainConfig`` was before it had groups); ``TrainConfig`` reads each
by this name, in this order."""


def check_data_options(data: Path | None, tokenizer: Path | None, token_dtype: str) -> None:
    """--tokenizer and --token-dtype fit --data (the files themselves are read by training)."""
    from ._data import TOKEN_DTYPES, TOKEN_FILE_SUFFIXES

    is_token_file = data is not None and Path(data).suffix in TOKEN_FILE_SUFFIXES
    if token_dtype != "auto" and token_dtype not in TOKEN_DTYPES:
        raise ConfigError(
            f"--token-dtype {token_dtype!r} is not a token type; choose auto or one of "
            f"{', '.join(TOKEN_DTYPES)}"
        )
    if token_dtype != "auto" and not (
        is_token_file and data is not None and Path(data).suffix == ".bin"
    ):
        raise ConfigError(
            f"--token-dtype {token_dtype} applies to .bin token files, not to --data "
            f"{data or 'default (text)'}; leave it at auto"
        )
    if tokenizer is not None:
        if is_token_file:
            raise ConfigError(
                f"--data {data} is already tokens; --tokenizer encodes text files: leave it out"
            )
        if not Path(tokenizer).is_file():
            raise ConfigError(f"--tokenizer {tokenizer}: no such file (a tokenizers JSON file)")


def check_writable(path: Path, option: str, alternative: str) -> None:
    """Creates the directory ``path`` (given as ``option``) and proves a file can be written
    there; the errors name ``alternative``, what the user can pass instead."""
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"{option} {path} is a file, not a directory; name a directory (it is created), "
            f"or {alternative}"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"  # processes of one run probe at once
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(
            f"{option} {path} is not writable ({e.strerror}); {alternative}"
        ) from None
