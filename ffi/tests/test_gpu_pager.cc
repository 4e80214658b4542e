// The GPU pager's data path against the simulated device (SimDeviceOps) and an in-memory
// ChunkIo: ordering, slot reuse, backpressure, commit, errors, aborted steps, deadlocks.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "crc32c.h"
#include "fake_chunk_io.h"
#include "gpu_pager.h"
#include "sim_device_ops.h"
#include "test_util.h"

namespace {

using jaxoff::aio::ChunkRef;
using jaxoff::aio::CopyKind;
using jaxoff::aio::Crc32c;
using jaxoff::aio::DeviceOps;
using jaxoff::aio::GpuPager;
using jaxoff::aio::IoStatus;
using jaxoff::aio::PagerConfig;
using jaxoff::aio::SimDelays;
using jaxoff::aio::SimDeviceOps;
using jaxoff::aio::StepPlan;
using jaxoff::aio::testing::FakeChunkIo;
using jaxoff::aio::testing::RandomBytes;
using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr uint64_t kStride = 64 << 10;

// Runs `fn` and fails the whole binary if it has not returned after `seconds`: a deadlock
// must not hang CI.
void Within(int seconds, const char* what, const std::function<void()>& fn) {
  std::promise<void> done;
  auto fut = done.get_future();
  std::thread t([&] {
    fn();
    done.set_value();
  });
  if (fut.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    std::cerr << what << ": no progress after " << seconds << " s (deadlock)" << std::endl;
    std::_Exit(3);
  }
  t.join();
}

struct RigOptions {
  SimDelays delays{microseconds(300), microseconds(300), microseconds(100)};
  microseconds xla_lag{0};
  microseconds read_delay{200};
  microseconds write_delay{200};
  PagerConfig config = [] {
    PagerConfig c;
    c.slot_bytes = kStride;
    c.arena_slots = 3;
    c.ring_slots = 2;
    c.write_slots = 2;
    c.wait_limit = milliseconds(20000);
    return c;
  }();
};

struct Rig {
  explicit Rig(const RigOptions& o = {})
      : ops(o.delays), io(2, o.read_delay, o.write_delay), xla(ops.CreateStream()) {
    ops.SetStreamLag(xla, o.xla_lag);
    pager = std::make_unique<GpuPager>(
        &ops, &io, o.config,
        [this](uint64_t step, const GpuPager::Crcs& crcs) -> IoStatus {
          std::lock_guard<std::mutex> lock(mu);
          committed.push_back(step);
          commit_crcs = crcs;
          if (on_commit) return on_commit(step);
          return {};
        });
  }
  ~Rig() {
    ops.SynchronizeStream(xla);
    pager.reset();
    ops.DestroyStream(xla);
  }
  std::vector<uint64_t> Commits() {
    std::lock_guard<std::mutex> lock(mu);
    return committed;
  }

