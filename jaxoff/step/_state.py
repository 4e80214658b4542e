"""``TrainState``: what a training step donates and returns. A leaf module (it imports nothing of
jaxoff), so placement, the step builders and the trainer all depend on it, not on each other."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax


class TrainState(NamedTuple):
    """What a step donates and returns: step count, parameters, optimizer state, and the
    model's state besides its ``nnx.Param`` (RNG stream keys and counts of ``nnx.Dropout``,
    batch statistics of ``nnx.BatchNorm``), which the step carries, updates and checkpoints
    but the optimizer never sees; ``rest`` is ``None`` for a model without such state."""

    step: jax.Array
    params: Any
    opt_state: Any
    rest: Any = None
