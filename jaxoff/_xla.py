"""XLA compiler options for a training step (``jax.jit(..., compiler_options=...)`` or
``lowered.compile(...)``): `compiler_options`.

XLA's CPU backend computes 16-bit floats in float32, a layer scan's dynamic slice of a stacked
bfloat16 leaf included: it converts the stack to float32 and slices the result. Its
while-loop invariant code motion then hoists that conversion out of the loop, so the compiled
step holds a float32 copy of every stacked 16-bit leaf (twice the leaf's bytes) for the whole
step. With the pass disabled the conversion stays inside the loop, where XLA fuses it with
the slice: one layer is converted at a time, with the same arithmetic, bit for bit.
``bench/investigations/bf16_scan_copy.py`` measures the memory and time it saves
(``docs/benchmarks.md``).
GPUs compute 16-bit floats natively; there the options are empty.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import jax
import jax.numpy as jnp

# the XLA pass that hoists the float32 conversion of a stacked 16-bit leaf out of the loop
LOOP_INVARIANT_CODE_MOTION = "while-loop-invariant-code-motion"

_lock = threading.Lock()
_disabled = 0  # how many `xla_default_options` blocks are open (in any thread)


def is_half_float(dtype) -> bool:
    """Whether ``dtype`` is a 16-bit float (bfloat16, float16), which XLA's CPU backend
    computes in float32."""
    return jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize == 2


def compiler_options(params=None, backend: str | None = None) -> dict[str, str]:
    """XLA compiler options for jitting a training step of ``params`` on ``backend``.

    Args:
      params: the step's parameters (arrays or ``jax.ShapeDtypeStruct``), or None (assume
        16-bit floats among them).
      backend: ``"cpu"``, ``"gpu"``, ...; default ``jax.default_backend()``.

    Returns:
      on CPU, where ``params`` hold a 16-bit float leaf, ``{"xla_disable_hlo_passes":
      "while-loop-invariant-code-motion"}``: XLA then keeps no float32 copy of the stacked
      16-bit leaves a layer scan slices (see the module docstring); else ``{}``. Pass it as
      ``jax.jit(step, compiler_options=...)``; ``jaxoff train`` does for its steps. It
      replaces an ``--xla_disable_hlo_passes`` given in ``XLA_FLAGS`` for this compile.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> compiler_options({"w": jnp.zeros((4, 8, 8), jnp.bfloat16)}, backend="cpu")
        {'xla_disable_hlo_passes': 'while-loop-invariant-code-motion'}
        >>> compiler_options({"w": jnp.zeros((4, 8, 8), jnp.float32)}, backend="cpu")
        {}
        >>> compiler_options(None, backend="gpu")
        {}
    """
    if _disabled or (backend or jax.default_backend()) != "cpu":
        return {}
    if params is not None and not any(is_half_float(x.dtype) for x in jax.tree.leaves(params)):
        return {}
    return {"xla_disable_hlo_passes": LOOP_INVARIANT_CODE_MOTION}


@contextlib.contextmanager
def xla_default_options() -> Iterator[None]:
    """Within it, `compiler_options` is ``{}`` in every thread: the steps that jaxoff
    compiles (``jaxoff.placement.jit_step``, ``jaxoff.step.compile_step``, the planner's
    profile and prices) compile with XLA's default options. For measuring what the options
    save (``bench/plan.py options``); training never needs it.

    Example:
        >>> import jax.numpy as jnp
        >>> params = {"w": jnp.zeros((4, 8, 8), jnp.bfloat16)}
        >>> with xla_default_options():
        ...     compiler_options(params, backend="cpu")
        {}
        >>> compiler_options(params, backend="cpu")
        {'xla_disable_hlo_passes': 'while-loop-invariant-code-motion'}
    """
    global _disabled
    with _lock:
        _disabled += 1
    try:
        yield
    finally:
        with _lock:
            _disabled -= 1
