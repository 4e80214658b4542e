#include "cuda_device_ops.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

namespace jaxoff::aio {

namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw DeviceError(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                      cudaGetErrorString(e) + ")");
  }
}

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice: return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost: return cudaMemcpyDeviceToHost;
    default: return cudaMemcpyDeviceToDevice;
  }
}

class CudaDeviceOps final : public DeviceOps {
 public:
  explicit CudaDeviceOps(int device) : device_(device) { Check(cudaSetDevice(device_), "cudaSetDevice"); }

  const char* name() const override { return "cuda"; }

  Stream CreateStream() override {
    Use();
    cudaStream_t s = nullptr;
    Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void DestroyStream(Stream stream) override {
    Use();
    Check(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
  }
  Event CreateEvent() override {
    Use();
    cudaEvent_t e = nullptr;
    Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void DestroyEvent(Event event) override {
    Use();
    Check(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
  }
  void RecordEvent(Event event, Stream stream) override {
    Use();
    Check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
          "cudaEventRecord");
  }
  void StreamWaitEvent(Stream stream, Event event) override {
    Use();
    Check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                              static_cast<cudaEvent_t>(event), 0),
          "cudaStreamWaitEvent");
  }
  bool EventDone(Event event) override {
    Use();
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it
      return false;
    }
    Check(e, "cudaEventQuery");
    return true;
  }
  void CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                 Stream stream) override {
    Use();
    Check(cudaMemcpyAsync(dst, src, bytes, ToCuda(kind), static_cast<cudaStream_t>(stream)),
          "cudaMemcpyAsync");
  }
  void MemsetAsync(void* dst, int value, size_t bytes, Stream stream) override {
    Use();
    Check(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)),
          "cudaMemsetAsync");
  }
  void LaunchHostFunc(Stream stream, std::function<void()> fn) override {
    Use();
    auto* heap = new std::function<void()>(std::move(fn));
    const cudaError_t e = cudaLaunchHostFunc(
        static_cast<cudaStream_t>(stream),
        [](void* p) {
          std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(p));
          (*f)();
        },
        heap);
    if (e != cudaSuccess) delete heap;
    Check(e, "cudaLaunchHostFunc");
  }
  void SynchronizeStream(Stream stream) override {
    Use();
    Check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }
  void* AllocPinned(size_t bytes) override {
    Use();
    void* p = nullptr;
    Check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void FreePinned(void* ptr) override {
    if (ptr != nullptr) Check(cudaFreeHost(ptr), "cudaFreeHost");
  }
  void* AllocDevice(size_t bytes) override {
    Use();
    void* p = nullptr;
    Check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void FreeDevice(void* ptr) override {
    Use();
    if (ptr != nullptr) Check(cudaFree(ptr), "cudaFree");
  }

 private:
  void Use() { Check(cudaSetDevice(device_), "cudaSetDevice"); }
  int device_;
};

}  // namespace

std::unique_ptr<DeviceOps> MakeCudaDeviceOps(int device) {
  return std::make_unique<CudaDeviceOps>(device);
}

int CudaDeviceCount(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
    (void)cudaGetLastError();
    return -1;
  }
  return n;
}

}  // namespace jaxoff::aio
