#pragma once
// The pager: one paging transaction per step, on DeviceOps and a ChunkIo, the same on the CPU
// (HostDeviceOps: host memory as the device) and on a GPU, where no call of a handler waits for
// the GPU. The four paging targets (ffi/src/pager_registry.h) are its calls.
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
//   commit: once the step's writes are done, the pager thread makes the files they went to
//          durable (ChunkIo::Sync), then calls the commit callback with the new version.
//
// Versions. The store alternates between two slots per chunk: a step that reads version v
// writes version v + 1 elsewhere, so a step that fails (a crash, a write error, a failed
// commit) leaves version v whole and readable. The pager holds version() (the committed one,
// which the next step reads) and the checksums of its chunks; a registered plan has two
// variants, and a step reading version v runs variant v % 2. A commit advances version() and
// merges the step's checksums; a step that does not commit changes neither. A step whose plan
// writes nothing (an evaluation) only reads: it ends, once its version check passed, without
// a new version (no sync, no commit callback; PagerStats::read_only_steps counts it).
//
// Version check. Begin may be given the version the caller's optimizer state describes, as
// an int32 in device memory written by the caller's stream. The pager compares it with
// version() without waiting for the device (a D2D of the word onto the pager's own word on
// the caller's stream, an event, a D2H on the d2h stream, a host function): a state saved or
// restored without its pages (stale) fails its step with ESTALE, and a step never commits
// before its check ran.
//
// Host memory (DeviceOps::host_memory(), HostDeviceOps on XLA:CPU): device memory is host
// memory and every call completes inline, so the copies between them are skipped: a chunk
// whose disk read is done is "on the device" in its arena slot, a take copies it from there
// into the caller's buffer and gives the arena slot back at once (no ring is allocated, and
// read-ahead is bounded by the arena alone); a write slot's device buffer is its pinned one
// (no D2H). A take and a put cost one memcpy each, as a CPU-only path would.
//
// Rules kept (tested against SimDeviceOps in ffi/tests/test_gpu_pager.cc):
// - A take never reads a ring slot before its H2D copy: the D2D waits the slot's `ready`.
// - A slot is reused only after its copy out: the next H2D into a ring slot waits its last
//   take's `free`; an arena slot is refilled only once its H2D ran (host function) or, with
//   host memory, once its take copied it out; a write slot only once its disk write is done.
// - Backpressure: read-ahead is bounded by the arena, H2D copies by the ring (chunk i uses
//   ring slot i % ring_slots and waits until take i - ring_slots is enqueued), puts by the
//   write slots. Everything is assigned in plan order, so a take waits (on the host) only for
//   host I/O and for device work already enqueued, never for work not yet enqueued (rule I2):
//   no deadlock, whatever the device's lag.
// - Read and checksum errors are returned by the take that needs the chunk; write, sync,
//   commit and (on a device) version-check errors by the next Begin or Settle (each once). A
//   step commits (sync, then the commit callback, on the pager thread) only after every
//   planned put's write is done, every planned take happened and its version check passed.
// - Begin after an aborted step (a failed take, an error, a missing Commit) resets the
//   cursors and drops the old step's read-ahead; the old step never commits.
// No handler-side call blocks on the device; only the destructor synchronises the streams.
//
// Mutation testing: built with -DJAXOFF_PAGER_MUTATION=k (ffi/CMakeLists.txt, tests only),
// gpu_pager.cc carries known bug k, and the pager tests must fail against it.

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
  // Makes the bytes written (and completed) so far to these files durable; blocks. Called by
  // the pager thread before a step commits.
  virtual IoStatus Sync(const std::vector<int>& files) = 0;
  // How messages name file `file` (its path where the storage knows it).
  virtual std::string Name(int file) const { return "file " + std::to_string(file); }
};

// ChunkIo on the I/O engine: file i of `files`, O_DIRECT into the caller's (pinned) memory,
// crc32c taken by the engine's workers.
class EngineChunkIo final : public ChunkIo {
 public:
  EngineChunkIo(std::shared_ptr<Engine> engine, std::vector<std::shared_ptr<File>> files);
  void Read(const ChunkRef& ref, void* dst, Done done) override;
  void Write(const ChunkRef& ref, const void* src, Done done) override;
  IoStatus Sync(const std::vector<int>& files) override;  // File::Sync of each
  std::string Name(int file) const override;               // its path

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
  uint64_t read_only_steps = 0;  // steps with no writes: ended without a new version
  uint64_t syncs = 0;           // ChunkIo::Sync calls (one per committing step with writes)
  uint64_t version_checks = 0;  // version checks that ran
  uint64_t stale_steps = 0;     // steps refused because their optimizer state was stale
  int max_reads_in_flight = 0;
  int max_h2d_ahead = 0;       // most H2D copies enqueued and not yet taken
  int reads_in_flight = 0;     // now: disk reads started and not done
  int writes_in_flight = 0;    // now: puts whose disk write is not done
};

