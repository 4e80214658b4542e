// jaxoff._ffi: the XLA FFI targets (as PyCapsules) and the Python face of the I/O engine.
#include <nanobind/nanobind.h>

#include "adamw_kernel.h"
#include "build_info.h"
#include "host_call.h"
#include "host_paging_api.h"
#include "page_handlers.h"
#include "py_engine.h"
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
  namespace h = jaxoff::ffi_handlers;
  m.doc() = "jaxoff native code: XLA FFI handlers and the async I/O engine.";
  m.def("registrations", []() {
    nb::dict d;
    d["jaxoff_copy"] = EncapsulateHandler(h::CopyHandler);
    d["jaxoff_adamw"] = EncapsulateHandler(h::AdamWHandler);
    d["jaxoff_host_call"] = EncapsulateHandler(h::HostCall);
    nb::dict page_in, page_out;
    page_in["instantiate"] = EncapsulateHandler(h::PageInInstantiate);
    page_in["execute"] = EncapsulateHandler(h::PageInExecute);
    page_out["instantiate"] = EncapsulateHandler(h::PageOutInstantiate);
    page_out["execute"] = EncapsulateHandler(h::PageOutExecute);
    d["jaxoff_page_in"] = page_in;
    d["jaxoff_page_out"] = page_out;
    nb::dict prefetch, take, flush;
    prefetch["instantiate"] = EncapsulateHandler(h::PagePrefetchInstantiate);
    prefetch["execute"] = EncapsulateHandler(h::PagePrefetchExecute);
    take["instantiate"] = EncapsulateHandler(h::PageTakeInstantiate);
    take["execute"] = EncapsulateHandler(h::PageTakeExecute);
    flush["instantiate"] = EncapsulateHandler(h::PageFlushInstantiate);
    flush["execute"] = EncapsulateHandler(h::PageFlushExecute);
    d["jaxoff_page_prefetch"] = prefetch;
    d["jaxoff_page_take"] = take;
    d["jaxoff_page_flush"] = flush;
    return d;
  }, "Every XLA FFI target of jaxoff, name -> PyCapsule or {stage: PyCapsule} (platform cpu).");
  m.def("state_types", []() {
    nb::dict d, page;
    page["type_id"] = nb::capsule(reinterpret_cast<void*>(h::PageStateTypeId()));
    page["type_info"] =
        nb::capsule(const_cast<void*>(reinterpret_cast<const void*>(h::PageStateTypeInfo())));
    d["jaxoff_page_state"] = page;
    return d;
  }, "FFI state types, name -> {type_id, type_info} capsules for jax.ffi.register_ffi_type.");
  m.def("host_paging_api", []() {
    return nb::capsule(const_cast<void*>(static_cast<const void*>(jaxoff::host_api::GetApi())),
                       jaxoff::host_api::kCapsuleName);
  }, "The host half of paging (host_paging_api.h) for the platform modules (jaxoff._ffi_cuda).");
  m.def("build_info", []() {
    nb::dict d;
    // Set by CMake: whether jaxoff._ffi_cuda was built in the same build, and why not.
    d["cuda"] = JAXOFF_CUDA_BUILT != 0;
    d["cuda_mode"] = JAXOFF_CUDA_MODE;
    d["cuda_reason"] = JAXOFF_CUDA_REASON;
    d["cuda_toolkit"] = JAXOFF_CUDA_TOOLKIT;
    return d;
  }, "How this build was configured: CUDA module built or not (cuda_reason says why).");
  h::BindEngine(m);
  h::BindHostCall(m);
}
