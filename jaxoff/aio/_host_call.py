"""``host_call``: a Python function called from inside a jitted step, named so that JAX's
persistent compilation cache can keep the step.

``jax.experimental.io_callback`` hands its Python callable to XLA as a pointer written into
the program, and JAX never stores such a program in its persistent compilation cache (see
``_cache_write`` in ``jax/_src/compiler.py``): every process compiled the paged step again
(6.6 s of a 19 s `jaxoff train` run of ``tiny``). On the CPU, `host_call` lowers instead to the
FFI target ``jaxoff_host_call`` (``ffi/src/host_call.cc``), whose only attribute is the
function's *name*; the function is registered under that name in this process when the step
is traced. A new process that runs the same code (a resumed run, or the same model trained
again) traces the same names, so the program is the same and the cache serves it. (The paging
calls name their file table the same way: `jaxoff.optim` uses an owner's prefix as its
table's name, not the store's path.)

Names come from `HostCalls`: ``<label>#<n>/<what>/<digest of key>``, where ``n`` counts the
owners with that label in this process (unique while the process lives, the same in a new
process that builds its owners in the same order) and ``key`` holds everything the function
depends on besides its operands (shapes, ...). A name is never reused for another function.

On other platforms the operands live on the device, and `host_call` is ``io_callback``;
``JAXOFF_HOST_CALL=io_callback`` makes it ``io_callback`` on the CPU too (the baseline of
``bench/investigations/resume_compile.py``, and a way out should the FFI call misbehave somewhere).

The function gets its operands as numpy arrays (copies), returns one array per result, and
may raise: the step then fails with a ``jax.errors.JaxRuntimeError`` whose text ends, as
io_callback's does, with the exception's traceback (``...PageStoreError: <message>``), which
`jaxoff.aio.store_error_from` reads back.

>>> import jax, jax.numpy as jnp, numpy as np
>>> calls = HostCalls("doc")
>>> @jax.jit
... def f(x):
...     name = calls.name("double", x.shape)
...     return host_call(lambda a: 2 * a, jax.ShapeDtypeStruct(x.shape, x.dtype), x, name=name)
>>> np.asarray(f(jnp.arange(3.0))).tolist()
[0.0, 2.0, 4.0]
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
import threading
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from jaxoff import _ffi
from jaxoff.aio._ffi_calls import register_targets

HOST_CALL = "jaxoff_host_call"

_lock = threading.Lock()
_functions: dict[str, Callable] = {}
_owners: collections.defaultdict[str, itertools.count] = collections.defaultdict(
    lambda: itertools.count(1)
)


class HostCalls:
    """The names of one owner's host calls (an optimizer, a step): unique in this process.

    Args:
      label: what the owner is (``"jaxoff.paged"``); owners are counted per label.
    """

    def __init__(self, label: str):
        if "/" in label or "#" in label:
            raise ValueError(f"a host call label has no '/' or '#': {label!r}")
        with _lock:
            self.prefix = f"{label}#{next(_owners[label])}"

    def name(self, what: str, key: Any = ()) -> str:
        """The name of this owner's function ``what`` for ``key`` (a value with a stable
        ``repr``: everything the function depends on besides its operands)."""
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
        return f"{self.prefix}/{what}/{digest}"


def host_call(fn: Callable, result: jax.ShapeDtypeStruct, *operands: Any, name: str) -> Any:
    """``fn(*operands)`` on the host, from inside a traced function; returns its result.

    As ``io_callback(fn, result, *operands, ordered=False)``: the call is kept (it has side
    effects) and runs once its operands exist, in no order with calls it does not depend on.

    Args:
      fn: called with numpy arrays (operand pytrees keep their structure); returns an array
        of ``result``'s shape and dtype.
      result: a ``jax.ShapeDtypeStruct``.
      *operands: arrays or pytrees of arrays.
      name: from `HostCalls.name`; registering another function under a name replaces it.
    """
    if jax.default_backend() != "cpu" or _mode() == "io_callback":
        return io_callback(fn, result, *operands, ordered=False)
    register_targets()
    flat, tree = jax.tree.flatten(operands)

    def call(*arrays):
        return fn(*jax.tree.unflatten(tree, arrays))

    with _lock:
        _functions[name] = call
    return jax.ffi.ffi_call(HOST_CALL, result, has_side_effect=True)(*flat, name=name)


def _mode() -> str:
    mode = os.environ.get("JAXOFF_HOST_CALL", "ffi")
    if mode not in ("ffi", "io_callback"):
        raise ValueError(
            f"JAXOFF_HOST_CALL={mode!r}: use 'ffi' (the default: the step can be cached) or "
            "'io_callback' (jax's own callback: never cached), or leave it unset"
        )
    return mode


def _dispatch(name: str, operands: list, results: list) -> str | None:
    """What ``jaxoff_host_call`` calls: None, or the message the step fails with."""
    try:
        with _lock:
            fn = _functions.get(name)
        if fn is None:
            return (
                f"jaxoff host call {name!r} is not registered in this process: a program that "
                "calls it runs only in the process that traced it (or one that traced it again)"
            )
        args = [_array(*o).copy() for o in operands]
        out = fn(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if len(outs) != len(results):
            raise ValueError(f"host call {name!r} returned {len(outs)} results for {len(results)}")
        for value, r in zip(outs, results, strict=True):
            target = _array(*r)
            value = np.asarray(value)
            if value.shape != target.shape:
                raise ValueError(
                    f"host call {name!r} returned shape {value.shape} for {target.shape}"
                )
            np.copyto(target, value.astype(target.dtype, copy=False))
        return None
    except BaseException as e:  # noqa: BLE001 - becomes the step's error, with its traceback
        return "".join(traceback.format_exception(e)).rstrip()


def _array(buffer, dtype: str, shape) -> np.ndarray:
    return np.frombuffer(buffer, dtype=jnp.dtype(dtype)).reshape(tuple(shape))


_ffi.set_host_call_dispatch(_dispatch)
