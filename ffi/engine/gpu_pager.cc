#include "gpu_pager.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

// Mutation testing (ffi/CMakeLists.txt, tests only): built with -DJAXOFF_PAGER_MUTATION=k,
// this file carries known bug k (listed where Mutant(k) is used), and the pager tests must
// fail against it. Every other build has 0: Mutant(k) is false and compiles away.
#ifndef JAXOFF_PAGER_MUTATION
#define JAXOFF_PAGER_MUTATION 0
#endif

namespace jaxoff::aio {

namespace {

using Clock = std::chrono::steady_clock;

constexpr bool Mutant(int k) { return JAXOFF_PAGER_MUTATION == k; }

IoStatus Failed(const std::string& message, int err = EIO) {
  IoStatus st;
  st.err = err;
  st.message = message;
  return st;
}

std::string Where(const ChunkIo& io, const ChunkRef& r) {
  return io.Name(r.file) + " at offset " + std::to_string(r.offset) + " (" +
         std::to_string(r.bytes) + " bytes)";
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

std::string Join(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

// JAXOFF_IO_FAULT="read:N" (tests only, as jaxoff/_faults.py documents): the N-th chunk read
// of this process completes with EIO instead of reading, reported as a failing device reports
// it, so that the error path of a read inside a step is tested end to end. Parsed once.
long InjectedReadFault() {
  static const long n = [] {
    const char* spec = std::getenv("JAXOFF_IO_FAULT");
    if (spec == nullptr || std::strncmp(spec, "read:", 5) != 0) return 0L;
    return std::atol(spec + 5);
  }();
  return n;
}

std::atomic<long> g_reads{0};

}  // namespace

// ---- EngineChunkIo ---------------------------------------------------------------------

EngineChunkIo::EngineChunkIo(std::shared_ptr<Engine> engine,
                             std::vector<std::shared_ptr<File>> files)
    : engine_(std::move(engine)), files_(std::move(files)) {}

const std::shared_ptr<File>& EngineChunkIo::At(int file) const {
  if (file < 0 || static_cast<size_t>(file) >= files_.size()) {
    throw std::out_of_range("EngineChunkIo: file " + std::to_string(file) + " of " +
                            std::to_string(files_.size()));
  }
  return files_[file];
}

void EngineChunkIo::Read(const ChunkRef& ref, void* dst, Done done) {
  if (ref.file < 0 || static_cast<size_t>(ref.file) >= files_.size()) {
    done(Failed("read of " + Name(ref.file) + ": the table has " +
                std::to_string(files_.size()) + " files", EINVAL));
    return;
  }
  if (const long n = InjectedReadFault(); n > 0 && ++g_reads == n) {
    done(Failed(FormatIoMessage("read", At(ref.file)->path(), static_cast<int64_t>(ref.offset),
                                static_cast<int64_t>(ref.bytes), EIO, __FILE__, __LINE__)));
    return;
  }
  IoOptions opt;
  opt.crc32c = true;
  engine_->Read(At(ref.file), ref.offset, dst, ref.bytes, std::move(done), opt);
}

void EngineChunkIo::Write(const ChunkRef& ref, const void* src, Done done) {
  if (ref.file < 0 || static_cast<size_t>(ref.file) >= files_.size()) {
    done(Failed("write of " + Name(ref.file) + ": the table has " +
                std::to_string(files_.size()) + " files", EINVAL));
    return;
  }
  IoOptions opt;
  opt.crc32c = true;
  engine_->Write(At(ref.file), ref.offset, src, ref.bytes, std::move(done), opt);
}

std::string EngineChunkIo::Name(int file) const {
  if (file < 0 || static_cast<size_t>(file) >= files_.size()) return ChunkIo::Name(file);
  return files_[file]->path();
}

IoStatus EngineChunkIo::Sync(const std::vector<int>& files) {
  if (files.empty()) return {};
  std::vector<const File*> which;
  try {
    for (int f : files) which.push_back(At(f).get());
    SyncFiles(which);
  } catch (const IoError& e) {
    return Failed(e.what(), e.err());
  } catch (const std::exception& e) {
    return Failed(std::string("sync of the page files: ") + e.what());
  }
  return {};
}

// ---- GpuPager --------------------------------------------------------------------------

void PagerConfig::Validate() const {
  auto fail = [](const std::string& m) { throw std::invalid_argument("PagerConfig: " + m); };
  if (slot_bytes == 0) fail("slot_bytes must be positive (the largest chunk)");
  if (arena_slots < 1) fail("arena_slots=" + std::to_string(arena_slots) + " must be >= 1");
  if (ring_slots < 1) fail("ring_slots=" + std::to_string(ring_slots) + " must be >= 1");
  if (write_slots < 1) fail("write_slots=" + std::to_string(write_slots) + " must be >= 1");
}

GpuPager::GpuPager(DeviceOps* ops, ChunkIo* io, PagerConfig config, CommitFn commit,
                   uint64_t version)
    : ops_(ops),
      io_(io),
      config_(config),
      commit_(std::move(commit)),
      host_(ops->host_memory()),
      version_(version) {
  config_.Validate();
  try {
    h2d_ = ops_->CreateStream();
    d2h_ = ops_->CreateStream();
    for (int i = 0; i < config_.arena_slots; ++i) {
      arena_.push_back(ops_->AllocPinned(config_.slot_bytes));
      free_arena_.push_back(i);
    }
    // With host memory a chunk is taken straight from its arena slot: no ring.
    if (!host_) ring_.resize(config_.ring_slots);
    for (RingSlot& r : ring_) {
      r.dev = ops_->AllocDevice(config_.slot_bytes);
      r.ready = ops_->CreateEvent();
      r.free = ops_->CreateEvent();
    }
    wslots_.resize(config_.write_slots);
    for (WriteSlot& w : wslots_) {
      if (host_) {
        // The device buffer a put copies into is already host memory the disk write can use.
        w.dev = w.host = ops_->AllocPinned(config_.slot_bytes);
      } else {
        w.dev = ops_->AllocDevice(config_.slot_bytes);
        w.host = ops_->AllocPinned(config_.slot_bytes);
      }
      w.ready = ops_->CreateEvent();
    }
    version_dev_ = ops_->AllocDevice(sizeof(int32_t));
    version_host_ = ops_->AllocPinned(sizeof(int32_t));
    version_ready_ = ops_->CreateEvent();
  } catch (const std::exception& e) {
    Release();  // what was made before the failure
    throw DeviceError(std::string("the pager's buffers (") +
                      std::to_string(config_.arena_slots) + " read slots, " +
                      std::to_string(host_ ? 0 : config_.ring_slots) + " device slots and " +
                      std::to_string(config_.write_slots) + " write slots of " +
                      std::to_string(config_.slot_bytes >> 10) + " KiB) cannot be made: " +
                      e.what() + "; lower the read-ahead (fewer slots) or the chunk size");
  }
  thread_ = std::thread([this] { Loop(); });
}

GpuPager::~GpuPager() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    closing_ = true;
    cv_.wait(lock, [&] { return reads_in_flight_ == 0; });
  }
  // The caller has synchronised its own streams; ours may still wait on their events. Once
  // they ran, every put's D2H and every version check has run.
  ops_->SynchronizeStream(h2d_);
  ops_->SynchronizeStream(d2h_);
  {
    // A step whose Commit() was called commits here once its writes are done: a pager
    // closed right after a step must not drop the step.
    std::unique_lock<std::mutex> lock(mu_);
    Kick();
    cv_.wait(lock, [&] { return Settled(); });
    stop_ = true;
    Kick();
  }
  thread_.join();
  ops_->SynchronizeStream(h2d_);
  ops_->SynchronizeStream(d2h_);
  Release();
}

void GpuPager::Release() {
  if (h2d_ != nullptr) ops_->DestroyStream(h2d_);
  if (d2h_ != nullptr) ops_->DestroyStream(d2h_);
  for (void* p : arena_) ops_->FreePinned(p);
  for (RingSlot& r : ring_) {
    ops_->FreeDevice(r.dev);
    if (r.ready != nullptr) ops_->DestroyEvent(r.ready);
    if (r.free != nullptr) ops_->DestroyEvent(r.free);
  }
  for (WriteSlot& w : wslots_) {
    if (w.dev != w.host) ops_->FreeDevice(w.dev);
    ops_->FreePinned(w.host);
    if (w.ready != nullptr) ops_->DestroyEvent(w.ready);
  }
  ops_->FreeDevice(version_dev_);
  ops_->FreePinned(version_host_);
  if (version_ready_ != nullptr) ops_->DestroyEvent(version_ready_);
}

void GpuPager::Kick() {
  kick_ = true;
  cv_.notify_all();
}

void GpuPager::NoteError(const IoStatus& st) {
  if (pending_error_.ok()) pending_error_ = st;
}

bool GpuPager::Settled() const {
  return writes_.empty() && checks_pending_ == 0 && !committing_ &&
         (!ended_ || failed_ || committed_gen_ == gen_);
}

size_t GpuPager::AheadBound() const { return host_ ? arena_.size() : ring_.size(); }

bool GpuPager::WaitFor(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready,
                       uint64_t* wait_ns) {
  if (ready()) return true;
  const auto t0 = Clock::now();
  const bool ok = cv_.wait_until(lock, t0 + config_.wait_limit, ready);
  *wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  return ok;
}

void GpuPager::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    kick_ = false;
    Pump(lock);
    MaybeCommit(lock);
    cv_.wait(lock, [&] { return stop_ || kick_; });
  }
}

