#pragma once
// DeviceOps on the CPU: one thread per stream running its queue in order, events as counters
// (a record bumps the event's target when enqueued and its completed count when it runs; a
// wait blocks its stream until the count reaches the target taken when the wait was
// enqueued), copies as memcpy after an injected delay, pinned and device memory as aligned
// heap memory.
//
// It also checks what a GPU would not: two copies in flight at once that touch overlapping
// bytes, one of them writing, are a hazard (a take reading a ring slot its H2D copy still
// fills, a slot refilled while its D2H copy still reads it). The host side touches pinned
// memory too (a disk read fills an arena slot, a disk write reads a write slot): it declares
// it with BeginHostAccess / EndHostAccess (or a HostAccess guard), and a host access that
// overlaps a copy in flight, one of them writing, is a hazard whichever started first (an
// arena slot refilled while its H2D copy still reads it, a write slot's disk write reading
// bytes its D2H copy still fills). Hazards are counted, and the first is described, so a test
// asserts there were none.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device_ops.h"

namespace jaxoff::aio {

struct SimDelays {
  std::chrono::microseconds h2d{0};
  std::chrono::microseconds d2h{0};
  std::chrono::microseconds d2d{0};
};

struct SimStats {
  uint64_t copies[3] = {0, 0, 0};  // by CopyKind
  uint64_t bytes[3] = {0, 0, 0};
  uint64_t host_funcs = 0;
  uint64_t hazards = 0;
};

class SimDeviceOps final : public DeviceOps {
 public:
  explicit SimDeviceOps(SimDelays delays = {});
  ~SimDeviceOps() override;  // joins the stream threads (streams must be destroyed first)

  // Every operation later run on `stream` first sleeps `lag`: a device that lags its host
  // (XLA's compute stream with long kernels).
  void SetStreamLag(Stream stream, std::chrono::microseconds lag);
  SimStats Stats() const;
  std::string FirstHazard() const;

  // The host is about to touch [p, p + n) (`write`: it writes it) until the matching
  // EndHostAccess with the same arguments; `what` names the access in a hazard's description.
  // Overlaps with copies in flight, and with other host accesses, one of them writing, are
  // hazards.
  void BeginHostAccess(const void* p, size_t n, bool write, const char* what = "host access");
  void EndHostAccess(const void* p, size_t n, bool write);
  // Declares a host access for its lifetime; a null `ops` declares nothing.
  class HostAccess {
   public:
    HostAccess(SimDeviceOps* ops, const void* p, size_t n, bool write,
               const char* what = "host access")
        : ops_(ops), p_(p), n_(n), write_(write) {
      if (ops_ != nullptr) ops_->BeginHostAccess(p_, n_, write_, what);
    }
    ~HostAccess() {
      if (ops_ != nullptr) ops_->EndHostAccess(p_, n_, write_);
    }
    HostAccess(const HostAccess&) = delete;
    HostAccess& operator=(const HostAccess&) = delete;

   private:
    SimDeviceOps* ops_;
    const void* p_;
    size_t n_;
    bool write_;
  };

  const char* name() const override { return "sim"; }
  Stream CreateStream() override;
  void DestroyStream(Stream stream) override;
  Event CreateEvent() override;
  void DestroyEvent(Event event) override;
  void RecordEvent(Event event, Stream stream) override;
  void StreamWaitEvent(Stream stream, Event event) override;
  bool EventDone(Event event) override;
  void CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                 Stream stream) override;
  void MemsetAsync(void* dst, int value, size_t bytes, Stream stream) override;
  void LaunchHostFunc(Stream stream, std::function<void()> fn) override;
  void SynchronizeStream(Stream stream) override;
  void* AllocPinned(size_t bytes) override;
  void FreePinned(void* ptr) override;
  void* AllocDevice(size_t bytes) override;
  void FreeDevice(void* ptr) override;

 private:
  struct SimStream;
  struct SimEvent {
    uint64_t recorded = 0;   // records enqueued
    uint64_t completed = 0;  // highest record that has run
  };
  struct Access {
    const char* begin;
    const char* end;
    bool write;
    const SimStream* stream;  // nullptr: a host access
    const char* what;         // "H2D", "memset", "disk read into an arena slot", ...
  };

  void Enqueue(Stream stream, std::function<void()> op);
  void Run(SimStream* s);
  void RunCopy(void* dst, const void* src, size_t bytes, CopyKind kind, const SimStream* s);
  // Under mu_: counts (and describes the first) hazard between `mine` and the accesses in
  // flight, then adds `mine` to them.
  void Start(const Access& mine);
  // Under mu_: removes one access equal to `mine`.
  void Finish(const Access& mine);

  const SimDelays delays_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Access> active_;  // bytes touched by copies running now
  SimStats stats_;
  std::string first_hazard_;
};

}  // namespace jaxoff::aio
