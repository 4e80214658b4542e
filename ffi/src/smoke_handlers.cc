#include "smoke_handlers.h"

#include <cstring>

namespace ffi = xla::ffi;

namespace jaxoff::ffi_handlers {
namespace {

ffi::Error CopyImpl(ffi::AnyBuffer in, ffi::Result<ffi::AnyBuffer> out) {
  if (in.size_bytes() != out->size_bytes()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "jaxoff_copy: operand and result sizes differ");
  }
  std::memcpy(out->untyped_data(), in.untyped_data(), in.size_bytes());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CopyHandler, CopyImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

}  // namespace jaxoff::ffi_handlers