void GpuPager::Pump(std::unique_lock<std::mutex>& lock) {
  const uint64_t gen = gen_;
  // Disk reads, in plan order, as far as the arena allows. A step that failed (a write
  // error, a stale version on a device) still runs to its end: its takes are served.
  std::vector<std::pair<size_t, int>> to_read;
  while (!closing_ && (active_ || ended_) && next_read_ < reads_.size() &&
         !free_arena_.empty()) {
    const int a = free_arena_.back();
    free_arena_.pop_back();
    Read& r = reads_[next_read_];
    r.state = ReadState::kReading;
    r.arena = a;
    to_read.emplace_back(next_read_++, a);
    ++reads_in_flight_;
    stats_.max_reads_in_flight = std::max(stats_.max_reads_in_flight, reads_in_flight_);
  }
  // H2D copies, in plan order: chunk i goes to ring slot i % ring once take i - ring is
  // enqueued (its D2D out of that slot is ordered before our copy by the slot's `free`).
  // With call sites, takes may come out of plan order (within the ring): the slot's previous
  // chunk, i - ring, must be taken, not just "ring takes made". (No ring with host memory.)
  std::vector<std::pair<size_t, int>> to_copy;
  const size_t ring = ring_.size();
  while (!host_ && !closing_ && next_h2d_ < reads_.size() &&
         (next_h2d_ < ring || reads_[next_h2d_ - ring].state == ReadState::kTaken) &&
         reads_[next_h2d_].state == ReadState::kRead) {
    Read& r = reads_[next_h2d_];
    r.state = ReadState::kCopying;
    to_copy.emplace_back(next_h2d_++, r.arena);
    ++arena_pending_;
  }
  // Disk writes of puts whose D2H copy ran.
  std::vector<std::pair<uint64_t, PendingWrite>> to_write;
  for (auto& [id, w] : writes_) {
    if (w.state == WriteState::kCopied) {
      w.state = WriteState::kWriting;
      to_write.emplace_back(id, w);
    }
  }
  if (to_read.empty() && to_copy.empty() && to_write.empty()) return;
  std::vector<ChunkRef> read_refs, copy_refs;
  for (auto& [i, a] : to_read) read_refs.push_back(plan_.reads[i]);
  for (auto& [i, a] : to_copy) copy_refs.push_back(plan_.reads[i]);

  // No DeviceOps or ChunkIo call under mu_: their callbacks and host functions take it.
  lock.unlock();
  IoStatus device_error;
  for (size_t k = 0; k < to_copy.size() && device_error.ok(); ++k) {
    const auto [i, a] = to_copy[k];
    const RingSlot& s = ring_[i % ring];
    try {
      // Mutant 1: the H2D overwrites the ring slot while its last take's D2D may still read it.
      if (!Mutant(1)) ops_->StreamWaitEvent(h2d_, s.free);
      ops_->CopyAsync(s.dev, arena_[a], copy_refs[k].bytes, CopyKind::kHostToDevice, h2d_);
      ops_->RecordEvent(s.ready, h2d_);
      if (Mutant(4)) {
        // Mutant 4: the arena slot is refilled while the H2D copy out of it may not have run.
        std::lock_guard<std::mutex> lk(mu_);
        free_arena_.push_back(a);
        Kick();
      }
      ops_->LaunchHostFunc(h2d_, [this, a = a] {
        std::lock_guard<std::mutex> lk(mu_);
        if (!Mutant(4)) free_arena_.push_back(a);
        --arena_pending_;
        Kick();
      });
    } catch (const std::exception& e) {
      device_error = Failed(std::string("H2D copy of ") + Where(*io_, copy_refs[k]) + ": " + e.what());
    }
  }
  for (size_t k = 0; k < to_read.size(); ++k) {
    const auto [i, a] = to_read[k];
    io_->Read(read_refs[k], arena_[a],
              [this, gen, i = i, a = a](const IoStatus& st) { OnReadDone(gen, i, a, st); });
  }
  for (const auto& [id, w] : to_write) {
    io_->Write(w.ref, wslots_[w.slot].host,
               [this, id = id](const IoStatus& st) { OnWriteDone(id, st); });
  }
  lock.lock();
  for (auto& r : copy_refs) stats_.h2d_bytes += r.bytes;
  if (gen == gen_) {
    for (auto& [i, a] : to_copy) {
      if (device_error.ok()) {
        reads_[i].state = ReadState::kOnDevice;
      } else {
        reads_[i].state = ReadState::kFailed;
        reads_[i].status = device_error;
      }
    }
    if (!to_copy.empty()) {
      stats_.max_h2d_ahead =
          std::max<int>(stats_.max_h2d_ahead, static_cast<int>(next_h2d_ - low_take_));
    }
  }
  Kick();
}

