"""The build -> register -> jax.ffi.ffi_call path of the compiled extension, inside jit."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxoff import _ffi


def test_registrations_are_capsules():
    regs = _ffi.registrations()
    assert "jaxoff_copy" in regs
    for name, handler in regs.items():
        # a plain handler is one capsule; a stateful one is {"instantiate": .., "execute": ..}
        capsules = handler.values() if isinstance(handler, dict) else [handler]
        assert all(type(c).__name__ == "PyCapsule" for c in capsules), name


def test_copy_handler_inside_jit():
    jax.ffi.register_ffi_target("jaxoff_copy", _ffi.registrations()["jaxoff_copy"], platform="cpu")

    @jax.jit
    def f(x):
        y = jax.ffi.ffi_call("jaxoff_copy", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        return y * 2

    x = jnp.arange(1000, dtype=jnp.float32).reshape(10, 100)
    np.testing.assert_array_equal(f(x), np.asarray(x) * 2)
    assert "jaxoff_copy" in f.lower(x).as_text()
