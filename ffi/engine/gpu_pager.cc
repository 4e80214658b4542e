#include "gpu_pager.h"

#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace jaxoff::aio {

namespace {

using Clock = std::chrono::steady_clock;

IoStatus Failed(const std::string& message, int err = EIO) {
  IoStatus st;
  st.err = err;
  st.message = message;
  return st;
}

std::string Where(const ChunkRef& r) {
  return "file " + std::to_string(r.file) + " at offset " + std::to_string(r.offset) + " (" +
         std::to_string(r.bytes) + " bytes)";
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

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
  IoOptions opt;
  opt.crc32c = true;
  engine_->Read(At(ref.file), ref.offset, dst, ref.bytes, std::move(done), opt);
}

void EngineChunkIo::Write(const ChunkRef& ref, const void* src, Done done) {
  IoOptions opt;
  opt.crc32c = true;
  engine_->Write(At(ref.file), ref.offset, src, ref.bytes, std::move(done), opt);
}

// ---- GpuPager --------------------------------------------------------------------------

void PagerConfig::Validate() const {
  auto fail = [](const std::string& m) { throw std::invalid_argument("PagerConfig: " + m); };
  if (slot_bytes == 0) fail("slot_bytes must be positive (the largest chunk)");
  if (arena_slots < 1) fail("arena_slots=" + std::to_string(arena_slots) + " must be >= 1");
  if (ring_slots < 1) fail("ring_slots=" + std::to_string(ring_slots) + " must be >= 1");
  if (write_slots < 1) fail("write_slots=" + std::to_string(write_slots) + " must be >= 1");
}

GpuPager::GpuPager(DeviceOps* ops, ChunkIo* io, PagerConfig config, CommitFn commit)
    : ops_(ops), io_(io), config_(config), commit_(std::move(commit)) {
  config_.Validate();
  h2d_ = ops_->CreateStream();
  d2h_ = ops_->CreateStream();
  for (int i = 0; i < config_.arena_slots; ++i) {
    arena_.push_back(ops_->AllocPinned(config_.slot_bytes));
    free_arena_.push_back(i);
  }
  ring_.resize(config_.ring_slots);
  for (RingSlot& r : ring_) {
    r.dev = ops_->AllocDevice(config_.slot_bytes);
    r.ready = ops_->CreateEvent();
    r.free = ops_->CreateEvent();
  }
  wslots_.resize(config_.write_slots);
  for (WriteSlot& w : wslots_) {
    w.dev = ops_->AllocDevice(config_.slot_bytes);
    w.host = ops_->AllocPinned(config_.slot_bytes);
    w.ready = ops_->CreateEvent();
  }
  thread_ = std::thread([this] { Loop(); });
}

GpuPager::~GpuPager() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    closing_ = true;
    cv_.wait(lock, [&] { return reads_in_flight_ == 0; });
  }
  // The caller has synchronised its own streams; ours may still wait on their events.
  ops_->SynchronizeStream(h2d_);
  ops_->SynchronizeStream(d2h_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    Kick();
    cv_.wait(lock, [&] { return writes_pending_ == 0 && !committing_; });
    stop_ = true;
    Kick();
  }
  thread_.join();
  ops_->SynchronizeStream(h2d_);
  ops_->SynchronizeStream(d2h_);
  ops_->DestroyStream(h2d_);
  ops_->DestroyStream(d2h_);
  for (void* p : arena_) ops_->FreePinned(p);
  for (RingSlot& r : ring_) {
    ops_->FreeDevice(r.dev);
    ops_->DestroyEvent(r.ready);
    ops_->DestroyEvent(r.free);
  }
  for (WriteSlot& w : wslots_) {
    ops_->FreeDevice(w.dev);
    ops_->FreePinned(w.host);
    ops_->DestroyEvent(w.ready);
  }
}

void GpuPager::Kick() {
  kick_ = true;
  cv_.notify_all();
}

