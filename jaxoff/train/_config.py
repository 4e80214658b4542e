"""The training configuration: frozen groups of options, validated, loadable from TOML."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import optax

from .._errors import ConfigError
from ..models import load_model  # pyright: ignore[reportMissingImports]
from ..nn import model_name
from ..placement import check_placement, get_placement, make_mesh, with_paged_optimizer
from ..plan import apply_plan
from ..policy import apply_policy
from ..step import RandomInit
from ..strategies.fuyou import FuyouOptions, RunShape
from ._config_file import load_config_file as load_config_file  # its old home
from ._optimizers import build_optimizer_parts, schedule
from ._options import (
    DEFAULT_MODEL,
    FLAT_NAMES,
    GROUP_OF,
    GROUPS,
    TOKEN_FILE_SUFFIXES,
    DataOptions,
    ModelOptions,
    OptimOptions,
    RunOptions,
    StoreOptions,
    StrategyOptions,
    check_writable,
    nest,
)
from ._options import check_data_options as _check_data_options  # noqa: F401 (its old name)


@dataclasses.dataclass(frozen=True, init=False)
class TrainConfig:
    """Everything ``jaxoff train`` needs: six frozen groups of options. Every option is a
    command-line option.

    The groups (``jaxoff.train._options``) are :class:`ModelOptions` (``model_options``:
    model, init_from, policy, positions, dtype, param_dtype, plan), :class:`DataOptions`
    (``data_options``: the corpus and the batch shape), :class:`OptimOptions`
    (``optim_options``: the optimizer, its schedule and steps), :class:`RunOptions`
    (``run_options``: out_dir, checkpoints, evaluation, resumption, seed),
    :class:`StoreOptions` (``store_options``: the page store), :class:`StrategyOptions`
    (``strategy_options``: placement, FSDP, strategy) and Fuyou's own
    (``fuyou_options``: ``jaxoff.strategies.fuyou.FuyouOptions``). Each option is defined
    and documented in its group, and each group checks its own values.

    ``TrainConfig(...)`` takes the groups (or dicts of their options), or the options by their
    flat names, or both (a flat name then replaces that option of the group given), and every
    option reads by its flat name too: ``TrainConfig(steps=6).steps == 6``.
    ``dataclasses.replace(cfg, lr=1e-3)`` works the same way. The command line and TOML files
    name the options flat; ``config.json`` holds them by group (`to_json`, and
    ``jaxoff.train._options.nest`` reads a flat one).

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
    fuyou_options: FuyouOptions

    def __init__(self, **options: Any) -> None:
        unknown = [k for k in options if k not in GROUP_OF and k not in GROUPS]
        if unknown:
            raise TypeError(f"TrainConfig got unexpected keyword arguments {unknown}")
        given = {k: options.pop(k) for k in list(options) if k in GROUPS}
        for name, group in GROUPS.items():
            value = given.get(name)
            if value is None:
                value = group()
            elif isinstance(value, dict):
                value = group(**nest({name: value})[name])
            elif not isinstance(value, group):
                raise TypeError(f"TrainConfig: {name} must be a {group.__name__}, got {value!r}")
            mine = nest(options)[name]
            if mine:
                value = dataclasses.replace(value, **mine)
            object.__setattr__(self, name, value)

    if not TYPE_CHECKING:  # a checker reads them as Any

        def __getattr__(self, name: str) -> Any:
            """An option by its flat name: ``cfg.lr`` is ``cfg.optim_options.lr``."""
            group = GROUP_OF.get(name)
            if group is None or group not in self.__dict__:
                raise AttributeError(f"'TrainConfig' object has no attribute {name!r}")
            return getattr(self.__dict__[group], name)

    else:

        def __getattr__(self, name: str) -> Any: ...

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
            self = apply_plan(self)  # noqa: PLW0642 (the plan's policy replaces --policy)
        self.strategy_options.check()
        if self.fuyou != (self.strategy == "fuyou"):  # --fuyou is --strategy fuyou
            self = dataclasses.replace(self, strategy="fuyou", fuyou=True)  # noqa: PLW0642

        model = self.model_config()  # raises ConfigError naming a bad --model or --policy
        self.data_options.check()
        self.optim_options.check()
        self.run_options.check()
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
        self.store_options.check()
        self.fuyou_options.check()
        self.fuyou_options.check_run(
            RunShape(
                policy=self.policy,
                grad_accum=self.grad_accum,
                paged=self.store_dir() is not None,
                clip_norm=self.clip_norm,
                devices=self.fsdp,
                processes=jax.process_count(),
                placement=self.placement,
            ),
            model,
        )
        self.data_options.check_files()
        check_writable(Path(self.out_dir), "--out-dir", "choose another --out-dir")
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

        if self.grad_accum > 1 and get_placement(self.placement).streams:
            raise ConfigError(
                f"--grad-accum {self.grad_accum} with --placement {self.placement}: the "
                f"streamed layers' gradients come back in host memory, and accumulating them "
                f"would hold a whole float32 gradient tree on the device, the memory the "
                f"streaming saves; use --placement host_params or device with --grad-accum"
            )

    def _with_init_from(self) -> TrainConfig:
        """``--init-from``: refuses a contradiction and a folder that cannot be read (every
        tensor checked, nothing loaded); returns the config with the folder's absolute path
        (config.json records where the run started) and its ``tokenizer.json`` as
        ``--tokenizer`` of a text ``--data`` when none is given."""

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
        from jaxoff.models.hf import open_pretrained  # pyright: ignore[reportMissingImports] (--init-from only)

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
            return RandomInit(self.seed)
        from jaxoff.models.hf import PretrainedInit  # pyright: ignore[reportMissingImports] (--init-from only)

        return PretrainedInit(Path(self.init_from))

    def fuyou_read_ahead_bytes(self) -> int | None:
        """``--fuyou-read-ahead-mib`` in bytes (None: Fuyou's default)."""
        return self.fuyou_options.read_ahead_bytes()

    def model_config(self):
        """The model config this run trains (a :class:`jaxoff.nn.LayeredModel`), with
        ``--positions``/``--dtype``/``--param-dtype`` and the policy's stack applied."""

        if self.init_from is not None:
            from jaxoff.models.hf import pretrained_config  # pyright: ignore[reportMissingImports] (--init-from only)

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

        if self.store_dir() is None:
            return get_placement(self.placement)
        return with_paged_optimizer(self.placement)

    def mesh(self):
        """The FSDP ``Mesh`` of ``--fsdp`` devices, or ``None`` for one device."""

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
        return self.store_options.host_mem_bytes()

    def to_json(self) -> dict:
        """What ``config.json`` holds: the options by group (the model as
        :meth:`model_label` names it), and the processes that train the run."""
        doc: dict[str, Any] = {
            name: {
                f.name: _jsonable(getattr(getattr(self, name), f.name))
                for f in dataclasses.fields(group)
            }
            for name, group in GROUPS.items()
        }
        doc["model_options"]["model"] = self.model_label()
        doc["processes"] = jax.process_count()  # a run resumes on as many processes
        return doc


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


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
