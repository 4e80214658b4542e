#include "buffer_pool.h"

#include <cstring>

namespace jaxoff::aio {

BufferPool::BufferPool(size_t buffer_size, size_t count) : buffer_size_(AlignUp(buffer_size)) {
  buffers_.reserve(count);
  free_.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    buffers_.emplace_back(buffer_size_);
    // Touch every page now: first touch of fresh memory is slow here and must not be timed.
    std::memset(buffers_.back().data(), 0, buffer_size_);
    free_.push_back(buffers_.back().data());
  }
}

char* BufferPool::TryAcquire() {
  if (free_.empty()) return nullptr;
  char* b = free_.back();
  free_.pop_back();
  return b;
}

void BufferPool::Release(char* buffer) { free_.push_back(buffer); }

}  // namespace jaxoff::aio
