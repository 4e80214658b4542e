#pragma once
// The asynchronous I/O engine: splits requests into blocks, keeps `queue_depth` blocks in
// flight (refilled on every completion), stages unaligned data through a bounded pool of
// 4 KiB-aligned buffers, and reports each request's outcome once.
//
// Staging copies and checksums run on `threads` worker threads of the engine, never on the
// thread that completes the I/O: the io_uring reaper only reaps and resubmits, the copy out of a
// block (and its crc32c, folded into the copy while the block is in cache) overlaps the next
// blocks' I/O, and a caller's thread only submits. A finished block gives its I/O slot back
// before its copy starts, so `queue_depth` blocks stay in flight while copies run.
//
// Tail handling: with O_DIRECT a write whose size is not a multiple of 4096 writes its last
// block padded with zeros up to the next 4 KiB boundary, so a request of n bytes at offset o
// occupies [o, o + AlignUp(n)) on disk: callers lay out files with 4 KiB-aligned slots (the
// PageStore does). Reads ask for the padded length but succeed once the n requested bytes
// arrived, so a file that ends exactly at o + n (written without padding) reads fine; only
// the n requested bytes are ever copied to the caller. Without O_DIRECT (or for unaligned
// offsets, which use a buffered descriptor) exactly n bytes are written.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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

// Per-request options.
struct IoOptions {
  // Compute the crc32c of the request's bytes (block by block, during the staging copy or
  // right after the block's I/O, combined in order) and report it in IoStatus::crc32c.
  bool crc32c = false;
};

// Cumulative I/O figures of an engine since it started.
struct EngineStats {
  uint64_t busy_ns = 0;      // wall time with at least one block's I/O in flight
  uint64_t read_bytes = 0;   // bytes read (completed blocks)
  uint64_t write_bytes = 0;  // bytes written (completed blocks)
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
            Callback done, IoOptions options = {});
  void Write(std::shared_ptr<const File> file, uint64_t offset, const void* src, size_t size,
             Callback done, IoOptions options = {});

  std::shared_ptr<Completion> Read(std::shared_ptr<const File> file, uint64_t offset, void* dst,
                                   size_t size, IoOptions options = {});
  std::shared_ptr<Completion> Write(std::shared_ptr<const File> file, uint64_t offset,
                                    const void* src, size_t size, IoOptions options = {});

  const EngineConfig& config() const { return config_; }
  const char* backend_name() const { return backend_->name(); }
  size_t pool_buffers() const { return pool_.count(); }
  EngineStats Stats();

 private:
  struct Request;
  struct Slot {
    BlockOp op;
    std::shared_ptr<Request> req;
    size_t req_pos = 0;      // where this block starts inside the request
    size_t bytes = 0;        // logical bytes of this block
    char* staging = nullptr; // pool buffer, or nullptr when the I/O uses caller memory
    const std::string* path = nullptr;
    size_t index = 0;        // block number within the request (for its crc)
    uint32_t crc = 0;        // crc32c of this block's bytes, when the request wants it
    int err = 0;
  };

  void Enqueue(std::shared_ptr<Request> req);
  void Pump();
  void OnBlockDone(BlockOp* op, int err);
  // Hands a slot to the workers: fill (write) or drain (read) its staging buffer, with crc.
  void Post(Slot* s);
  void Work();
  // Bookkeeping once a block is fully done (I/O and copy): may complete the request.
  void Finish(Slot* s);

  EngineConfig config_;
  BufferPool pool_;
  std::unique_ptr<Backend> backend_;

  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::deque<std::shared_ptr<Request>> pending_;  // requests with blocks left to start
  std::vector<Slot> slots_;
  std::vector<Slot*> free_slots_;
  size_t in_flight_ = 0;     // slots in use (I/O or copy)
  size_t io_in_flight_ = 0;  // blocks between start and I/O completion (<= queue_depth)
  // Busy time: io_in_flight_ > 0 since busy_since_ (when it is), plus closed intervals.
  std::chrono::steady_clock::time_point busy_since_;
  uint64_t busy_ns_ = 0;
  uint64_t read_bytes_ = 0;
  uint64_t write_bytes_ = 0;

  std::mutex work_mu_;
  std::condition_variable work_cv_;
  std::deque<Slot*> work_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace jaxoff::aio
