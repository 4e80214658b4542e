#pragma once
// The GPU pager's data path, on DeviceOps and a ChunkIo: no call of a handler waits for the GPU.
//
// One step follows a plan fixed at trace time: the ordered chunks its `take` calls read and its
// `put` calls write. Data path (design §4.2):
//   read:  disk --ChunkIo (O_DIRECT, crc32c on engine workers)--> pinned arena slot
//          --H2D on the pager's h2d stream--> device ring slot (event `ready`)
//          take, on the caller's (XLA's) stream: wait `ready`, D2D slot -> output,
//          record `free`; the next H2D into that slot waits `free` on the h2d stream.
//   write: put, on the caller's stream: D2D input -> device write slot, record `ready`;
//          the d2h stream waits `ready`, D2H -> the slot's pinned half, then a host function
//          hands the slot to the pager thread, which writes it with ChunkIo (crc32c on
//          workers, into the host checksum table); the slot is free once the write is done.
//
// Rules kept (tested against SimDeviceOps in ffi/tests/test_gpu_pager.cc):
// - A take never reads a ring slot before its H2D copy: the D2D waits the slot's `ready`.
// - A slot is reused only after its copy out: the next H2D into a ring slot waits its last
//   take's `free`; an arena slot is refilled only once its H2D ran (host function); a write
//   slot only once its disk write is done.
// - Backpressure: read-ahead is bounded by the arena, H2D copies by the ring (chunk i uses
//   ring slot i % ring_slots and waits until take i - ring_slots is enqueued), puts by the
//   write slots. Everything is assigned in plan order, so a take waits (on the host) only for
//   host I/O and for device work already enqueued, never for work not yet enqueued (rule I2):
//   no deadlock, whatever the device's lag.
// - Read and checksum errors are returned by the take that needs the chunk; write and commit
//   errors by the next Begin (each once). A step commits (commit callback, on the pager
//   thread) only after every planned put's write is done and every planned take happened.
// - Begin after an aborted step (a failed take, an error, a missing Commit) resets the
//   cursors and drops the old step's read-ahead; the old step never commits.
// No handler-side call blocks on the device; only the destructor synchronises the streams.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device_ops.h"
#include "engine.h"
#include "error.h"
#include "file_handle.h"

namespace jaxoff::aio {

// Where a chunk lives: a file of the pager's ChunkIo, a byte offset and its length.
struct ChunkRef {
  int file = 0;
  uint64_t offset = 0;
  size_t bytes = 0;
};

// Storage under the pager. Callbacks run on the storage's threads and must not block long.
class ChunkIo {
 public:
  using Done = std::function<void(const IoStatus&)>;  // IoStatus::crc32c: the bytes' crc32c
  virtual ~ChunkIo() = default;
  virtual void Read(const ChunkRef& ref, void* dst, Done done) = 0;
  virtual void Write(const ChunkRef& ref, const void* src, Done done) = 0;
};

// ChunkIo on the I/O engine: file i of `files`, O_DIRECT into the caller's (pinned) memory,
// crc32c taken by the engine's workers.
class EngineChunkIo final : public ChunkIo {
 public:
  EngineChunkIo(std::shared_ptr<Engine> engine, std::vector<std::shared_ptr<File>> files);
  void Read(const ChunkRef& ref, void* dst, Done done) override;
  void Write(const ChunkRef& ref, const void* src, Done done) override;

