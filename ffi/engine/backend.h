#pragma once
// The interface between the engine's scheduler and the kernel: submit one block, get told
// when it is done. Backends retry short transfers and EINTR/EAGAIN themselves.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "config.h"

namespace jaxoff::aio {

// One block transfer. `len` bytes are transferred (for O_DIRECT the padded length); a read is
// complete once `need` bytes arrived even if the file ends before `len` (an unpadded tail).
struct BlockOp {
  int fd = -1;
  bool write = false;
  bool direct = false;
  char* buf = nullptr;
  size_t len = 0;
  size_t need = 0;
  uint64_t offset = 0;
  size_t done = 0;  // bytes transferred so far (backend-owned while in flight)
  void* user = nullptr;  // the submitter's bookkeeping
};

class Backend {
 public:
  // Called once per op, from a backend thread, with errno (0 on success, kErrEof).
  using Completion = std::function<void(BlockOp* op, int err)>;

  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Thread-safe; `op` stays owned by the caller until its completion runs.
  virtual void Submit(BlockOp* op) = 0;
};

// Position to resume a short transfer from: O_DIRECT needs an aligned restart.
size_t ResumePoint(const BlockOp& op);

// Names the calling thread (shown by top -H, perf, gdb); best effort.
void NameThisThread(const char* name);

// True when `op` is complete after `op.done` bytes.
inline bool IsComplete(const BlockOp& op) {
  return op.write ? op.done >= op.len : op.done >= op.need;
}

std::unique_ptr<Backend> MakePosixBackend(int threads, Backend::Completion on_done);
// Throws IoError when io_uring cannot be set up (or was not compiled in).
std::unique_ptr<Backend> MakeUringBackend(int queue_depth, Backend::Completion on_done);
bool UringCompiledIn();

}  // namespace jaxoff::aio
