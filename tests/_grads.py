"""The one tolerance remat-equivalence tests compare gradients with."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

ULPS = 8
"""Remat changes how XLA fuses the recomputed forward ops into the backward pass, so an
elementwise op may round one ulp differently and that propagates through the layers.
Measured: ~3 float32 ulps of the largest gradient at most. A layer out of order or a wrong
residual gives differences ~1e-3, far above this bound."""


def assert_grads_close(grads, grads0) -> None:
    """``grads`` equal ``grads0`` within ``ULPS`` float32 ulps of ``grads0``'s largest
    magnitude, leaf by leaf (the failing leaf's path in the message)."""
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads0))
    atol = ULPS * np.finfo(np.float32).eps * scale
    for (path, g0), g in zip(
        jax.tree.leaves_with_path(grads0), jax.tree.leaves(grads), strict=True
    ):
        np.testing.assert_allclose(g, g0, rtol=0, atol=atol, err_msg=jax.tree_util.keystr(path))
