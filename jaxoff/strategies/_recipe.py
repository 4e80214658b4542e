"""What a strategy produces (a :class:`Recipe`), what it is built from (a :class:`Context`),
and the registry that names strategies.

A strategy is a function ``Context -> Recipe`` registered under a name. The recipe is data:
a remat/offload policy spelling, a placement, whether the optimizer is paged to disk, a few
model overrides, and whether the update runs inside the backward pass. Everything that runs
a recipe (``jaxoff compare --strategies``, tests, the trainer through
:func:`strategy_overrides`) reads only these fields.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import ConfigError, JaxoffError
from ..nn import Stack
from ..placement import PRESETS, Placement
from ..plan import preset, profile


class StrategyUnavailable(JaxoffError):
    """A registered strategy cannot be built in this installation (the reason says why)."""


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One strategy's composition of jaxoff's parts. Plain data, JSON-able.

    Attributes:
        policy: a ``jaxoff.policy`` spelling for the scanned layers (preset, ``name=action``
            pairs, or a ``jax.checkpoint_policies`` name).
        placement: a ``jaxoff.placement`` preset name (or a ``Placement``) for parameters,
            gradients and optimizer states.
        store: page the optimizer state (and fp32 masters) to disk with ``jaxoff.paged``;
            the placement is then adjusted by ``with_paged_optimizer``.
        stack_overrides: :class:`jaxoff.nn.Stack` fields set after the policy (e.g.
            ``split_layers``); a field whose name ends in ``policy`` takes a ``jaxoff.policy``
            spelling (e.g. ``split_policy``).
        update_in_backward: the optimizer update runs inside the backward layer scan
            (Fuyou); the step comes from ``jaxoff.strategies.fuyou``.
        note: how the strategy chose (shown by ``jaxoff compare``).

    Example:
        >>> from jaxoff.strategies import Recipe
        >>> Recipe(policy="full", placement="host_params_stream1").placement
        'host_params_stream1'
    """

    policy: str = "none"
    placement: Any = "device"
    store: bool = False
    stack_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    update_in_backward: bool = False
    note: str = ""

    def to_json(self) -> dict:

        d = dataclasses.asdict(self)
        d["stack_overrides"] = dict(self.stack_overrides)
        if isinstance(self.placement, Placement):
            d["placement"] = {"placement": dataclasses.asdict(self.placement)}
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> Recipe:

        d = dict(d)
        if isinstance(d.get("placement"), Mapping):
            d["placement"] = Placement(**d["placement"]["placement"])
        return cls(**d)

    def placement_name(self) -> str:
        """The placement's preset name (a ``Placement`` object is spelled by its fields)."""

        if not isinstance(self.placement, Placement):
            return self.placement
        for name, (p, _) in PRESETS.items():
            if p == self.placement:
                return name
        if self.placement == Placement(
            params="host", opt_state="host", stream_window=self.placement.stream_window
        ):
            return f"host_params_stream{self.placement.stream_window}"
        return "custom"


@dataclasses.dataclass(frozen=True)
class Context:
    """What a strategy is built for: the model, the batch shape, and an optional budget.

    Attributes:
        model_config: the model config to train (a :class:`jaxoff.nn.LayeredModel`; its
            stack is ignored).
        batch: sequences per step.
        seq: tokens per sequence.
        device_mem: device memory budget in bytes (``None``: the hardware's); budgeted
            strategies (checkmate, dtr_greedy, capuchin) plan under it.
        hardware: ``jaxoff.plan`` hardware preset whose speeds price recompute against
            transfers (budgets other than ``device_mem`` are the preset's). Planned as for
            that accelerator: offloaded residuals leave device memory.
        model: the model's name (for messages).
        grad_accum: micro-batches of ``batch`` rows per step (``jaxoff train
            --grad-accum``): the profile's residuals are one micro-batch's, its workspace
            holds the gradient accumulator.
    """

    model_config: Any
    batch: int
    seq: int
    device_mem: float | None = None
    hardware: str = "a100-40"
    model: str = "custom"
    grad_accum: int = 1

    def profile(self):
        """The planner's profile of this model and batch shape (cached per process)."""
        return _profile(
            _plain(self.model_config), self.batch, self.seq, self.model, self.grad_accum
        )

    def hw(self):
        """The hardware preset with ``device_mem`` as its device budget."""

        return preset(self.hardware, self.model_config.dtype).with_budgets(
            device_mem=self.device_mem
        )


