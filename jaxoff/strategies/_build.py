"""A recipe made runnable: model config, placement, optimizer and the jitted step."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from .._errors import ConfigError, OptionError
from ..distributed import ShardedPagedStep
from ..nn import Stack, check_model, with_stack
from ..optim import paged
from ..placement import (
    abstract_with,
    check_placement,
    get_placement,
    streamed_model,
    with_paged_optimizer,
)
from ..policy import apply_policy, resolve_policy
from ..step import PlainStep, abstract_state, init_state, jit_train_step, make_train_step
from ._recipe import Recipe
from .fuyou import FuyouStep


def model_config(recipe: Recipe, base_cfg):
    """``base_cfg`` (a model config) with the recipe's policy and stack overrides."""

    cfg = apply_policy(base_cfg, recipe.policy)
    names = tuple(getattr(cfg, "residual_names", ()) or ())
    over = {
        k: resolve_policy(v, names=names)
        if k.endswith("policy") and (v is None or isinstance(v, str))
        else v
        for k, v in recipe.stack_overrides.items()
    }
    unknown = [k for k in over if k not in {f.name for f in dataclasses.fields(Stack)}]
    if unknown:
        raise ConfigError(f"recipe stack_overrides {unknown} are not jaxoff.nn.Stack fields")
    try:
        return with_stack(cfg, **over)
    except ValueError as e:
        raise ConfigError(f"recipe stack_overrides {over}: {e}") from None


def placement(recipe: Recipe):
    """The recipe's ``Placement`` (adjusted by ``with_paged_optimizer`` when paged)."""

    p = get_placement(recipe.placement)
    return with_paged_optimizer(p) if recipe.store else p


@dataclasses.dataclass
class Prepared:
    """Everything needed to run one recipe's step.

    Attributes:
        step: the step jitted with the state donated and placed (call ``.lower`` to compile).
        state: the ``TrainState`` placed in its memory kinds (or its abstract shapes).
        tx: the optimizer the step uses (paged when the recipe says so; close it after).
        model_config: the model with policy, overrides and streaming applied.
        placement: the ``Placement`` the state's shardings come from.
        step_fn: the un-jitted step (for ``jax.make_jaxpr`` / export).
    """

    recipe: Recipe
    step: Any
    state: Any
    tx: Any
    graphdef: Any
    model_config: Any
    placement: Any
    step_fn: Any
    shardings: Any


def prepare(
    recipe: Recipe,
    base_cfg,
    tx,
    *,
    store_dir=None,
    chunk_bytes: int = 1 << 20,
    seed: int = 0,
    abstract: bool = False,
    grad_accum: int = 1,
) -> Prepared:
    """Builds the state and the jitted step of ``recipe`` for ``base_cfg`` and optax ``tx``.

    ``store_dir``: page-store directory when the recipe pages the optimizer (``tx`` is then
    wrapped in ``jaxoff.paged``). ``abstract``: shapes only, nothing allocated (not for
    paged recipes, whose ``init`` writes the store). ``grad_accum``: micro-batches per step
    (``jaxoff train --grad-accum``; the step then takes that many times the rows); refused
    for a recipe that updates in the backward pass or streams its parameters, as the trainer
    refuses it.

    Example:
        >>> import optax
        >>> from jaxoff.models.gpt import CONFIGS
        >>> from jaxoff.strategies import Recipe, prepare
        >>> p = prepare(Recipe(policy="selective"), CONFIGS["tiny"], optax.adam(1e-3))
        >>> p.placement.params
        'device'
    """

    pl = placement(recipe)
    if grad_accum > 1 and not accumulates(recipe):
        raise OptionError(
            f"`grad_accum={grad_accum}`: the recipe updates inside the backward pass or "
            f"streams its parameters, whose gradients jaxoff does not accumulate: leave "
            f"`grad_accum` at 1 with it"
        )
    cfg = model_config(recipe, base_cfg)
    check_placement(pl, cfg, policy=recipe.policy)
    cfg = streamed_model(cfg, pl)
    if recipe.store:
        if store_dir is None:
            raise ConfigError("this strategy pages the optimizer state: pass store_dir")

        tx = paged(tx, store_dir, chunk_bytes=chunk_bytes)
    if recipe.update_in_backward:
        graphdef, state, step_fn = _fuyou_parts(cfg, tx, pl, seed)
    else:
        graphdef, state = (abstract_state if abstract else init_state)(
            cfg, tx, *(() if abstract else (seed,))
        )
        step_fn = make_train_step(graphdef, tx, pl, grad_accum)
    # a model with state besides nnx.Param (dropout RNG, batch statistics) carries it as rest
    jitted, shardings = jit_train_step(step_fn, pl, state)
    state = abstract_with(state, shardings) if abstract else jax.device_put(state, shardings)
    return Prepared(recipe, jitted, state, tx, graphdef, cfg, pl, step_fn, shardings)