void GpuPager::OnReadDone(uint64_t gen, size_t index, int arena, const IoStatus& st) {
  std::lock_guard<std::mutex> lock(mu_);
  --reads_in_flight_;
  ++stats_.reads_done;
  Kick();
  if (gen != gen_ || closing_) {  // the step was abandoned: the bytes are not needed
    free_arena_.push_back(arena);
    return;
  }
  Read& r = reads_[index];
  const ChunkRef& ref = plan_.reads[index];
  if (!st.ok()) {
    r.status = st;
  } else {
    auto it = crcs_.find({ref.file, ref.offset});
    if (it != crcs_.end() && it->second != st.crc32c) {
      r.status = Failed("checksum mismatch in " + Where(*io_, ref) + ": expected crc32c " +
                        Hex(it->second) + ", read " + Hex(st.crc32c) +
                        ". The page file is corrupt or was written by a crashed run; restore "
                        "the store from the last checkpoint (resume), or delete it to start over",
                        EBADMSG);
    }
  }
  if (r.status.ok()) {
    // With host memory the arena slot is the chunk's place "on the device".
    r.state = host_ ? ReadState::kOnDevice : ReadState::kRead;
  } else {
    r.state = ReadState::kFailed;
    r.arena = -1;
    free_arena_.push_back(arena);
  }
}