class GpuPager {
 public:
  using Crcs = std::map<std::pair<int, uint64_t>, uint32_t>;  // (file, offset) -> crc32c
  // Runs on the pager thread once a step's writes are all done and durable: `new_version` is
  // version() + 1, `step_crcs` the checksums of the step's writes. Its error fails the step
  // (version() and the checksums stay) and is returned by the next Begin or Settle.
  using CommitFn = std::function<IoStatus(uint64_t new_version, const Crcs& step_crcs)>;

  // `version`: the store version the pager starts at (the committed one, which the first step
  // reads).
  GpuPager(DeviceOps* ops, ChunkIo* io, PagerConfig config, CommitFn commit = nullptr,
           uint64_t version = 0);
  // Waits for I/O in flight, completes the commit of a step whose Commit() was called (once
  // its writes are done), and synchronises its own streams.
  ~GpuPager();
  GpuPager(const GpuPager&) = delete;
  GpuPager& operator=(const GpuPager&) = delete;

  // Keeps a plan under `id` (a page_begin call names it by this id; registering an id again
  // replaces it from the next Begin): `even` for steps that read an even version, `odd` for
  // steps that read an odd one. Throws std::invalid_argument for a plan the pager cannot run
  // (a chunk larger than slot_bytes, sites not one per chunk).
  void RegisterPlan(int64_t id, StepPlan even, StepPlan odd);
  void RegisterPlan(int64_t id, StepPlan plan);  // the same plan for both
  bool HasPlan(int64_t id) const;

  // Starts a step of registered plan `plan_id` (EINVAL if unknown): waits on the host for the
  // previous step's writes and commit, returns their first error if any (the plan is not
  // started; the next Begin is), else resets the cursors and starts reading ahead, with the
  // plan's variant for version() % 2.
  //
  // `version_dev`, if given: an int32 in device memory, readable in `stream`'s order, holding
  // the store version the caller's state describes (the buffer may be reused by the caller
  // once Begin returns). If it is not version(), the step fails with ESTALE and never
  // commits: with host-memory ops Begin returns that error itself (the step is not started);
  // on a device, the next Begin or Settle returns it.
  IoStatus Begin(int64_t plan_id, DeviceOps::Stream stream = nullptr,
                 const void* version_dev = nullptr);
  // The same for `plan` itself, whatever the version (tests), with no version check.
  IoStatus Begin(StepPlan plan);
  // The plan id of the step begun last (-1 for a plan passed by value, or none yet).
  int64_t plan_id() const;

  // Site `site`'s next planned read into device memory `dst` (`bytes` must match the plan),
  // ordered on `stream` (XLA's): enqueues a wait, a D2D copy and an event record, and returns.
  // It waits on the host only for its chunk's disk read. A take more than `ring_slots` reads
  // (with host memory: `arena_slots`) ahead of the first read not yet taken fails at once
  // (the calls do not follow the plan's order, and waiting would deadlock).
  IoStatus Take(int site, DeviceOps::Stream stream, void* dst, size_t bytes);
  IoStatus Take(DeviceOps::Stream stream, void* dst, size_t bytes) {
    return Take(0, stream, dst, bytes);
  }
  // True when site `site`'s next Take would not wait on the host for a disk read: its chunk
  // is on the device (or, with host memory, in its arena slot), its read failed, or the call
  // would fail at once. (The CPU handler takes inline when it is, else on a waiting thread.)
  bool TakeReady(int site) const;
  // Site `site`'s next planned write from device memory `src`, ordered on `stream`.
  IoStatus Put(int site, DeviceOps::Stream stream, const void* src, size_t bytes);
  IoStatus Put(DeviceOps::Stream stream, const void* src, size_t bytes) {
    return Put(0, stream, src, bytes);
  }
  // Ends the step and returns at once; the step commits once its writes are done.
  IoStatus Commit();
  // Waits (at most wait_limit) until the last ended step's writes are done and its commit
  // settled, and returns the first pending error (write, sync, commit, stale version), once.
  IoStatus Settle();
  // Replaces version() and the whole checksum table (the store was written from outside,
  // e.g. restored from a checkpoint). Only when idle: no step begun and not ended, no write
  // pending, no commit running; else EBUSY.
  IoStatus Reset(uint64_t version, Crcs crcs);

  // Calls site `site` has made in the current step (reset by Begin).
  size_t TakeCursor(int site) const;
  size_t PutCursor(int site) const;

  // Expected crc32c of a chunk (verified after its read); a committed write sets it too.
  void SetChecksum(const ChunkRef& ref, uint32_t crc);
  bool Checksum(const ChunkRef& ref, uint32_t* crc) const;
  Crcs Checksums() const;  // every checksum held
  // The committed store version: the one the next step reads.
  uint64_t version() const;
  PagerStats Stats() const;

