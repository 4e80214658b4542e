"""The jitted step with the placement's shardings as in/out shardings of the donated state."""

from __future__ import annotations

import jax

from ._placement import Placement, get_placement
from ._shardings import batch_sharding, state_shardings


def jit_step(step_fn, placement: Placement | str | None, state, mesh=None):
    """``(jitted, state_shardings)``: ``step_fn`` jitted with the state donated and placed.

    ``state`` may be concrete or abstract (``jax.ShapeDtypeStruct`` leaves). Metrics
    come back unconstrained.
    """
    shardings = state_shardings(get_placement(placement), state, mesh)
    tokens = batch_sharding(mesh)
    jitted = jax.jit(
        step_fn,
        donate_argnums=0,
        in_shardings=(shardings, tokens, tokens),
        out_shardings=(shardings, None),
    )
    return jitted, shardings


def abstract_with(state, shardings):
    """``state``'s shapes and dtypes carrying ``shardings`` (to lower, or to restore into)."""
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state, shardings
    )
