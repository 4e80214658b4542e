#pragma once
// Knobs of the I/O engine. Validated once; the Python EngineConfig mirrors this struct.

#include <cstddef>
#include <string>

namespace jaxoff::aio {

enum class BackendKind { kAuto, kIoUring, kPosix };

struct EngineConfig {
  size_t block_size = 1 << 20;   // bytes per I/O request (multiple of 4096)
  int queue_depth = 8;           // requests in flight per engine
  int threads = 2;               // POSIX backend I/O threads; also the engine's copy/crc threads
  bool o_direct = true;          // bypass the page cache (falls back when unsupported)
  size_t pool_bytes = 16 << 20;  // total staging memory (pool_bytes / block_size buffers)
  BackendKind backend = BackendKind::kAuto;

  // Throws std::invalid_argument naming the bad knob and the accepted range.
  void Validate() const;
};

// "auto" | "io_uring" | "posix" (throws std::invalid_argument otherwise).
BackendKind ParseBackend(const std::string& name);
const char* BackendName(BackendKind kind);

// kAuto resolved by the environment variable JAXOFF_AIO_BACKEND (auto | io_uring | posix).
BackendKind ResolveBackend(BackendKind requested);

}  // namespace jaxoff::aio
