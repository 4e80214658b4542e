#pragma once
// The device operations a GPU pager needs, behind one small interface: streams, events,
// asynchronous copies, host functions on a stream, pinned host and device memory.
//
// Three implementations: CudaDeviceOps (ffi/src/cuda_device_ops.cc, the CUDA runtime, built
// only when a CUDA toolkit is found); SimDeviceOps (sim_device_ops.h, CPU threads), so that
// the pager's ordering, backpressure, error and deadlock rules are tested on a machine without
// a GPU, under ThreadSanitizer too; and HostDeviceOps (host_device_ops.h), where the "device"
// is host memory and every call completes inline, so the same pager runs under XLA:CPU.
//
// Semantics are CUDA's:
// - Work enqueued on one stream runs in order; different streams run concurrently.
// - RecordEvent(e, s) captures the work enqueued on `s` so far; the event completes when that
//   work has. StreamWaitEvent(s, e) makes work enqueued on `s` afterwards wait for the most
//   recent record of `e` at the time of the call (an event never recorded is complete).
// - LaunchHostFunc runs `fn` on a runtime thread once the stream's earlier work is done, and
//   later work on the stream waits for `fn`; `fn` must not call DeviceOps (CUDA forbids
//   runtime calls inside a host function): it may only hand work to the caller's threads.
// - No call here waits for the device except SynchronizeStream, which is for teardown and
//   tests, never for a handler (rule I1 of the GPU design).
// Errors throw DeviceError naming the call and the runtime's message.

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>

namespace jaxoff::aio {

class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
const char* CopyKindName(CopyKind kind);

class DeviceOps {
 public:
  // Opaque handles; each implementation casts them to its own types.
  using Stream = void*;
  using Event = void*;

  virtual ~DeviceOps() = default;

  virtual const char* name() const = 0;
  // A non-blocking stream (does not synchronise with the legacy default stream).
  virtual Stream CreateStream() = 0;
  virtual void DestroyStream(Stream stream) = 0;
  // Events are for ordering only (no timing).
  virtual Event CreateEvent() = 0;
  virtual void DestroyEvent(Event event) = 0;
  virtual void RecordEvent(Event event, Stream stream) = 0;
  virtual void StreamWaitEvent(Stream stream, Event event) = 0;
  // True once the most recent record of `event` has completed; never blocks.
  virtual bool EventDone(Event event) = 0;
  virtual void CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                         Stream stream) = 0;
  // Sets `bytes` bytes at `dst` (device memory) to `value`, ordered on `stream` (the FFI
  // handlers fill their output tokens with it).
  virtual void MemsetAsync(void* dst, int value, size_t bytes, Stream stream) = 0;
  virtual void LaunchHostFunc(Stream stream, std::function<void()> fn) = 0;
  // Teardown and tests only: blocks until everything enqueued on `stream` has run.
  virtual void SynchronizeStream(Stream stream) = 0;

  // Page-locked host memory (cudaHostAlloc) and device memory; Free* of nullptr is a no-op.
  virtual void* AllocPinned(size_t bytes) = 0;
  virtual void FreePinned(void* ptr) = 0;
  virtual void* AllocDevice(size_t bytes) = 0;
  virtual void FreeDevice(void* ptr) = 0;

  // True when device memory IS host memory and every call has completed when it returns
  // (HostDeviceOps): a copy between "host" and "device" is then pointless, and a host
  // function has run before LaunchHostFunc returns (so it must not take a lock its caller
  // holds).
  virtual bool host_memory() const { return false; }
};

}  // namespace jaxoff::aio