  SimDeviceOps ops;
  FakeChunkIo io;
  DeviceOps::Stream xla;
  std::unique_ptr<GpuPager> pager;
  std::mutex mu;
  std::vector<uint64_t> committed;
  GpuPager::Crcs commit_crcs;
  std::function<IoStatus(uint64_t)> on_commit;
};

size_t SizeOf(int i) { return 4096 * (1 + i % 3) + 8 * i; }

// n chunks of file `file`, chunk i at i * kStride.
std::vector<ChunkRef> Chunks(int file, int n) {
  std::vector<ChunkRef> v;
  for (int i = 0; i < n; ++i) v.push_back({file, i * kStride, SizeOf(i)});
  return v;
}

// Stores random contents for `refs` in the fake disk; returns them.
std::vector<std::vector<char>> Seed(FakeChunkIo& io, const std::vector<ChunkRef>& refs,
                                    uint32_t seed) {
  std::vector<std::vector<char>> out;
  for (size_t i = 0; i < refs.size(); ++i) {
    out.push_back(RandomBytes(refs[i].bytes, seed * 1000 + static_cast<uint32_t>(i)));
    io.Put(refs[i].file, refs[i].offset, out.back());
  }
  return out;
}

struct StepResult {
  IoStatus begin, first_error, commit;
  std::vector<std::vector<char>> got;  // what each take delivered
};

// One step as XLA would run it on one thread: take i and put i interleaved (reads first),
// `think` of host time between calls, then Commit; the takes' outputs are read back after the
// caller's stream is synchronised (as a later consumer on the device would see them).
StepResult RunStep(Rig& r, const StepPlan& plan, const std::vector<std::vector<char>>& put_data,
                   microseconds think = microseconds(0), size_t stop_after_takes = SIZE_MAX) {
  StepResult res;
  res.begin = r.pager->Begin(plan);
  if (!res.begin.ok()) return res;
  std::vector<void*> dst, src;
  const size_t n = std::max(plan.reads.size(), plan.writes.size());
  bool aborted = false;
  for (size_t k = 0; k < n && !aborted; ++k) {
    if (k < plan.reads.size()) {
      if (k == stop_after_takes) {
        aborted = true;
        break;
      }
      void* d = r.ops.AllocDevice(plan.reads[k].bytes);
      dst.push_back(d);
      IoStatus st = r.pager->Take(r.xla, d, plan.reads[k].bytes);
      if (!st.ok()) {
        res.first_error = st;
        aborted = true;
        break;
      }
    }
    if (k < plan.writes.size()) {
      void* s = r.ops.AllocDevice(plan.writes[k].bytes);
      std::memcpy(s, put_data[k].data(), plan.writes[k].bytes);
      src.push_back(s);
      IoStatus st = r.pager->Put(r.xla, s, plan.writes[k].bytes);
      if (!st.ok() && res.first_error.ok()) {
        res.first_error = st;
        aborted = true;
      }
    }
    if (think.count() > 0) std::this_thread::sleep_for(think);
  }
  if (!aborted) res.commit = r.pager->Commit();
  r.ops.SynchronizeStream(r.xla);
  for (size_t k = 0; k < dst.size(); ++k) {
    const char* p = static_cast<const char*>(dst[k]);
    res.got.emplace_back(p, p + plan.reads[k].bytes);
    r.ops.FreeDevice(dst[k]);
  }
  for (void* s : src) r.ops.FreeDevice(s);
  return res;
}

// Waits (bounded) until `pred` holds; false if it never did.
bool Eventually(const std::function<bool()>& pred, int ms = 10000) {
  for (int i = 0; i < ms; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return pred();
}

TEST(SimDetectsACopyReadingBytesAnotherCopyStillWrites) {
  // The checker the other tests rely on: an H2D into a buffer and a D2D out of it on another
  // stream, with no event between them, is reported. (A real race of two memcpys: under
  // ThreadSanitizer, which reports it too, only the ordered half runs.)
#ifndef __SANITIZE_THREAD__
  {
  SimDeviceOps ops({microseconds(20000), microseconds(0), microseconds(0)});
  auto a = ops.CreateStream(), b = ops.CreateStream();
  std::vector<char> host(4096, 1);
  void* ring = ops.AllocDevice(4096);
  void* out = ops.AllocDevice(4096);
  ops.CopyAsync(ring, host.data(), 4096, CopyKind::kHostToDevice, a);
  std::this_thread::sleep_for(milliseconds(5));
  ops.CopyAsync(out, ring, 4096, CopyKind::kDeviceToDevice, b);
  ops.SynchronizeStream(a);
  ops.SynchronizeStream(b);
  CHECK(ops.Stats().hazards >= 1);
  CHECK_CONTAINS(ops.FirstHazard(), "D2D");
  for (auto s : {a, b}) ops.DestroyStream(s);
  ops.FreeDevice(ring);
  ops.FreeDevice(out);
  }
#endif
  std::vector<char> host(4096, 1);
  std::vector<char> ring(4096), out(4096);
  // With an event, the same copies are ordered and clean.
  SimDeviceOps ok({microseconds(20000), microseconds(0), microseconds(0)});
  auto c = ok.CreateStream(), d = ok.CreateStream();
  auto e = ok.CreateEvent();
  ok.CopyAsync(ring.data(), host.data(), 4096, CopyKind::kHostToDevice, c);
  ok.RecordEvent(e, c);
  ok.StreamWaitEvent(d, e);
  ok.CopyAsync(out.data(), ring.data(), 4096, CopyKind::kDeviceToDevice, d);
  ok.SynchronizeStream(d);
  CHECK(ok.EventDone(e));
  CHECK_EQ(ok.Stats().hazards, uint64_t{0});
  CHECK(out == host);
  ok.DestroyEvent(e);
  for (auto s : {c, d}) ok.DestroyStream(s);
}

TEST(TakesDeliverEveryChunkInOrderAndPutsReachDiskOverSteps) {
  Within(120, "round trip", [] {
    Rig r;
    StepPlan plan{Chunks(0, 12), Chunks(1, 12)};
    auto want = Seed(r.io, plan.reads, 1);
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<char>> data;
      for (size_t i = 0; i < plan.writes.size(); ++i) {
        data.push_back(RandomBytes(plan.writes[i].bytes, 77 + step * 100 + i));
      }
      StepResult res = RunStep(r, plan, data);
      CHECK(res.begin.ok());
      CHECK(res.first_error.ok());
      CHECK(res.commit.ok());
      CHECK_EQ(res.got.size(), want.size());
      for (size_t i = 0; i < res.got.size(); ++i) CHECK(res.got[i] == want[i]);
      // The commit came only once every write was on disk (Begin waits for it).
      CHECK(r.pager->Begin(StepPlan{}).ok());
      CHECK(r.pager->Commit().ok());
      for (size_t i = 0; i < data.size(); ++i) {
        CHECK(r.io.Get(1, plan.writes[i].offset, plan.writes[i].bytes) == data[i]);
        uint32_t crc = 0;
        CHECK(r.pager->Checksum(plan.writes[i], &crc));
        CHECK_EQ(crc, Crc32c(data[i].data(), data[i].size()));
      }
    }
    CHECK(r.pager->Begin(StepPlan{}).ok());  // settles the last empty step's commit
    CHECK_EQ(r.Commits().size(), size_t{6});  // three steps and three empty ones
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
    auto st = r.pager->Stats();
    CHECK_EQ(st.takes, uint64_t{36});
    CHECK_EQ(st.puts, uint64_t{36});
  });
}

TEST(ATakeNeverReadsARingSlotBeforeItsH2dCopy) {
  // H2D copies take 5 ms; the take returns as soon as the copy is enqueued, and the D2D on the
  // caller's stream must wait for it: the data is right and no copy overlapped another.
  Within(120, "slow h2d", [] {
    RigOptions o;
    o.delays = {microseconds(5000), microseconds(0), microseconds(0)};
    o.read_delay = microseconds(0);
    Rig r(o);
    StepPlan plan{Chunks(0, 8), {}};
    auto want = Seed(r.io, plan.reads, 2);
    StepResult res = RunStep(r, plan, {});
    CHECK(res.commit.ok());
    for (size_t i = 0; i < want.size(); ++i) CHECK(res.got[i] == want[i]);
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
    CHECK_EQ(r.ops.Stats().copies[static_cast<int>(CopyKind::kHostToDevice)], uint64_t{8});
  });
}

TEST(SlotsAreReusedOnlyAfterTheirCopyOutWithOneSlotEach) {
  // One arena slot, one ring slot, one write slot, and a caller stream lagging 2 ms per
  // operation: every refill must wait for the previous chunk's copy out.
  Within(120, "one slot", [] {
    RigOptions o;
    o.xla_lag = microseconds(2000);
    o.config.arena_slots = 1;
    o.config.ring_slots = 1;
    o.config.write_slots = 1;
    Rig r(o);
    StepPlan plan{Chunks(0, 6), Chunks(1, 6)};
    auto want = Seed(r.io, plan.reads, 3);
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < 6; ++i) data.push_back(RandomBytes(plan.writes[i].bytes, 300 + i));
    StepResult res = RunStep(r, plan, data);
    CHECK(res.commit.ok());
    for (size_t i = 0; i < want.size(); ++i) CHECK(res.got[i] == want[i]);
    CHECK(r.pager->Begin(StepPlan{}).ok());
    for (size_t i = 0; i < data.size(); ++i) {
      CHECK(r.io.Get(1, plan.writes[i].offset, plan.writes[i].bytes) == data[i]);
    }
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
    CHECK_EQ(r.pager->Stats().max_h2d_ahead, 1);
  });
}

