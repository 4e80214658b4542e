"""``TrainState``: what a training step donates and returns. A leaf module (it imports nothing of
jaxoff), so placement, the step builders and the trainer all depend on it, not on each other."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax


class TrainState(NamedTuple):
    """What a step donates and returns: step count, parameters, optimizer state."""

    step: jax.Array
    params: Any
    opt_state: Any


class TrainStateWithRest(NamedTuple):
    """A :class:`TrainState` of a model with state besides its ``nnx.Param``: ``rest`` holds
    it (RNG stream keys and counts of ``nnx.Dropout``, batch statistics of ``nnx.BatchNorm``);
    the step carries, updates and checkpoints it, the optimizer never sees it. A model
    without such state keeps the three-field :class:`TrainState` (and its checkpoints)."""

    step: jax.Array
    params: Any
    opt_state: Any
    rest: Any
