#pragma once

#include "xla/ffi/api/ffi.h"

namespace jaxoff::ffi_handlers {

// Fused AdamW: one pass over params, grads and the fp32 moments (see adamw_kernel.cc).
XLA_FFI_DECLARE_HANDLER_SYMBOL(AdamWHandler);

}  // namespace jaxoff::ffi_handlers