TEST(RingAndArenaBoundTheReadAhead) {
  Within(120, "backpressure", [] {
    RigOptions o;
    o.config.arena_slots = 3;
    o.config.ring_slots = 2;
    Rig r(o);
    StepPlan plan{Chunks(0, 20), {}};
    auto want = Seed(r.io, plan.reads, 4);
    CHECK(r.pager->Begin(plan).ok());
    // Nobody takes: the pager fills the ring (2) and the arena (3), then stops.
    CHECK(Eventually([&] { return r.pager->Stats().reads_done == 5; }));
    std::this_thread::sleep_for(milliseconds(50));
    auto st = r.pager->Stats();
    CHECK_EQ(st.reads_done, uint64_t{5});
    CHECK(st.max_reads_in_flight <= 3);
    CHECK(st.max_h2d_ahead <= 2);
    CHECK_EQ(r.ops.Stats().copies[static_cast<int>(CopyKind::kHostToDevice)], uint64_t{2});
    // Taking them all drains the plan through the bounded buffers.
    std::vector<void*> dst;
    for (size_t i = 0; i < plan.reads.size(); ++i) {
      dst.push_back(r.ops.AllocDevice(plan.reads[i].bytes));
      CHECK(r.pager->Take(r.xla, dst.back(), plan.reads[i].bytes).ok());
    }
    CHECK(r.pager->Commit().ok());
    r.ops.SynchronizeStream(r.xla);
    for (size_t i = 0; i < dst.size(); ++i) {
      CHECK(std::memcmp(dst[i], want[i].data(), want[i].size()) == 0);
      r.ops.FreeDevice(dst[i]);
    }
    st = r.pager->Stats();
    CHECK(st.max_reads_in_flight <= 3);
    CHECK(st.max_h2d_ahead <= 2);
  });
}

TEST(APutWaitsForAFreeWriteSlotWhenTheDiskIsSlow) {
  Within(120, "write backpressure", [] {
    RigOptions o;
    o.write_delay = microseconds(5000);
    o.config.write_slots = 2;
    Rig r(o);
    StepPlan plan{{}, Chunks(1, 8)};
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < 8; ++i) data.push_back(RandomBytes(plan.writes[i].bytes, 500 + i));
    StepResult res = RunStep(r, plan, data);
    CHECK(res.commit.ok());
    CHECK(r.pager->Stats().put_wait_ns > 0);
    CHECK(r.pager->Begin(StepPlan{}).ok());
    for (size_t i = 0; i < 8; ++i) {
      CHECK(r.io.Get(1, plan.writes[i].offset, plan.writes[i].bytes) == data[i]);
    }
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
  });
}

