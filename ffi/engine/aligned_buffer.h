#pragma once
// 4 KiB-aligned, move-only heap buffers (O_DIRECT needs aligned memory) and alignment helpers.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

namespace jaxoff::aio {

// Alignment of buffers, offsets and lengths for O_DIRECT (the physical sector size here).
inline constexpr size_t kAlign = 4096;

constexpr uint64_t AlignUp(uint64_t x, uint64_t a = kAlign) { return (x + a - 1) / a * a; }
constexpr uint64_t AlignDown(uint64_t x, uint64_t a = kAlign) { return x / a * a; }
inline bool IsAligned(const void* p, size_t a = kAlign) {
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size) : size_(AlignUp(size)) {
    if (size_ == 0) return;
    if (posix_memalign(&data_, kAlign, size_) != 0) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  char* data() const noexcept { return static_cast<char*>(data_); }
  size_t size() const noexcept { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace jaxoff::aio
