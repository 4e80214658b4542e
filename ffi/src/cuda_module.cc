// jaxoff._ffi_cuda: the paging targets for platform CUDA (see cuda_pager_handlers.h). A module
// of its own, so that importing jaxoff on a machine without CUDA never loads CUDA code; the
// CUDA runtime is linked statically, so the module needs only the driver (libcuda) at run time.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "cuda_device_ops.h"
#include "cuda_pager_handlers.h"
#include "host_api_chunk_io.h"
#include "pager_bindings.h"

namespace nb = nanobind;

namespace {

template <typename T>
nb::capsule EncapsulateHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "Encapsulated function must be an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// The CUDA pager of a registered file table on `device`: its streams, pinned arena, device
// ring and write slots, and `io_threads` disk threads over jaxoff._ffi's file table.
std::shared_ptr<jaxoff::pager::Entry> CudaEntry(const std::string& table, int device,
                                                int io_threads) {
  namespace api = jaxoff::host_api;
  const api::Api* host = jaxoff::pager::BoundHostApi();
  if (host == nullptr) {
    throw std::runtime_error("jaxoff._ffi_cuda is not bound to jaxoff._ffi; call "
                             "jaxoff.aio.register_targets() first");
  }
  api::Status st;
  void* handle = host->acquire("jaxoff pager", table.c_str(), &st);
  if (handle == nullptr) throw std::runtime_error(st.message);
  auto e = std::make_shared<jaxoff::pager::Entry>();
  e->table = table;
  e->device = device;
  e->keep = std::shared_ptr<void>(handle, [host](void* h) { host->release(h); });
  e->ops = jaxoff::aio::MakeCudaDeviceOps(device);
  e->io = std::make_unique<jaxoff::pager::HostApiChunkIo>(host, handle, io_threads);
  return e;
}

}  // namespace

NB_MODULE(_ffi_cuda, m) {
  namespace api = jaxoff::host_api;
  namespace pg = jaxoff::pager;
  m.doc() = "jaxoff CUDA code: the XLA FFI paging targets for platform CUDA.";
  m.attr("CUDART_VERSION") = CUDART_VERSION;  // the toolkit the module was built with

  m.def("registrations", []() {
    nb::dict d;
    d[pg::kBegin] = EncapsulateHandler(pg::CudaPagerBegin);
    d[pg::kTake] = EncapsulateHandler(pg::CudaPagerTake);
    d[pg::kOut] = EncapsulateHandler(pg::CudaPagerOut);
    d[pg::kCommit] = EncapsulateHandler(pg::CudaPagerCommit);
    return d;
  }, "The paging targets, name -> PyCapsule, for platform CUDA.");

  m.def("bind_host_api", [](nb::capsule capsule) {
    if (capsule.name() == nullptr || std::strcmp(capsule.name(), api::kCapsuleName) != 0) {
      throw nb::type_error("expected jaxoff._ffi.host_paging_api() of the same build");
    }
    const auto* table = static_cast<const api::Api*>(capsule.data());
    if (table->version != api::kVersion || table->struct_size < sizeof(api::Api)) {
      throw std::runtime_error(
          "jaxoff._ffi and jaxoff._ffi_cuda come from different builds (host paging API "
          "version " + std::to_string(table->version) + ", expected " +
          std::to_string(api::kVersion) + "); reinstall jaxoff");
    }
    pg::BindHostApi(table);
  }, "Binds the disk half of paging (jaxoff._ffi.host_paging_api()).");

  m.def("host_api_bound", []() { return pg::BoundHostApi() != nullptr; });

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

  pg::BindPager(m, CudaEntry);
}