 private:
  const std::shared_ptr<File>& At(int file) const;
  std::shared_ptr<Engine> engine_;
  std::vector<std::shared_ptr<File>> files_;
};

// The chunks one step moves, fixed at trace time (jaxoff.optim.StepPlan on the Python side):
// the reads in the order the pager reads them ahead, the writes in put order.
//
// Call sites: a paging call in a traced program is one site (an XLA custom call, run
// `trip_count` times inside a scan). The handler passes its site id, an attribute, and the
// pager keeps one cursor per site: site s's k-th take in a step consumes the k-th read whose
// site is s. So a handler never reads a device buffer (a step counter, a chunk index) to know
// what it moves: the plan and a host-side cursor advanced per call say it, and Begin resets
// every cursor. Without sites (empty `read_sites`), every read is site 0's, in plan order;
// likewise for writes.
struct StepPlan {
  std::vector<ChunkRef> reads;   // in read-ahead order
  std::vector<ChunkRef> writes;  // in put order
  std::vector<int> read_sites;   // empty, or one site per read
  std::vector<int> write_sites;  // empty, or one site per write
};

struct PagerConfig {
  size_t slot_bytes = 16 << 20;  // largest chunk (arena, ring and write slots hold one each)
  int arena_slots = 4;           // pinned read slots: disk read-ahead depth
  int ring_slots = 2;            // device read ring
  int write_slots = 2;           // device + pinned write slots
  // A take or put that waits longer than this fails with a message (a hang, not a slow disk).
  std::chrono::milliseconds wait_limit{std::chrono::minutes(10)};
  void Validate() const;  // throws std::invalid_argument naming the knob
};

struct PagerStats {
  uint64_t steps_begun = 0;
  uint64_t commits = 0;
  uint64_t takes = 0;
  uint64_t puts = 0;
  uint64_t reads_done = 0;     // disk reads completed (any step)
  uint64_t writes_done = 0;    // disk writes completed
  uint64_t h2d_bytes = 0;      // enqueued on the h2d stream
  uint64_t d2h_bytes = 0;      // enqueued on the d2h stream
  uint64_t take_wait_ns = 0;   // takes waiting on the host for their chunk (read not hidden)
  uint64_t put_wait_ns = 0;    // puts waiting for a free write slot (write ring full)
  uint64_t begin_wait_ns = 0;  // Begin waiting for the previous step's writes and commit
  int max_reads_in_flight = 0;
  int max_h2d_ahead = 0;       // most H2D copies enqueued and not yet taken
};

class GpuPager {
 public:
  // Runs on the pager thread once a step's writes are all done; its error fails the next Begin.
  // The checksums of the step's writes are in `crcs` ((file, offset) -> crc32c).
  using Crcs = std::map<std::pair<int, uint64_t>, uint32_t>;  // (file, offset) -> crc32c
  using CommitFn = std::function<IoStatus(uint64_t step, const Crcs& crcs)>;

  GpuPager(DeviceOps* ops, ChunkIo* io, PagerConfig config, CommitFn commit = nullptr);
  ~GpuPager();  // waits for I/O in flight and synchronises its own streams
  GpuPager(const GpuPager&) = delete;
  GpuPager& operator=(const GpuPager&) = delete;

  // Keeps `plan` under `id` (a page_begin call names it by this id; registering an id again
  // replaces it from the next Begin). Throws std::invalid_argument for a plan the pager
  // cannot run (a chunk larger than slot_bytes, sites not one per chunk).
  void RegisterPlan(int64_t id, StepPlan plan);
  bool HasPlan(int64_t id) const;

  // Starts step `plan` (kept by the pager): waits on the host for the previous step's writes
  // and commit, returns their first error if any (the plan is not started; the next Begin
  // is), else resets the cursors and starts reading ahead.
  IoStatus Begin(StepPlan plan);
  // The same for a registered plan (EINVAL if `id` is unknown).
  IoStatus Begin(int64_t plan_id);
  // The plan id of the step begun last (-1 for a plan passed by value, or none yet).
  int64_t plan_id() const;

  // Site `site`'s next planned read into device memory `dst` (`bytes` must match the plan),
  // ordered on `stream` (XLA's): enqueues a wait, a D2D copy and an event record, and returns.
  // It waits on the host only for its chunk's disk read. A take more than `ring_slots` reads
  // ahead of the first read not yet taken fails at once (the calls do not follow the plan's
  // order, and waiting would deadlock).
  IoStatus Take(int site, DeviceOps::Stream stream, void* dst, size_t bytes);
  IoStatus Take(DeviceOps::Stream stream, void* dst, size_t bytes) {
    return Take(0, stream, dst, bytes);
  }
  // Site `site`'s next planned write from device memory `src`, ordered on `stream`.
  IoStatus Put(int site, DeviceOps::Stream stream, const void* src, size_t bytes);
  IoStatus Put(DeviceOps::Stream stream, const void* src, size_t bytes) {
    return Put(0, stream, src, bytes);
  }
  // Ends the step and returns at once; the step commits once its writes are done.
  IoStatus Commit();

