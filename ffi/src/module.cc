// jaxoff._ffi: the XLA FFI targets (as PyCapsules) and the Python face of the I/O engine.
#include <nanobind/nanobind.h>

#include "smoke_handlers.h"

namespace nb = nanobind;

namespace {

template <typename T>
nb::capsule EncapsulateHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "Encapsulated function must be an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_ffi, m) {
  m.doc() = "jaxoff native code: XLA FFI handlers and the async I/O engine.";
  m.def("registrations", []() {
    nb::dict d;
    d["jaxoff_copy"] = EncapsulateHandler(jaxoff::ffi_handlers::CopyHandler);
    return d;
  }, "Every XLA FFI target of jaxoff, name -> PyCapsule (platform cpu).");
}
