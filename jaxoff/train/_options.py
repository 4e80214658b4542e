"""The groups of options that make up a :class:`~jaxoff.train.TrainConfig`: the only place
an option of ``jaxoff train`` is defined.

Each group is a frozen dataclass of the options one part of training reads (the optimizer
builder takes :class:`OptimOptions`, the data checks :class:`DataOptions`, ...) and checks its
own values (``check()``); Fuyou's group (``FuyouOptions``) belongs to its strategy
(``jaxoff.strategies.fuyou``). ``TrainConfig`` holds one of each (``cfg.optim_options``, ...)
and reads each option by its flat name too (``cfg.lr`` is ``cfg.optim_options.lr``); the
command line names them flat (``--lr``). No two groups share an option name, so every flat
name (:data:`FLAT_NAMES`, :data:`GROUP_OF`) follows from the groups; `nest` turns flat names
(a TOML file's, an older ``config.json``'s) into groups.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any, Literal

from .._errors import ConfigError
from ..aio import MAX_CHUNK_BYTES
from ..plan import parse_size
from ..strategies.fuyou import FuyouOptions

Optimizer = Literal["adamw", "adam", "lion", "sgd", "rmsprop"]
Strategy = Literal["plain", "fuyou"]
PagedCheckpoint = Literal["copy", "store"]
DEFAULT_MODEL = "mini"  # --model when not given (--init-from then names the model)
TOKEN_DTYPES = ("uint8", "uint16", "uint32")
"""Element types of token files (``--token-dtype``); ``.npy`` files may also be ``int32``."""
TOKEN_FILE_SUFFIXES = (".bin", ".npy")
"""What makes ``--data`` a token file rather than text."""


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

    def check(self) -> None:
        """The batch shape and the held-out share (the files: :meth:`check_files`)."""
        if not self.grad_accum >= 1:
            raise ConfigError(
                f"--grad-accum must be at least 1 (micro-batches per optimizer step; 1: no "
                f"accumulation), got {self.grad_accum}"
            )
        _at_least(self, 1, "batch_size", "seq_len")
        if not 0 < self.val_fraction < 0.5:
            raise ConfigError(f"--val-fraction must be in (0, 0.5), got {self.val_fraction}")

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

    def check(self) -> None:
        _at_least(self, 1, "steps")
        _at_least(self, 0, "warmup_steps", "lr", "weight_decay", "clip_norm")
        if self.lr == 0:
            raise ConfigError("--lr must be positive")
        if self.optimizer not in typing.get_args(Optimizer):
            raise ConfigError(
                f"--optimizer must be one of {', '.join(typing.get_args(Optimizer))}, got "
                f"{self.optimizer!r}"
            )


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

    def check(self) -> None:
        """The counts and the cache's name (the folders are probed last, by
        ``TrainConfig.validate``: nothing is written before every value is known good)."""
        _at_least(self, 1, "eval_batches", "keep_checkpoints")
        _at_least(self, 0, "eval_every", "ckpt_every", "stop_at")
        if not self.compile_cache.strip():
            raise ConfigError(
                "--compile-cache is empty: give a directory, auto (<out-dir>/compile-cache) or "
                "none (JAX's own setting)"
            )


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

    @property
    def paged(self) -> bool:
        """Whether a page store holds the optimizer state (``--store`` is not ``none``)."""
        return self.store != "none"

    def check(self) -> None:

        if self.paged:
            if not 1 <= self.chunk_mib <= MAX_CHUNK_BYTES >> 20:
                raise ConfigError(
                    f"--chunk-mib must be from 1 to {MAX_CHUNK_BYTES >> 20} (MiB per chunk of "
                    f"the paged optimizer state), got {self.chunk_mib}"
                )
            self.host_mem_bytes()  # a size
            if self.store_slots not in (1, 2):
                raise ConfigError(
                    f"--store-slots must be 2 (crash-safe) or 1 (in place, half the disk; a "
                    f"crash mid-step needs --resume from a checkpoint), got {self.store_slots}"
                )
        if self.paged_checkpoint not in typing.get_args(PagedCheckpoint):
            raise ConfigError(
                f"--paged-checkpoint must be copy or store, got {self.paged_checkpoint!r}"
            )
        if self.paged_checkpoint == "store" and not self.paged:
            raise ConfigError(
                "--paged-checkpoint store records the page store's version in each checkpoint, "
                "but --store none keeps the optimizer state in RAM; drop --paged-checkpoint or "
                "give a --store"
            )

    def host_mem_bytes(self) -> int:
        """``--host-mem`` in bytes (0: no RAM tier)."""

        try:
            size = parse_size(self.host_mem)
        except ConfigError:
            size = -1.0
        if size < 0:
            raise ConfigError(
                f"--host-mem must be a size such as 4GiB, 512MiB or 0 (no RAM tier), got "
                f"{self.host_mem!r}"
            )
        return int(size)


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
    """

    placement: str = "device"
    fsdp: int = 1
    strategy: Strategy = "plain"

    def check(self) -> None:
        if self.strategy not in typing.get_args(Strategy):
            raise ConfigError(
                f"--strategy must be one of {', '.join(typing.get_args(Strategy))}, got "
                f"{self.strategy!r}"
            )
        if self.fsdp < 1:
            raise ConfigError(f"--fsdp must be at least 1 (devices), got {self.fsdp}")