  // Calls site `site` has made in the current step (reset by Begin).
  size_t TakeCursor(int site) const;
  size_t PutCursor(int site) const;

  // Expected crc32c of a chunk (verified after its read); a committed write sets it too.
  void SetChecksum(const ChunkRef& ref, uint32_t crc);
  bool Checksum(const ChunkRef& ref, uint32_t* crc) const;
  Crcs Checksums() const;  // every checksum held
  uint64_t committed_step() const;
  PagerStats Stats() const;

 private:
  enum class ReadState { kPlanned, kReading, kRead, kFailed, kCopying, kOnDevice, kTaken };
  struct Read {
    ReadState state = ReadState::kPlanned;
    int arena = -1;
    IoStatus status;
  };
  enum class WriteState { kFree, kCopying, kCopied, kWriting };
  struct WriteSlot {
    void* dev = nullptr;
    void* host = nullptr;
    DeviceOps::Event ready = nullptr;
    WriteState state = WriteState::kFree;
    ChunkRef ref;
    uint64_t step = 0;
  };
  struct RingSlot {
    void* dev = nullptr;
    DeviceOps::Event ready = nullptr;
    DeviceOps::Event free = nullptr;
  };

  void Loop();
  // Under mu_: starts disk reads and H2D copies that can go, and writes whose D2H is done.
  void Pump(std::unique_lock<std::mutex>& lock);
  void MaybeCommit(std::unique_lock<std::mutex>& lock);
  void OnReadDone(uint64_t gen, size_t index, int arena, const IoStatus& st);
  void OnWriteDone(int slot, const IoStatus& st);
  bool WaitFor(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready,
               uint64_t* wait_ns);
  void NoteError(const IoStatus& st);
  void Kick();  // under mu_
  // Checks a plan against the config (empty string if it can run).
  std::string PlanProblem(const StepPlan& plan) const;
  // Per site, the plan indices it consumes, in order.
  using Schedule = std::map<int, std::vector<size_t>>;
  static Schedule SitesOf(const std::vector<int>& sites, size_t n);

  DeviceOps* ops_;
  ChunkIo* io_;
  const PagerConfig config_;
  CommitFn commit_;
  DeviceOps::Stream h2d_ = nullptr;
  DeviceOps::Stream d2h_ = nullptr;
  std::vector<void*> arena_;
  std::vector<RingSlot> ring_;
  std::vector<WriteSlot> wslots_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<int> free_arena_;
  uint64_t gen_ = 0;  // step number; reads of an older step are dropped when they complete
  StepPlan plan_;
  int64_t plan_id_ = -1;
  std::map<int64_t, StepPlan> plans_;  // registered plans
  Schedule take_sites_, put_sites_;    // this step's per-site schedules
  std::map<int, size_t> take_cursor_, put_cursor_;  // per site: calls made this step
  size_t low_take_ = 0;  // first plan read not yet taken
  std::set<std::pair<int, uint64_t>> step_puts_;  // (file, offset) put this step
  bool active_ = false;  // Begin succeeded, Commit not yet called
  bool ended_ = false;   // Commit called for step gen_
  bool failed_ = false;  // step gen_ saw an error: it never commits
  bool closing_ = false;     // destructor: no new reads or copies
  bool committing_ = false;  // the commit callback runs (mu_ released)
  bool kick_ = false;        // state changed: the pager thread looks again
  std::vector<Read> reads_;
  size_t next_read_ = 0;   // next plan read to start
  size_t next_h2d_ = 0;    // next plan read to copy to the ring
  size_t take_ = 0;        // takes made this step (all sites)
  size_t put_ = 0;         // puts made this step (all sites)
  int reads_in_flight_ = 0;  // disk reads of any step
  int arena_pending_ = 0;    // arena slots held by H2D copies not yet run
  int writes_pending_ = 0;   // puts of any step whose write is not done
  IoStatus pending_error_;   // first write/commit error, for the next Begin
  Crcs crcs_;       // committed checksums (and those set by SetChecksum)
  Crcs step_crcs_;  // this step's writes, committed with it
  uint64_t committed_ = 0;
  PagerStats stats_;
  std::thread thread_;
};

}  // namespace jaxoff::aio
