#include "config.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "aligned_buffer.h"

namespace jaxoff::aio {

void EngineConfig::Validate() const {
  auto fail = [](const std::string& m) { throw std::invalid_argument("EngineConfig: " + m); };
  if (block_size == 0 || block_size % kAlign != 0) {
    fail("block_size=" + std::to_string(block_size) + " must be a positive multiple of 4096");
  }
  if (queue_depth < 1 || queue_depth > 4096) {
    fail("queue_depth=" + std::to_string(queue_depth) + " must be in [1, 4096]");
  }
  if (threads < 1 || threads > 256) {
    fail("threads=" + std::to_string(threads) + " must be in [1, 256]");
  }
  if (pool_bytes < block_size) {
    fail("pool_bytes=" + std::to_string(pool_bytes) + " must hold at least one block (" +
         std::to_string(block_size) + " bytes)");
  }
}

BackendKind ParseBackend(const std::string& name) {
  if (name.empty() || name == "auto") return BackendKind::kAuto;
  if (name == "io_uring" || name == "uring") return BackendKind::kIoUring;
  if (name == "posix") return BackendKind::kPosix;
  throw std::invalid_argument("unknown I/O backend '" + name +
                              "': expected 'auto', 'io_uring' or 'posix'");
}

const char* BackendName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kIoUring: return "io_uring";
    case BackendKind::kPosix: return "posix";
    default: return "auto";
  }
}

BackendKind ResolveBackend(BackendKind requested) {
  if (requested != BackendKind::kAuto) return requested;
  const char* env = std::getenv("JAXOFF_AIO_BACKEND");
  if (env == nullptr) return BackendKind::kAuto;
  try {
    return ParseBackend(env);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("JAXOFF_AIO_BACKEND: ") + e.what());
  }
}

}  // namespace jaxoff::aio
