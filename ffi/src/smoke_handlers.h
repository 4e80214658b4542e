#pragma once

#include "xla/ffi/api/ffi.h"

namespace jaxoff::ffi_handlers {

// Copies its operand into its result. Proves the build -> register -> ffi_call path.
XLA_FFI_DECLARE_HANDLER_SYMBOL(CopyHandler);

}  // namespace jaxoff::ffi_handlers
