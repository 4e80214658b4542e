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