TEST(CommitRunsOnlyAfterEveryWriteIsDurable) {
  Within(120, "commit", [] {
    RigOptions o;
    o.write_delay = microseconds(3000);
    o.config.write_slots = 4;
    Rig r(o);
    StepPlan plan{{}, Chunks(1, 10)};
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < 10; ++i) data.push_back(RandomBytes(plan.writes[i].bytes, 600 + i));
    std::atomic<int> checked{0}, complete{0};
    r.on_commit = [&](uint64_t) -> IoStatus {
      ++checked;
      bool all = r.io.writes_done() == 10;
      for (size_t i = 0; i < 10; ++i) {
        all = all && r.io.Get(1, plan.writes[i].offset, plan.writes[i].bytes) == data[i];
      }
      if (all) ++complete;
      return {};
    };
    StepResult res = RunStep(r, plan, data);
    CHECK(res.commit.ok());  // returns at once, the writes still running
    CHECK(r.pager->Begin(StepPlan{}).ok());  // waits for the commit
    CHECK_EQ(checked.load(), 1);
    CHECK_EQ(complete.load(), 1);
    CHECK_EQ(r.pager->committed_step(), uint64_t{1});
    CHECK_EQ(r.commit_crcs.size(), size_t{10});
  });
}

TEST(AReadErrorFailsTheTakeThatNeedsItAndTheStepDoesNotCommit) {
  Within(120, "read error", [] {
    Rig r;
    StepPlan plan{Chunks(0, 6), Chunks(1, 2)};
    auto want = Seed(r.io, plan.reads, 5);
    r.io.FailRead(plan.reads[3].offset);
    std::vector<std::vector<char>> data = {RandomBytes(plan.writes[0].bytes, 1),
                                           RandomBytes(plan.writes[1].bytes, 2)};
    StepResult res = RunStep(r, plan, data);
    CHECK(res.begin.ok());
    CHECK(!res.first_error.ok());
    CHECK_CONTAINS(res.first_error.message, "injected read error at offset " +
                                                std::to_string(plan.reads[3].offset));
    CHECK_EQ(res.got.size(), size_t{4});  // takes 0..2 ran, take 3 failed
    for (size_t i = 0; i < 3; ++i) CHECK(res.got[i] == want[i]);
    // The failed step never commits; the next one starts from its first chunk and does.
    r.io.FailRead(plan.reads[3].offset, false);
    StepResult again = RunStep(r, plan, data);
    CHECK(again.begin.ok());
    CHECK(again.commit.ok());
    for (size_t i = 0; i < want.size(); ++i) CHECK(again.got[i] == want[i]);
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK_EQ(r.Commits().size(), size_t{1});
    CHECK_EQ(r.Commits()[0], uint64_t{2});
  });
}

TEST(AChecksumMismatchFailsTheTake) {
  Within(120, "checksum", [] {
    Rig r;
    StepPlan write{{}, Chunks(0, 4)};
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < 4; ++i) data.push_back(RandomBytes(write.writes[i].bytes, 700 + i));
    CHECK(RunStep(r, write, data).commit.ok());
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK(r.pager->Commit().ok());
    // The committed checksums are verified on read: chunk 2 changes behind the pager's back.
    auto bad = data[2];
    bad[5] ^= 1;
    r.io.Put(0, write.writes[2].offset, bad);
    StepPlan read{Chunks(0, 4), {}};
    StepResult res = RunStep(r, read, {});
    CHECK_CONTAINS(res.first_error.message, "checksum mismatch in file 0 at offset " +
                                                std::to_string(write.writes[2].offset));
    CHECK_EQ(res.got.size(), size_t{3});
    CHECK(res.got[0] == data[0]);
    CHECK(res.got[1] == data[1]);
  });
}

TEST(AWriteErrorSurfacesAtTheNextBeginOnceAndBlocksTheCommit) {
  Within(120, "write error", [] {
    Rig r;
    StepPlan plan{{}, Chunks(1, 4)};
    r.io.FailWrite(plan.writes[1].offset);
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < 4; ++i) data.push_back(RandomBytes(plan.writes[i].bytes, 800 + i));
    StepResult res = RunStep(r, plan, data);
    CHECK(res.begin.ok());
    CHECK(res.first_error.ok());  // puts return before their writes
    IoStatus next = r.pager->Begin(StepPlan{});
    CHECK(!next.ok());
    CHECK_CONTAINS(next.message, "injected write error at offset " +
                                     std::to_string(plan.writes[1].offset));
    CHECK(r.Commits().empty());
    // Reported once: the Begin after it starts a step.
    r.io.FailWrite(plan.writes[1].offset, false);
    StepResult ok = RunStep(r, plan, data);
    CHECK(ok.begin.ok());
    CHECK(ok.commit.ok());
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK_EQ(r.Commits().size(), size_t{1});
  });
}

