// jaxoff._ffi: the XLA FFI targets (as PyCapsules) and the Python face of the I/O engine.
#include <nanobind/nanobind.h>

#include <memory>
#include <stdexcept>
#include <vector>

#include "adamw_kernel.h"
#include "build_info.h"
#include "file_handle.h"
#include "file_table.h"
#include "gpu_pager.h"
#include "host_device_ops.h"
#include "host_paging_api.h"
#include "pager_bindings.h"
#include "pager_handlers.h"
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

// The CPU pager of a registered file table: host memory as the device, the table's engine
// (O_DIRECT into the pager's 4 KiB-aligned slots, crc32c on its workers) as the disk.
std::shared_ptr<jaxoff::pager::Entry> CpuEntry(const std::string& table, int /*device*/,
                                               int /*io_threads*/) {
  auto t = jaxoff::ffi_handlers::FindFileTable(table);
  if (t == nullptr) {
    throw std::invalid_argument("file table '" + table + "' is not registered "
                                "(jaxoff.aio.register_file_table)");
  }
  auto e = std::make_shared<jaxoff::pager::Entry>();
  e->table = table;
  e->keep = t;
  e->ops = std::make_unique<jaxoff::aio::HostDeviceOps>();
  std::vector<std::shared_ptr<jaxoff::aio::File>> files;
  for (const auto& f : t->files) files.push_back(std::const_pointer_cast<jaxoff::aio::File>(f));
  e->io = std::make_unique<jaxoff::aio::EngineChunkIo>(t->engine, std::move(files));
  return e;
}

}  // namespace

NB_MODULE(_ffi, m) {
  namespace h = jaxoff::ffi_handlers;
  namespace pg = jaxoff::pager;
  m.doc() = "jaxoff native code: XLA FFI handlers and the async I/O engine.";
  // The XLA FFI API version the handlers were built against (the headers' XLA_FFI_API_*): a
  // jaxlib runs handlers of its own API version or older, so the build uses the oldest
  // supported jaxlib's headers (pyproject.toml's build requirements).
  m.def("ffi_api_version", []() { return nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); });
  m.def("registrations", []() {
    nb::dict d;
    d["jaxoff_copy"] = EncapsulateHandler(h::CopyHandler);
    d["jaxoff_adamw"] = EncapsulateHandler(h::AdamWHandler);
    d[pg::kBegin] = EncapsulateHandler(pg::CpuPagerBegin);
    d[pg::kTake] = EncapsulateHandler(pg::CpuPagerTake);
    d[pg::kOut] = EncapsulateHandler(pg::CpuPagerOut);
    d[pg::kCommit] = EncapsulateHandler(pg::CpuPagerCommit);
    return d;
  }, "Every XLA FFI target of jaxoff, name -> PyCapsule (platform cpu).");
  m.def("host_paging_api", []() {
    return nb::capsule(const_cast<void*>(static_cast<const void*>(jaxoff::host_api::GetApi())),
                       jaxoff::host_api::kCapsuleName);
  }, "The disk half of paging (host_paging_api.h) for the platform modules (jaxoff._ffi_cuda).");
  m.def("build_info", []() {
    nb::dict d;
    // Set by CMake: whether jaxoff._ffi_cuda was built in the same build, and why not.
    d["cuda"] = JAXOFF_CUDA_BUILT != 0;
    d["cuda_mode"] = JAXOFF_CUDA_MODE;
    d["cuda_reason"] = JAXOFF_CUDA_REASON;
    d["cuda_toolkit"] = JAXOFF_CUDA_TOOLKIT;
    return d;
  }, "How this build was configured: CUDA module built or not (cuda_reason says why).");
  m.def("file_sync_count", &jaxoff::aio::FileSyncCount,
        "fsync calls of page files in this process (a test of the commit's durability).");
  h::BindEngine(m);
  pg::BindPager(m, CpuEntry);
}
