#pragma once
// The asynchronous I/O engine: splits requests into blocks, keeps `queue_depth` blocks in
// flight (refilled on every completion), stages unaligned data through a bounded pool of
// 4 KiB-aligned buffers, and reports each request's outcome once.
//
// Tail handling: with O_DIRECT a write whose size is not a multiple of 4096 writes its last
// block padded with zeros up to the next 4 KiB boundary, so a request of n bytes at offset o
// occupies [o, o + AlignUp(n)) on disk: callers lay out files with 4 KiB-aligned slots (the
// PageStore does). Reads ask for the padded length but succeed once the n requested bytes
// arrived, so a file that ends exactly at o + n (written without padding) reads fine; only
// the n requested bytes are ever copied to the caller. Without O_DIRECT (or for unaligned
// offsets, which use a buffered descriptor) exactly n bytes are written.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.h"
#include "buffer_pool.h"
#include "config.h"
#include "error.h"
#include "file_handle.h"

namespace jaxoff::aio {

// A request's outcome, for callers that wait rather than take a callback.
class Completion {
 public:
  void Set(IoStatus status);
  // Blocks until done; returns the status.
  const IoStatus& Wait();
  // Waits at most `seconds`; false on timeout.
  bool WaitFor(double seconds);
  bool done() const;
  const IoStatus& status() const { return status_; }  // valid once done()

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  IoStatus status_;
};

class Engine {
 public:
  // Runs on a backend thread once every block of the request finished (or one failed).
  using Callback = std::function<void(const IoStatus&)>;

  // Picks the backend: io_uring if requested or available, else POSIX (see ResolveBackend).
  explicit Engine(const EngineConfig& config);
  ~Engine();  // waits for requests in flight
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Reads `size` bytes at logical `offset` of `file` into `dst` / writes them from `src`.
  // Buffers must stay alive until the callback ran. `file` is kept alive by the engine.
  void Read(std::shared_ptr<const File> file, uint64_t offset, void* dst, size_t size,
            Callback done);
  void Write(std::shared_ptr<const File> file, uint64_t offset, const void* src, size_t size,
             Callback done);

  std::shared_ptr<Completion> Read(std::shared_ptr<const File> file, uint64_t offset, void* dst,
                                   size_t size);
  std::shared_ptr<Completion> Write(std::shared_ptr<const File> file, uint64_t offset,
                                    const void* src, size_t size);

  const EngineConfig& config() const { return config_; }
  const char* backend_name() const { return backend_->name(); }
  size_t pool_buffers() const { return pool_.count(); }

 private:
  struct Request;
  struct Slot {
    BlockOp op;
    std::shared_ptr<Request> req;
    size_t req_pos = 0;      // where this block starts inside the request
    size_t bytes = 0;        // logical bytes of this block
    char* staging = nullptr; // pool buffer, or nullptr when the I/O uses caller memory
    const std::string* path = nullptr;
  };

  void Enqueue(std::shared_ptr<Request> req);
  void Pump();
  void OnBlockDone(BlockOp* op, int err);

  EngineConfig config_;
  BufferPool pool_;
  std::unique_ptr<Backend> backend_;

  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::deque<std::shared_ptr<Request>> pending_;  // requests with blocks left to start
  std::vector<Slot> slots_;
  std::vector<Slot*> free_slots_;
  size_t in_flight_ = 0;
};

}  // namespace jaxoff::aio
