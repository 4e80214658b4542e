#pragma once
// XLA FFI target jaxoff_host_call: a Python function called from a jitted CPU program by
// name (see jaxoff/aio/_host_call.py). Unlike jax's io_callback, whose callback object is a
// pointer baked into the program, the program names the function by a string attribute, so
// JAX's persistent compilation cache can store it and a new process can run it again.

#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace jaxoff::ffi_handlers {

XLA_FFI_DECLARE_HANDLER_SYMBOL(HostCall);

// Binds set_host_call_dispatch(fn): the Python function every jaxoff_host_call calls as
// fn(name, [(memoryview, dtype, shape) per operand], [(memoryview, dtype, shape) per result]);
// it returns None, or a str: the call fails with that message.
void BindHostCall(nanobind::module_& m);

}  // namespace jaxoff::ffi_handlers
