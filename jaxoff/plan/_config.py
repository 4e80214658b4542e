"""``jaxoff plan``: options (one frozen dataclass) and the runner."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import tyro

from .. import _output
from .._errors import ConfigError
from ..models import load_model  # pyright: ignore[reportMissingImports]
from ..nn import check_model
from ..policy import PRESETS as POLICY_PRESETS
from ..policy import Segments, Untagged, preset
from ._calibrate import calibrate_workspace
from ._cost import Plan, evaluate, fits
from ._greedy import greedy
from ._hardware import PRESETS, get_hardware, parse_size
from ._planfile import PlanFile, check_writable, prediction_json
from ._price import Pricer, solve_priced
from ._profile import trace_profile
from ._report import fmt_bytes, print_plan
from ._solver import solve

# `jaxoff plan` plans for what `jaxoff train` runs by default, its model and batch shape (the
# planner sits below the trainer and reads nothing of it: tests/test_plan.py checks these are
# train's defaults)
_TRAIN: dict[str, Any] = {"model": "mini", "batch_size": 16, "grad_accum": 1, "seq_len": 128}

_DTYPES = ("float32", "bfloat16", "float16")


def compared_presets() -> tuple[str, ...]:
    """The policy presets the cost model can price: remat per layer, driven by residual
    names alone (``none`` runs no remat; ``dots_*`` keep untagged matmul outputs and
    ``sqrt`` remats segments of layers, which the per-name model does not express).

    Example:
        >>> from jaxoff.plan._config import compared_presets
        >>> "full" in compared_presets() and "sqrt" not in compared_presets()
        True
    """

    return tuple(
        name
        for name, p in POLICY_PRESETS.items()
        if p.remat and p.segments is Segments.LAYER and p.untagged is Untagged.RECOMPUTE
    )


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """Chooses, per residual and for parameters and optimizer states, where they live.

    Attributes:
        model: a size name (tiny, ..., llama-tiny, ...) or ``package.module:factory``
            naming a model config of your own (see ``jaxoff.nn``).
        hardware: a preset (h100-sxm, h100-pcie, a100-40, a100-80, rtx4090, tpu-v5e) or
            ``cpu`` to calibrate this machine.
        device_mem: device memory budget (e.g. 16GiB); default: the hardware's.
        host_mem: host memory budget; default: the hardware's.
        disk: NVMe budget for page files; default: the hardware's.
        batch_size: sequences per step, per micro-batch with --grad-accum (default: that
            of ``jaxoff train``).
        grad_accum: micro-batches per optimizer step (``jaxoff train --grad-accum``): the
            residuals are one micro-batch's, the device memory includes the float32
            gradient accumulator (measured on the accumulating step), recomputation and
            offload traffic count once per micro-batch; the parameters stay on the device
            (streamed and Fuyou-paged parameters do not accumulate).
        seq_len: tokens per sequence (default: ``jaxoff train``'s).
        dtype: compute and parameter dtype (float32 or bfloat16).
        io_bench: JSON lines from ``jaxoff io-bench --json FILE`` for disk speeds (with
            ``--hardware cpu``); default: a quick measurement.
        out: where the plan (JSON) is written; run it with ``jaxoff train --plan FILE``.
            An existing file is refused unless ``--overwrite``.
        overwrite: replace an existing ``--out`` file.
        cpu_lowering: count offloaded residuals in device memory, as XLA's CPU backend
            does (default: on for ``--hardware cpu``).
        price: price the plans with the compiled program: compile 4- and 8-layer copies
            of the model (a model of at most 8 layers as it is) and extrapolate their
            device temporaries to its depth; the MILP's device budget is moved until its
            plan's compiled price fits. ``--no-price``: the linear cost model alone (no
            compiles beyond profiling).
    """

    model: str = _TRAIN["model"]
    hardware: str = "cpu"
    device_mem: str | None = None
    host_mem: str | None = None
    disk: str | None = None
    batch_size: Annotated[int, tyro.conf.arg(aliases=("--batch",))] = _TRAIN["batch_size"]
    grad_accum: int = _TRAIN["grad_accum"]
    seq_len: Annotated[int, tyro.conf.arg(aliases=("--seq",))] = _TRAIN["seq_len"]
    dtype: str = "float32"
    io_bench: Path | None = None
    out: Path = Path("plan.json")
    overwrite: bool = False
    cpu_lowering: bool | None = None
    price: bool = True

    def validate(self) -> PlanConfig:

        if self.dtype not in _DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(_DTYPES)}")
        model = self.model_config()  # raises ConfigError naming a bad --model
        check_model(model, needs=["policy"])
        if self.hardware not in PRESETS and self.hardware not in ("cpu", "calibrate"):
            raise ConfigError(
                f"--hardware {self.hardware!r}: choose a preset ({', '.join(PRESETS)}) or cpu"
            )
        for name in ("batch_size", "grad_accum", "seq_len"):
            if not getattr(self, name) >= 1:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}"
                )
        if self.seq_len > model.max_seq_len:
            raise ConfigError(
                f"--seq-len {self.seq_len} exceeds model {self.model}'s max_seq_len "
                f"{model.max_seq_len}"
            )
        for name in ("device_mem", "host_mem", "disk"):
            if getattr(self, name) is not None and parse_size(getattr(self, name)) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")

        check_writable(self.out, self.overwrite)  # before minutes of profiling
        return self

    def model_config(self):
        """The model to plan for, in ``--dtype`` (compute and parameters)."""
        model = load_model(self.model)
        try:
            return dataclasses.replace(model, dtype=self.dtype, param_dtype=self.dtype)
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"--model {self.model}: cannot set --dtype {self.dtype} ({e})"
            ) from None

    def get_hardware(self):
        hw = get_hardware(self.hardware, self.dtype, self.io_bench)
        size = {
            k: (None if v is None else parse_size(v))
            for k, v in dict(
                device_mem=self.device_mem, host_mem=self.host_mem, disk=self.disk
            ).items()
        }
        return hw.with_budgets(**size)


def make_plan(cfg: PlanConfig, console=None):
    """Profiles, solves (MILP and greedy), prints, writes ``cfg.out``; returns the PlanFile.

    Example (``console`` takes the printed tables):
        >>> import io, rich.console
        >>> from jaxoff.plan import PlanConfig, make_plan
        >>> cfg = PlanConfig(model="tiny", hardware="rtx4090", batch_size=2, seq_len=16,
        ...                  out=tmp_path / "plan.json", price=False)
        >>> found = make_plan(cfg, console=rich.console.Console(file=io.StringIO()))
        >>> found.model, found.batch, found.seq, (tmp_path / "plan.json").is_file()
        ('tiny', 2, 16, True)
    """

    console = console or _output.console()
    hw = cfg.get_hardware()
    cpu_lowering = hw.shared_memory if cfg.cpu_lowering is None else cfg.cpu_lowering
    model_cfg = cfg.model_config()
    presets = compared_presets()
    # a line per part in a log (a spinner at a terminal): profile, MILP, greedy, each preset
    steps = _output.Steps("plan", 3 + len(presets), console)
    shape = f"batch {cfg.batch_size} x seq {cfg.seq_len}" + (
        f" x {cfg.grad_accum} micro-batches" if cfg.grad_accum > 1 else ""
    )
    with steps.step(f"profiling {cfg.model} at {shape}"):
        prof = trace_profile(
            model_cfg, cfg.batch_size, cfg.seq_len, model=cfg.model, grad_accum=cfg.grad_accum
        )
        prof = calibrate_workspace(prof, model_cfg)  # two compiles: the workspace
    pricer = Pricer(prof, model_cfg) if cfg.price else None

    def predict(p):
        if pricer is None:
            return evaluate(prof, hw, p, cpu_lowering=cpu_lowering)
        return pricer.price(hw, p, cpu_lowering=cpu_lowering)

    if pricer is None:
        with steps.step("solving the MILP"):
            plan = solve(prof, hw, cpu_lowering=cpu_lowering)
            pred = predict(plan)
    else:
        with steps.step(f"solving the MILP, pricing its plans ({pricer.describe()})"):
            found = solve_priced(prof, hw, pricer, cpu_lowering=cpu_lowering)
        plan, pred = found.plan, found.pred
    with steps.step("the greedy baseline"):
        gplan, gpred = greedy(prof, hw, cpu_lowering=cpu_lowering)
        if gplan is not None and pricer is not None:
            gpred = predict(gplan)
    others = [
        (
            "greedy baseline" + ("" if gpred is None or fits(gpred, hw) else " (does not fit)"),
            gplan,
            gpred,
        )
    ]
    for name in presets:
        with steps.step(f"{'pricing' if pricer else 'costing'} preset {name}"):
            p = preset_plan(prof, name)
            e = predict(p)
        others.append((f"preset {name}" + ("" if fits(e, hw) else " (does not fit)"), p, e))
    print_plan(prof, hw, plan, pred, others, console)
    if pricer is not None:
        modelled = found.modelled.device_bytes
        console.print(
            f"device memory priced by the compiled program ({pricer.compiles} "
            f"{pricer.describe()}, {pricer.compile_s:.1f} s; "
            f"{len(found.rounds)} MILP round(s)); the cost model alone predicted "
            f"{fmt_bytes(modelled)} for the chosen plan ({modelled / pred.device_bytes - 1:+.1%})"
        )
    pf = PlanFile(
        cfg.model,
        prof.model_config,
        cfg.batch_size,
        cfg.seq_len,
        plan,
        hw.to_json(),
        {**prediction_json(pred), "priced": pricer is not None},
        None
        if gplan is None or gpred is None
        else {
            "plan": {"actions": dict(gplan.actions), "params": gplan.params, "opt": gplan.opt},
            "prediction": prediction_json(gpred),
        },
        cfg.grad_accum,
    )
    path = pf.save(cfg.out, overwrite=cfg.overwrite)
    accum = f" --grad-accum {cfg.grad_accum}" if cfg.grad_accum > 1 else ""
    console.print(
        f"plan written to {path}; run it with `jaxoff train --model {cfg.model} "
        f"--batch-size {cfg.batch_size}{accum} --seq-len {cfg.seq_len} --plan {path}`"
    )
    return pf


def preset_plan(prof, name: str):
    """A names-based preset as a :class:`~jaxoff.plan._cost.Plan` (params, states on device)."""

    names = tuple(n.name for n in prof.names)
    return Plan.from_actions(prof, {n: a.value for n, a in preset(name, names).actions})


def run(cfg: PlanConfig) -> int:
    make_plan(cfg)
    return 0
