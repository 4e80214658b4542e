"""The training configuration: frozen groups of options, validated, loadable from TOML."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import jax
import optax

from .._errors import ConfigError
from ..nn._protocol import model_name
from ._config_file import load_config_file as load_config_file  # its old home
from ._optimizers import build_optimizer_parts, schedule
from ._options import (
    DEFAULT_MODEL,
    FLAT_NAMES,
    GROUP_OF,
    GROUPS,
    DataOptions,
    ModelOptions,
    OptimOptions,
    PagedCheckpoint,
    RunOptions,
    StoreOptions,
    Strategy,
    StrategyOptions,
    check_writable,
)
from ._options import check_data_options as _check_data_options  # noqa: F401 (its old name)

T = TypeVar("T")


class _Flat(Generic[T]):
    """A flat, read-only option name of :class:`TrainConfig`: ``cfg.lr`` reads
    ``cfg.optim_options.lr``."""

    def __init__(self, read: Callable[[TrainConfig], T]) -> None:
        self._read = read

    @overload
    def __get__(self, obj: None, owner: type) -> _Flat[T]: ...
    @overload
    def __get__(self, obj: TrainConfig, owner: type) -> T: ...
    def __get__(self, obj: TrainConfig | None, owner: type) -> T | _Flat[T]:
        return self if obj is None else self._read(obj)


@dataclasses.dataclass(frozen=True, init=False)
class TrainConfig:
    """Everything ``jaxoff train`` needs: six frozen groups of options. Every option is a
    command-line option.

    The groups (``jaxoff.train._options``) are :class:`ModelOptions` (``model_options``:
    model, init_from, policy, positions, dtype, param_dtype, plan), :class:`DataOptions`
    (``data_options``: the corpus and the batch shape), :class:`OptimOptions`
    (``optim_options``: the optimizer, its schedule and steps), :class:`RunOptions`
    (``run_options``: out_dir, checkpoints, evaluation, resumption, seed),
    :class:`StoreOptions` (``store_options``: the page store) and :class:`StrategyOptions`
    (``strategy_options``: placement, FSDP, strategy and Fuyou's options). Each option is
    documented in its group.

    ``TrainConfig(...)`` takes the groups, or the options by their flat names, or both (a
    flat name then replaces that option of the group given), and every option reads by its
    flat name too: ``TrainConfig(steps=6).steps == 6``. ``dataclasses.replace(cfg, lr=1e-3)``
    works the same way. The command line, TOML files and ``config.json`` use the flat names.

    >>> cfg = TrainConfig(model="tiny", lr=1e-3)
    >>> cfg.lr, cfg.optim_options.lr, cfg.model_options.model
    (0.001, 0.001, 'tiny')
    >>> cfg == TrainConfig(model_options=ModelOptions(model="tiny"),
    ...                    optim_options=OptimOptions(lr=1e-3))
    True
    """

    model_options: ModelOptions
    data_options: DataOptions
    optim_options: OptimOptions
    run_options: RunOptions
    store_options: StoreOptions
    strategy_options: StrategyOptions

    def __init__(
        self,
        *,
        model_options: ModelOptions | None = None,
        data_options: DataOptions | None = None,
        optim_options: OptimOptions | None = None,
        run_options: RunOptions | None = None,
        store_options: StoreOptions | None = None,
        strategy_options: StrategyOptions | None = None,
        **options: Any,
    ) -> None:
        unknown = [k for k in options if k not in GROUP_OF]
        if unknown:
            raise TypeError(f"TrainConfig got unexpected keyword arguments {unknown}")
        given = {
            "model_options": model_options,
            "data_options": data_options,
            "optim_options": optim_options,
            "run_options": run_options,
            "store_options": store_options,
            "strategy_options": strategy_options,
        }
        for name, group in GROUPS.items():
            value = given[name]
            if value is None:
                value = group()
            elif not isinstance(value, group):
                raise TypeError(f"TrainConfig: {name} must be a {group.__name__}, got {value!r}")
            mine = {k: v for k, v in options.items() if GROUP_OF[k] == name}
            if mine:
                value = dataclasses.replace(value, **mine)
            object.__setattr__(self, name, value)

    # the options by their flat names, in FLAT_NAMES order (the command line's)
    model = _Flat(lambda c: c.model_options.model)
    init_from = _Flat(lambda c: c.model_options.init_from)
    policy = _Flat(lambda c: c.model_options.policy)
    positions = _Flat(lambda c: c.model_options.positions)
    dtype = _Flat(lambda c: c.model_options.dtype)
    param_dtype = _Flat(lambda c: c.model_options.param_dtype)
    batch_size = _Flat(lambda c: c.data_options.batch_size)
    grad_accum = _Flat(lambda c: c.data_options.grad_accum)
    seq_len = _Flat(lambda c: c.data_options.seq_len)
    steps = _Flat(lambda c: c.optim_options.steps)
    optimizer = _Flat(lambda c: c.optim_options.optimizer)
    lr = _Flat(lambda c: c.optim_options.lr)
    warmup_steps = _Flat(lambda c: c.optim_options.warmup_steps)
    weight_decay = _Flat(lambda c: c.optim_options.weight_decay)
    clip_norm = _Flat(lambda c: c.optim_options.clip_norm)
    seed = _Flat(lambda c: c.run_options.seed)
    data = _Flat(lambda c: c.data_options.data)
    tokenizer = _Flat(lambda c: c.data_options.tokenizer)
    token_dtype = _Flat(lambda c: c.data_options.token_dtype)
    val_fraction = _Flat(lambda c: c.data_options.val_fraction)
    eval_every = _Flat(lambda c: c.run_options.eval_every)
    eval_batches = _Flat(lambda c: c.run_options.eval_batches)
    out_dir = _Flat(lambda c: c.run_options.out_dir)
    ckpt_every = _Flat(lambda c: c.run_options.ckpt_every)
    keep_checkpoints = _Flat(lambda c: c.run_options.keep_checkpoints)
    resume = _Flat(lambda c: c.run_options.resume)
    resume_fallback = _Flat(lambda c: c.run_options.resume_fallback)
    resume_unverified = _Flat(lambda c: c.run_options.resume_unverified)
    overwrite = _Flat(lambda c: c.run_options.overwrite)
    stop_at = _Flat(lambda c: c.run_options.stop_at)
    progress = _Flat(lambda c: c.run_options.progress)
    plan = _Flat(lambda c: c.model_options.plan)
    store = _Flat(lambda c: c.store_options.store)
    chunk_mib = _Flat(lambda c: c.store_options.chunk_mib)
    store_slots = _Flat(lambda c: c.store_options.store_slots)
    paged_checkpoint = _Flat(lambda c: c.store_options.paged_checkpoint)
    host_mem = _Flat(lambda c: c.store_options.host_mem)
    placement = _Flat(lambda c: c.strategy_options.placement)
    fsdp = _Flat(lambda c: c.strategy_options.fsdp)
    strategy = _Flat(lambda c: c.strategy_options.strategy)
    fuyou = _Flat(lambda c: c.strategy_options.fuyou)
    page_params = _Flat(lambda c: c.strategy_options.page_params)
    fuyou_read_ahead_mib = _Flat(lambda c: c.strategy_options.fuyou_read_ahead_mib)
    compile_cache = _Flat(lambda c: c.run_options.compile_cache)

    def options(self) -> dict[str, Any]:
        """The options by their flat names, in :data:`FLAT_NAMES` order: the keyword
        arguments that build this config again."""
        return {name: getattr(self, name) for name in FLAT_NAMES}

    def validate(self) -> TrainConfig:
        """Checks every value; raises :class:`ConfigError` naming the option and the fix
        (``PretrainedError`` for an ``--init-from`` folder that cannot be read)."""
        if self.init_from is not None:
            self = self._with_init_from()  # noqa: PLW0642 (its folder, checked; its tokenizer)
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
        if not self.grad_accum >= 1:
            raise ConfigError(
                f"--grad-accum must be at least 1 (micro-batches per optimizer step; 1: no "
                f"accumulation), got {self.grad_accum}"
            )
        for name in (
            "batch_size",
            "seq_len",
            "steps",
            "eval_batches",
            "keep_checkpoints",
        ):
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
        if self.seq_len > model.max_seq_len and self.init_from is not None:
            raise ConfigError(
                f"--seq-len {self.seq_len} exceeds the {model.max_seq_len} positions of "
                f"--init-from {self.init_from} (its config.json's maximum): the checkpoint has "
                f"learned no later position; use --seq-len {model.max_seq_len} or less"
            )
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
        self._check_grad_accum()
        if self.store_dir() is not None:
            from ..aio._layout import MAX_CHUNK_BYTES  # the page store's own bound

            if not 1 <= self.chunk_mib <= MAX_CHUNK_BYTES >> 20:
                raise ConfigError(
                    f"--chunk-mib must be from 1 to {MAX_CHUNK_BYTES >> 20} (MiB per chunk of the "
                    f"paged optimizer state), got {self.chunk_mib}"
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
        if self.paged_checkpoint == "store" and self.store_dir() is None:
            raise ConfigError(
                "--paged-checkpoint store records the page store's version in each checkpoint, "
                "but --store none keeps the optimizer state in RAM; drop --paged-checkpoint or "
                "give a --store"
            )
        self._check_fuyou(model)
        self.data_options.check_files()
        check_writable(Path(self.out_dir), "--out-dir", "choose another --out-dir")
        if not self.compile_cache.strip():
            raise ConfigError(
                "--compile-cache is empty: give a directory, auto (<out-dir>/compile-cache) or "
                "none (JAX's own setting)"
            )
        if self.compile_cache not in ("auto", "none"):
            check_writable(
                Path(self.compile_cache).expanduser(),
                "--compile-cache",
                "choose another directory, auto or none",
            )
        store = self.store_dir()
        if store is not None:
            check_writable(store, "--store", "choose another --store directory, or --store none")
        return self

    def _check_grad_accum(self) -> None:
        """--grad-accum fits the placement (Fuyou's refusal: :meth:`_check_fuyou`)."""
        from ..placement import get_placement

        if self.grad_accum > 1 and get_placement(self.placement).streams:
            raise ConfigError(
                f"--grad-accum {self.grad_accum} with --placement {self.placement}: the "
                f"streamed layers' gradients come back in host memory, and accumulating them "
                f"would hold a whole float32 gradient tree on the device, the memory the "
                f"streaming saves; use --placement host_params or device with --grad-accum"
            )

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
        if self.grad_accum > 1:
            raise ConfigError(
                f"--grad-accum {self.grad_accum} does not apply to --strategy fuyou, which "
                f"updates each layer inside the backward pass as soon as its gradients exist: "
                f"there is no step-wide gradient to accumulate (holding one would cost the "
                f"gradient memory Fuyou saves); use --strategy plain with --store and "
                f"--grad-accum (the paged update after the backward pass), or a larger "
                f"--batch-size under Fuyou"
            )
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

    def _with_init_from(self) -> TrainConfig:
        """``--init-from``: refuses a contradiction and a folder that cannot be read (every
        tensor checked, nothing loaded); returns the config with the folder's absolute path
        (config.json records where the run started) and its ``tokenizer.json`` as
        ``--tokenizer`` of a text ``--data`` when none is given."""
        from ._data import TOKEN_FILE_SUFFIXES

        folder = Path(self.init_from).expanduser().absolute()  # pyright: ignore[reportArgumentType]
        if not isinstance(self.model, str) or self.model not in (DEFAULT_MODEL, _hf_name(folder)):
            raise ConfigError(
                f"--model {self.model if isinstance(self.model, str) else model_name(self.model)}"
                f" and --init-from {self.init_from} both name the "
                f"model: the model is the checkpoint's; leave out --model"
            )
        if self.positions is not None:
            raise ConfigError(
                f"--positions {self.positions}: the positions of --init-from {self.init_from} "
                f"are the checkpoint's; leave --positions out"
            )
        if self.plan is not None:
            raise ConfigError(
                f"--plan {self.plan} and --init-from: a plan is made for a named --model; pass "
                f"its --policy instead"
            )
        from jaxoff.models.hf import open_pretrained  # pyright: ignore[reportMissingImports]

        open_pretrained(folder).close()  # PretrainedError naming the file and the fix
        self = dataclasses.replace(self, init_from=folder)  # noqa: PLW0642
        data = self.data
        is_text = data is None or Path(data).suffix not in TOKEN_FILE_SUFFIXES
        if self.tokenizer is None and is_text and (folder / "tokenizer.json").is_file():
            self = dataclasses.replace(self, tokenizer=folder / "tokenizer.json")  # noqa: PLW0642
        return self

    def initializer(self):
        """Where a new run's parameters come from (a :class:`jaxoff.step.Initializer`): the
        ``--init-from`` checkpoint, else the random init from ``--seed``."""
        if self.init_from is None:
            from ..step import RandomInit

            return RandomInit(self.seed)
        from jaxoff.models.hf import PretrainedInit  # pyright: ignore[reportMissingImports]

        return PretrainedInit(Path(self.init_from))

    def fuyou_read_ahead_bytes(self) -> int | None:
        """``--fuyou-read-ahead-mib`` in bytes (None: Fuyou's default)."""
        mib = self.fuyou_read_ahead_mib
        return None if mib is None else mib << 20

    def model_config(self):
        """The model config this run trains (a :class:`jaxoff.nn.LayeredModel`), with
        ``--positions``/``--dtype``/``--param-dtype`` and the policy's stack applied."""
        from ..nn import load_model
        from ..policy import apply_policy

        if self.init_from is not None:
            from jaxoff.models.hf import pretrained_config  # pyright: ignore[reportMissingImports]

            folder = Path(self.init_from).expanduser().absolute()
            base = pretrained_config(folder, name=_hf_name(folder))
        else:
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
        """The model's name as written in records (``config.json``, tables): with
        ``--init-from``, ``hf:<folder name>``."""
        if self.init_from is not None:
            return _hf_name(Path(self.init_from))
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
        """The learning rate by step (see :func:`jaxoff.train._optimizers.schedule`)."""
        return schedule(self.optim_options)

    def build_optimizer(self) -> optax.GradientTransformation:
        """The optax chain: optional global-norm clipping, then the optimizer."""
        pre, tx = self.build_optimizer_parts()
        return tx if pre is None else optax.chain(pre, tx)

    def build_optimizer_parts(self):
        """``(clipping or None, the rest)``; the rest is paged when ``--store`` pages (see
        :func:`jaxoff.train._optimizers.build_optimizer_parts`; FSDP blocks, see
        :meth:`sharded_store`, get the clipping apart)."""
        store = self.store_options
        return build_optimizer_parts(
            self.optim_options,
            self.store_dir(),
            chunk_mib=store.chunk_mib,
            slots=store.store_slots,
            sharded=self.sharded_store(),
            host_mem=self.host_mem_bytes() if self.store_dir() is not None else 0,
        )

    def host_mem_bytes(self) -> int:
        """``--host-mem`` in bytes (0: no RAM tier)."""
        from ..plan._hardware import parse_size

        text = self.store_options.host_mem
        try:
            size = parse_size(text)
        except ConfigError:
            size = -1.0
        if size < 0:
            raise ConfigError(
                f"--host-mem must be a size such as 4GiB, 512MiB or 0 (no RAM tier), got {text!r}"
            )
        return int(size)

    def to_json(self) -> dict:
        values = self.options()
        values["model"] = self.model_label()
        values["processes"] = jax.process_count()  # a run resumes on as many processes
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}


def flat_options_type() -> type:
    """A flat frozen dataclass of every option (field order :data:`FLAT_NAMES`, defaults and
    docs from the groups): what the command line parses; ``TrainConfig(**vars(parsed))``
    turns it into a config."""
    fields, docs = [], []
    for group in GROUPS.values():
        hints = typing.get_type_hints(group)
        doc = inspect.cleandoc(group.__doc__ or "")
        docs.append(doc.split("Attributes:\n", 1)[1])
        for f in dataclasses.fields(group):
            fields.append((f.name, hints[f.name], dataclasses.field(default=f.default)))
    fields.sort(key=lambda f: FLAT_NAMES.index(f[0]))
    flat = dataclasses.make_dataclass("TrainConfig", fields, frozen=True)
    flat.__doc__ = "Every option of ``jaxoff train``.\n\nAttributes:\n" + "\n".join(docs)
    return flat


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
        "paged_checkpoint",  # how the next checkpoints hold the paged state
        "host_mem",  # where the store's pages live, not what they hold
        "fuyou_read_ahead_mib",  # how far reads run ahead, not what the step computes
        "compile_cache",  # where compiled programs are kept, not what they compute
        "steps",  # a run grows (never below the steps done): see _resume.grow_run
    }
)


def _hf_name(folder: Path) -> str:
    """The model name of an ``--init-from`` folder (as ``jaxoff.models.hf`` names it)."""
    return f"hf:{Path(folder).expanduser().absolute().name}"


def _opt(field: str) -> str:
    return field.replace("_", "-")