def accumulates(recipe: Recipe) -> bool:
    """Whether the recipe's step can accumulate gradients (``grad_accum`` > 1): not when it
    updates inside the backward pass (Fuyou: no step-wide gradient exists) nor when it
    streams its parameters (their gradients come back in host memory), as ``jaxoff train``
    refuses ``--grad-accum`` there."""
    return not recipe.update_in_backward and not placement(recipe).streams


def _fuyou_parts(cfg, tx, pl, seed: int):
    """``(graphdef, state, step_fn)`` of Fuyou's step for the model ``cfg``, initialised and
    built as ``jaxoff train --strategy fuyou`` builds them (`FuyouStep`): in the bits form
    (``blocks_as_bits``) wherever `FuyouStep` decides it applies."""

    check_model(cfg, needs=["fuyou"])  # nnx.Param state only: one line, not flax's error
    step = FuyouStep(cfg, tx, placement=pl, seed=seed)
    state = step.init()
    return step.graphdef, state, step.step_fn()


def build_step(cfg):
    """The :class:`jaxoff.step.Step` that trains ``cfg`` (a validated
    ``jaxoff.train.TrainConfig``), with its optimizer: the builder `STEP_BUILDERS` holds
    under ``cfg.step_kind()``.

    Example:
        >>> from jaxoff.strategies import build_step
        >>> from jaxoff.train import TrainConfig
        >>> step = build_step(TrainConfig(model="tiny", store="none", out_dir=tmp_path))
        >>> type(step).__name__
        'PlainStep'
    """
    return STEP_BUILDERS[cfg.step_kind()](cfg)


def _trained_model(cfg):
    """``(model_cfg, placement, mesh)`` of ``cfg``: the model with its policy and streaming
    applied, where its state lives, the FSDP mesh (None: one device)."""

    mesh = cfg.mesh()
    placement = cfg.resolved_placement()
    return streamed_model(cfg.model_config(), placement, mesh), placement, mesh


def _plain_step(cfg):
    model_cfg, placement, mesh = _trained_model(cfg)
    return PlainStep(
        model_cfg,
        cfg.build_optimizer(),
        placement,
        mesh,
        seed=cfg.seed,
        initializer=cfg.initializer(),
        grad_accum=cfg.grad_accum,
    )


def _sharded_step(cfg):
    model_cfg, placement, mesh = _trained_model(cfg)
    pre, tx = cfg.build_optimizer_parts()  # the clipping sees the global gradients
    return ShardedPagedStep(
        model_cfg,
        pre,
        tx,
        mesh,
        placement,
        seed=cfg.seed,
        initializer=cfg.initializer(),
        grad_accum=cfg.grad_accum,
    )


def _fuyou_step(cfg):
    model_cfg, placement, _ = _trained_model(cfg)
    return FuyouStep(
        model_cfg,
        cfg.build_optimizer(),
        placement=placement,
        seed=cfg.seed,
        page_params=cfg.page_params,
        read_ahead_bytes=cfg.fuyou_read_ahead_bytes(),
        initializer=cfg.initializer(),
    )


STEP_BUILDERS = {
    "plain": _plain_step,  # one device, or an FSDP mesh with the optimizer state in RAM
    "sharded": _sharded_step,  # FSDP with a paged optimizer: one store per process
    "fuyou": _fuyou_step,  # each layer's update inside the backward pass
}
"""``TrainConfig.step_kind()`` -> ``builder(cfg) -> Step``."""