void GpuPager::NoteError(const IoStatus& st) {
  if (pending_error_.ok()) pending_error_ = st;
}

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
  // Disk reads, in plan order, as far as the arena allows.
  std::vector<std::pair<size_t, int>> to_read;
  while (!closing_ && (active_ || ended_) && !failed_ && next_read_ < reads_.size() &&
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
  std::vector<std::pair<size_t, int>> to_copy;
  // With call sites, takes may come out of plan order (within the ring): the slot's previous
  // chunk, i - ring, must be taken, not just "ring takes made".
  const size_t ring = ring_.size();
  while (!closing_ && next_h2d_ < reads_.size() &&
         (next_h2d_ < ring || reads_[next_h2d_ - ring].state == ReadState::kTaken) &&
         reads_[next_h2d_].state == ReadState::kRead) {
    Read& r = reads_[next_h2d_];
    r.state = ReadState::kCopying;
    to_copy.emplace_back(next_h2d_++, r.arena);
    ++arena_pending_;
  }
  // Disk writes of slots whose D2H copy ran.
  std::vector<int> to_write;
  for (size_t w = 0; w < wslots_.size(); ++w) {
    if (wslots_[w].state == WriteState::kCopied) {
      wslots_[w].state = WriteState::kWriting;
      to_write.push_back(static_cast<int>(w));
    }
  }
  if (to_read.empty() && to_copy.empty() && to_write.empty()) return;
  std::vector<ChunkRef> read_refs, copy_refs, write_refs;
  for (auto& [i, a] : to_read) read_refs.push_back(plan_.reads[i]);
  for (auto& [i, a] : to_copy) copy_refs.push_back(plan_.reads[i]);
  for (int w : to_write) write_refs.push_back(wslots_[w].ref);

  // No DeviceOps or ChunkIo call under mu_: their callbacks and host functions take it.
  lock.unlock();
  IoStatus device_error;
  for (size_t k = 0; k < to_copy.size() && device_error.ok(); ++k) {
    const auto [i, a] = to_copy[k];
    const RingSlot& s = ring_[i % ring];
    try {
      ops_->StreamWaitEvent(h2d_, s.free);
      ops_->CopyAsync(s.dev, arena_[a], copy_refs[k].bytes, CopyKind::kHostToDevice, h2d_);
      ops_->RecordEvent(s.ready, h2d_);
      ops_->LaunchHostFunc(h2d_, [this, a = a] {
        std::lock_guard<std::mutex> lk(mu_);
        free_arena_.push_back(a);
        --arena_pending_;
        Kick();
      });
    } catch (const std::exception& e) {
      device_error = Failed(std::string("H2D copy of ") + Where(copy_refs[k]) + ": " + e.what());
    }
  }
  for (size_t k = 0; k < to_read.size(); ++k) {
    const auto [i, a] = to_read[k];
    io_->Read(read_refs[k], arena_[a],
              [this, gen, i = i, a = a](const IoStatus& st) { OnReadDone(gen, i, a, st); });
  }
  for (size_t k = 0; k < to_write.size(); ++k) {
    const int w = to_write[k];
    io_->Write(write_refs[k], wslots_[w].host,
               [this, w](const IoStatus& st) { OnWriteDone(w, st); });
  }
  lock.lock();
  stats_.h2d_bytes += [&] {
    uint64_t b = 0;
    for (auto& r : copy_refs) b += r.bytes;
    return b;
  }();
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
      r.status = Failed("checksum mismatch in " + Where(ref) + ": expected crc32c " +
                        Hex(it->second) + ", read " + Hex(st.crc32c) +
                        ". The page file is corrupt or was written by a crashed run; restore "
                        "the store from the last checkpoint (resume), or delete it to start over",
                        EBADMSG);
    }
  }
  if (r.status.ok()) {
    r.state = ReadState::kRead;
  } else {
    r.state = ReadState::kFailed;
    free_arena_.push_back(arena);
  }
}

void GpuPager::OnWriteDone(int slot, const IoStatus& st) {
  std::lock_guard<std::mutex> lock(mu_);
  WriteSlot& w = wslots_[slot];
  ++stats_.writes_done;
  if (!st.ok()) {
    NoteError(st);
    if (w.step == gen_) failed_ = true;
  } else if (w.step == gen_) {
    step_crcs_[{w.ref.file, w.ref.offset}] = st.crc32c;
  }
  w.state = WriteState::kFree;
  --writes_pending_;
  Kick();
}

