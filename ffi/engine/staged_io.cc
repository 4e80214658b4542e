#include "staged_io.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "aligned_buffer.h"
#include "crc32c.h"

namespace jaxoff::aio {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t NanosSince(Clock::time_point t0, Clock::time_point t1 = Clock::now()) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

std::string Where(const File& file, uint64_t offset, size_t size) {
  return file.path() + " at offset " + std::to_string(offset) + " (" + std::to_string(size) +
         " bytes)";
}

IoStatus Failed(std::string message, int err = -1) {
  IoStatus s;
  s.err = err;
  s.message = std::move(message);
  return s;
}

bool Overlaps(uint64_t a, size_t an, uint64_t b, size_t bn) { return a < b + bn && b < a + an; }

}  // namespace

struct StagedIo::State {
  struct Ticket {
    std::shared_ptr<const File> file;
    uint64_t offset = 0;
    size_t size = 0;
    bool verify = false;
    uint32_t expected = 0;
    AlignedBuffer buf;
    bool done = false;
    IoStatus status;
    Clock::time_point born;
    std::function<void()> on_done;  // a TakeAsync waiting for the read; run once, unlocked
  };
  struct Write {
    std::shared_ptr<const File> file;
    uint64_t offset = 0;
    size_t size = 0;
    AlignedBuffer buf;
  };

  size_t budget;
  double stale_seconds;
  mutable std::mutex mu;
  std::condition_variable cv;  // a read or write finished, staging was released

  // Staging arena: buffers in use are owned by tickets and writes; free ones are cached here
  // (first touch of fresh memory is slow on these machines) and count against the budget.
  std::vector<AlignedBuffer> free;
  size_t allocated = 0;
  size_t in_use = 0;

  int32_t next_ticket = 1;
  std::map<int32_t, std::shared_ptr<Ticket>> tickets;  // not yet taken
  size_t reads_in_flight = 0;  // including those of tickets dropped before their read ended
  std::vector<std::shared_ptr<Ticket>> reading;  // every ticket whose read is in flight

  uint64_t next_write = 1;
  std::map<uint64_t, Write> writes;  // write-behind writes in flight, by sequence number
  std::set<const File*> written;     // files written since the last Flush (for fsync)
  std::vector<std::shared_ptr<const File>> written_keep;
  IoStatus first_error;
  uint64_t reclaimed = 0;
  uint64_t takes = 0, take_wait_ns = 0, take_copy_ns = 0;
  // Time callers spent blocked on I/O outside takes: prefetch / write-behind waiting for
  // overlapping requests or staging, flush waiting for write-behind writes.
  uint64_t prefetch_wait_ns = 0, write_wait_ns = 0, flush_wait_ns = 0;

  // A buffer of at least AlignUp(n) bytes, or an empty one when the budget has no room for it.
  // Caller holds mu.
  AlignedBuffer Acquire(size_t n) {
    const size_t want = AlignUp(n == 0 ? 1 : n);
    // Best fit among cached buffers, wasting at most half of one.
    size_t best = free.size();
    for (size_t i = 0; i < free.size(); ++i) {
      const size_t s = free[i].size();
      if (s >= want && s <= 2 * want && (best == free.size() || s < free[best].size())) best = i;
    }
    if (best < free.size()) {
      AlignedBuffer b = std::move(free[best]);
      free.erase(free.begin() + static_cast<std::ptrdiff_t>(best));
      in_use += b.size();
      return b;
    }
    // Drop cached buffers (largest first) until a new one fits.
    std::sort(free.begin(), free.end(),
              [](const AlignedBuffer& a, const AlignedBuffer& b) { return a.size() < b.size(); });
    while (allocated + want > budget && !free.empty()) {
      allocated -= free.back().size();
      free.pop_back();
    }
    if (allocated + want > budget) return AlignedBuffer();
    AlignedBuffer b(want);
    AdviseHugePages(b.data(), b.size());
    allocated += b.size();
    in_use += b.size();
    return b;
  }

  void Release(AlignedBuffer b) {  // caller holds mu
    if (b.size() == 0) return;
    in_use -= b.size();
    free.push_back(std::move(b));
  }