TEST(AnAbortedStepResetsTheCursorsAndNeverCommits) {
  Within(120, "abort", [] {
    Rig r;
    StepPlan plan{Chunks(0, 8), {}};
    auto want = Seed(r.io, plan.reads, 9);
    StepResult part = RunStep(r, plan, {}, microseconds(0), /*stop_after_takes=*/3);
    CHECK_EQ(part.got.size(), size_t{3});
    // XLA abandoned the program after three takes: no Commit. The next step starts over.
    StepResult full = RunStep(r, plan, {});
    CHECK(full.begin.ok());
    CHECK(full.commit.ok());
    CHECK_EQ(full.got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) CHECK(full.got[i] == want[i]);
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK_EQ(r.Commits().size(), size_t{1});
    CHECK_EQ(r.Commits()[0], uint64_t{2});
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
  });
}

TEST(PlanMismatchesFailWithAMessage) {
  Rig r;
  StepPlan plan{Chunks(0, 2), {}};
  Seed(r.io, plan.reads, 10);
  void* d = r.ops.AllocDevice(kStride);
  CHECK_CONTAINS(r.pager->Take(r.xla, d, 4096).message, "call Begin first");
  CHECK(r.pager->Begin(plan).ok());
  CHECK_CONTAINS(r.pager->Take(r.xla, d, 12345).message, "wants 12345 bytes but the plan reads");
  CHECK(r.pager->Begin(plan).ok());
  CHECK(r.pager->Take(r.xla, d, plan.reads[0].bytes).ok());
  CHECK_CONTAINS(r.pager->Commit().message, "1 of 2 planned takes");
  StepPlan big{{ChunkRef{0, 0, kStride + 1}}, {}};
  CHECK_CONTAINS(r.pager->Begin(big).message, "more than slot_bytes");
  r.ops.SynchronizeStream(r.xla);
  r.ops.FreeDevice(d);
}

TEST(NoDeadlockWithALaggingDeviceAndMinimalBuffers) {
  // The caller's stream lags 1 ms per operation and the host runs far ahead of it; one slot of
  // each kind. Every take may wait only for host I/O and for device work already enqueued.
  Within(300, "lagging device", [] {
    RigOptions o;
    o.xla_lag = microseconds(1000);
    o.delays = {microseconds(500), microseconds(500), microseconds(200)};
    o.config.arena_slots = 1;
    o.config.ring_slots = 1;
    o.config.write_slots = 1;
    Rig r(o);
    StepPlan plan{Chunks(0, 16), Chunks(1, 16)};
    auto want = Seed(r.io, plan.reads, 11);
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < 16; ++i) data.push_back(RandomBytes(plan.writes[i].bytes, 900 + i));
    for (int step = 0; step < 3; ++step) {
      StepResult res = RunStep(r, plan, data);
      CHECK(res.commit.ok());
      for (size_t i = 0; i < want.size(); ++i) CHECK(res.got[i] == want[i]);
    }
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK_EQ(r.Commits().size(), size_t{3});
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
  });
}

TEST(ASlowDiskAndAFastDeviceStillDeliverEverything) {
  Within(120, "slow disk", [] {
    RigOptions o;
    o.delays = {microseconds(0), microseconds(0), microseconds(0)};
    o.read_delay = microseconds(3000);
    Rig r(o);
    StepPlan plan{Chunks(0, 10), {}};
    auto want = Seed(r.io, plan.reads, 12);
    StepResult res = RunStep(r, plan, {});
    CHECK(res.commit.ok());
    for (size_t i = 0; i < want.size(); ++i) CHECK(res.got[i] == want[i]);
    CHECK(r.pager->Stats().take_wait_ns > 0);  // the takes waited for the disk, on the host
  });
}


// ---- Host-side paging metadata: per-site cursors, registered plans, call-time ordering. ----