void GpuPager::MaybeCommit(std::unique_lock<std::mutex>& lock) {
  if (!ended_ || failed_ || committing_ || committed_ == gen_) return;
  for (const WriteSlot& w : wslots_) {
    if (w.step == gen_ && w.state != WriteState::kFree) return;  // a write of this step runs
  }
  committing_ = true;
  const uint64_t step = gen_;
  Crcs crcs = step_crcs_;
  lock.unlock();
  IoStatus st = commit_ ? commit_(step, crcs) : IoStatus{};
  lock.lock();
  committing_ = false;
  if (st.ok()) {
    committed_ = step;
    ++stats_.commits;
    for (auto& [k, v] : crcs) crcs_[k] = v;
  } else {
    NoteError(st);
    failed_ = true;
  }
  Kick();
}

std::string GpuPager::PlanProblem(const StepPlan& plan) const {
  for (const ChunkRef& r : plan.reads) {
    if (r.bytes > config_.slot_bytes) {
      return "plan reads " + Where(r) + ", more than slot_bytes=" +
             std::to_string(config_.slot_bytes) + ": raise the pager's slot size";
    }
  }
  for (const ChunkRef& r : plan.writes) {
    if (r.bytes > config_.slot_bytes) {
      return "plan writes " + Where(r) + ", more than slot_bytes=" +
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

void GpuPager::RegisterPlan(int64_t id, StepPlan plan) {
  const std::string problem = PlanProblem(plan);
  if (!problem.empty()) {
    throw std::invalid_argument("plan " + std::to_string(id) + ": " + problem);
  }
  std::lock_guard<std::mutex> lock(mu_);
  plans_[id] = std::move(plan);
}

bool GpuPager::HasPlan(int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.count(id) != 0;
}

int64_t GpuPager::plan_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plan_id_;
}

IoStatus GpuPager::Begin(int64_t plan_id) {
  StepPlan plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(plan_id);
    if (it == plans_.end()) {
      return Failed("page_begin names plan " + std::to_string(plan_id) +
                    ", which is not registered with this pager (register the step's plan "
                    "before running it)", EINVAL);
    }
    plan = it->second;
  }
  IoStatus st = Begin(std::move(plan));
  if (st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    plan_id_ = plan_id;
  }
  return st;
}

IoStatus GpuPager::Begin(StepPlan plan) {
  if (const std::string problem = PlanProblem(plan); !problem.empty()) {
    return Failed(problem, EINVAL);
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (active_) failed_ = true;  // the previous step never reached Commit: it was aborted
  // The previous step's writes (of any step) are on disk and its commit is settled.
  auto settled = [&] {
    return writes_pending_ == 0 && !committing_ && (!ended_ || failed_ || committed_ == gen_);
  };
  if (!WaitFor(lock, settled, &stats_.begin_wait_ns)) {
    return Failed("Begin waited " + std::to_string(config_.wait_limit.count()) +
                  " ms for the previous step's writes; the disk is stuck", ETIMEDOUT);
  }
  active_ = false;
  ended_ = false;
  if (!pending_error_.ok()) {
    IoStatus st = pending_error_;
    pending_error_ = IoStatus{};
    return st;
  }
  // Chunks the old step read but never copied give their arena slots back (those in flight
  // or in an H2D copy give them back when they finish).
  for (const Read& r : reads_) {
    if (r.state == ReadState::kRead) free_arena_.push_back(r.arena);
  }
  ++gen_;
  ++stats_.steps_begun;
  plan_ = std::move(plan);
  plan_id_ = -1;
  take_sites_ = SitesOf(plan_.read_sites, plan_.reads.size());
  put_sites_ = SitesOf(plan_.write_sites, plan_.writes.size());
  take_cursor_.clear();
  put_cursor_.clear();
  step_puts_.clear();
  reads_.assign(plan_.reads.size(), Read{});
  next_read_ = next_h2d_ = take_ = put_ = low_take_ = 0;
  failed_ = false;
  step_crcs_.clear();
  active_ = true;
  Kick();
  return {};
}

IoStatus GpuPager::Take(int site, DeviceOps::Stream stream, void* dst, size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!active_) return Failed("take outside a step: call Begin first", EINVAL);
  const std::string who = "take #" + std::to_string(take_cursor_[site] + 1) + " of site " +
                          std::to_string(site);
  auto sched = take_sites_.find(site);
  const size_t planned = sched == take_sites_.end() ? 0 : sched->second.size();
  const size_t k = take_cursor_[site];
  if (k >= planned) {
    failed_ = true;
    return Failed(who + " but the step's plan gives that site " + std::to_string(planned) +
                  " reads", EINVAL);
  }
  const size_t i = sched->second[k];
  const ChunkRef ref = plan_.reads[i];
  if (bytes != ref.bytes) {
    failed_ = true;
    return Failed(who + " wants " + std::to_string(bytes) + " bytes but the plan reads " +
                  Where(ref), EINVAL);
  }
  if (i >= low_take_ + ring_.size()) {
    // Its H2D copy needs ring slot i % ring, which chunk i - ring holds until taken, and
    // that take comes later in this thread's call order: waiting would never end.
    failed_ = true;
    return Failed(who + " is plan read " + std::to_string(i) + " but plan read " +
                  std::to_string(low_take_) + " is not taken yet, more than the ring's " +
                  std::to_string(ring_.size()) + " slots before it: the calls do not follow "
                  "the plan's read order", EINVAL);
  }
  if (step_puts_.count({ref.file, ref.offset}) != 0) {
    failed_ = true;
    return Failed(who + " reads " + Where(ref) + ", which this step already wrote: the read "
                  "ahead may predate the write; read it in the next step", EINVAL);
  }
  Read& r = reads_[i];
  auto here = [&] { return r.state == ReadState::kOnDevice || r.state == ReadState::kFailed; };
  if (!WaitFor(lock, here, &stats_.take_wait_ns)) {
    failed_ = true;
    return Failed("take of " + Where(ref) + " waited " +
                  std::to_string(config_.wait_limit.count()) + " ms for its read", ETIMEDOUT);
  }
  if (r.state == ReadState::kFailed) {
    failed_ = true;
    return r.status;
  }
  const RingSlot& s = ring_[i % ring_.size()];
  lock.unlock();
  try {
    ops_->StreamWaitEvent(stream, s.ready);
    ops_->CopyAsync(dst, s.dev, bytes, CopyKind::kDeviceToDevice, stream);
    ops_->RecordEvent(s.free, stream);
  } catch (const std::exception& e) {
    lock.lock();
    failed_ = true;
    return Failed("take of " + Where(ref) + ": " + e.what());
  }
  lock.lock();
  r.state = ReadState::kTaken;
  while (low_take_ < reads_.size() && reads_[low_take_].state == ReadState::kTaken) ++low_take_;
  ++take_cursor_[site];
  ++take_;
  ++stats_.takes;
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
                  Where(ref), EINVAL);
  }
  const int wi = static_cast<int>(j % wslots_.size());
  WriteSlot& w = wslots_[wi];
  if (!WaitFor(lock, [&] { return w.state == WriteState::kFree; }, &stats_.put_wait_ns)) {
    failed_ = true;
    return Failed("put of " + Where(ref) + " waited " +
                  std::to_string(config_.wait_limit.count()) + " ms for a write slot",
                  ETIMEDOUT);
  }
  w.state = WriteState::kCopying;
  w.ref = ref;
  w.step = gen_;
  ++put_cursor_[site];
  step_puts_.insert({ref.file, ref.offset});
  ++put_;
  ++writes_pending_;
  ++stats_.puts;
  stats_.d2h_bytes += bytes;
  lock.unlock();
  try {
    ops_->CopyAsync(w.dev, src, bytes, CopyKind::kDeviceToDevice, stream);
    ops_->RecordEvent(w.ready, stream);
    ops_->StreamWaitEvent(d2h_, w.ready);
    ops_->CopyAsync(w.host, w.dev, bytes, CopyKind::kDeviceToHost, d2h_);
    ops_->LaunchHostFunc(d2h_, [this, wi] {
      std::lock_guard<std::mutex> lk(mu_);
      wslots_[wi].state = WriteState::kCopied;
      Kick();
    });
  } catch (const std::exception& e) {
    lock.lock();
    failed_ = true;
    w.state = WriteState::kFree;
    --writes_pending_;
    return Failed("put of " + Where(ref) + ": " + e.what());
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
  if (failed_) return Failed("commit of a step that failed: it is not committed");
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

uint64_t GpuPager::committed_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_;
}

PagerStats GpuPager::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace jaxoff::aio