void GpuPager::OnWriteDone(uint64_t id, const IoStatus& st) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = writes_.find(id);
  const PendingWrite w = it->second;
  writes_.erase(it);
  ++stats_.writes_done;
  if (!st.ok()) {
    NoteError(st);
    if (w.step == gen_) failed_ = true;
  } else if (w.step == gen_) {
    step_crcs_[{w.ref.file, w.ref.offset}] = st.crc32c;
  }
  if (!Mutant(3)) wslots_[w.slot].busy = false;
  Kick();
}

void GpuPager::OnVersionChecked(uint64_t gen, uint64_t expected, int32_t seen) {
  std::lock_guard<std::mutex> lock(mu_);
  --checks_pending_;
  ++stats_.version_checks;
  if (static_cast<int64_t>(seen) != static_cast<int64_t>(expected)) {
    ++stats_.stale_steps;
    if (gen == gen_) failed_ = true;
    NoteError(Failed("the optimizer state describes version " + std::to_string(seen) +
                     " of its page store, but the store holds version " +
                     std::to_string(expected) +
                     ": the state is stale (saved or restored without its page store "
                     "contents); restore it together with its pages, or start again from a "
                     "fresh init",
                     ESTALE));
  }
  Kick();
}

void GpuPager::MaybeCommit(std::unique_lock<std::mutex>& lock) {
  if (!ended_ || failed_ || committing_ || committed_gen_ == gen_) return;
  // Not before the step's version check ran (it may refuse the step). Mutant 9: it does.
  if (checks_pending_ > 0 && !Mutant(9)) return;
  // Mutant 6: the step commits while its writes may still be running.
  if (!Mutant(6)) {
    for (const auto& [id, w] : writes_) {
      if (w.step == gen_) return;  // a write of this step runs
    }
  }
  if (plan_.writes.empty()) {
    // A step that only reads (an evaluation) ends without a new version: nothing to make
    // durable, nothing to commit.
    committed_gen_ = gen_;
    ++stats_.read_only_steps;
    Kick();
    return;
  }
  committing_ = true;
  const uint64_t gen = gen_;
  const uint64_t next = version_ + 1;
  const Crcs crcs = step_crcs_;
  std::vector<int> files;
  for (const ChunkRef& r : plan_.writes) files.push_back(r.file);
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  lock.unlock();
  IoStatus st;
  bool synced = false;
  // Mutant 5: the step commits before its writes are durable.
  if (!files.empty() && !Mutant(5)) {
    synced = true;
    try {
      st = io_->Sync(files);
    } catch (const std::exception& e) {
      st = Failed(e.what());
    }
    if (!st.ok()) {
      st.message = "making the step's writes durable (sync of page files " + Join(files) +
                   ") before committing version " + std::to_string(next) + " failed: " +
                   st.message + "; the step is not committed (the store stays at version " +
                   std::to_string(next - 1) + ")";
    }
  }
  if (st.ok() && commit_) {
    try {
      st = commit_(next, crcs);
    } catch (const std::exception& e) {
      st = Failed("committing version " + std::to_string(next) + ": " + e.what());
    }
  }
  lock.lock();
  committing_ = false;
  if (synced) ++stats_.syncs;
  // Mutant 8: a failed commit still moves the store to the new version and its checksums.
  if (st.ok() || Mutant(8)) {
    version_ = next;
    for (auto& [k, v] : crcs) crcs_[k] = v;
  }
  if (st.ok()) {
    committed_gen_ = gen;
    ++stats_.commits;
  } else {
    NoteError(st);
    failed_ = true;
  }
  Kick();
}