TEST(TakeAndPutReturnBeforeTheirCopiesRunAndTheCommitComesAfterThem) {
  // Device copies take 200 ms; every handler-side call returns once its work is enqueued,
  // and the commit runs only after the D2H copies and the disk writes.
  Within(120, "asynchronous calls", [] {
    RigOptions o;
    o.delays = {microseconds(0), microseconds(200000), microseconds(200000)};
    o.read_delay = microseconds(0);
    o.write_delay = microseconds(0);
    Rig r(o);
    StepPlan plan{Chunks(0, 1), Chunks(1, 1)};
    auto want = Seed(r.io, plan.reads, 20);
    auto data = RandomBytes(plan.writes[0].bytes, 2000);
    std::atomic<uint64_t> d2h_at_commit{0};
    std::atomic<bool> disk_at_commit{false};
    r.on_commit = [&](uint64_t) -> IoStatus {
      d2h_at_commit = r.ops.Stats().copies[static_cast<int>(CopyKind::kDeviceToHost)];
      disk_at_commit = r.io.Get(1, plan.writes[0].offset, plan.writes[0].bytes) == data;
      return {};
    };
    CHECK(r.pager->Begin(plan).ok());
    // The chunk reaches the device ring before the take (no host wait in it).
    CHECK(Eventually([&] {
      return r.ops.Stats().copies[static_cast<int>(CopyKind::kHostToDevice)] == 1;
    }));
    void* dst = r.ops.AllocDevice(plan.reads[0].bytes);
    void* src = r.ops.AllocDevice(plan.writes[0].bytes);
    std::memcpy(src, data.data(), data.size());
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(r.pager->Take(r.xla, dst, plan.reads[0].bytes).ok());
    CHECK(r.pager->Put(r.xla, src, plan.writes[0].bytes).ok());
    CHECK(r.pager->Commit().ok());
    const auto spent = std::chrono::steady_clock::now() - t0;
    // Returned before the first 200 ms copy could finish: nothing was waited for.
    CHECK_EQ(r.ops.Stats().copies[static_cast<int>(CopyKind::kDeviceToDevice)], uint64_t{0});
    CHECK(spent < milliseconds(150));
    CHECK(r.Commits().empty());
    r.ops.SynchronizeStream(r.xla);
    CHECK(std::memcmp(dst, want[0].data(), want[0].size()) == 0);
    CHECK(r.pager->Begin(StepPlan{}).ok());  // waits for the step's commit
    CHECK_EQ(r.Commits().size(), size_t{1});
    CHECK_EQ(d2h_at_commit.load(), uint64_t{1});
    CHECK(disk_at_commit.load());
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
    r.ops.FreeDevice(dst);
    r.ops.FreeDevice(src);
  });
}

TEST(AReadInTheNextStepSeesTheBytesThisStepWrote) {
  // Each step reads chunks and writes them back changed (an optimizer's state); the disk is
  // slow and the next Begin comes at once: every read sees the previous step's bytes.
  Within(120, "read after write", [] {
    RigOptions o;
    o.write_delay = microseconds(5000);
    o.delays = {microseconds(200), microseconds(3000), microseconds(100)};
    Rig r(o);
    const auto refs = Chunks(0, 6);
    StepPlan plan{refs, refs};
    auto prev = Seed(r.io, refs, 21);
    for (int step = 0; step < 4; ++step) {
      std::vector<std::vector<char>> data;
      for (size_t i = 0; i < refs.size(); ++i) {
        data.push_back(RandomBytes(refs[i].bytes, 2100 + 10 * step + i));
      }
      StepResult res = RunStep(r, plan, data);
      CHECK(res.begin.ok());
      CHECK(res.first_error.ok());
      CHECK(res.commit.ok());
      CHECK_EQ(res.got.size(), refs.size());
      for (size_t i = 0; i < res.got.size(); ++i) CHECK(res.got[i] == prev[i]);
      prev = data;
    }
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK_EQ(r.Commits().size(), size_t{4});
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
  });
}

TEST(EachSiteHasItsOwnCursorWhichRestartsEveryStep) {
  // Two take sites and two put sites, as two paging calls in a scanned layer would be: the
  // plan interleaves them (site 0 on file 0, site 1 on file 2), the calls come site 1 first,
  // within the ring. Each call's chunk is its site's next one, whatever the other site did.
  Within(120, "sites", [] {
    RigOptions o;
    o.config.ring_slots = 2;
    Rig r(o);
    StepPlan plan;
    for (int c = 0; c < 4; ++c) {
      for (int site = 0; site < 2; ++site) {
        plan.reads.push_back({2 * site, c * kStride, SizeOf(c + site)});
        plan.read_sites.push_back(site);
        plan.writes.push_back({2 * site + 1, c * kStride, SizeOf(c + site)});
        plan.write_sites.push_back(site);
      }
    }
    auto want = Seed(r.io, plan.reads, 22);
    for (int step = 0; step < 2; ++step) {
      CHECK(r.pager->Begin(plan).ok());
      CHECK_EQ(r.pager->TakeCursor(0), size_t{0});
      CHECK_EQ(r.pager->TakeCursor(1), size_t{0});
      CHECK_EQ(r.pager->PutCursor(1), size_t{0});
      std::vector<void*> bufs;
      std::vector<size_t> index;
      for (int c = 0; c < 4; ++c) {
        for (int site : {1, 0}) {
          const size_t i = static_cast<size_t>(2 * c + site);
          void* d = r.ops.AllocDevice(plan.reads[i].bytes);
          bufs.push_back(d);
          index.push_back(i);
          CHECK(r.pager->Take(site, r.xla, d, plan.reads[i].bytes).ok());
          CHECK_EQ(r.pager->TakeCursor(site), static_cast<size_t>(c + 1));
          CHECK(r.pager->Put(site, r.xla, d, plan.writes[i].bytes).ok());
          CHECK_EQ(r.pager->PutCursor(site), static_cast<size_t>(c + 1));
        }
      }
      CHECK(r.pager->Commit().ok());
      r.ops.SynchronizeStream(r.xla);
      for (size_t k = 0; k < bufs.size(); ++k) {
        CHECK(std::memcmp(bufs[k], want[index[k]].data(), want[index[k]].size()) == 0);
      }
      CHECK(r.pager->Begin(StepPlan{}).ok());  // the writes are on disk
      CHECK(r.pager->Commit().ok());
      for (size_t i = 0; i < plan.writes.size(); ++i) {
        CHECK(r.io.Get(plan.writes[i].file, plan.writes[i].offset, plan.writes[i].bytes) ==
              want[i]);
      }
      for (void* b : bufs) r.ops.FreeDevice(b);
    }
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
    CHECK_EQ(r.pager->Stats().takes, uint64_t{16});
  });
}

