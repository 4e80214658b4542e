"""The jitted step with the placement's shardings as in/out shardings of the donated state."""

from __future__ import annotations

import jax

from .._errors import OptionError
from .._xla import compiler_options
from ._placement import Placement, get_placement
from ._shardings import batch_sharding, state_shardings

# XLA's words when it cannot compile a computation it was asked to run on the host
# (``compute_on("device_host")``): seen with XLA 0.11.2 on an H200 for the optimizer update.
_HOST_COMPUTE_FAILURES = ("host-call", "_xla_compute_type", "host_compute", "host-compute")


def jit_step(step_fn, placement: Placement | str | None, state, mesh=None):
    """``(jitted, state_shardings)``: ``step_fn`` jitted with the state donated and placed.

    ``state`` may be concrete or abstract (``jax.ShapeDtypeStruct`` leaves). Metrics
    come back unconstrained. Compiled with `jaxoff.compiler_options` of the state's
    parameters (on CPU with 16-bit ones, no float32 copy of the stacked layers): the trainer,
    ``jaxoff plan`` and ``jaxoff compare`` all compile the same program.
    """
    shardings = state_shardings(get_placement(placement), state, mesh)
    tokens = batch_sharding(mesh)
    jitted = jax.jit(
        step_fn,
        donate_argnums=0,
        in_shardings=(shardings, tokens, tokens),
        out_shardings=(shardings, None),
        compiler_options=compiler_options(getattr(state, "params", state)) or None,
    )
    return jitted, shardings


def abstract_with(state, shardings):
    """``state``'s shapes and dtypes carrying ``shardings`` (to lower, or to restore into)."""
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state, shardings
    )


def compile_placed(lowered, placement: Placement | str | None):
    """``lowered.compile()``; where the placement runs the optimizer update as host
    computation and XLA cannot compile that (an XLA limitation on GPUs: JAX 0.11.2 on an H200
    failed with ``host-call ... async-start expects the async shape ...``), one
    :class:`ConfigError` naming the placement and the routes that compile instead."""
    try:
        return lowered.compile()
    except Exception as e:
        placement = get_placement(placement)
        if placement.all_on_device or placement.update_kind != "host":
            raise
        if not any(word in str(e) for word in _HOST_COMPUTE_FAILURES):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OptionError(
            f"XLA could not compile the optimizer update as host computation "
            f"(compute_on('device_host')) for placement update_on={placement.update_on!r} "
            f"on {jax.default_backend()}: {first[:300]}; run the update on the device with "
            f"transfers (placement host_opt_xfer, or Placement(..., update_on='device')), or "
            f"page the optimizer state to a store (`store`, jaxoff.paged)"
        ) from e
