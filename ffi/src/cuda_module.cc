// jaxoff._ffi_cuda: the paging targets for platform CUDA (see cuda_page_handlers.h). A module
// of its own, so that importing jaxoff on a machine without CUDA never loads CUDA code; the
// CUDA runtime is linked statically, so the module needs only the driver (libcuda) at run time.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_page_handlers.h"
#include "cuda_pager_handlers.h"

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

  // ---- The GPU pager (cuda_pager_handlers.h): calls that never wait for the GPU. ----------
  namespace pg = jaxoff::cuda_pager;
  m.def("pager_registrations", []() {
    nb::dict d;
    d["jaxoff_gpu_page_begin"] = Stages(pg::GpuPageBeginInstantiate, pg::GpuPageBeginExecute);
    d["jaxoff_gpu_page_take"] = Stages(pg::GpuPageTakeInstantiate, pg::GpuPageTakeExecute);
    d["jaxoff_gpu_page_out"] = Stages(pg::GpuPageOutInstantiate, pg::GpuPageOutExecute);
    d["jaxoff_gpu_page_commit"] = Stages(pg::GpuPageCommitInstantiate, pg::GpuPageCommitExecute);
    return d;
  }, "The GPU pager's targets, name -> {stage: PyCapsule}, for platform CUDA.");

  m.def("pager_state_types", []() {
    nb::dict d, page;
    page["type_id"] = nb::capsule(reinterpret_cast<void*>(pg::PagerStateTypeId()));
    page["type_info"] =
        nb::capsule(const_cast<void*>(reinterpret_cast<const void*>(pg::PagerStateTypeInfo())));
    d["jaxoff_gpu_pager_state"] = page;
    return d;
  }, "The GPU pager's FFI state type, name -> {type_id, type_info} capsules.");

  m.def("pager_open", [](const std::string& table, int device, size_t slot_bytes,
                         int arena_slots, int ring_slots, int write_slots, int io_threads,
                         double wait_limit_s) {
    jaxoff::aio::PagerConfig c;
    c.slot_bytes = slot_bytes;
    c.arena_slots = arena_slots;
    c.ring_slots = ring_slots;
    c.write_slots = write_slots;
    c.wait_limit = std::chrono::milliseconds(static_cast<int64_t>(wait_limit_s * 1000));
    nb::gil_scoped_release nogil;
    pg::OpenPager(h::BoundHostApi(), table, device, c, io_threads);
  }, nb::arg("table"), nb::arg("device") = 0, nb::arg("slot_bytes") = size_t{16} << 20,
     nb::arg("arena_slots") = 4, nb::arg("ring_slots") = 2, nb::arg("write_slots") = 2,
     nb::arg("io_threads") = 4, nb::arg("wait_limit_s") = 600.0,
     "Opens the GPU pager of a registered file table on a CUDA device (RuntimeError, one "
     "line, when there is no usable device).");

  m.def("pager_plan", [](const std::string& table, int64_t plan_id,
                         const std::vector<pg::PlanIo>& reads,
                         const std::vector<pg::PlanIo>& writes) {
    pg::RegisterPagerPlan(table, plan_id, reads, writes);
  }, nb::arg("table"), nb::arg("plan_id"), nb::arg("reads"), nb::arg("writes"),
     "Registers a step plan: reads and writes as (site, file id, offset, bytes), in order.");

  m.def("pager_set_checksums", &pg::SetPagerChecksums, nb::arg("table"), nb::arg("crcs"),
        "Expected crc32c of chunks on disk, as (file id, offset, crc32c).");
  m.def("pager_checksums", &pg::PagerChecksums, nb::arg("table"),
        "The checksums the pager holds, as (file id, offset, crc32c).");

  m.def("pager_stats", [](const std::string& table) {
    uint64_t committed = 0;
    const jaxoff::aio::PagerStats s = pg::PagerStatsOf(table, &committed);
    nb::dict d;
    d["committed_step"] = committed;
    d["steps_begun"] = s.steps_begun;
    d["commits"] = s.commits;
    d["takes"] = s.takes;
    d["puts"] = s.puts;
    d["reads_done"] = s.reads_done;
    d["writes_done"] = s.writes_done;
    d["h2d_bytes"] = s.h2d_bytes;
    d["d2h_bytes"] = s.d2h_bytes;
    d["take_wait_ns"] = s.take_wait_ns;
    d["put_wait_ns"] = s.put_wait_ns;
    d["begin_wait_ns"] = s.begin_wait_ns;
    d["max_reads_in_flight"] = s.max_reads_in_flight;
    d["max_h2d_ahead"] = s.max_h2d_ahead;
    return d;
  }, nb::arg("table"), "The GPU pager's counters.");

  m.def("pager_close", [](const std::string& table) {
    nb::gil_scoped_release nogil;
    return pg::ClosePager(table);
  }, nb::arg("table"), "Closes a GPU pager (False if none was open).");

  m.def("pinned_bytes", []() {
    nb::dict d;
    d["held"] = h::PinnedBytesHeld();
    d["cap"] = h::PinnedBytesCap();
    return d;
  }, "Page-locked staging held by the CUDA paging handlers, and its cap (0 = none).");
}