TEST(NoDeadlockWithSitesOutOfOrderAndALaggingDevice) {
  // Two sites whose calls swap order against the plan, the caller's stream lagging 1 ms per
  // operation, one arena slot and a two-slot ring: every call is served, nothing overlaps.
  Within(300, "sites, lagging device", [] {
    RigOptions o;
    o.xla_lag = microseconds(1000);
    o.config.arena_slots = 1;
    o.config.ring_slots = 2;
    o.config.write_slots = 1;
    Rig r(o);
    StepPlan plan;
    for (int c = 0; c < 6; ++c) {
      for (int site = 0; site < 2; ++site) {
        plan.reads.push_back({0, (2 * c + site) * kStride, SizeOf(2 * c + site)});
        plan.read_sites.push_back(site);
        plan.writes.push_back({1, (2 * c + site) * kStride, SizeOf(2 * c + site)});
        plan.write_sites.push_back(1 - site);
      }
    }
    auto want = Seed(r.io, plan.reads, 26);
    for (int step = 0; step < 2; ++step) {
      CHECK(r.pager->Begin(plan).ok());
      std::vector<void*> bufs(plan.reads.size());
      for (int c = 0; c < 6; ++c) {
        for (int site : {1, 0}) {
          const size_t i = static_cast<size_t>(2 * c + site);
          bufs[i] = r.ops.AllocDevice(plan.reads[i].bytes);
          CHECK(r.pager->Take(site, r.xla, bufs[i], plan.reads[i].bytes).ok());
        }
        for (int site : {0, 1}) {  // write site 0 writes the odd chunks
          const size_t j = static_cast<size_t>(2 * c + 1 - site);
          CHECK(r.pager->Put(site, r.xla, bufs[j], plan.writes[j].bytes).ok());
        }
      }
      CHECK(r.pager->Commit().ok());
      r.ops.SynchronizeStream(r.xla);
      for (size_t i = 0; i < bufs.size(); ++i) {
        CHECK(std::memcmp(bufs[i], want[i].data(), want[i].size()) == 0);
      }
      CHECK(r.pager->Begin(StepPlan{}).ok());
      CHECK(r.pager->Commit().ok());
      for (size_t i = 0; i < plan.writes.size(); ++i) {
        CHECK(r.io.Get(1, plan.writes[i].offset, plan.writes[i].bytes) == want[i]);
      }
      for (void* b : bufs) r.ops.FreeDevice(b);
    }
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK_EQ(r.Commits().size(), size_t{4});
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
  });
}

TEST(ATakeTooFarAheadOfThePlanFailsAtOnceInsteadOfHanging) {
  Within(60, "out of order", [] {
    RigOptions o;
    o.config.ring_slots = 2;
    Rig r(o);
    StepPlan plan{Chunks(0, 6), {}, {0, 0, 0, 1, 1, 1}, {}};
    Seed(r.io, plan.reads, 23);
    CHECK(r.pager->Begin(plan).ok());
    void* d = r.ops.AllocDevice(kStride);
    IoStatus st = r.pager->Take(1, r.xla, d, plan.reads[3].bytes);
    CHECK(!st.ok());
    CHECK_CONTAINS(st.message, "take #1 of site 1 is plan read 3 but plan read 0 is not taken");
    CHECK_CONTAINS(st.message, "do not follow the plan's read order");
    CHECK_CONTAINS(r.pager->Take(2, r.xla, d, 4096).message,
                   "take #1 of site 2 but the step's plan gives that site 0 reads");
    // The failed step never commits; the next one runs in plan order.
    StepResult ok = RunStep(r, StepPlan{Chunks(0, 3), {}}, {});
    CHECK(ok.commit.ok());
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK_EQ(r.Commits().size(), size_t{1});
    r.ops.SynchronizeStream(r.xla);
    r.ops.FreeDevice(d);
  });
}

TEST(APageReadOfAChunkThisStepAlreadyWroteIsRefused) {
  Within(60, "read after write in one step", [] {
    Rig r;
    const auto refs = Chunks(0, 1);
    StepPlan plan{refs, refs};
    Seed(r.io, refs, 24);
    CHECK(r.pager->Begin(plan).ok());
    void* d = r.ops.AllocDevice(refs[0].bytes);
    CHECK(r.pager->Put(r.xla, d, refs[0].bytes).ok());
    IoStatus st = r.pager->Take(r.xla, d, refs[0].bytes);
    CHECK_CONTAINS(st.message, "which this step already wrote");
    r.ops.SynchronizeStream(r.xla);
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK(r.Commits().empty());
    r.ops.FreeDevice(d);
  });
}

