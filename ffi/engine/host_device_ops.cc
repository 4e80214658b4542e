#include "host_device_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "aligned_buffer.h"

namespace jaxoff::aio {

namespace {
// Streams and events carry nothing; a distinct heap byte each keeps them non-null and unique
// (a caller may use them as map keys or check them against nullptr).
struct Placeholder {
  char unused = 0;
};
}  // namespace

DeviceOps::Stream HostDeviceOps::CreateStream() { return new Placeholder(); }

void HostDeviceOps::DestroyStream(Stream stream) { delete static_cast<Placeholder*>(stream); }

DeviceOps::Event HostDeviceOps::CreateEvent() { return new Placeholder(); }

void HostDeviceOps::DestroyEvent(Event event) { delete static_cast<Placeholder*>(event); }

void HostDeviceOps::CopyAsync(void* dst, const void* src, size_t bytes, CopyKind, Stream) {
  // The pager copies a buffer onto itself where host and device memory are one (dst == src):
  // nothing to move.
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

void HostDeviceOps::MemsetAsync(void* dst, int value, size_t bytes, Stream) {
  if (bytes > 0) std::memset(dst, value, bytes);
}

void HostDeviceOps::LaunchHostFunc(Stream, std::function<void()> fn) { fn(); }

void* HostDeviceOps::AllocPinned(size_t bytes) {
  void* p = std::aligned_alloc(kAlign, AlignUp(std::max<size_t>(bytes, 1)));
  if (p == nullptr) {
    throw DeviceError("host AllocPinned(" + std::to_string(bytes) +
                      ") failed: out of host memory; lower the pager's slot counts or sizes");
  }
  return p;
}

void HostDeviceOps::FreePinned(void* ptr) { std::free(ptr); }

void* HostDeviceOps::AllocDevice(size_t bytes) { return AllocPinned(bytes); }

void HostDeviceOps::FreeDevice(void* ptr) { std::free(ptr); }

}  // namespace jaxoff::aio