def _plain(model_cfg):
    return dataclasses.replace(model_cfg, stack=Stack())


@functools.lru_cache(maxsize=8)
def _profile(model_cfg, batch: int, seq: int, model: str, grad_accum: int = 1):
    return profile(model_cfg, batch, seq, model=model, grad_accum=grad_accum)


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A registered strategy: its builder and where it comes from.

    Attributes:
        name: the registry key (``jaxoff compare --strategies NAME``).
        build: ``Context -> Recipe``; its docstring says what it keeps from the paper and
            what the paper does that it does not (under XLA's static compilation, or not
            done yet).
        paper: the citation.
        budgeted: the strategy plans under ``Context.device_mem``.
    """

    name: str
    build: Callable[[Context], Recipe]
    paper: str
    budgeted: bool = False

    @property
    def summary(self) -> str:
        return (self.build.__doc__ or "").strip().splitlines()[0] if self.build.__doc__ else ""

    def recipe(self, ctx: Context) -> Recipe:
        return self.build(ctx)


STRATEGIES: dict[str, Strategy] = {}
"""Name -> :class:`Strategy`, in registration order."""


def register(name: str, *, paper: str, budgeted: bool = False):
    """Decorator registering ``build(ctx) -> Recipe`` as strategy ``name``.

    Example:
        >>> from jaxoff.strategies import Recipe, register, STRATEGIES
        >>> @register("my_offload", paper="Me et al. 2026")
        ... def my_offload(ctx):
        ...     '''MLP activations to host, the rest recomputed.'''
        ...     return Recipe(policy="mlp_up=offload,mlp_act=offload")
        >>> STRATEGIES["my_offload"].summary
        'MLP activations to host, the rest recomputed.'
        >>> _ = STRATEGIES.pop("my_offload")
    """

    def wrap(build: Callable[[Context], Recipe]):
        if name in STRATEGIES:
            raise ConfigError(f"strategy {name!r} is already registered")
        STRATEGIES[name] = Strategy(name, build, paper, budgeted)
        return build

    return wrap


def get_strategy(name: str) -> Strategy:
    """The registered :class:`Strategy` called ``name``.

    Raises:
        ConfigError: for an unknown name, listing the valid ones.
    """
    key = name.strip()
    if key not in STRATEGIES:
        raise ConfigError(
            f"strategy {name!r} is not known; choose one of {', '.join(STRATEGIES)} (or 'all')"
        )
    return STRATEGIES[key]


def build_recipe(name: str, ctx: Context) -> Recipe:
    """``get_strategy(name).recipe(ctx)``."""
    return get_strategy(name).recipe(ctx)


def strategy_overrides(
    name: str, model_cfg, batch: int, seq: int, device_mem: float | None = None, **ctx
) -> dict:
    """``TrainConfig`` field values that run strategy ``name``: ``policy``, ``placement``,
    ``store`` (``"auto"`` or ``"none"``), plus ``stack_overrides`` and
    ``update_in_backward`` when the strategy needs them (the trainer must apply those).

    Example:
        >>> from jaxoff.models.gpt import CONFIGS
        >>> from jaxoff.strategies import strategy_overrides
        >>> strategy_overrides("zero_infinity", CONFIGS["tiny"], 4, 32)
        {'policy': 'full', 'placement': 'host_params_stream1', 'store': 'auto'}
    """
    recipe = build_recipe(name, Context(model_cfg, batch, seq, device_mem, **ctx))
    placement = recipe.placement_name()
    if placement == "custom":
        raise ConfigError(
            f"strategy {name!r} uses a placement with no preset name ({recipe.placement}); "
            f"run it through jaxoff.strategies.prepare instead of TrainConfig"
        )
    out: dict[str, Any] = {
        "policy": recipe.policy,
        "placement": placement,
        "store": "auto" if recipe.store else "none",
    }
    if recipe.stack_overrides:
        out["stack_overrides"] = dict(recipe.stack_overrides)
    if recipe.update_in_backward:
        out["update_in_backward"] = True
    return out