  bool WriteOverlaps(const File* f, uint64_t off, size_t n) const {
    for (const auto& [seq, w] : writes) {
      if (w.file.get() == f && Overlaps(w.offset, w.size, off, n)) return true;
    }
    return false;
  }
  bool ReadOverlaps(const File* f, uint64_t off, size_t n) const {
    for (const auto& t : reading) {
      if (t->file.get() == f && Overlaps(t->offset, t->size, off, n)) return true;
    }
    return false;
  }

  // Drops tickets whose read is over and that were not taken within stale_seconds.
  size_t ReclaimStale() {
    const auto now = Clock::now();
    size_t n = 0;
    for (auto it = tickets.begin(); it != tickets.end();) {
      const auto& t = it->second;
      if (t->done &&
          std::chrono::duration<double>(now - t->born).count() > stale_seconds) {
        Release(std::move(t->buf));
        it = tickets.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    reclaimed += n;
    return n;
  }
};

StagedIo::StagedIo(std::shared_ptr<Engine> engine, size_t budget_bytes, double stale_seconds)
    : engine_(std::move(engine)), state_(std::make_shared<State>()) {
  state_->budget = budget_bytes;
  state_->stale_seconds = stale_seconds;
}

StagedIo::~StagedIo() {
  Drain();
  std::unique_lock<std::mutex> lk(state_->mu);
  state_->cv.wait(lk, [this] { return state_->writes.empty(); });
}

IoStatus StagedIo::Prefetch(std::shared_ptr<const File> file, uint64_t offset, size_t size,
                            bool verify, uint32_t expected_crc, int32_t* ticket) {
  State& st = *state_;
  auto t = std::make_shared<State::Ticket>();
  const auto w0 = Clock::now();
  {
    std::unique_lock<std::mutex> lk(st.mu);
    // Read-after-write: the bytes must be those of the last write ordered before this call.
    st.cv.wait(lk, [&] { return !st.WriteOverlaps(file.get(), offset, size); });
    for (;;) {
      t->buf = st.Acquire(size);
      if (t->buf.size() > 0) break;
      if (!st.writes.empty()) {  // write-behind writes free their staging on their own
        const size_t before = st.writes.size();
        st.cv.wait(lk, [&] { return st.writes.size() < before; });
        continue;
      }
      if (st.ReclaimStale() > 0) continue;
      size_t held = 0;
      double oldest = 0;
      for (const auto& [id, other] : st.tickets) {
        held += other->buf.size();
        oldest = std::max(
            oldest, std::chrono::duration<double>(Clock::now() - other->born).count());
      }
      char age[32];
      std::snprintf(age, sizeof(age), "%.1f", oldest);
      return Failed(
          "cannot stage " + std::to_string(size) + " bytes of " + Where(*file, offset, size) +
          ": the split-phase staging (EngineConfig.pool_bytes = " + std::to_string(st.budget) +
          " bytes) holds " + std::to_string(st.tickets.size()) + " prefetched chunks not yet taken (" +
          std::to_string(held) + " bytes, the oldest " + age +
          " s old). Take tickets before prefetching more, raise pool_bytes (to at least the bytes "
          "prefetched at once), or drain the tickets a failed program left behind "
          "(jaxoff.aio.drain_prefetches)");
    }
    t->file = file;
    t->offset = offset;
    t->size = size;
    t->verify = verify;
    t->expected = expected_crc;
    t->born = Clock::now();
    st.prefetch_wait_ns += NanosSince(w0, t->born);
    if (st.next_ticket <= 0) st.next_ticket = 1;  // wrapped: ids stay positive
    *ticket = st.next_ticket++;
    st.tickets[*ticket] = t;
    st.reading.push_back(t);
    ++st.reads_in_flight;
  }
  IoOptions options;
  options.crc32c = verify;
  engine_->Read(
      std::move(file), offset, t->buf.data(), size,
      [state = state_, t](const IoStatus& s) {
        std::function<void()> take;
        {
          std::lock_guard<std::mutex> lk(state->mu);
          t->status = s;
          t->done = true;
          auto& r = state->reading;
          r.erase(std::remove(r.begin(), r.end(), t), r.end());
          --state->reads_in_flight;
          // No ticket is dropped while its read is in flight (Drain and ReclaimStale wait for
          // it, Take owns it), so the staging stays with the ticket.
          take = std::move(t->on_done);
          t->on_done = nullptr;
          state->cv.notify_all();
        }
        if (take) take();
      },
      options);
  return IoStatus();
}

namespace {

IoStatus UnknownTicket(int32_t ticket, double stale_seconds) {
  return Failed("ticket " + std::to_string(ticket) +
                " is unknown: it was already taken, or reclaimed (drained, its table "
                "unregistered, or not taken within " +
                std::to_string(static_cast<int>(stale_seconds)) +
                " s while staging was short). Take each ticket exactly once, from the "
                "program that prefetched it");
}

}  // namespace

// The end of a take whose read is over: checks, copy out, counters, staging released. Called
// without holding mu.
IoStatus StagedIo::FinishTake(const std::shared_ptr<State>& state, int32_t ticket,
                              const std::shared_ptr<void>& ticket_ptr, void* dst, size_t size,
                              std::chrono::steady_clock::time_point t0) {
  State& st = *state;
  auto t = std::static_pointer_cast<State::Ticket>(ticket_ptr);
  const auto t1 = Clock::now();
  IoStatus result;
  if (!t->status.ok()) {
    result = t->status;
  } else if (size != t->size) {
    result = Failed("ticket " + std::to_string(ticket) + " read " + std::to_string(t->size) +
                    " bytes of " + Where(*t->file, t->offset, t->size) + " but the take wants " +
                    std::to_string(size) + ": prefetch and take must agree on shape and dtype");
  } else if (t->verify && t->status.crc32c != t->expected) {
    result = Failed("checksum mismatch in " + Where(*t->file, t->offset, t->size) +
                    ": expected crc32c " + Hex(t->expected) + ", read " +
                    Hex(t->status.crc32c) +
                    ". The page file is corrupt or was written by a crashed run; restore the "
                    "store from the last checkpoint (resume), or delete the store to start over");
  } else {
    std::memcpy(dst, t->buf.data(), size);
  }
  const auto t2 = Clock::now();
  std::lock_guard<std::mutex> lk(st.mu);
  if (result.ok()) {
    ++st.takes;
    st.take_wait_ns += NanosSince(t0, t1);
    st.take_copy_ns += NanosSince(t1, t2);
  }
  st.Release(std::move(t->buf));
  st.cv.notify_all();
  return result;
}

IoStatus StagedIo::Take(int32_t ticket, void* dst, size_t size) {
  State& st = *state_;
  std::shared_ptr<State::Ticket> t;
  const auto t0 = Clock::now();
  {
    std::unique_lock<std::mutex> lk(st.mu);
    auto it = st.tickets.find(ticket);
    if (it == st.tickets.end()) return UnknownTicket(ticket, st.stale_seconds);
    t = it->second;
    st.tickets.erase(it);  // ours now: nobody else can take or reclaim it
    st.cv.wait(lk, [&] { return t->done; });
  }
  return FinishTake(state_, ticket, t, dst, size, t0);
}

bool StagedIo::TakeAsync(int32_t ticket, void* dst, size_t size, IoStatus* now,
                         std::function<void(const IoStatus&)> done) {
  State& st = *state_;
  std::shared_ptr<State::Ticket> t;
  const auto t0 = Clock::now();
  {
    std::unique_lock<std::mutex> lk(st.mu);
    auto it = st.tickets.find(ticket);
    if (it == st.tickets.end()) {
      *now = UnknownTicket(ticket, st.stale_seconds);
      return true;
    }
    t = it->second;
    st.tickets.erase(it);  // ours now: nobody else can take or reclaim it
    if (!t->done) {
      // Run by the read's completion (which moves it out of the ticket, breaking the cycle).
      t->on_done = [state = state_, ticket, t, dst, size, t0, done = std::move(done)]() {
        done(FinishTake(state, ticket, t, dst, size, t0));
      };
      return false;
    }
  }
  *now = FinishTake(state_, ticket, t, dst, size, t0);
  return true;
}

bool StagedIo::WriteBehind(std::shared_ptr<const File> file, uint64_t offset, const void* src,
                           size_t size, uint32_t* crc) {
  State& st = *state_;
  uint64_t seq = 0;
  char* staging = nullptr;
  const auto w0 = Clock::now();
  {
    std::unique_lock<std::mutex> lk(st.mu);
    if (AlignUp(size == 0 ? 1 : size) > st.budget) return false;
    // Write-after-write and write-after-read on the same bytes keep their order.
    st.cv.wait(lk, [&] {
      return !st.WriteOverlaps(file.get(), offset, size) &&
             !st.ReadOverlaps(file.get(), offset, size);
    });
    AlignedBuffer buf;
    for (;;) {
      buf = st.Acquire(size);
      if (buf.size() > 0) break;
      if (st.writes.empty()) return false;  // held by tickets: the caller writes synchronously
      const size_t before = st.writes.size();
      st.cv.wait(lk, [&] { return st.writes.size() < before; });
    }
    st.write_wait_ns += NanosSince(w0);
    seq = st.next_write++;
    State::Write& w = st.writes[seq];
    w.file = file;
    w.offset = offset;
    w.size = size;
    w.buf = std::move(buf);
    staging = w.buf.data();
    if (st.written.insert(file.get()).second) st.written_keep.push_back(file);
  }
  // The map node (and so the buffer) stays put until the write's callback erases it.
  *crc = Crc32cCopy(0, staging, src, size);
  const size_t padded = AlignUp(size);
  if (padded > size) std::memset(staging + size, 0, padded - size);
  engine_->Write(std::move(file), offset, staging, size,
                 [state = state_, seq](const IoStatus& s) {
                   std::lock_guard<std::mutex> lk(state->mu);
                   auto it = state->writes.find(seq);
                   if (!s.ok() && state->first_error.ok()) state->first_error = s;
                   state->Release(std::move(it->second.buf));
                   state->writes.erase(it);
                   state->cv.notify_all();
                 });
  return true;
}

IoStatus StagedIo::Flush(bool fsync) {
  State& st = *state_;
  std::vector<std::shared_ptr<const File>> files;
  IoStatus result;
  {
    std::unique_lock<std::mutex> lk(st.mu);
    const uint64_t last = st.next_write - 1;
    const auto w0 = Clock::now();
    st.cv.wait(lk, [&] { return st.writes.empty() || st.writes.begin()->first > last; });
    st.flush_wait_ns += NanosSince(w0);
    result = std::move(st.first_error);
    st.first_error = IoStatus();
    if (fsync) {
      files = std::move(st.written_keep);
      st.written_keep.clear();
      st.written.clear();
    }
  }
  if (fsync && result.ok()) {
    try {
      for (const auto& f : files) f->Sync();
    } catch (const IoError& e) {
      result = Failed(e.what(), e.err());
    }
  }
  return result;
}

void StagedIo::WaitForOverlaps(const File* file, uint64_t offset, size_t size, bool reads) {
  State& st = *state_;
  std::unique_lock<std::mutex> lk(st.mu);
  st.cv.wait(lk, [&] {
    return !st.WriteOverlaps(file, offset, size) &&
           !(reads && st.ReadOverlaps(file, offset, size));
  });
}

size_t StagedIo::Drain() {
  State& st = *state_;
  std::unique_lock<std::mutex> lk(st.mu);
  st.cv.wait(lk, [&] { return st.reads_in_flight == 0; });
  const size_t n = st.tickets.size();
  for (auto& [id, t] : st.tickets) st.Release(std::move(t->buf));
  st.tickets.clear();
  st.reclaimed += n;
  st.cv.notify_all();
  return n;
}

StagedIoStats StagedIo::Stats() const {
  const State& st = *state_;
  std::lock_guard<std::mutex> lk(st.mu);
  StagedIoStats s;
  s.tickets = st.tickets.size();
  s.reads_in_flight = st.reads_in_flight;
  s.writes_in_flight = st.writes.size();
  s.staging_in_use = st.in_use;
  s.staging_allocated = st.allocated;
  s.budget = st.budget;
  s.reclaimed = st.reclaimed;
  s.takes = st.takes;
  s.take_wait_ns = st.take_wait_ns;
  s.take_copy_ns = st.take_copy_ns;
  s.prefetch_wait_ns = st.prefetch_wait_ns;
  s.write_wait_ns = st.write_wait_ns;
  s.flush_wait_ns = st.flush_wait_ns;
  return s;
}

}  // namespace jaxoff::aio
