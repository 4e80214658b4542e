"""``jaxoff compare`` options: one frozen dataclass, validated."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import tyro

from .._errors import ConfigError
from ..models import load_model  # pyright: ignore[reportMissingImports]
from ..placement import get_placement
from ..plan import HARDWARE_PRESETS, parse_size
from ..policy import JAX_POLICIES, get_policy
from ..strategies import STRATEGIES, get_strategy

DEFAULT_POLICIES = "none,full,dots_saveable,selective,offload_all,offload_dots,sqrt"


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """Compiles the real training step once per policy and measures it.

    Attributes:
        model: a size name (tiny, mini, small, ..., llama-tiny, ...) or
            ``package.module:factory`` naming a model config of your own (see ``jaxoff.nn``).
        policies: comma-separated presets or a JAX policy name; a custom
            ``name=action`` policy is one entry with ``;`` between its pairs
            (``"none,attn_probs=remat;*=device"``) or a ``.toml`` file.
        batch_size: sequences per step, per micro-batch with --grad-accum.
        grad_accum: micro-batches per optimizer step (``jaxoff train --grad-accum``): each
            step measured is the accumulating one, its float32 gradient accumulator among
            its temporaries and its FLOPs those of all its micro-batches. Not with streamed
            placements; under --strategies, the strategies that stream their parameters or
            update in the backward pass are listed as not run.
        steps: timed steps per policy (after warm-up); the median is reported.
        warmup: untimed steps before timing (the first one includes nothing to compile:
            the step is compiled ahead of time).
        out_dir: where compare.csv, compare.json and compare.png go.
        check_export: export each train step for cuda and tpu and check that exactly the
            offloaded names are placed in host memory.
        isolate: measure each policy in its own subprocess so peak RSS figures don't mix.
        seed: parameter init and token seed.
        placements: comma-separated ``jaxoff.placement`` presets (device, host_opt,
            host_opt_xfer, host_params, host_params_stream<N>); every policy is measured
            under every placement (streaming placements only with the ``full`` policy).
        strategies: comma-separated ``jaxoff.strategies`` names, or ``all``; replaces
            --policies/--placements: each strategy is planned for this model and batch,
            compiled, and run unless it needs more than --device-mem on the device.
        device_mem: device memory budget for --strategies (e.g. 1.5GiB, 800MiB):
            budgeted strategies plan under it, and a strategy whose compiled step needs
            more is listed with the reason instead of run.
        hardware: ``jaxoff plan`` hardware preset whose speeds the budgeted strategies
            plan with (recompute vs transfer).
    """

    model: str = "tiny"
    policies: str = DEFAULT_POLICIES
    batch_size: Annotated[int, tyro.conf.arg(aliases=("--batch",))] = 8
    grad_accum: int = 1
    seq_len: Annotated[int, tyro.conf.arg(aliases=("--seq",))] = 128
    steps: int = 5
    warmup: int = 2
    out_dir: Annotated[Path, tyro.conf.arg(aliases=("--out",))] = Path("runs/compare")
    check_export: bool = False
    isolate: bool = True
    seed: int = 0
    placements: str = "device"
    strategies: str = ""
    device_mem: str | None = None
    hardware: str = "a100-40"

    def strategy_list(self) -> list[str]:
        """The strategy names, in order (``all``: every registered one)."""

        names = [s.strip() for s in self.strategies.split(",") if s.strip()]
        return list(STRATEGIES) if names == ["all"] else names

    def device_mem_bytes(self) -> float | None:

        return None if self.device_mem is None else parse_size(self.device_mem)

    def placement_list(self) -> list[str]:
        return [p.strip() for p in self.placements.split(",") if p.strip()]

    def runs(self) -> list[tuple[str, str]]:
        """``(policy, placement)`` pairs to measure; streaming only pairs with ``full``."""

        return [
            (spec, pl)
            for pl in self.placement_list()
            for spec in self.policy_list()
            if not get_placement(pl).streams or spec in ("full", "nothing_saveable")
        ]

    def policy_list(self) -> list[str]:
        """The policy spellings, in order, ``;`` turned back into ``,``."""
        return [p.strip().replace(";", ",") for p in self.policies.split(",") if p.strip()]

    def validate(self) -> CompareConfig:
        """Checks every value; raises :class:`ConfigError` naming the option and the fix."""

        model = load_model(self.model)  # raises ConfigError naming what is wrong
        for name in ("batch_size", "grad_accum", "seq_len", "steps"):
            if not getattr(self, name) >= 1:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}"
                )
        if self.warmup < 0:
            raise ConfigError("--warmup must be 0 or more")
        if self.seq_len > model.max_seq_len:
            raise ConfigError(
                f"--seq-len {self.seq_len} exceeds model {self.model}'s max_seq_len "
                f"{model.max_seq_len}"
            )
        if self.strategies.strip():
            return self._validate_strategies()
        specs = self.policy_list()
        if not specs:
            raise ConfigError("--policies is empty; give e.g. none,full,selective")
        if len(set(specs)) != len(specs):
            raise ConfigError(f"--policies lists a policy twice: {self.policies}")
        for spec in specs:
            if spec not in JAX_POLICIES:
                get_policy(spec, names=model.residual_names)  # ConfigError: valid names

        for pl in self.placement_list():
            if get_placement(pl).streams and self.grad_accum > 1:  # ConfigError: bad names
                raise ConfigError(
                    f"--grad-accum {self.grad_accum} with --placements {pl}: streamed layers' "
                    f"gradients are not accumulated (jaxoff train refuses it too); leave "
                    f"{pl} out or --grad-accum at 1"
                )
        if not self.runs():
            raise ConfigError(
                "--placements: streaming placements run with the full policy only; "
                "add full to --policies"
            )
        return self

    def _validate_strategies(self) -> CompareConfig:

        names = self.strategy_list()
        if len(set(names)) != len(names):
            raise ConfigError(f"--strategies lists a strategy twice: {self.strategies}")
        for name in names:
            get_strategy(name)  # raises ConfigError listing the valid names
        if self.device_mem is not None:
            try:
                if (self.device_mem_bytes() or 0) <= 0:
                    raise ValueError
            except (ValueError, ConfigError):
                raise ConfigError(
                    f"--device-mem {self.device_mem!r} is not a positive size (e.g. 1.5GiB)"
                ) from None
        if self.hardware not in HARDWARE_PRESETS:
            raise ConfigError(
                f"--hardware {self.hardware!r}: choose one of {', '.join(HARDWARE_PRESETS)}"
            )
        return self
