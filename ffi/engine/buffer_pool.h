#pragma once
// A bounded pool of equally sized, 4 KiB-aligned staging buffers. Its total size is fixed at
// construction (pool_bytes / block_size buffers): I/O never allocates staging memory later.

#include <cstddef>
#include <vector>

#include "aligned_buffer.h"

namespace jaxoff::aio {

class BufferPool {
 public:
  // `count` buffers of `buffer_size` bytes each (rounded up to 4 KiB).
  BufferPool(size_t buffer_size, size_t count);
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A free buffer, or nullptr when all are in use. Not thread-safe: the engine holds its lock.
  char* TryAcquire();
  void Release(char* buffer);

  size_t buffer_size() const noexcept { return buffer_size_; }
  size_t count() const noexcept { return buffers_.size(); }
  size_t available() const noexcept { return free_.size(); }
  size_t total_bytes() const noexcept { return buffer_size_ * buffers_.size(); }

 private:
  size_t buffer_size_;
  std::vector<AlignedBuffer> buffers_;
  std::vector<char*> free_;
};

}  // namespace jaxoff::aio