std::string GpuPager::PlanProblem(const StepPlan& plan) const {
  for (const ChunkRef& r : plan.reads) {
    if (r.bytes > config_.slot_bytes) {
      return "plan reads " + Where(*io_, r) + ", more than slot_bytes=" +
             std::to_string(config_.slot_bytes) + ": raise the pager's slot size";
    }
  }
  for (const ChunkRef& r : plan.writes) {
    if (r.bytes > config_.slot_bytes) {
      return "plan writes " + Where(*io_, r) + ", more than slot_bytes=" +
             std::to_string(config_.slot_bytes) + ": raise the pager's slot size";
    }
  }
  if (!plan.read_sites.empty() && plan.read_sites.size() != plan.reads.size()) {
    return "plan has " + std::to_string(plan.reads.size()) + " reads but " +
           std::to_string(plan.read_sites.size()) + " read sites (one per read, or none)";
  }
  if (!plan.write_sites.empty() && plan.write_sites.size() != plan.writes.size()) {
    return "plan has " + std::to_string(plan.writes.size()) + " writes but " +
           std::to_string(plan.write_sites.size()) + " write sites (one per write, or none)";
  }
  return "";
}

GpuPager::Schedule GpuPager::SitesOf(const std::vector<int>& sites, size_t n) {
  Schedule out;
  for (size_t i = 0; i < n; ++i) out[sites.empty() ? 0 : sites[i]].push_back(i);
  return out;
}

void GpuPager::RegisterPlan(int64_t id, StepPlan even, StepPlan odd) {
  const std::string prefix = "plan " + std::to_string(id);
  if (const std::string p = PlanProblem(even); !p.empty()) {
    throw std::invalid_argument(prefix + " (variant for even versions): " + p);
  }
  if (const std::string p = PlanProblem(odd); !p.empty()) {
    throw std::invalid_argument(prefix + " (variant for odd versions): " + p);
  }
  std::lock_guard<std::mutex> lock(mu_);
  plans_[id] = {std::move(even), std::move(odd)};
}

void GpuPager::RegisterPlan(int64_t id, StepPlan plan) {
  if (const std::string p = PlanProblem(plan); !p.empty()) {
    throw std::invalid_argument("plan " + std::to_string(id) + ": " + p);
  }
  std::lock_guard<std::mutex> lock(mu_);
  plans_[id] = {plan, plan};
}

bool GpuPager::HasPlan(int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.count(id) != 0;
}

int64_t GpuPager::plan_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plan_id_;
}

IoStatus GpuPager::Begin(int64_t plan_id, DeviceOps::Stream stream, const void* version_dev) {
  return Start(nullptr, plan_id, stream, version_dev);
}

IoStatus GpuPager::Begin(StepPlan plan) { return Start(&plan, -1, nullptr, nullptr); }