GROUPS: dict[str, type] = {
    "model_options": ModelOptions,
    "data_options": DataOptions,
    "optim_options": OptimOptions,
    "run_options": RunOptions,
    "store_options": StoreOptions,
    "strategy_options": StrategyOptions,
    "fuyou_options": FuyouOptions,
}
"""``TrainConfig``'s field name -> the group's type, in field order."""

GROUP_OF: dict[str, str] = {
    f.name: name for name, group in GROUPS.items() for f in dataclasses.fields(group)
}
"""Flat option name -> the ``TrainConfig`` field of the group that holds it."""

FLAT_NAMES: tuple[str, ...] = tuple(GROUP_OF)
"""Every option's flat name, group by group in :data:`GROUPS` order (that of ``jaxoff train
--help``)."""


def nest(values: dict[str, Any], where: str = "TrainConfig") -> dict[str, dict[str, Any]]:
    """``{group field: {option: value}}`` of ``values``, whose keys are flat option names
    (``lr``: a TOML file's ``[train]`` table, a ``config.json`` written before the options
    had groups) or group fields (``optim_options``: a dict of its options, or the group
    itself): the one converter from flat names to groups. Raises `ConfigError` naming
    ``where`` for a key that is neither.

    >>> nest({"lr": 0.5, "run_options": {"seed": 3}})["optim_options"]
    {'lr': 0.5}
    """
    out: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    unknown = []
    for key, value in values.items():
        if key in GROUPS:
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {key} must be a table of its options, got {value!r}")
            bad = sorted(k for k in value if GROUP_OF.get(k) != key)
            if bad:
                raise ConfigError(f"{where}: {key} has no options {bad}")
            out[key].update(value)
        elif key in GROUP_OF:
            out[GROUP_OF[key]][key] = value
        else:
            unknown.append(key)
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {sorted(unknown)}; valid keys are {', '.join(FLAT_NAMES)} "
            f"(or their groups, {', '.join(GROUPS)})"
        )
    return out


def flat_options(doc: dict[str, Any], extra: tuple[str, ...] = ("processes",)) -> dict[str, Any]:
    """A saved ``config.json`` (by group, or flat as written before the groups) as flat
    option names, with the ``extra`` keys it records beside the options (the processes);
    keys it holds of options no longer known are dropped (`nest` for the rest)."""
    known = {k: v for k, v in doc.items() if k in GROUP_OF or k in GROUPS}
    for name in GROUPS:
        if isinstance(known.get(name), dict):
            known[name] = {k: v for k, v in known[name].items() if GROUP_OF.get(k) == name}
    flat = {k: v for group in nest(known, "config.json").values() for k, v in group.items()}
    return flat | {k: doc[k] for k in extra if k in doc}


def _at_least(group: Any, low: int, *names: str) -> None:
    """Each option ``names`` of ``group`` is at least ``low`` (a NaN is not)."""
    for name in names:
        value = getattr(group, name)
        if not value >= low:
            more = "at least 1" if low == 1 else f"{low} or more"
            raise ConfigError(f"--{name.replace('_', '-')} must be {more}, got {value}")


def check_data_options(data: Path | None, tokenizer: Path | None, token_dtype: str) -> None:
    """--tokenizer and --token-dtype fit --data (the files themselves are read by training)."""

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