 private:
  enum class ReadState { kPlanned, kReading, kRead, kFailed, kCopying, kOnDevice, kTaken };
  struct Read {
    ReadState state = ReadState::kPlanned;
    int arena = -1;
    IoStatus status;
  };
  struct WriteSlot {
    void* dev = nullptr;
    void* host = nullptr;  // == dev with host memory
    DeviceOps::Event ready = nullptr;
    bool busy = false;  // claimed by a put whose disk write is not done
  };
  // A put's write, from its put until its disk write is done.
  enum class WriteState { kCopying, kCopied, kWriting };
  struct PendingWrite {
    int slot = 0;
    ChunkRef ref;
    uint64_t step = 0;
    WriteState state = WriteState::kCopying;
  };
  struct RingSlot {
    void* dev = nullptr;
    DeviceOps::Event ready = nullptr;
    DeviceOps::Event free = nullptr;
  };

  void Loop();
  void Release();  // the streams, events and buffers made (the destructor's, or a failed ctor's)
  // Under mu_: starts disk reads and H2D copies that can go, and writes whose D2H is done.
  void Pump(std::unique_lock<std::mutex>& lock);
  void MaybeCommit(std::unique_lock<std::mutex>& lock);
  void OnReadDone(uint64_t gen, size_t index, int arena, const IoStatus& st);
  void OnWriteDone(uint64_t id, const IoStatus& st);
  void OnVersionChecked(uint64_t gen, uint64_t expected, int32_t seen);
  IoStatus Start(StepPlan* given, int64_t plan_id, DeviceOps::Stream stream,
                 const void* version_dev);
  // Under mu_: the previous step's writes are done, its version check ran and its commit is
  // settled (committed, failed, or never asked for).
  bool Settled() const;
  bool WaitFor(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready,
               uint64_t* wait_ns);
  void NoteError(const IoStatus& st);
  void Kick();  // under mu_
  // How far ahead of the first untaken read a take may be: the ring (device) or the arena
  // (host memory), whichever holds the chunks between their read and their take.
  size_t AheadBound() const;
  // Under mu_: the plan read site `site`'s next take consumes, or the error a take of it
  // fails with at once (outside a step, past the site's reads, too far ahead, a chunk this
  // step wrote). `bytes` is checked against the plan unless it is SIZE_MAX.
  IoStatus NextTake(int site, size_t bytes, size_t* index) const;
  // Checks a plan against the config (empty string if it can run).
  std::string PlanProblem(const StepPlan& plan) const;
  // Per site, the plan indices it consumes, in order.
  using Schedule = std::map<int, std::vector<size_t>>;
  static Schedule SitesOf(const std::vector<int>& sites, size_t n);

  DeviceOps* ops_;
  ChunkIo* io_;
  const PagerConfig config_;
  CommitFn commit_;
  const bool host_;  // ops_->host_memory()
  DeviceOps::Stream h2d_ = nullptr;
  DeviceOps::Stream d2h_ = nullptr;
  std::vector<void*> arena_;
  std::vector<RingSlot> ring_;  // empty with host memory
  std::vector<WriteSlot> wslots_;
  // The version check's words: the caller's int32 copied on its stream into version_dev_,
  // then to the pinned version_host_ on the d2h stream (one check runs at a time).
  void* version_dev_ = nullptr;
  void* version_host_ = nullptr;
  DeviceOps::Event version_ready_ = nullptr;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<int> free_arena_;
  uint64_t gen_ = 0;  // step number; reads of an older step are dropped when they complete
  StepPlan plan_;
  int64_t plan_id_ = -1;
  std::map<int64_t, std::pair<StepPlan, StepPlan>> plans_;  // registered: (even, odd)
  Schedule take_sites_, put_sites_;    // this step's per-site schedules
  std::map<int, size_t> take_cursor_, put_cursor_;  // per site: calls made this step
  size_t low_take_ = 0;  // first plan read not yet taken
  std::set<std::pair<int, uint64_t>> step_puts_;  // (file, offset) put this step
  bool active_ = false;  // Begin succeeded, Commit not yet called
  bool ended_ = false;   // Commit called for step gen_
  bool failed_ = false;  // step gen_ saw an error: it never commits
  bool closing_ = false;     // destructor: no new reads or copies
  bool committing_ = false;  // the sync and commit callback run (mu_ released)
  bool kick_ = false;        // state changed: the pager thread looks again
  std::vector<Read> reads_;
  size_t next_read_ = 0;   // next plan read to start
  size_t next_h2d_ = 0;    // next plan read to copy to the ring
  size_t take_ = 0;        // takes made this step (all sites)
  size_t put_ = 0;         // puts made this step (all sites)
  int reads_in_flight_ = 0;  // disk reads of any step
  int arena_pending_ = 0;    // arena slots held by H2D copies not yet run
  std::map<uint64_t, PendingWrite> writes_;  // by put id: puts whose write is not done
  uint64_t next_write_id_ = 0;
  int checks_pending_ = 0;   // version checks enqueued, not yet run
  IoStatus pending_error_;   // first write/sync/commit/version error, for Begin or Settle
  Crcs crcs_;       // checksums of version_ (and those set by SetChecksum)
  Crcs step_crcs_;  // this step's writes, committed with it
  uint64_t version_ = 0;        // committed store version
  uint64_t committed_gen_ = 0;  // the last step (gen_) that committed
  PagerStats stats_;
  std::thread thread_;
};

}  // namespace jaxoff::aio
