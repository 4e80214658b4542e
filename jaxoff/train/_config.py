"""The training configuration: one frozen dataclass, validated, loadable from TOML."""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from pathlib import Path
from typing import Literal

import jax
import optax

from .._errors import ConfigError
from ..nn._protocol import model_name

Optimizer = Literal["adamw", "adam", "lion", "sgd", "rmsprop"]
Strategy = Literal["plain", "fuyou"]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything ``jaxoff train`` needs. Every field is a command-line option.

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
        batch_size: sequences per step.
        seq_len: tokens per sequence.
        steps: total optimizer steps of the run (the schedule spans them).
        optimizer: adamw, adam, lion, sgd (with momentum) or rmsprop.
        lr: peak learning rate (linear warm-up, then cosine decay to 10%).
        warmup_steps: steps of linear warm-up.
        weight_decay: decoupled weight decay (adamw and lion).
        clip_norm: global gradient-norm clipping; 0 disables it.
        seed: seeds parameter init and the batch order.
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
        store: where the optimizer state lives (with 16-bit parameters also the fp32 master
            weights; float32 parameters are their own masters): ``auto`` pages it to
            ``<out_dir>/store`` (``jaxoff.paged``: streamed chunk by chunk through the async
            I/O engine), a directory pages it there, ``none`` keeps it in RAM.
        chunk_mib: MiB per chunk of the paged optimizer state (with --store).
        store_slots: 2 keeps the last committed optimizer step on disk while the next one is
            written (a crash mid-step loses nothing); 1 updates the store in place with half
            the disk (12 instead of 24 bytes/parameter with AdamW), and a crash mid-step is
            then recovered from the last checkpoint (--resume).
        plan: a plan file from ``jaxoff plan``: its remat/offload policy replaces --policy
            (the plan must be for this model and batch shape).
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
        compile_cache: JAX's persistent compilation cache for this run, so that a resumed run
            loads its compiled step instead of compiling it again: ``auto`` keeps the cache
            already configured (``JAX_COMPILATION_CACHE_DIR``), else uses
            ``<out_dir>/compile-cache``; a directory uses it; ``none`` leaves a cache
            configured outside jaxoff as it is. In a process that trains several runs
            (``jaxoff.train.train``), each run's ``auto`` uses its own out_dir, and ``none``
            turns off a cache an earlier run set.
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

    model: str = "mini"
    policy: str = "none"
    positions: Literal["learned", "rotary"] | None = None
    dtype: str | None = None
    param_dtype: str | None = None
    batch_size: int = 16
    seq_len: int = 128
    steps: int = 300
    optimizer: Optimizer = "adamw"
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    seed: int = 0
    data: Path | None = None
    tokenizer: Path | None = None
    token_dtype: str = "auto"
    val_fraction: float = 0.05
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
    plan: Path | None = None
    store: str = "auto"
    chunk_mib: int = 16
    store_slots: int = 2
    placement: str = "device"
    fsdp: int = 1
    strategy: Strategy = "plain"
    fuyou: bool = False
    page_params: bool = False
    fuyou_read_ahead_mib: int | None = None
    compile_cache: str = "auto"

    def validate(self) -> TrainConfig:
        """Checks every value; raises :class:`ConfigError` naming the option and the fix."""
        if self.plan is not None:
            from ..plan._planfile import apply_plan

            self = apply_plan(self)  # noqa: PLW0642 (the plan's policy replaces --policy)
        if self.strategy not in typing.get_args(Strategy):
            raise ConfigError(
                f"--strategy must be one of {', '.join(typing.get_args(Strategy))}, got "
                f"{self.strategy!r}"
            )
        if self.fuyou != (self.strategy == "fuyou"):  # --fuyou is --strategy fuyou
            self = dataclasses.replace(self, strategy="fuyou", fuyou=True)  # noqa: PLW0642

        model = self.model_config()  # raises ConfigError naming a bad --model or --policy
        for name in ("batch_size", "seq_len", "steps", "eval_batches", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{_opt(name)} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "ckpt_every", "stop_at"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{_opt(name)} must be 0 or more, got {getattr(self, name)}")
        for name in ("lr", "weight_decay", "clip_norm"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"--{_opt(name)} must be 0 or more, got {getattr(self, name)}")
        if self.lr == 0:
            raise ConfigError("--lr must be positive")
        if not 0 < self.val_fraction < 0.5:
            raise ConfigError(f"--val-fraction must be in (0, 0.5), got {self.val_fraction}")
        if self.seq_len > model.max_seq_len:
            raise ConfigError(
                f"--seq-len {self.seq_len} exceeds model {model_name(model)}'s max_seq_len "
                f"{model.max_seq_len}; use a shorter --seq-len"
            )
        from ..placement import check_placement, make_mesh

        make_mesh(self.fsdp)  # raises ConfigError when the devices are not there
        if jax.process_count() > 1 and self.fsdp != jax.device_count():
            raise ConfigError(
                f"--fsdp {self.fsdp}: under {jax.process_count()} processes the FSDP mesh "
                f"spans every device of every process; pass --fsdp {jax.device_count()}"
            )
        check_placement(
            self.placement,
            model,
            policy=self.policy,
            devices=self.fsdp,
            batch_size=self.batch_size,
        )
        if self.store_dir() is not None:
            from ..aio._layout import MAX_CHUNK_BYTES  # the page store's own bound

            if not 1 <= self.chunk_mib <= MAX_CHUNK_BYTES >> 20:
                raise ConfigError(
                    f"--chunk-mib must be from 1 to {MAX_CHUNK_BYTES >> 20} (MiB per chunk of the "
                    f"paged optimizer state), got {self.chunk_mib}"
                )
            if self.store_slots not in (1, 2):
                raise ConfigError(
                    f"--store-slots must be 2 (crash-safe) or 1 (in place, half the disk; a "
                    f"crash mid-step needs --resume from a checkpoint), got {self.store_slots}"
                )
        self._check_fuyou(model)
        if self.data is not None and not Path(self.data).exists():
            raise ConfigError(f"--data {self.data}: no such file or directory")
        _check_data_options(self.data, self.tokenizer, self.token_dtype)
        _check_writable(Path(self.out_dir), "--out-dir", "choose another --out-dir")
        if not self.compile_cache.strip():
            raise ConfigError(
                "--compile-cache is empty: give a directory, auto (<out-dir>/compile-cache) or "
                "none (JAX's own setting)"
            )
        if self.compile_cache not in ("auto", "none"):
            _check_writable(
                Path(self.compile_cache).expanduser(),
                "--compile-cache",
                "choose another directory, auto or none",
            )
        store = self.store_dir()
        if store is not None:
            _check_writable(store, "--store", "choose another --store directory, or --store none")
        return self

    def _check_fuyou(self, model) -> None:
        """--fuyou and --page-params fit the rest of the options (each error says what to
        change)."""
        if self.page_params and not self.fuyou:
            raise ConfigError(
                "--page-params pages the block parameters through Fuyou's step: add --fuyou"
            )
        if self.fuyou_read_ahead_mib is not None and not self.fuyou:
            raise ConfigError(
                "--fuyou-read-ahead-mib sets what Fuyou's step reads ahead of each layer's "
                "update: add --fuyou, or leave it out"
            )
        if self.fuyou_read_ahead_mib is not None and self.fuyou_read_ahead_mib < 0:
            raise ConfigError(
                f"--fuyou-read-ahead-mib must be >= 0 (MiB of optimizer state read ahead of "
                f"each layer's update; 0: each tensor's first chunk only), got "
                f"{self.fuyou_read_ahead_mib}"
            )
        if not self.fuyou:
            return
        from ..nn import recomputes_everything

        stack = getattr(model, "stack", None)
        if self.policy != "none" and not recomputes_everything(getattr(stack, "policy", None)):
            raise ConfigError(
                f"--policy {self.policy} does not apply to --strategy fuyou, which recomputes "
                f"each block whole in backward (what --policy full does): leave --policy out "
                f"or pass --policy full"
            )
        if self.store_dir() is None:
            raise ConfigError(
                "--fuyou pages the optimizer state inside the backward pass and needs a page "
                "store: leave out --store none (or name a --store directory)"
            )
        if self.clip_norm > 0:
            raise ConfigError(
                "--fuyou updates each layer inside the backward pass, as soon as its gradients "
                f"exist, so it cannot clip by the global gradient norm (--clip-norm "
                f"{self.clip_norm} needs every gradient before the first update): pass "
                "--clip-norm 0"
            )
        if self.fsdp != 1 or jax.process_count() > 1:
            raise ConfigError(
                "--fuyou runs on one device in one process: use --fsdp 1 (and one process), "
                "or leave out --fuyou"
            )
        if self.placement != "device":
            raise ConfigError(
                f"--fuyou keeps the parameters in the training state (or, with "
                f"--page-params, in the page store) and the optimizer state in the store: "
                f"--placement {self.placement} does not apply; use --placement device"
            )
        from ..strategies.fuyou import check_model

        check_model(model)  # a protocol model with stacked blocks, one block per layer step

    def fuyou_read_ahead_bytes(self) -> int | None:
        """``--fuyou-read-ahead-mib`` in bytes (None: Fuyou's default)."""
        mib = self.fuyou_read_ahead_mib
        return None if mib is None else mib << 20

    def model_config(self):
        """The model config this run trains (a :class:`jaxoff.nn.LayeredModel`), with
        ``--positions``/``--dtype``/``--param-dtype`` and the policy's stack applied."""
        from ..nn import load_model
        from ..policy import apply_policy

        base = load_model(self.model)
        fields = {f.name for f in dataclasses.fields(base)}
        over = {}
        for name in ("positions", "dtype", "param_dtype"):
            value = getattr(self, name)
            if value is None:
                continue
            if name not in fields:
                raise ConfigError(
                    f"--{_opt(name)}: model {model_name(base)} has no {name} field; leave the "
                    f"option out"
                )
            over[name] = value
        try:
            base = dataclasses.replace(base, **over)
        except ValueError as e:  # the model's own validation (e.g. an unknown dtype name)
            raise ConfigError(f"--model {model_name(base)}: {e}") from None
        return apply_policy(base, self.policy)

    def model_label(self) -> str:
        """The model's name as written in records (``config.json``, tables)."""
        return self.model if isinstance(self.model, str) else model_name(self.model)

    def store_dir(self) -> Path | None:
        """The page-store directory of the optimizer state, or ``None`` to keep it in RAM."""
        if self.store == "none":
            return None
        root = Path(self.out_dir) / "store" if self.store == "auto" else Path(self.store)
        if jax.process_count() > 1:  # one store per process (on its host's disk)
            return root / f"process-{jax.process_index()}"
        return root

    def step_kind(self) -> str:
        """Which step trains this run (``jaxoff.strategies.STEP_BUILDERS``): ``fuyou``,
        ``sharded`` (FSDP blocks paged by each process: :meth:`sharded_store`) or ``plain``."""
        return "sharded" if self.strategy == "plain" and self.sharded_store() else self.strategy

    def sharded_store(self) -> bool:
        """Whether the paged optimizer pages FSDP blocks (``--store`` with ``--fsdp`` > 1,
        one store per process; see ``jaxoff.distributed``)."""
        return self.store_dir() is not None and self.fsdp > 1

    def resolved_placement(self):
        """The ``jaxoff.placement.Placement`` of this run: ``--placement``, with the optimizer
        state on disk when ``--store`` pages it (see ``with_paged_optimizer``)."""
        from ..placement import get_placement, with_paged_optimizer

        if self.store_dir() is None:
            return get_placement(self.placement)
        return with_paged_optimizer(self.placement)

    def mesh(self):
        """The FSDP ``Mesh`` of ``--fsdp`` devices, or ``None`` for one device."""
        from ..placement import make_mesh

        return make_mesh(self.fsdp)

    def schedule(self) -> optax.Schedule:
        # at least one warm-up step and one decay step, so that --steps 1 runs
        warmup = max(min(self.warmup_steps, self.steps - 1), 1)
        return optax.warmup_cosine_decay_schedule(
            0.0, self.lr, warmup, max(self.steps, warmup + 1), end_value=self.lr * 0.1
        )

    def build_optimizer(self) -> optax.GradientTransformation:
        """The optax chain: optional global-norm clipping, then the optimizer."""
        pre, tx = self.build_optimizer_parts()
        return tx if pre is None else optax.chain(pre, tx)

    def build_optimizer_parts(self):
        """``(clipping or None, the rest)``; the rest is paged when ``--store`` pages. With
        ``--store`` the clipping is inside the paged transformation (it splits it off and
        runs it on the gradients in RAM), except for FSDP blocks (:meth:`sharded_store`):
        there the clipping must see the global gradients, so it is returned apart."""
        lr = self.schedule()
        make = {
            "adamw": lambda: optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=self.weight_decay),
            "adam": lambda: optax.adam(lr, b1=0.9, b2=0.95),
            "lion": lambda: optax.lion(lr, weight_decay=self.weight_decay),
            "sgd": lambda: optax.sgd(lr, momentum=0.9),
            "rmsprop": lambda: optax.rmsprop(lr),
        }
        if self.optimizer not in make:
            raise ConfigError(f"--optimizer must be one of {', '.join(make)}")
        tx = make[self.optimizer]()
        pre = optax.clip_by_global_norm(self.clip_norm) if self.clip_norm > 0 else None
        store = self.store_dir()
        if store is None:
            return pre, tx
        from ..optim import paged

        if pre is not None and not self.sharded_store():
            # the leading clip is split off and runs on the gradients in RAM
            tx, pre = optax.chain(pre, tx), None
        # every optimizer of the menu above is element-wise, and its paged update is compared
        # bitwise with optax's in the tests: the probe would only cost seconds of tracing
        return pre, paged(
            tx, store, chunk_bytes=self.chunk_mib << 20, slots=self.store_slots, probe=False
        )

    def to_json(self) -> dict:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["model"] = self.model_label()
        values["processes"] = jax.process_count()  # a run resumes on as many processes
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}


