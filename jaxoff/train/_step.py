"""The jitted training step: loss, gradients, optimizer update. Offload lives elsewhere."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class TrainState(NamedTuple):
    """What a step donates and returns: step count, parameters, optimizer state."""

    step: jax.Array
    params: Any
    opt_state: Any


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def make_loss_fn(graphdef: nnx.GraphDef, fetch=None):
    """``loss(params, inputs, targets)`` of the model described by ``graphdef``.

    ``fetch`` (see ``jaxoff.placement.fetch_params``) brings host parameters to the device.
    """

    def loss_fn(params, inputs, targets):
        params = params if fetch is None else fetch(params)
        return cross_entropy(nnx.merge(graphdef, params)(inputs), targets)

    return loss_fn


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, placement=None):
    """Returns ``train_step(state, inputs, targets) -> (state, metrics)``, not yet jitted.

    The caller jits it with ``donate_argnums=0`` so parameters and optimizer state are
    updated in place. ``placement`` (a ``jaxoff.placement.Placement`` or its name) says
    where the state lives; the caller also gives the jit its ``state_shardings``.
    """
    from ..placement import fetch_params, make_update

    loss_fn = make_loss_fn(graphdef, fetch_params(placement))
    update = make_update(tx, placement)

    def train_step(state: TrainState, inputs: jax.Array, targets: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(state.params, inputs, targets)
        params, opt_state, grad_norm = update(grads, state.opt_state, state.params)
        metrics = {"loss": loss, "grad_norm": grad_norm}
        return TrainState(state.step + 1, params, opt_state), metrics

    return train_step


def init_state(model_cfg, tx: optax.GradientTransformation, seed: int):
    """Builds the model and its optimizer state; returns ``(graphdef, TrainState)``."""
    model = model_cfg.build(nnx.Rngs(seed))
    graphdef, params = nnx.split(model, nnx.Param)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    return graphdef, state


def abstract_state(model_cfg, tx: optax.GradientTransformation):
    """Shapes and dtypes of the TrainState, without allocating it."""
    def build():
        model = model_cfg.build(nnx.Rngs(0))
        graphdef, params = nnx.split(model, nnx.Param)
        return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))

    graphdef = nnx.graphdef(nnx.eval_shape(lambda: model_cfg.build(nnx.Rngs(0))))
    return graphdef, jax.eval_shape(build)