TEST(RegisteredPlansAreBegunByIdAndCheckedWhenRegistered) {
  Within(60, "plan ids", [] {
    Rig r;
    StepPlan plan{Chunks(0, 3), {}};
    auto want = Seed(r.io, plan.reads, 25);
    r.pager->RegisterPlan(7, plan);
    CHECK(r.pager->HasPlan(7));
    CHECK(!r.pager->HasPlan(8));
    CHECK_EQ(r.pager->plan_id(), int64_t{-1});
    CHECK(r.pager->Begin(int64_t{7}).ok());
    CHECK_EQ(r.pager->plan_id(), int64_t{7});
    std::vector<void*> dst;
    for (size_t i = 0; i < 3; ++i) {
      dst.push_back(r.ops.AllocDevice(plan.reads[i].bytes));
      CHECK(r.pager->Take(r.xla, dst.back(), plan.reads[i].bytes).ok());
    }
    CHECK(r.pager->Commit().ok());
    CHECK_CONTAINS(r.pager->Begin(int64_t{8}).message, "plan 8, which is not registered");
    std::string thrown;
    try {
      r.pager->RegisterPlan(9, StepPlan{Chunks(0, 2), {}, {0}, {}});
    } catch (const std::invalid_argument& e) {
      thrown = e.what();
    }
    CHECK_CONTAINS(thrown, "plan 9: plan has 2 reads but 1 read sites");
    CHECK(!r.pager->HasPlan(9));
    r.ops.SynchronizeStream(r.xla);
    for (size_t i = 0; i < 3; ++i) {
      CHECK(std::memcmp(dst[i], want[i].data(), want[i].size()) == 0);
      r.ops.FreeDevice(dst[i]);
    }
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK_EQ(r.Commits().size(), size_t{1});
  });
}
}  // namespace

namespace {

using jaxoff::aio::Engine;
using jaxoff::aio::EngineChunkIo;
using jaxoff::aio::EngineConfig;
using jaxoff::aio::File;

// Writes a step through the real engine (O_DIRECT from the pinned write slots) and reads it
// back in the next step, with checksums verified against the committed table.
void EngineRoundTrip(DeviceOps& ops) {
  EngineConfig c;
  c.block_size = 64 << 10;
  c.queue_depth = 4;
  c.threads = 2;
  c.pool_bytes = 256 << 10;
  c.backend = jaxoff::aio::testing::SelectedBackend();
  auto engine = std::make_shared<Engine>(c);
  const std::string dir = jaxoff::aio::testing::TempDir();
  auto file = std::make_shared<File>(std::vector<std::string>{dir + "/pages"}, true, true, true);
  EngineChunkIo io(engine, {file});
  PagerConfig pc;
  pc.slot_bytes = kStride;
  int commits = 0;
  auto xla = ops.CreateStream();
  {
    GpuPager pager(&ops, &io, pc, [&](uint64_t, const GpuPager::Crcs&) -> IoStatus {
      ++commits;
      return {};
    });
    const auto refs = Chunks(0, 5);
    std::vector<std::vector<char>> data;
    std::vector<void*> bufs;
    CHECK(pager.Begin(StepPlan{{}, refs}).ok());
    for (size_t i = 0; i < refs.size(); ++i) {
      data.push_back(RandomBytes(refs[i].bytes, 1234 + i));
      bufs.push_back(ops.AllocDevice(refs[i].bytes));
      ops.CopyAsync(bufs.back(), data.back().data(), refs[i].bytes, CopyKind::kHostToDevice, xla);
      CHECK(pager.Put(xla, bufs.back(), refs[i].bytes).ok());
    }
    CHECK(pager.Commit().ok());
    CHECK(pager.Begin(StepPlan{refs, {}}).ok());
    std::vector<std::vector<char>> host(refs.size());
    for (size_t i = 0; i < refs.size(); ++i) {
      CHECK(pager.Take(xla, bufs[i], refs[i].bytes).ok());
      host[i].resize(refs[i].bytes);
      ops.CopyAsync(host[i].data(), bufs[i], refs[i].bytes, CopyKind::kDeviceToHost, xla);
    }
    CHECK(pager.Commit().ok());
    ops.SynchronizeStream(xla);
    for (size_t i = 0; i < refs.size(); ++i) CHECK(host[i] == data[i]);
    CHECK(pager.Begin(StepPlan{}).ok());
    CHECK_EQ(commits, 2);
    for (void* b : bufs) ops.FreeDevice(b);
  }
  ops.DestroyStream(xla);
}

TEST(EngineChunkIoRoundTripThroughTheSimulatedDevice) {
  SimDeviceOps ops({microseconds(100), microseconds(100), microseconds(50)});
  EngineRoundTrip(ops);
  CHECK_EQ(ops.Stats().hazards, uint64_t{0});
}

}  // namespace