# Fields that may differ between a run and its resumption without changing the result.
RESUMABLE_CHANGES = frozenset(
    {
        "resume",
        "resume_fallback",
        "resume_unverified",
        "overwrite",
        "out_dir",  # a moved run resumes where it now lies
        "stop_at",
        "progress",
        "eval_every",
        "eval_batches",
        "ckpt_every",
        "keep_checkpoints",
        "store",  # the paged state is restored from the checkpoint into any store directory
        "chunk_mib",
        "store_slots",
        "fuyou_read_ahead_mib",  # how far reads run ahead, not what the step computes
        "compile_cache",  # where compiled programs are kept, not what they compute
    }
)


def _opt(field: str) -> str:
    return field.replace("_", "-")


def _check_data_options(data: Path | None, tokenizer: Path | None, token_dtype: str) -> None:
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


def _check_writable(path: Path, option: str, alternative: str) -> None:
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


def _type_error(value, hint) -> str | None:
    """What is wrong with a TOML ``value`` for a field annotated ``hint``; None if it fits."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        return None if value in args else f"one of {', '.join(map(repr, args))}"
    if args:  # a union, e.g. Path | None (TOML has no null: the value is one of the others)
        errors = [_type_error(value, a) for a in args if a is not type(None)]
        return None if None in errors else " or ".join(e for e in errors if e is not None)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
        Path: isinstance(value, str),
    }
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return None if ok.get(hint, True) else names.get(hint, "a path string")


def load_config_file(path: Path | str) -> dict:
    """Reads a TOML config file into ``TrainConfig`` keyword arguments (unknown keys refused)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not valid TOML ({e})") from None
    values = values.get("train", values)
    known = {f.name: f for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"--config {path}: unknown keys {unknown}; valid keys are {', '.join(known)}"
        )
    hints = typing.get_type_hints(TrainConfig)
    for key, value in values.items():
        expected = _type_error(value, hints[key])
        if expected is not None:
            raise ConfigError(
                f"--config {path}: {key} must be {expected}, got {value!r} "
                f"({type(value).__name__}); fix that line or leave it out"
            )
    for key in ("data", "tokenizer", "out_dir", "plan"):
        if values.get(key) is not None:
            values[key] = Path(values[key])
    return values