IoStatus GpuPager::Start(StepPlan* given, int64_t plan_id, DeviceOps::Stream stream,
                         const void* version_dev) {
  if (given != nullptr) {
    if (const std::string problem = PlanProblem(*given); !problem.empty()) {
      return Failed(problem, EINVAL);
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (given == nullptr && plans_.count(plan_id) == 0) {
    return Failed("page_begin names plan " + std::to_string(plan_id) +
                  ", which is not registered with this pager (register the step's plan "
                  "before running it)", EINVAL);
  }
  if (active_) failed_ = true;  // the previous step never reached Commit: it was aborted
  // The previous step's writes (of any step) are on disk and its commit is settled.
  if (!WaitFor(lock, [&] { return Settled(); }, &stats_.begin_wait_ns)) {
    return Failed("Begin waited " + std::to_string(config_.wait_limit.count()) +
                  " ms for the previous step's writes and commit; the disk is stuck",
                  ETIMEDOUT);
  }
  active_ = false;
  ended_ = false;
  if (!pending_error_.ok()) {
    IoStatus st = pending_error_;
    pending_error_ = IoStatus{};
    return st;
  }
  // Chunks the old step read but never copied (with host memory: never took) give their
  // arena slots back (those in flight or in an H2D copy give them back when they finish).
  for (Read& r : reads_) {
    if (r.state == ReadState::kRead || (host_ && r.state == ReadState::kOnDevice)) {
      free_arena_.push_back(r.arena);
      r.arena = -1;
      r.state = ReadState::kPlanned;
    }
  }
  ++gen_;
  if (given != nullptr) {
    plan_ = std::move(*given);
  } else {
    const auto& variants = plans_.at(plan_id);
    plan_ = version_ % 2 == 0 ? variants.first : variants.second;
  }
  plan_id_ = given == nullptr ? plan_id : -1;
  take_sites_ = SitesOf(plan_.read_sites, plan_.reads.size());
  put_sites_ = SitesOf(plan_.write_sites, plan_.writes.size());
  take_cursor_.clear();
  put_cursor_.clear();
  step_puts_.clear();
  reads_.assign(plan_.reads.size(), Read{});
  next_read_ = next_h2d_ = take_ = put_ = low_take_ = 0;
  failed_ = false;
  step_crcs_.clear();
  if (version_dev == nullptr || !host_) {
    // On a device the step starts now and its check runs behind (it gates the commit).
    active_ = true;
    ++stats_.steps_begun;
    Kick();
  }
  if (version_dev == nullptr) return {};
  // With host memory the check runs inline, before the step reads anything.
  const uint64_t gen = gen_;
  const uint64_t expected = version_;
  ++checks_pending_;
  lock.unlock();
  IoStatus issued;
  bool launched = false;
  try {
    // The caller may reuse its buffer once we return: its word is copied on its own stream
    // first, and the d2h stream reads our copy once the caller's stream got there.
    ops_->CopyAsync(version_dev_, version_dev, sizeof(int32_t), CopyKind::kDeviceToDevice,
                    stream);
    ops_->RecordEvent(version_ready_, stream);
    ops_->StreamWaitEvent(d2h_, version_ready_);
    ops_->CopyAsync(version_host_, version_dev_, sizeof(int32_t), CopyKind::kDeviceToHost,
                    d2h_);
    ops_->LaunchHostFunc(d2h_, [this, gen, expected] {
      int32_t seen = 0;
      std::memcpy(&seen, version_host_, sizeof(seen));
      OnVersionChecked(gen, expected, seen);
    });
    launched = true;
  } catch (const std::exception& e) {
    issued = Failed(std::string("the version check of the step: ") + e.what());
  }
  lock.lock();
  if (!launched) {
    --checks_pending_;
    failed_ = true;
    active_ = false;
    plan_id_ = -1;
    Kick();
    return issued;
  }
  if (!host_) return {};
  if (failed_) {
    // The check refused the step: Begin returns its error itself, and the step never starts.
    IoStatus st = pending_error_;
    pending_error_ = IoStatus{};
    plan_id_ = -1;
    return st;
  }
  active_ = true;
  ++stats_.steps_begun;
  Kick();
  return {};
}

IoStatus GpuPager::NextTake(int site, size_t bytes, size_t* index) const {
  if (!active_) return Failed("take outside a step: call Begin first", EINVAL);
  auto cur = take_cursor_.find(site);
  const size_t k = cur == take_cursor_.end() ? 0 : cur->second;
  const std::string who = "take #" + std::to_string(k + 1) + " of site " + std::to_string(site);
  auto sched = take_sites_.find(site);
  const size_t planned = sched == take_sites_.end() ? 0 : sched->second.size();
  if (k >= planned) {
    return Failed(who + " but the step's plan gives that site " + std::to_string(planned) +
                  " reads", EINVAL);
  }
  const size_t i = sched->second[k];
  const ChunkRef& ref = plan_.reads[i];
  if (bytes != SIZE_MAX && bytes != ref.bytes) {
    return Failed(who + " wants " + std::to_string(bytes) + " bytes but the plan reads " +
                  Where(*io_, ref), EINVAL);
  }
  if (i >= low_take_ + AheadBound()) {
    // Its chunk needs the ring slot (host memory: an arena slot) that an earlier chunk holds
    // until taken, and that take comes later in this thread's call order: waiting would
    // never end.
    return Failed(who + " is plan read " + std::to_string(i) + " but plan read " +
                  std::to_string(low_take_) + " is not taken yet, more than the " +
                  (host_ ? "arena's " : "ring's ") + std::to_string(AheadBound()) +
                  " slots before it: the calls do not follow the plan's read order", EINVAL);
  }
  if (step_puts_.count({ref.file, ref.offset}) != 0) {
    return Failed(who + " reads " + Where(*io_, ref) + ", which this step already wrote: the read "
                  "ahead may predate the write; read it in the next step", EINVAL);
  }
  *index = i;
  return {};
}

bool GpuPager::TakeReady(int site) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  if (!NextTake(site, SIZE_MAX, &i).ok()) return true;  // it fails at once
  const ReadState s = reads_[i].state;
  return s == ReadState::kOnDevice || s == ReadState::kFailed;
}

IoStatus GpuPager::Take(int site, DeviceOps::Stream stream, void* dst, size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  size_t i = 0;
  if (IoStatus st = NextTake(site, bytes, &i); !st.ok()) {
    if (active_) failed_ = true;
    return st;
  }
  const ChunkRef ref = plan_.reads[i];
  Read& r = reads_[i];
  auto here = [&] { return r.state == ReadState::kOnDevice || r.state == ReadState::kFailed; };
  if (!WaitFor(lock, here, &stats_.take_wait_ns)) {
    failed_ = true;
    return Failed("take of " + Where(*io_, ref) + " waited " +
                  std::to_string(config_.wait_limit.count()) + " ms for its read", ETIMEDOUT);
  }
  if (r.state == ReadState::kFailed) {
    failed_ = true;
    return r.status;
  }
  auto taken = [&] {
    r.state = ReadState::kTaken;
    while (low_take_ < reads_.size() && reads_[low_take_].state == ReadState::kTaken) {
      ++low_take_;
    }
    ++take_cursor_[site];
    ++take_;
    ++stats_.takes;
  };
  if (host_) {
    // The chunk is in its arena slot: one copy into the caller's buffer, done when CopyAsync
    // returns, and the slot goes back to the read-ahead.
    const int a = r.arena;
    r.arena = -1;
    taken();
    lock.unlock();
    IoStatus st;
    try {
      ops_->CopyAsync(dst, arena_[a], bytes, CopyKind::kDeviceToDevice, stream);
    } catch (const std::exception& e) {
      st = Failed("take of " + Where(*io_, ref) + ": " + e.what());
    }
    lock.lock();
    free_arena_.push_back(a);
    if (!st.ok()) failed_ = true;
    Kick();
    return st;
  }
  const RingSlot& s = ring_[i % ring_.size()];
  lock.unlock();
  try {
    // Mutant 2: the D2D may read the ring slot before its H2D copy filled it.
    if (!Mutant(2)) ops_->StreamWaitEvent(stream, s.ready);
    ops_->CopyAsync(dst, s.dev, bytes, CopyKind::kDeviceToDevice, stream);
    ops_->RecordEvent(s.free, stream);
  } catch (const std::exception& e) {
    lock.lock();
    failed_ = true;
    return Failed("take of " + Where(*io_, ref) + ": " + e.what());
  }
  lock.lock();
  // Only now may the next H2D into this slot be enqueued: it waits the `free` just recorded.
  taken();
  Kick();
  return {};
}

IoStatus GpuPager::Put(int site, DeviceOps::Stream stream, const void* src, size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!active_) return Failed("put outside a step: call Begin first", EINVAL);
  const std::string who = "put #" + std::to_string(put_cursor_[site] + 1) + " of site " +
                          std::to_string(site);
  auto sched = put_sites_.find(site);
  const size_t planned = sched == put_sites_.end() ? 0 : sched->second.size();
  const size_t k = put_cursor_[site];
  if (k >= planned) {
    failed_ = true;
    return Failed(who + " but the step's plan gives that site " + std::to_string(planned) +
                  " writes", EINVAL);
  }
  const size_t j = sched->second[k];
  const ChunkRef ref = plan_.writes[j];
  if (bytes != ref.bytes) {
    failed_ = true;
    return Failed(who + " has " + std::to_string(bytes) + " bytes but the plan writes " +
                  Where(*io_, ref), EINVAL);
  }
  const int wi = static_cast<int>(j % wslots_.size());
  WriteSlot& w = wslots_[wi];
  if (!WaitFor(lock, [&] { return !w.busy; }, &stats_.put_wait_ns)) {
    failed_ = true;
    return Failed("put of " + Where(*io_, ref) + " waited " +
                  std::to_string(config_.wait_limit.count()) + " ms for a write slot",
                  ETIMEDOUT);
  }
  w.busy = true;
  const uint64_t id = next_write_id_++;
  PendingWrite& pw = writes_[id];
  pw.slot = wi;
  pw.ref = ref;
  pw.step = gen_;
  ++put_cursor_[site];
  step_puts_.insert({ref.file, ref.offset});
  ++put_;
  ++stats_.puts;
  const bool d2h = w.host != w.dev;  // with host memory the slot is already host memory
  if (d2h) stats_.d2h_bytes += bytes;
  lock.unlock();
  try {
    ops_->CopyAsync(w.dev, src, bytes, CopyKind::kDeviceToDevice, stream);
    ops_->RecordEvent(w.ready, stream);
    // Mutant 7: the D2H may copy the slot before the put's D2D on the caller's stream ran.
    if (!Mutant(7)) ops_->StreamWaitEvent(d2h_, w.ready);
    if (d2h) ops_->CopyAsync(w.host, w.dev, bytes, CopyKind::kDeviceToHost, d2h_);
    ops_->LaunchHostFunc(d2h_, [this, id] {
      std::lock_guard<std::mutex> lk(mu_);
      writes_.at(id).state = WriteState::kCopied;
      Kick();
    });
  } catch (const std::exception& e) {
    lock.lock();
    failed_ = true;
    writes_.erase(id);
    w.busy = false;
    Kick();
    return Failed("put of " + Where(*io_, ref) + ": " + e.what());
  }
  if (Mutant(3)) {
    // Mutant 3: the write slot is free again once its D2H is enqueued, before its disk write.
    lock.lock();
    w.busy = false;
    Kick();
  }
  return {};
}

