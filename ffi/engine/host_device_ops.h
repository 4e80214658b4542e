#pragma once
// DeviceOps whose "device" is host memory: the GPU pager's data path on the CPU platform, so
// that XLA:CPU pages through the same GpuPager (ordering, backpressure, commit and version
// rules) as a GPU does.
//
// Everything is synchronous and runs inline on the caller's thread: a copy is a memcpy done
// when CopyAsync returns, a host function has run when LaunchHostFunc returns, streams and
// events are placeholders (a record is complete at once, a wait has nothing to wait for).
// host_memory() is true, so the pager skips the copies a shared memory makes pointless (see
// gpu_pager.h). Pinned and device memory are 4096-aligned heap allocations, so O_DIRECT reads
// and writes go straight into and out of them. No state is shared between calls: any number
// of threads (XLA's, the pager's, the engine's) may call it at once.

#include "device_ops.h"

namespace jaxoff::aio {

class HostDeviceOps final : public DeviceOps {
 public:
  const char* name() const override { return "host"; }
  bool host_memory() const override { return true; }

  Stream CreateStream() override;
  void DestroyStream(Stream stream) override;
  Event CreateEvent() override;
  void DestroyEvent(Event event) override;
  void RecordEvent(Event, Stream) override {}
  void StreamWaitEvent(Stream, Event) override {}
  bool EventDone(Event) override { return true; }
  void CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                 Stream stream) override;
  void MemsetAsync(void* dst, int value, size_t bytes, Stream stream) override;
  void LaunchHostFunc(Stream stream, std::function<void()> fn) override;
  void SynchronizeStream(Stream) override {}
  void* AllocPinned(size_t bytes) override;
  void FreePinned(void* ptr) override;
  void* AllocDevice(size_t bytes) override;
  void FreeDevice(void* ptr) override;
};

}  // namespace jaxoff::aio
