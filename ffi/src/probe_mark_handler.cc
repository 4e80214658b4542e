// A debug FFI target for bench/gpu/pager_probe.py, compiled by that script at run time (not
// part of the package): `jaxoff_probe_mark` copies its operand to its result and logs, per
// call, XLA's run id, the call site (attribute `site`), the host time when XLA's thread ran the
// handler and, with JAXOFF_PROBE_CUDA, the host time when the GPU stream reached the call (a
// host function enqueued on XLA's stream). The records answer what the GPU pager's design
// assumes of XLA: a new run id per execution, calls in site order inside scans, and a host
// that runs ahead of the GPU.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "xla/ffi/api/ffi.h"

#ifdef JAXOFF_PROBE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ffi = xla::ffi;

namespace {

struct Record {
  int64_t run_id;
  int64_t site;
  int64_t host_ns;
  std::atomic<int64_t> gpu_ns;
};

constexpr int kMax = 1 << 16;
Record g_records[kMax];
std::atomic<int> g_count{0};

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Record* Log(int64_t run_id, int64_t site) {
  const int i = g_count.fetch_add(1);
  if (i >= kMax) return nullptr;
  Record& r = g_records[i];
  r.run_id = run_id;
  r.site = site;
  r.gpu_ns.store(-1);
  r.host_ns = Now();
  return &r;
}

#ifdef JAXOFF_PROBE_CUDA
void Reached(void* p) { static_cast<Record*>(p)->gpu_ns.store(Now()); }

ffi::Error MarkImpl(cudaStream_t stream, ffi::RunId run_id, int64_t site, ffi::AnyBuffer x,
                    ffi::Result<ffi::AnyBuffer> out) {
  Record* r = Log(run_id.run_id, site);
  cudaMemcpyAsync(out->untyped_data(), x.untyped_data(), x.size_bytes(),
                  cudaMemcpyDeviceToDevice, stream);
  if (r != nullptr) cudaLaunchHostFunc(stream, Reached, r);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(e));
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ProbeMark, MarkImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::RunId>()
                                  .Attr<int64_t>("site")
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
#else
ffi::Error MarkImpl(ffi::RunId run_id, int64_t site, ffi::AnyBuffer x,
                    ffi::Result<ffi::AnyBuffer> out) {
  Log(run_id.run_id, site);
  std::memcpy(out->untyped_data(), x.untyped_data(), x.size_bytes());
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ProbeMark, MarkImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()
                                  .Attr<int64_t>("site")
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
#endif

}  // namespace

extern "C" {
__attribute__((visibility("default"))) int jaxoff_probe_count() {
  const int n = g_count.load();
  return n < kMax ? n : kMax;
}
// out: run_id, site, host_ns, gpu_ns (-1: no GPU, or not reached yet)
__attribute__((visibility("default"))) void jaxoff_probe_read(int i, int64_t* out) {
  const Record& r = g_records[i];
  out[0] = r.run_id;
  out[1] = r.site;
  out[2] = r.host_ns;
  out[3] = r.gpu_ns.load();
}
__attribute__((visibility("default"))) void jaxoff_probe_reset() { g_count.store(0); }
__attribute__((visibility("default"))) void* jaxoff_probe_handler() {
  return reinterpret_cast<void*>(&ProbeMark);
}
}