IoStatus GpuPager::Commit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return Failed("commit outside a step: call Begin first", EINVAL);
  active_ = false;
  ended_ = true;
  Kick();
  if (take_ != plan_.reads.size() || put_ != plan_.writes.size()) {
    failed_ = true;
    return Failed("commit after " + std::to_string(take_) + " of " +
                  std::to_string(plan_.reads.size()) + " planned takes and " +
                  std::to_string(put_) + " of " + std::to_string(plan_.writes.size()) +
                  " planned puts: the step does not match its plan and is not committed",
                  EINVAL);
  }
  if (failed_) {
    // Name the failure when it is known (a write error: the path and errno), else the step's
    // call that failed has said why.
    return Failed("commit of a step that failed" +
                  (pending_error_.ok() ? std::string() : " (" + pending_error_.message + ")") +
                  ": it is not committed", pending_error_.ok() ? EIO : pending_error_.err);
  }
  return {};
}

IoStatus GpuPager::Settle() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t waited = 0;
  if (!WaitFor(lock, [&] { return Settled(); }, &waited)) {
    return Failed("Settle waited " + std::to_string(config_.wait_limit.count()) +
                  " ms for the last step's writes and commit; the disk is stuck", ETIMEDOUT);
  }
  IoStatus st = pending_error_;
  pending_error_ = IoStatus{};
  return st;
}

