// jaxoff._ffi_cuda: the paging targets for platform CUDA (see cuda_page_handlers.h). A module
// of its own, so that importing jaxoff on a machine without CUDA never loads CUDA code; the
// CUDA runtime is linked statically, so the module needs only the driver (libcuda) at run time.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <string>

#include "cuda_page_handlers.h"

namespace nb = nanobind;

namespace {

template <typename T>
nb::capsule EncapsulateHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "Encapsulated function must be an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

nb::dict Stages(XLA_FFI_Handler* instantiate, XLA_FFI_Handler* execute) {
  nb::dict d;
  d["instantiate"] = EncapsulateHandler(instantiate);
  d["execute"] = EncapsulateHandler(execute);
  return d;
}

}  // namespace

NB_MODULE(_ffi_cuda, m) {
  namespace h = jaxoff::cuda_handlers;
  namespace api = jaxoff::host_api;
  m.doc() = "jaxoff CUDA code: the XLA FFI paging targets for platform CUDA.";
  m.attr("CUDART_VERSION") = CUDART_VERSION;  // the toolkit the module was built with

  m.def("registrations", []() {
    nb::dict d;
    d["jaxoff_page_in"] = Stages(h::CudaPageInInstantiate, h::CudaPageInExecute);
    d["jaxoff_page_out"] = Stages(h::CudaPageOutInstantiate, h::CudaPageOutExecute);
    d["jaxoff_page_prefetch"] = Stages(h::CudaPagePrefetchInstantiate, h::CudaPagePrefetchExecute);
    d["jaxoff_page_take"] = Stages(h::CudaPageTakeInstantiate, h::CudaPageTakeExecute);
    d["jaxoff_page_flush"] = Stages(h::CudaPageFlushInstantiate, h::CudaPageFlushExecute);
    return d;
  }, "The paging targets, name -> {stage: PyCapsule}, for platform CUDA.");

  m.def("state_types", []() {
    nb::dict d, page;
    page["type_id"] = nb::capsule(reinterpret_cast<void*>(h::CudaPageStateTypeId()));
    page["type_info"] =
        nb::capsule(const_cast<void*>(reinterpret_cast<const void*>(h::CudaPageStateTypeInfo())));
    d["jaxoff_cuda_page_state"] = page;
    return d;
  }, "FFI state types, name -> {type_id, type_info} capsules (platform CUDA).");

  m.def("bind_host_api", [](nb::capsule capsule) {
    if (capsule.name() == nullptr || std::strcmp(capsule.name(), api::kCapsuleName) != 0) {
      throw nb::type_error("expected jaxoff._ffi.host_paging_api()");
    }
    const auto* table = static_cast<const api::Api*>(capsule.data());
    if (table->version != api::kVersion || table->struct_size < sizeof(api::Api)) {
      throw std::runtime_error(
          "jaxoff._ffi and jaxoff._ffi_cuda come from different builds (host paging API "
          "version " + std::to_string(table->version) + ", expected " +
          std::to_string(api::kVersion) + "); reinstall jaxoff");
    }
    h::BindHostApi(table);
  }, "Binds the host half of paging (jaxoff._ffi.host_paging_api()).");

  m.def("host_api_bound", []() { return h::HostApiBound(); });

  m.def("runtime", []() {
    nb::dict d;
    int driver = 0, runtime = 0, count = 0;
    d["driver_version"] = cudaDriverGetVersion(&driver) == cudaSuccess ? driver : 0;
    d["runtime_version"] = cudaRuntimeGetVersion(&runtime) == cudaSuccess ? runtime : 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    d["device_count"] = e == cudaSuccess ? count : 0;
    d["error"] = e == cudaSuccess ? std::string()
                                  : std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    (void)cudaGetLastError();
    return d;
  }, "CUDA driver/runtime versions and device count as this module sees them ('error' if none).");

  m.def("pinned_bytes", []() {
    nb::dict d;
    d["held"] = h::PinnedBytesHeld();
    d["cap"] = h::PinnedBytesCap();
    return d;
  }, "Page-locked staging held by the CUDA paging handlers, and its cap (0 = none).");
}