IoStatus GpuPager::Reset(uint64_t version, Crcs crcs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ || !Settled()) {
    return Failed("cannot reset the pager to version " + std::to_string(version) +
                  " while it is busy (" +
                  (active_ ? std::string("a step is begun and not ended")
                           : std::string("the last step's writes or commit are pending")) +
                  "): end the step (Commit) and wait for it (Settle) first", EBUSY);
  }
  version_ = version;
  crcs_ = std::move(crcs);
  return {};
}

void GpuPager::SetChecksum(const ChunkRef& ref, uint32_t crc) {
  std::lock_guard<std::mutex> lock(mu_);
  crcs_[{ref.file, ref.offset}] = crc;
}

bool GpuPager::Checksum(const ChunkRef& ref, uint32_t* crc) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = crcs_.find({ref.file, ref.offset});
  if (it == crcs_.end()) return false;
  *crc = it->second;
  return true;
}

GpuPager::Crcs GpuPager::Checksums() const {
  std::lock_guard<std::mutex> lock(mu_);
  return crcs_;
}

size_t GpuPager::TakeCursor(int site) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = take_cursor_.find(site);
  return it == take_cursor_.end() ? 0 : it->second;
}

size_t GpuPager::PutCursor(int site) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = put_cursor_.find(site);
  return it == put_cursor_.end() ? 0 : it->second;
}

uint64_t GpuPager::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

PagerStats GpuPager::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PagerStats s = stats_;
  s.reads_in_flight = reads_in_flight_;
  s.writes_in_flight = static_cast<int>(writes_.size());
  return s;
}

}  // namespace jaxoff::aio
