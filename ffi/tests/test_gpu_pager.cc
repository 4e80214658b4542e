// The GPU pager's data path against the simulated device (SimDeviceOps) and an in-memory
// ChunkIo: ordering, slot reuse, backpressure, durability, versions and their check, commit,
// errors, aborted steps, deadlocks; the same pager on host memory (HostDeviceOps); and a
// seeded randomised schedule test over both. The mutant builds (ffi/CMakeLists.txt) run
// these tests against pagers with known bugs: each must fail.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "crc32c.h"
#include "fake_chunk_io.h"
#include "file_handle.h"
#include "gpu_pager.h"
#include "host_device_ops.h"
#include "sim_device_ops.h"
#include "test_util.h"

namespace {

using jaxoff::aio::ChunkRef;
using jaxoff::aio::CopyKind;
using jaxoff::aio::Crc32c;
using jaxoff::aio::DeviceOps;
using jaxoff::aio::GpuPager;
using jaxoff::aio::HostDeviceOps;
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
  uint64_t version = 0;  // the store version the pager starts at
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
      : ops(o.delays), io(2, o.read_delay, o.write_delay, &ops), xla(ops.CreateStream()) {
    ops.SetStreamLag(xla, o.xla_lag);
    pager = std::make_unique<GpuPager>(
        &ops, &io, o.config,
        [this](uint64_t new_version, const GpuPager::Crcs& crcs) -> IoStatus {
          std::lock_guard<std::mutex> lock(mu);
          committed.push_back(new_version);
          commit_crcs = crcs;
          if (on_commit) return on_commit(new_version);
          return {};
        },
        o.version);
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
  std::vector<uint64_t> committed;  // the new versions the commit callback was called with
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

// `got` holds exactly the chunks of `want`, in order. A `got` cut short (a take failed) is a
// failed check, never a read past either vector's end: a CHECK does not end the test.
#define CHECK_CHUNKS(got, want)                                                            \
  do {                                                                                     \
    const auto& _got = (got);                                                              \
    const auto& _want = (want);                                                            \
    CHECK_EQ(_got.size(), _want.size());                                                   \
    for (size_t _i = 0; _i < std::min(_got.size(), _want.size()); ++_i) {                  \
      CHECK(_got[_i] == _want[_i]);                                                        \
    }                                                                                      \
  } while (0)

// The new versions the commit callback was called with, printable in a CHECK_EQ.
std::string Versions(const std::vector<uint64_t>& v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "}";
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
      CHECK_CHUNKS(res.got, want);
      // The commit came only once every write was on disk (Begin waits for it). The empty
      // step between (no writes) makes no version of its own.
      CHECK(r.pager->Begin(StepPlan{}).ok());
      CHECK_EQ(r.pager->version(), static_cast<uint64_t>(step + 1));
      CHECK(r.pager->Commit().ok());
      for (size_t i = 0; i < data.size(); ++i) {
        CHECK(r.io.Get(1, plan.writes[i].offset, plan.writes[i].bytes) == data[i]);
        uint32_t crc = 0;
        CHECK(r.pager->Checksum(plan.writes[i], &crc));
        CHECK_EQ(crc, Crc32c(data[i].data(), data[i].size()));
      }
    }
    CHECK(r.pager->Begin(StepPlan{}).ok());  // settles the last empty step
    // Three steps committed versions 1, 2, 3; the three empty ones ended without a version.
    CHECK_EQ(Versions(r.Commits()), std::string("{1, 2, 3}"));
    CHECK_EQ(r.pager->version(), uint64_t{3});
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
    auto st = r.pager->Stats();
    CHECK_EQ(st.takes, uint64_t{36});
    CHECK_EQ(st.puts, uint64_t{36});
    CHECK_EQ(st.commits, uint64_t{3});
    CHECK_EQ(st.read_only_steps, uint64_t{3});
    CHECK_EQ(st.syncs, uint64_t{3});
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
    CHECK_CHUNKS(res.got, want);
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
    CHECK_CHUNKS(res.got, want);
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
    CHECK_EQ(r.pager->version(), uint64_t{1});
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
    for (size_t i = 0; i < std::min<size_t>(3, res.got.size()); ++i) CHECK(res.got[i] == want[i]);
    // The failed step never commits; the next one starts from its first chunk and does.
    r.io.FailRead(plan.reads[3].offset, false);
    StepResult again = RunStep(r, plan, data);
    CHECK(again.begin.ok());
    CHECK(again.commit.ok());
    CHECK_CHUNKS(again.got, want);
    CHECK(r.pager->Begin(StepPlan{}).ok());
    // The first step failed: version 1 is the second's.
    CHECK_EQ(Versions(r.Commits()), std::string("{1}"));
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
    for (size_t i = 0; i < std::min<size_t>(2, res.got.size()); ++i) CHECK(res.got[i] == data[i]);
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
    StepPlan plan{Chunks(0, 8), Chunks(1, 8)};
    auto want = Seed(r.io, plan.reads, 9);
    std::vector<std::vector<char>> old_data, data;
    for (size_t i = 0; i < plan.writes.size(); ++i) {
      old_data.push_back(RandomBytes(plan.writes[i].bytes, 950 + i));
      data.push_back(RandomBytes(plan.writes[i].bytes, 970 + i));
    }
    StepResult part = RunStep(r, plan, old_data, microseconds(0), /*stop_after_takes=*/3);
    CHECK_EQ(part.got.size(), size_t{3});
    // XLA abandoned the program after three takes (and three puts): no Commit. The next step
    // starts over.
    StepResult full = RunStep(r, plan, data);
    CHECK(full.begin.ok());
    CHECK(full.commit.ok());
    CHECK_CHUNKS(full.got, want);
    CHECK(r.pager->Begin(StepPlan{}).ok());
    // The first step failed: version 1 is the second's, with the second's checksums only.
    CHECK_EQ(Versions(r.Commits()), std::string("{1}"));
    CHECK_EQ(r.pager->version(), uint64_t{1});
    CHECK_EQ(r.commit_crcs.size(), plan.writes.size());
    for (size_t i = 0; i < plan.writes.size(); ++i) {
      uint32_t crc = 0;
      CHECK(r.pager->Checksum(plan.writes[i], &crc));
      CHECK_EQ(crc, Crc32c(data[i].data(), data[i].size()));
    }
    CHECK_EQ(r.pager->Stats().commits, uint64_t{1});
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
      CHECK_CHUNKS(res.got, want);
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
    CHECK_CHUNKS(res.got, want);
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
      CHECK(r.pager->Begin(StepPlan{}).ok());  // the writes are on disk, the step committed
      CHECK_EQ(r.pager->version(), static_cast<uint64_t>(step + 1));
      CHECK(r.pager->Commit().ok());
      for (size_t i = 0; i < plan.writes.size(); ++i) {
        CHECK(r.io.Get(1, plan.writes[i].offset, plan.writes[i].bytes) == want[i]);
      }
      for (void* b : bufs) r.ops.FreeDevice(b);
    }
    CHECK(r.pager->Begin(StepPlan{}).ok());
    // The two steps committed; the empty steps between them (no writes) made no version.
    CHECK_EQ(Versions(r.Commits()), std::string("{1, 2}"));
    CHECK_EQ(r.pager->Stats().read_only_steps, uint64_t{2});
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
  });
}

TEST(ATakeTooFarAheadOfThePlanFailsAtOnceInsteadOfHanging) {
  Within(60, "out of order", [] {
    RigOptions o;
    o.config.ring_slots = 2;
    Rig r(o);
    StepPlan plan{Chunks(0, 6), Chunks(1, 6), {0, 0, 0, 1, 1, 1}, {}};
    Seed(r.io, plan.reads, 23);
    CHECK(r.pager->Begin(plan).ok());
    void* d = r.ops.AllocDevice(kStride);
    IoStatus st = r.pager->Take(1, r.xla, d, plan.reads[3].bytes);
    CHECK(!st.ok());
    CHECK_CONTAINS(st.message, "take #1 of site 1 is plan read 3 but plan read 0 is not taken");
    CHECK_CONTAINS(st.message, "do not follow the plan's read order");
    CHECK_CONTAINS(r.pager->Take(2, r.xla, d, 4096).message,
                   "take #1 of site 2 but the step's plan gives that site 0 reads");
    // The failed step never commits, even with its puts made and Commit called; the next one
    // runs in plan order and does.
    void* s = r.ops.AllocDevice(kStride);
    std::memset(s, 5, kStride);
    for (const ChunkRef& w : plan.writes) CHECK(r.pager->Put(r.xla, s, w.bytes).ok());
    CHECK(!r.pager->Commit().ok());
    StepPlan next{Chunks(0, 3), Chunks(1, 3)};
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < next.writes.size(); ++i) {
      data.push_back(RandomBytes(next.writes[i].bytes, 2300 + i));
    }
    StepResult ok = RunStep(r, next, data);
    CHECK(ok.commit.ok());
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK_EQ(Versions(r.Commits()), std::string("{1}"));
    // Version 1 holds the second step's checksums, none of the failed one's.
    uint32_t crc = 0;
    for (size_t i = 0; i < next.writes.size(); ++i) {
      CHECK(r.pager->Checksum(next.writes[i], &crc));
      CHECK_EQ(crc, Crc32c(data[i].data(), data[i].size()));
    }
    for (size_t i = next.writes.size(); i < plan.writes.size(); ++i) {
      CHECK(!r.pager->Checksum(plan.writes[i], &crc));
    }
    r.ops.SynchronizeStream(r.xla);
    r.ops.FreeDevice(d);
    r.ops.FreeDevice(s);
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
    StepPlan plan{Chunks(0, 3), Chunks(1, 3)};
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
      CHECK(r.pager->Put(r.xla, dst.back(), plan.writes[i].bytes).ok());  // written back
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
    CHECK_EQ(Versions(r.Commits()), std::string("{1}"));
    for (size_t i = 0; i < 3; ++i) {
      CHECK(r.io.Durable(1, plan.writes[i].offset, plan.writes[i].bytes) == want[i]);
    }
  });
}

// ---- The simulator's own checks: host accesses and memsets. ----------------------------

TEST(SimDetectsAHostAccessOverlappingACopyInFlightEitherWay) {
  // The host declares the bytes it touches; the test touches none (so ThreadSanitizer has no
  // race to see), it only declares, as the fake disk does around its copies.
  SimDeviceOps ops({microseconds(20000), microseconds(20000), microseconds(0)});
  auto s = ops.CreateStream();
  void* pinned = ops.AllocPinned(8192);
  void* dev = ops.AllocDevice(8192);
  // A copy in flight, then a host write over the bytes it reads: an arena slot refilled
  // while its H2D copy still reads it.
  ops.CopyAsync(dev, pinned, 8192, CopyKind::kHostToDevice, s);
  std::this_thread::sleep_for(milliseconds(5));
  ops.BeginHostAccess(static_cast<char*>(pinned) + 4096, 100, /*write=*/true, "a disk read");
  ops.EndHostAccess(static_cast<char*>(pinned) + 4096, 100, true);
  ops.SynchronizeStream(s);
  CHECK_EQ(ops.Stats().hazards, uint64_t{1});
  CHECK_CONTAINS(ops.FirstHazard(), "a disk read (100 bytes) writes bytes while H2D copy reads");
  // A host read running, then a copy starting that writes those bytes: a disk write reading a
  // write slot that a D2H copy fills.
  {
    SimDeviceOps::HostAccess reading(&ops, pinned, 8192, /*write=*/false, "a disk write");
    ops.CopyAsync(pinned, dev, 8192, CopyKind::kDeviceToHost, s);
    std::this_thread::sleep_for(milliseconds(5));
  }
  ops.SynchronizeStream(s);
  CHECK_EQ(ops.Stats().hazards, uint64_t{2});
  // Reads on both sides, or disjoint bytes, are no hazard; neither is an access after the
  // copy is done.
  ops.CopyAsync(dev, pinned, 4096, CopyKind::kHostToDevice, s);
  std::this_thread::sleep_for(milliseconds(5));
  { SimDeviceOps::HostAccess a(&ops, pinned, 4096, /*write=*/false); }
  { SimDeviceOps::HostAccess b(&ops, static_cast<char*>(pinned) + 4096, 4096, true); }
  ops.SynchronizeStream(s);
  { SimDeviceOps::HostAccess c(&ops, pinned, 8192, true); }
  { SimDeviceOps::HostAccess none(nullptr, pinned, 8192, true); }
  CHECK_EQ(ops.Stats().hazards, uint64_t{2});
  // A memset is a write on its stream like a copy.
  {
    SimDeviceOps::HostAccess reading(&ops, dev, 64, /*write=*/false);
    ops.MemsetAsync(dev, 0, 64, s);
    ops.SynchronizeStream(s);
  }
  CHECK_EQ(ops.Stats().hazards, uint64_t{3});
  CHECK_CONTAINS(ops.FirstHazard(), "a disk read");  // the first stays described
  ops.DestroyStream(s);
  ops.FreePinned(pinned);
  ops.FreeDevice(dev);
}

TEST(SimMemsetRunsInStreamOrder) {
  SimDeviceOps ops({microseconds(2000), microseconds(0), microseconds(0)});
  auto s = ops.CreateStream();
  std::vector<char> host(256, 7);
  void* dev = ops.AllocDevice(256);
  ops.CopyAsync(dev, host.data(), 256, CopyKind::kHostToDevice, s);
  ops.MemsetAsync(dev, 0, 128, s);  // after the copy, on the same stream
  ops.SynchronizeStream(s);
  CHECK_EQ(static_cast<const char*>(dev)[0], char{0});
  CHECK_EQ(static_cast<const char*>(dev)[127], char{0});
  CHECK_EQ(static_cast<const char*>(dev)[128], char{7});
  CHECK_EQ(ops.Stats().hazards, uint64_t{0});
  ops.DestroyStream(s);
  ops.FreeDevice(dev);
}

// ---- Durability, versions, the version check, Settle, Reset, TakeReady. ----------------

TEST(TheCommitComesAfterTheStepsFilesAreSynced) {
  // Writes to two files; the commit callback sees every write durable (synced), and the sync
  // named exactly the files the step wrote, once each.
  Within(120, "sync before commit", [] {
    RigOptions o;
    o.write_delay = microseconds(1000);
    Rig r(o);
    StepPlan plan{{}, Chunks(1, 3)};
    for (const ChunkRef& c : Chunks(3, 3)) plan.writes.push_back(c);
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < plan.writes.size(); ++i) {
      data.push_back(RandomBytes(plan.writes[i].bytes, 3100 + i));
    }
    std::atomic<int> durable{0};
    r.on_commit = [&](uint64_t v) -> IoStatus {
      bool all = v == 1;
      for (size_t i = 0; i < plan.writes.size(); ++i) {
        const ChunkRef& w = plan.writes[i];
        all = all && r.io.Durable(w.file, w.offset, w.bytes) == data[i];
      }
      if (all) ++durable;
      return {};
    };
    StepResult res = RunStep(r, plan, data);
    CHECK(res.commit.ok());
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(durable.load(), 1);
    CHECK_EQ(r.io.syncs(), uint64_t{1});
    CHECK(r.io.synced_files() == (std::vector<int>{1, 3}));
    CHECK_EQ(r.pager->Stats().syncs, uint64_t{1});
    // A step with no writes (one that only reads) has nothing to sync and makes no version.
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK(r.pager->Commit().ok());
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(r.io.syncs(), uint64_t{1});
    CHECK_EQ(r.pager->version(), uint64_t{1});
    CHECK_EQ(r.Commits().size(), size_t{1});
    CHECK_EQ(r.pager->Stats().read_only_steps, uint64_t{1});
  });
}

TEST(ASyncErrorFailsTheStepAndKeepsTheVersion) {
  Within(120, "sync error", [] {
    Rig r;
    StepPlan plan{{}, Chunks(1, 3)};
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < 3; ++i) data.push_back(RandomBytes(plan.writes[i].bytes, 3200 + i));
    r.io.FailSync();
    StepResult res = RunStep(r, plan, data);
    CHECK(res.commit.ok());  // the sync runs later, on the pager thread
    IoStatus next = r.pager->Begin(StepPlan{});
    CHECK_EQ(next.err, EIO);
    CHECK_CONTAINS(next.message, "injected sync error");
    CHECK_CONTAINS(next.message, "before committing version 1");
    CHECK(r.Commits().empty());
    CHECK_EQ(r.pager->version(), uint64_t{0});
    uint32_t crc = 0;
    CHECK(!r.pager->Checksum(plan.writes[0], &crc));  // the failed step's checksums stay out
    r.io.FailSync(false);
    CHECK(RunStep(r, plan, data).commit.ok());
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(r.pager->version(), uint64_t{1});
    CHECK(r.pager->Checksum(plan.writes[0], &crc));
    CHECK_EQ(r.pager->Stats().syncs, uint64_t{2});
  });
}

// Alternating slots: chunk c of the store at file 0, offset (2c + slot) * kStride; a step
// reading version v reads slot v % 2 and writes slot (v + 1) % 2.
StepPlan SlotPlan(int chunks, int read_slot) {
  StepPlan p;
  for (int c = 0; c < chunks; ++c) {
    p.reads.push_back({0, (2 * c + read_slot) * kStride, SizeOf(c)});
    p.writes.push_back({0, (2 * c + 1 - read_slot) * kStride, SizeOf(c)});
  }
  return p;
}

TEST(AFailedCommitLeavesThePreviousVersionReadableWithItsChecksums) {
  // Steps alternate between two slots per chunk; the commit of step 3 fails. The store stays
  // at version 2, and the next step reads version 2 (step 2's bytes, verified against step 2's
  // checksums) from the slot step 3 did not touch.
  Within(120, "failed commit", [] {
    Rig r;
    const int n = 4;
    r.pager->RegisterPlan(5, SlotPlan(n, 0), SlotPlan(n, 1));
    std::vector<std::vector<char>> slot0;
    for (int c = 0; c < n; ++c) {
      slot0.push_back(RandomBytes(SizeOf(c), 3300 + c));
      r.io.Put(0, 2 * c * kStride, slot0.back());
      r.pager->SetChecksum({0, 2 * c * kStride, 0}, Crc32c(slot0.back().data(), SizeOf(c)));
    }
    auto step = [&](uint32_t seed, std::vector<std::vector<char>>* got) {
      std::vector<std::vector<char>> data;
      for (int c = 0; c < n; ++c) data.push_back(RandomBytes(SizeOf(c), seed + c));
      CHECK(r.pager->Begin(int64_t{5}).ok());
      std::vector<void*> bufs;
      for (int c = 0; c < n; ++c) {
        bufs.push_back(r.ops.AllocDevice(SizeOf(c)));
        CHECK(r.pager->Take(r.xla, bufs.back(), SizeOf(c)).ok());
        void* src = r.ops.AllocDevice(SizeOf(c));
        std::memcpy(src, data[c].data(), SizeOf(c));
        bufs.push_back(src);
        CHECK(r.pager->Put(r.xla, src, SizeOf(c)).ok());
      }
      CHECK(r.pager->Commit().ok());
      r.ops.SynchronizeStream(r.xla);
      got->clear();
      for (int c = 0; c < n; ++c) {
        const char* p = static_cast<const char*>(bufs[2 * c]);
        got->emplace_back(p, p + SizeOf(c));
      }
      for (void* b : bufs) r.ops.FreeDevice(b);
      return data;
    };
    std::vector<std::vector<char>> got;
    auto v1 = step(3400, &got);  // reads slot 0 (version 0), writes slot 1
    CHECK(got == slot0);
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(r.pager->version(), uint64_t{1});
    auto v2 = step(3500, &got);  // reads slot 1, writes slot 0
    CHECK(got == v1);
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(r.pager->version(), uint64_t{2});
    const GpuPager::Crcs at_v2 = r.pager->Checksums();
    r.on_commit = [](uint64_t v) -> IoStatus {
      IoStatus st;
      st.err = EIO;
      st.message = "injected commit error at version " + std::to_string(v);
      return st;
    };
    step(3600, &got);  // reads slot 0 (version 2), writes slot 1: not committed
    CHECK(got == v2);
    IoStatus st = r.pager->Settle();
    CHECK_CONTAINS(st.message, "injected commit error at version 3");
    CHECK(r.pager->Settle().ok());  // reported once
    CHECK_EQ(r.pager->version(), uint64_t{2});
    CHECK(r.pager->Checksums() == at_v2);
    r.on_commit = nullptr;
    auto v3 = step(3700, &got);  // reads version 2 again: slot 0, step 2's bytes
    CHECK(got == v2);
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(r.pager->version(), uint64_t{3});
    CHECK(r.Commits() == (std::vector<uint64_t>{1, 2, 3, 3}));
    step(3800, &got);  // version 3 is slot 1: the retried step's bytes
    CHECK(got == v3);
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(r.pager->version(), uint64_t{4});
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
  });
}

TEST(TheStartingVersionPicksThePlanVariantAndResetReplacesVersionAndChecksums) {
  Within(120, "reset", [] {
    RigOptions o;
    o.version = 7;  // odd: the first step runs the odd variant
    Rig r(o);
    const int n = 3;
    r.pager->RegisterPlan(1, SlotPlan(n, 0), SlotPlan(n, 1));
    CHECK_EQ(r.pager->version(), uint64_t{7});
    std::vector<std::vector<char>> slot1, slot0;
    GpuPager::Crcs crcs1, crcs0;
    for (int c = 0; c < n; ++c) {
      slot1.push_back(RandomBytes(SizeOf(c), 3900 + c));
      slot0.push_back(RandomBytes(SizeOf(c), 3950 + c));
      r.io.Put(0, (2 * c + 1) * kStride, slot1.back());
      r.io.Put(0, 2 * c * kStride, slot0.back());
      crcs1[{0, (2 * c + 1) * kStride}] = Crc32c(slot1.back().data(), SizeOf(c));
      crcs0[{0, 2 * c * kStride}] = Crc32c(slot0.back().data(), SizeOf(c));
    }
    CHECK(r.pager->Reset(7, crcs1).ok());
    CHECK(r.pager->Checksums() == crcs1);
    auto read_all = [&](const std::vector<std::vector<char>>& want, uint64_t expect_version) {
      CHECK(r.pager->Begin(int64_t{1}).ok());
      std::vector<void*> bufs;
      for (int c = 0; c < n; ++c) {
        bufs.push_back(r.ops.AllocDevice(SizeOf(c)));
        CHECK(r.pager->Take(r.xla, bufs.back(), SizeOf(c)).ok());
        CHECK(r.pager->Put(r.xla, bufs.back(), SizeOf(c)).ok());
      }
      // Busy while the step runs.
      IoStatus busy = r.pager->Reset(0, {});
      CHECK_EQ(busy.err, EBUSY);
      CHECK_CONTAINS(busy.message, "a step is begun and not ended");
      CHECK(r.pager->Commit().ok());
      r.ops.SynchronizeStream(r.xla);
      for (int c = 0; c < n; ++c) CHECK(std::memcmp(bufs[c], want[c].data(), SizeOf(c)) == 0);
      CHECK(r.pager->Settle().ok());
      CHECK_EQ(r.pager->version(), expect_version);
      for (void* b : bufs) r.ops.FreeDevice(b);
    };
    read_all(slot1, 8);  // version 7: slot 1, verified against crcs1
    // The store is written from outside (a restore): version 4 (even, slot 0), its checksums.
    for (int c = 0; c < n; ++c) r.io.Put(0, 2 * c * kStride, slot0[c]);
    CHECK(r.pager->Reset(4, crcs0).ok());
    CHECK_EQ(r.pager->version(), uint64_t{4});
    CHECK(r.pager->Checksums() == crcs0);
    read_all(slot0, 5);
    CHECK(r.Commits() == (std::vector<uint64_t>{8, 5}));
    // Reset with checksums that do not match the store: the next read fails on them.
    GpuPager::Crcs wrong = crcs1;
    for (auto& [k, v] : wrong) v ^= 1;
    CHECK(r.pager->Reset(5, wrong).ok());
    CHECK(r.pager->Begin(int64_t{1}).ok());
    void* d = r.ops.AllocDevice(kStride);
    IoStatus st = r.pager->Take(r.xla, d, SizeOf(0));
    CHECK_EQ(st.err, EBADMSG);
    r.ops.SynchronizeStream(r.xla);
    r.ops.FreeDevice(d);
  });
}

TEST(ResetIsRefusedWhileTheLastStepsWritesOrCommitArePending) {
  Within(60, "reset busy", [] {
    RigOptions o;
    o.write_delay = microseconds(20000);
    Rig r(o);
    StepPlan plan{{}, Chunks(1, 2)};
    std::vector<std::vector<char>> data = {RandomBytes(plan.writes[0].bytes, 1),
                                           RandomBytes(plan.writes[1].bytes, 2)};
    CHECK(RunStep(r, plan, data).commit.ok());
    IoStatus st = r.pager->Reset(9, {});
    CHECK_EQ(st.err, EBUSY);
    CHECK_CONTAINS(st.message, "the last step's writes or commit are pending");
    CHECK_CONTAINS(st.message, "Settle");
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(r.pager->version(), uint64_t{1});
    CHECK(r.pager->Reset(9, {}).ok());
    CHECK_EQ(r.pager->version(), uint64_t{9});
    CHECK(r.pager->Checksums().empty());
  });
}

// Writes `v` into a fresh device word on `stream` (as the previous step's program would have
// produced it); the caller frees it after synchronising the stream.
void* VersionWord(SimDeviceOps& ops, DeviceOps::Stream stream, int32_t v,
                  std::vector<std::unique_ptr<int32_t>>* keep) {
  void* word = ops.AllocDevice(sizeof(int32_t));
  keep->push_back(std::make_unique<int32_t>(v));
  ops.CopyAsync(word, keep->back().get(), sizeof(int32_t), CopyKind::kHostToDevice, stream);
  return word;
}

TEST(AStaleVersionFailsTheStepWithoutWaitingForTheDevice) {
  // The caller's stream lags 100 ms per operation: Begin returns long before its version word
  // is even written, the step runs, and its commit waits for the check, which refuses it.
  Within(120, "stale version", [] {
    RigOptions o;
    o.version = 10;
    o.xla_lag = microseconds(100000);
    Rig r(o);
    StepPlan plan{{}, Chunks(1, 2)};
    r.pager->RegisterPlan(1, plan);
    std::vector<std::unique_ptr<int32_t>> keep;
    void* stale = VersionWord(r.ops, r.xla, 9, &keep);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(r.pager->Begin(1, r.xla, stale).ok());
    CHECK(std::chrono::steady_clock::now() - t0 < milliseconds(75));
    void* src = r.ops.AllocDevice(kStride);
    std::memset(src, 1, kStride);
    CHECK(r.pager->Put(r.xla, src, plan.writes[0].bytes).ok());
    CHECK(r.pager->Put(r.xla, src, plan.writes[1].bytes).ok());
    CHECK(r.pager->Commit().ok());
    CHECK(std::chrono::steady_clock::now() - t0 < milliseconds(75));
    IoStatus st = r.pager->Settle();
    CHECK_EQ(st.err, ESTALE);
    CHECK_CONTAINS(st.message, "the optimizer state describes version 9 of its page store, but "
                               "the store holds version 10: the state is stale");
    CHECK(r.Commits().empty());
    CHECK_EQ(r.pager->version(), uint64_t{10});
    auto stats = r.pager->Stats();
    CHECK_EQ(stats.version_checks, uint64_t{1});
    CHECK_EQ(stats.stale_steps, uint64_t{1});
    // The right version commits; the caller may overwrite its word as soon as Begin returned
    // (on its stream): the check read its own copy.
    void* good = VersionWord(r.ops, r.xla, 10, &keep);
    CHECK(r.pager->Begin(1, r.xla, good).ok());
    keep.push_back(std::make_unique<int32_t>(12345));
    r.ops.CopyAsync(good, keep.back().get(), sizeof(int32_t), CopyKind::kHostToDevice, r.xla);
    CHECK(r.pager->Put(r.xla, src, plan.writes[0].bytes).ok());
    CHECK(r.pager->Put(r.xla, src, plan.writes[1].bytes).ok());
    CHECK(r.pager->Commit().ok());
    CHECK(r.pager->Settle().ok());
    CHECK(r.Commits() == (std::vector<uint64_t>{11}));
    // A stale step reported by the next Begin instead (once).
    void* old = VersionWord(r.ops, r.xla, 10, &keep);
    CHECK(r.pager->Begin(1, r.xla, old).ok());
    CHECK(r.pager->Put(r.xla, src, plan.writes[0].bytes).ok());
    CHECK(r.pager->Put(r.xla, src, plan.writes[1].bytes).ok());
    CHECK(r.pager->Commit().ok());
    CHECK_EQ(r.pager->Begin(plan).err, ESTALE);
    // A step begun without a version word is not checked: it commits.
    CHECK(r.pager->Begin(plan).ok());
    CHECK(r.pager->Put(r.xla, src, plan.writes[0].bytes).ok());
    CHECK(r.pager->Put(r.xla, src, plan.writes[1].bytes).ok());
    CHECK(r.pager->Commit().ok());
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(r.pager->version(), uint64_t{12});
    CHECK_EQ(Versions(r.Commits()), std::string("{11, 12}"));
    stats = r.pager->Stats();
    CHECK_EQ(stats.version_checks, uint64_t{3});
    CHECK_EQ(stats.stale_steps, uint64_t{2});
    r.ops.SynchronizeStream(r.xla);
    for (void* w : {stale, good, old, src}) r.ops.FreeDevice(w);
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
  });
}

TEST(AStepWithoutWritesStillWaitsForItsVersionCheckBeforeItEnds) {
  // Nothing to write, so nothing else holds the step's end back: only its check, which runs
  // 200 ms or more later on the lagging stream. (On a device a step with writes cannot end
  // before its check anyway: the d2h stream runs the check ahead of the step's D2H copies.) A
  // stale step is refused (ESTALE) and does not end as a read-only step; a current one ends,
  // without a new version, once its check ran.
  Within(60, "end after check", [] {
    RigOptions o;
    o.version = 3;
    o.xla_lag = microseconds(100000);
    Rig r(o);
    StepPlan plan{Chunks(0, 2), {}};
    Seed(r.io, plan.reads, 45);
    r.pager->RegisterPlan(1, plan);
    std::vector<std::unique_ptr<int32_t>> keep;
    std::vector<void*> words;
    void* d = r.ops.AllocDevice(kStride);
    auto step = [&](int32_t claimed) {
      words.push_back(VersionWord(r.ops, r.xla, claimed, &keep));
      CHECK(r.pager->Begin(1, r.xla, words.back()).ok());
      for (size_t i = 0; i < 2; ++i) CHECK(r.pager->Take(r.xla, d, plan.reads[i].bytes).ok());
      CHECK(r.pager->Commit().ok());
    };
    step(4);
    CHECK_EQ(r.pager->Settle().err, ESTALE);
    CHECK(r.Commits().empty());
    CHECK_EQ(r.pager->version(), uint64_t{3});
    auto st = r.pager->Stats();
    CHECK_EQ(st.version_checks, uint64_t{1});
    CHECK_EQ(st.stale_steps, uint64_t{1});
    CHECK_EQ(st.read_only_steps, uint64_t{0});  // refused: it did not end as a read-only step
    CHECK_EQ(st.commits, uint64_t{0});
    // The right version: the step ends only once its check ran, with no new version.
    step(3);
    std::this_thread::sleep_for(milliseconds(20));
    st = r.pager->Stats();
    if (st.version_checks == 1) CHECK_EQ(st.read_only_steps, uint64_t{0});
    CHECK(r.pager->Settle().ok());
    st = r.pager->Stats();
    CHECK_EQ(st.version_checks, uint64_t{2});
    CHECK_EQ(st.read_only_steps, uint64_t{1});
    CHECK_EQ(st.commits, uint64_t{0});
    CHECK_EQ(st.syncs, uint64_t{0});
    CHECK_EQ(r.io.syncs(), uint64_t{0});
    CHECK(r.Commits().empty());
    CHECK_EQ(r.pager->version(), uint64_t{3});
    r.ops.SynchronizeStream(r.xla);
    r.ops.FreeDevice(d);
    for (void* w : words) r.ops.FreeDevice(w);
  });
}

TEST(AStepWithoutWritesEndsWithoutANewVersionAndTheNextStepWithWritesCommits) {
  // An evaluation: a step that only reads. Nothing to make durable and nothing new to commit:
  // no Sync, no commit callback, version() and the checksums unchanged, read_only_steps counts
  // it. The store stays at the version it read, so the next step runs the same plan variant,
  // and a step with writes after it commits version() + 1 as usual.
  Within(120, "read-only steps", [] {
    RigOptions o;
    o.version = 4;
    Rig r(o);
    const int n = 3;
    // Version 4 (even) is slot 0; slot 1 holds other bytes, which a wrong variant would read.
    std::vector<std::vector<char>> slot0, slot1;
    GpuPager::Crcs crcs;
    for (int c = 0; c < n; ++c) {
      slot0.push_back(RandomBytes(SizeOf(c), 4400 + c));
      slot1.push_back(RandomBytes(SizeOf(c), 4450 + c));
      r.io.Put(0, 2 * c * kStride, slot0.back());
      r.io.Put(0, (2 * c + 1) * kStride, slot1.back());
      crcs[{0, 2 * c * kStride}] = Crc32c(slot0.back().data(), SizeOf(c));
    }
    CHECK(r.pager->Reset(4, crcs).ok());
    r.pager->RegisterPlan(1, SlotPlan(n, 0), SlotPlan(n, 1));  // reads and writes back
    StepPlan eval0{SlotPlan(n, 0).reads, {}}, eval1{SlotPlan(n, 1).reads, {}};
    r.pager->RegisterPlan(2, eval0, eval1);                      // reads only
    std::vector<std::unique_ptr<int32_t>> keep;
    std::vector<void*> words;
    // A step of plan `id` checked against version `claimed`: takes every chunk, puts `data`
    // (if the plan writes), commits; returns what the takes delivered.
    auto step = [&](int64_t id, int32_t claimed, const std::vector<std::vector<char>>& data) {
      words.push_back(VersionWord(r.ops, r.xla, claimed, &keep));
      CHECK(r.pager->Begin(id, r.xla, words.back()).ok());
      std::vector<void*> bufs;
      for (int c = 0; c < n; ++c) {
        bufs.push_back(r.ops.AllocDevice(SizeOf(c)));
        CHECK(r.pager->Take(r.xla, bufs.back(), SizeOf(c)).ok());
        if (!data.empty()) {
          void* src = r.ops.AllocDevice(SizeOf(c));
          std::memcpy(src, data[c].data(), SizeOf(c));
          CHECK(r.pager->Put(r.xla, src, SizeOf(c)).ok());
          bufs.push_back(src);
        }
      }
      CHECK(r.pager->Commit().ok());
      r.ops.SynchronizeStream(r.xla);
      std::vector<std::vector<char>> got;
      for (size_t k = 0; k < bufs.size(); k += data.empty() ? 1 : 2) {
        const char* p = static_cast<const char*>(bufs[k]);
        got.emplace_back(p, p + SizeOf(static_cast<int>(got.size())));
      }
      for (void* b : bufs) r.ops.FreeDevice(b);
      return got;
    };
    auto unchanged = [&](uint64_t version, uint64_t read_only, uint64_t commits) {
      CHECK_EQ(r.pager->version(), version);
      const auto st = r.pager->Stats();
      CHECK_EQ(st.read_only_steps, read_only);
      CHECK_EQ(st.commits, commits);
      CHECK_EQ(st.syncs, commits);  // one Sync per committed step with writes, none else
      CHECK_EQ(r.io.syncs(), commits);
      CHECK_EQ(r.Commits().size(), static_cast<size_t>(commits));
    };
    // Two evaluations at version 4: the even variant both times, no version made.
    for (uint64_t k = 1; k <= 2; ++k) {
      CHECK_CHUNKS(step(2, 4, {}), slot0);
      CHECK(r.pager->Settle().ok());
      unchanged(4, k, 0);
      CHECK(r.pager->Checksums() == crcs);
    }
    // An empty step is read-only too.
    CHECK(r.pager->Begin(StepPlan{}).ok());
    CHECK(r.pager->Commit().ok());
    CHECK(r.pager->Settle().ok());
    unchanged(4, 3, 0);
    CHECK_EQ(r.pager->Stats().version_checks, uint64_t{2});
    // A training step after them reads version 4 and commits version 5 into slot 1, synced.
    std::vector<std::vector<char>> v5;
    for (int c = 0; c < n; ++c) v5.push_back(RandomBytes(SizeOf(c), 4500 + c));
    CHECK_CHUNKS(step(1, 4, v5), slot0);
    CHECK(r.pager->Settle().ok());
    CHECK_EQ(Versions(r.Commits()), std::string("{5}"));
    unchanged(5, 3, 1);
    for (int c = 0; c < n; ++c) {
      const ChunkRef w{0, (2 * c + 1) * kStride, SizeOf(c)};
      CHECK(r.io.Durable(0, w.offset, w.bytes) == v5[c]);
      uint32_t crc = 0;
      CHECK(r.pager->Checksum(w, &crc));
      CHECK_EQ(crc, Crc32c(v5[c].data(), SizeOf(c)));
    }
    // An evaluation of version 5: the odd variant, the training step's bytes, no version.
    const GpuPager::Crcs at_v5 = r.pager->Checksums();
    CHECK_CHUNKS(step(2, 5, {}), v5);
    CHECK(r.pager->Settle().ok());
    unchanged(5, 4, 1);
    CHECK(r.pager->Checksums() == at_v5);
    // Closing the pager right after an evaluation commits nothing either.
    CHECK_CHUNKS(step(2, 5, {}), v5);
    r.pager.reset();
    CHECK_EQ(Versions(r.Commits()), std::string("{5}"));
    CHECK_EQ(r.io.syncs(), uint64_t{1});
    CHECK_EQ(r.ops.Stats().hazards, uint64_t{0});
    for (void* w : words) r.ops.FreeDevice(w);
    r.pager = std::make_unique<GpuPager>(&r.ops, &r.io, o.config);  // for Rig's destructor
  });
}

TEST(TakeReadySaysWhetherATakeWouldWaitForTheDisk) {
  Within(60, "take ready", [] {
    RigOptions o;
    o.read_delay = microseconds(100000);
    Rig r(o);
    StepPlan plan{Chunks(0, 2), {}, {0, 1}, {}};
    Seed(r.io, plan.reads, 40);
    CHECK(r.pager->TakeReady(0));  // outside a step: the take fails at once
    CHECK(r.pager->Begin(plan).ok());
    CHECK(!r.pager->TakeReady(0));  // its read runs for 100 ms
    CHECK(!r.pager->TakeReady(1));
    CHECK(r.pager->TakeReady(2));   // a site with no reads: fails at once
    CHECK(Eventually([&] { return r.pager->TakeReady(0) && r.pager->TakeReady(1); }));
    void* d = r.ops.AllocDevice(kStride);
    CHECK(r.pager->Take(0, r.xla, d, plan.reads[0].bytes).ok());
    CHECK(r.pager->TakeReady(0));  // past its reads: fails at once
    CHECK(r.pager->Take(1, r.xla, d, plan.reads[1].bytes).ok());
    CHECK(r.pager->Commit().ok());
    r.ops.SynchronizeStream(r.xla);
    r.ops.FreeDevice(d);
    // A failed read is ready too (its take returns the error without waiting).
    r.io.FailRead(plan.reads[0].offset);
    CHECK(r.pager->Begin(plan).ok());
    CHECK(Eventually([&] { return r.pager->TakeReady(0); }));
    CHECK_CONTAINS(r.pager->Take(0, r.xla, d, plan.reads[0].bytes).message,
                   "injected read error");
  });
}

TEST(SettleWaitsForTheLastStepAndReturnsItsErrorOnce) {
  Within(60, "settle", [] {
    RigOptions o;
    o.write_delay = microseconds(10000);
    Rig r(o);
    CHECK(r.pager->Settle().ok());  // nothing to wait for
    StepPlan plan{{}, Chunks(1, 3)};
    std::vector<std::vector<char>> data;
    for (size_t i = 0; i < 3; ++i) data.push_back(RandomBytes(plan.writes[i].bytes, 4100 + i));
    CHECK(RunStep(r, plan, data).commit.ok());
    CHECK(r.pager->Settle().ok());
    CHECK(r.Commits() == (std::vector<uint64_t>{1}));
    r.io.FailWrite(plan.writes[2].offset);
    CHECK(RunStep(r, plan, data).commit.ok());
    IoStatus st = r.pager->Settle();
    CHECK_EQ(st.err, ENOSPC);
    CHECK_CONTAINS(st.message, "injected write error");
    CHECK(r.pager->Settle().ok());
    CHECK(r.pager->Begin(StepPlan{}).ok());  // Settle took the error: Begin starts
    CHECK_EQ(r.pager->version(), uint64_t{1});
  });
}

TEST(ClosingThePagerRightAfterAStepCompletesItsCommit) {
  // The step's writes are still running when the pager is destroyed: the destructor waits for
  // them, syncs and commits the step, as a process closing its store after its last step must.
  Within(60, "close after commit", [] {
    for (int round = 0; round < 5; ++round) {
      RigOptions o;
      o.write_delay = microseconds(round * 2000);
      o.delays.d2h = microseconds(round * 1000);
      Rig r(o);
      StepPlan plan{{}, Chunks(1, 4)};
      std::vector<std::vector<char>> data;
      for (size_t i = 0; i < 4; ++i) data.push_back(RandomBytes(plan.writes[i].bytes, 4200 + i));
      StepResult res = RunStep(r, plan, data);
      CHECK(res.commit.ok());
      r.pager.reset();
      CHECK(r.Commits() == (std::vector<uint64_t>{1}));
      for (size_t i = 0; i < 4; ++i) {
        CHECK(r.io.Durable(1, plan.writes[i].offset, plan.writes[i].bytes) == data[i]);
      }
      r.pager = std::make_unique<GpuPager>(&r.ops, &r.io, o.config);  // for Rig's destructor
    }
  });
}

TEST(ClosingThePagerMidStepNeverCommitsIt) {
  Within(60, "close mid step", [] {
    Rig r;
    StepPlan plan{{}, Chunks(1, 2)};
    std::vector<std::vector<char>> data = {RandomBytes(plan.writes[0].bytes, 5),
                                           RandomBytes(plan.writes[1].bytes, 6)};
    CHECK(r.pager->Begin(plan).ok());
    void* src = r.ops.AllocDevice(kStride);
    CHECK(r.pager->Put(r.xla, src, plan.writes[0].bytes).ok());
    r.ops.SynchronizeStream(r.xla);
    r.pager.reset();  // no Commit: the step is abandoned
    CHECK(r.Commits().empty());
    r.ops.FreeDevice(src);
    r.pager = std::make_unique<GpuPager>(&r.ops, &r.io, RigOptions().config);
  });
}

// ---- The same pager on host memory (HostDeviceOps: XLA:CPU). ---------------------------

// DeviceOps forwarding to another, counting the chunk copies (more than a version word's 4
// bytes) and the allocations the pager makes.
class CountingOps final : public DeviceOps {
 public:
  explicit CountingOps(DeviceOps* inner) : inner_(inner) {}
  const char* name() const override { return inner_->name(); }
  bool host_memory() const override { return inner_->host_memory(); }
  Stream CreateStream() override { return inner_->CreateStream(); }
  void DestroyStream(Stream s) override { inner_->DestroyStream(s); }
  Event CreateEvent() override { return inner_->CreateEvent(); }
  void DestroyEvent(Event e) override { inner_->DestroyEvent(e); }
  void RecordEvent(Event e, Stream s) override { inner_->RecordEvent(e, s); }
  void StreamWaitEvent(Stream s, Event e) override { inner_->StreamWaitEvent(s, e); }
  bool EventDone(Event e) override { return inner_->EventDone(e); }
  void CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind, Stream s) override {
    if (bytes > sizeof(int32_t)) {
      ++chunk_copies;
      chunk_bytes += bytes;
    }
    inner_->CopyAsync(dst, src, bytes, kind, s);
  }
  void MemsetAsync(void* dst, int value, size_t bytes, Stream s) override {
    inner_->MemsetAsync(dst, value, bytes, s);
  }
  void LaunchHostFunc(Stream s, std::function<void()> fn) override {
    inner_->LaunchHostFunc(s, std::move(fn));
  }
  void SynchronizeStream(Stream s) override { inner_->SynchronizeStream(s); }
  void* AllocPinned(size_t bytes) override {
    ++pinned_allocs;
    return inner_->AllocPinned(bytes);
  }
  void FreePinned(void* p) override { inner_->FreePinned(p); }
  void* AllocDevice(size_t bytes) override {
    ++device_allocs;
    return inner_->AllocDevice(bytes);
  }
  void FreeDevice(void* p) override { inner_->FreeDevice(p); }

  std::atomic<uint64_t> chunk_copies{0}, chunk_bytes{0}, pinned_allocs{0}, device_allocs{0};

 private:
  DeviceOps* inner_;
};

TEST(HostDeviceOpsRunEverythingInline) {
  HostDeviceOps ops;
  CHECK(ops.host_memory());
  CHECK_CONTAINS(std::string(ops.name()), "host");
  auto s = ops.CreateStream();
  auto e = ops.CreateEvent();
  CHECK(s != nullptr);
  CHECK(e != nullptr);
  void* p = ops.AllocPinned(10000);
  void* d = ops.AllocDevice(100);
  CHECK(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
  CHECK(reinterpret_cast<uintptr_t>(d) % 4096 == 0);
  std::memset(p, 3, 100);
  ops.CopyAsync(d, p, 100, CopyKind::kHostToDevice, s);
  ops.CopyAsync(d, d, 100, CopyKind::kDeviceToDevice, s);  // onto itself: nothing to do
  CHECK_EQ(static_cast<char*>(d)[99], char{3});
  ops.MemsetAsync(d, 0, 50, nullptr);
  CHECK_EQ(static_cast<char*>(d)[49], char{0});
  CHECK_EQ(static_cast<char*>(d)[50], char{3});
  ops.RecordEvent(e, s);
  ops.StreamWaitEvent(s, e);
  CHECK(ops.EventDone(e));
  bool ran = false;
  ops.LaunchHostFunc(s, [&] { ran = true; });
  CHECK(ran);  // before LaunchHostFunc returned, on this thread
  ops.SynchronizeStream(s);
  ops.DestroyEvent(e);
  ops.DestroyStream(s);
  ops.FreePinned(p);
  ops.FreeDevice(d);
}

TEST(OnHostMemoryATakeAndAPutCostOneCopyEachAndNoRingIsAllocated) {
  Within(120, "host memory", [] {
    HostDeviceOps host;
    CountingOps ops(&host);
    FakeChunkIo io(2, microseconds(200), microseconds(200));
    PagerConfig c = RigOptions().config;
    c.arena_slots = 3;
    c.ring_slots = 2;
    c.write_slots = 2;
    std::vector<uint64_t> commits;
    std::mutex mu;
    GpuPager pager(&ops, &io, c, [&](uint64_t v, const GpuPager::Crcs&) -> IoStatus {
      std::lock_guard<std::mutex> lock(mu);
      commits.push_back(v);
      return {};
    });
    // The arena, one buffer per write slot (host and device at once), the version words.
    CHECK_EQ(ops.pinned_allocs.load(), uint64_t{3 + 2 + 1});
    CHECK_EQ(ops.device_allocs.load(), uint64_t{1});
    StepPlan plan{Chunks(0, 12), Chunks(1, 12)};
    pager.RegisterPlan(1, plan);
    auto want = Seed(io, plan.reads, 50);
    for (int step = 0; step < 3; ++step) {
      const uint64_t copies0 = ops.chunk_copies.load();
      int32_t version = step;
      CHECK(pager.Begin(1, nullptr, &version).ok());
      std::vector<std::vector<char>> got(12), data(12);
      for (size_t i = 0; i < 12; ++i) {
        got[i].resize(plan.reads[i].bytes);
        CHECK(pager.Take(nullptr, got[i].data(), got[i].size()).ok());
        data[i] = RandomBytes(plan.writes[i].bytes, 5000 + 100 * step + i);
        CHECK(pager.Put(nullptr, data[i].data(), data[i].size()).ok());
      }
      CHECK(pager.Commit().ok());
      CHECK(pager.Settle().ok());
      for (size_t i = 0; i < 12; ++i) {
        CHECK(got[i] == want[i]);
        CHECK(io.Durable(1, plan.writes[i].offset, plan.writes[i].bytes) == data[i]);
      }
      CHECK_EQ(ops.chunk_copies.load() - copies0, uint64_t{24});
    }
    CHECK_EQ(pager.version(), uint64_t{3});
    auto st = pager.Stats();
    CHECK_EQ(st.h2d_bytes, uint64_t{0});
    CHECK_EQ(st.d2h_bytes, uint64_t{0});
    CHECK_EQ(st.version_checks, uint64_t{3});
    CHECK_EQ(st.syncs, uint64_t{3});
    std::lock_guard<std::mutex> lock(mu);
    CHECK(commits == (std::vector<uint64_t>{1, 2, 3}));
  });
}

TEST(OnHostMemoryAStaleVersionFailsBeginItselfAndTheStepNeverStarts) {
  Within(60, "host stale", [] {
    HostDeviceOps ops;
    FakeChunkIo io(2);
    std::atomic<int> commits{0};
    GpuPager pager(&ops, &io, RigOptions().config,
                   [&](uint64_t, const GpuPager::Crcs&) -> IoStatus {
                     ++commits;
                     return {};
                   },
                   /*version=*/15);
    StepPlan plan{Chunks(0, 2), Chunks(1, 2)};
    Seed(io, plan.reads, 51);
    pager.RegisterPlan(3, plan);
    int32_t stale = 10;
    IoStatus st = pager.Begin(3, nullptr, &stale);
    CHECK_EQ(st.err, ESTALE);
    CHECK_CONTAINS(st.message, "the optimizer state describes version 10 of its page store, "
                               "but the store holds version 15: the state is stale (saved or "
                               "restored without its page store contents); restore it "
                               "together with its pages, or start again from a fresh init");
    std::vector<char> buf(kStride);
    CHECK_CONTAINS(pager.Take(nullptr, buf.data(), plan.reads[0].bytes).message,
                   "call Begin first");
    CHECK(pager.Settle().ok());  // Begin returned the error: nothing is pending
    CHECK_EQ(pager.Stats().reads_done, uint64_t{0});  // nothing was read for it
    int32_t good = 15;
    CHECK(pager.Begin(3, nullptr, &good).ok());
    for (size_t i = 0; i < 2; ++i) {
      CHECK(pager.Take(nullptr, buf.data(), plan.reads[i].bytes).ok());
      CHECK(pager.Put(nullptr, buf.data(), plan.writes[i].bytes).ok());
    }
    CHECK(pager.Commit().ok());
    CHECK(pager.Settle().ok());
    CHECK_EQ(pager.version(), uint64_t{16});
    CHECK_EQ(commits.load(), 1);
    CHECK_EQ(pager.Stats().stale_steps, uint64_t{1});
    CHECK_EQ(pager.Stats().steps_begun, uint64_t{1});
  });
}

TEST(OnHostMemoryTheArenaNotTheRingBoundsTheReadAhead) {
  Within(60, "host read-ahead", [] {
    HostDeviceOps ops;
    FakeChunkIo io(2, microseconds(100));
    PagerConfig c = RigOptions().config;
    c.arena_slots = 4;
    c.ring_slots = 1;
    GpuPager pager(&ops, &io, c);
    StepPlan plan{Chunks(0, 10), {}, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, {}};
    auto want = Seed(io, plan.reads, 52);
    CHECK(pager.Begin(plan).ok());
    CHECK(Eventually([&] { return pager.Stats().reads_done == 4; }));
    std::this_thread::sleep_for(milliseconds(20));
    CHECK_EQ(pager.Stats().reads_done, uint64_t{4});
    CHECK(pager.TakeReady(0));
    std::vector<char> buf(kStride);
    // Three reads ahead is within the arena (a ring of one would refuse it on a device)...
    CHECK(pager.Begin(StepPlan{Chunks(0, 4), {}, {0, 0, 0, 1}, {}}).ok());
    CHECK(pager.Take(1, nullptr, buf.data(), SizeOf(3)).ok());
    CHECK(std::memcmp(buf.data(), want[3].data(), SizeOf(3)) == 0);
    for (size_t i = 0; i < 3; ++i) {
      CHECK(pager.Take(0, nullptr, buf.data(), SizeOf(i)).ok());
      CHECK(std::memcmp(buf.data(), want[i].data(), SizeOf(i)) == 0);
    }
    CHECK(pager.Commit().ok());
    // ... four is not: that read would wait for an arena slot only later takes free.
    CHECK(pager.Begin(plan).ok());
    IoStatus st = pager.Take(1, nullptr, buf.data(), SizeOf(8));
    CHECK_CONTAINS(st.message, "more than the arena's 4 slots before it");
  });
}

TEST(OnHostMemoryPagersOnOneOpsRunOnSeveralThreads) {
  Within(120, "host threads", [] {
    HostDeviceOps ops;
    auto run = [&](int file, uint32_t seed) {
      FakeChunkIo io(2, microseconds(50), microseconds(50));
      GpuPager pager(&ops, &io, RigOptions().config);
      StepPlan plan{Chunks(file, 8), Chunks(file + 1, 8)};
      auto want = Seed(io, plan.reads, seed);
      for (int step = 0; step < 4; ++step) {
        CHECK(pager.Begin(plan).ok());
        for (size_t i = 0; i < 8; ++i) {
          std::vector<char> buf(plan.reads[i].bytes);
          CHECK(pager.Take(nullptr, buf.data(), buf.size()).ok());
          CHECK(buf == want[i]);
          CHECK(pager.Put(nullptr, buf.data(), buf.size()).ok());
        }
        CHECK(pager.Commit().ok());
      }
      CHECK(pager.Settle().ok());
      CHECK_EQ(pager.version(), uint64_t{4});
    };
    std::thread a(run, 0, 60), b(run, 2, 61);
    a.join();
    b.join();
  });
}

// ---- A seeded randomised schedule, on the simulated device and on host memory. ----------

// Number of seeds: JAXOFF_PAGER_SEEDS, else 200 (100 under ThreadSanitizer, ~10x slower).
int RandomSeeds() {
  if (const char* env = std::getenv("JAXOFF_PAGER_SEEDS")) return std::atoi(env);
#if defined(__SANITIZE_THREAD__)
  return 100;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  return 100;
#endif
#endif
  return 200;
}

enum class Fault { kNone, kRead, kWrite, kSync, kCommit, kStale, kAbort };
// Steps run per fault, over all seeds (printed: the schedules did exercise every fault).
std::map<std::string, int>& FaultTally() {
  static std::map<std::string, int> t;
  return t;
}
// Read-only steps over all seeds: run, and ended (no fault) without a new version.
struct ReadOnlyTally {
  int run = 0;
  int ended = 0;
};
ReadOnlyTally& ReadOnlySteps() {
  static ReadOnlyTally t;
  return t;
}
const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kNone: return "none";
    case Fault::kRead: return "read error";
    case Fault::kWrite: return "write error";
    case Fault::kSync: return "sync error";
    case Fault::kCommit: return "commit error";
    case Fault::kStale: return "stale version";
    default: return "abort";
  }
}

// A store of `n` chunks: read-write ones alternate between two slots (a step reading version v
// reads slot v % 2 and writes the other), read-only ones have one slot, write-only ones are
// written to the slot of the new version. Chunk c's slot s is at file c % 2, offset
// (2c + s) * kStride (unique across files, as the fake disk's injected faults are by offset).
// The program calls take and put in a random order (a chunk's take before its put) on random
// sites, as a lowered step would, and the plan is that order. Some steps only read (an
// evaluation: plan 2, the program's takes alone; or every step, when every chunk is read-only):
// they end without a new version. Over random buffer counts, delays, lags and steps, with a
// random fault in some steps, every take must deliver the committed bytes, every commit the
// right version and checksums with its writes durable, a failed or read-only step must not
// commit (nor sync), and no copy or disk access may overlap another.
void RandomSchedule(uint32_t seed, bool host_mode) {
  const int failures_before = jaxoff::aio::testing::FailureCount();
  std::mt19937 rng(seed);
  auto uni = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  auto pick = [&](std::vector<int> v) { return v[rng() % v.size()]; };
  auto us = [](int n) { return microseconds(n); };

  PagerConfig cfg;
  cfg.slot_bytes = 8192;
  cfg.arena_slots = uni(1, 4);
  cfg.ring_slots = uni(1, 3);
  cfg.write_slots = uni(1, 3);
  cfg.wait_limit = milliseconds(20000);
  const SimDelays delays{us(pick({0, 0, 20, 100, 300, 1000})),
                         us(pick({0, 0, 20, 100, 300, 1000})), us(pick({0, 0, 20, 100}))};
  const int lag = pick({0, 0, 0, 20, 100, 200, 500});
  const int read_delay = pick({0, 20, 100, 300, 1000});
  const int write_delay = pick({0, 20, 100, 300, 1000});
  const int jitter = pick({0, 50, 200});
  const int io_threads = uni(1, 3);
  const int n = uni(1, 16);
  // One seed in eight: every chunk read-only, so every step is one without writes.
  const bool all_read_only = uni(0, 7) == 0;
  enum Kind { kRW, kRO, kWO };
  std::vector<Kind> kind(n);
  std::vector<size_t> size(n);
  for (int c = 0; c < n; ++c) {
    const int k = uni(0, 9);
    kind[c] = all_read_only ? kRO : k < 6 ? kRW : k < 8 ? kRO : kWO;
    size[c] = static_cast<size_t>(uni(1, 8192));
  }
  const int take_sites = uni(1, 3), put_sites = uni(1, 3);
  const uint64_t v0 = static_cast<uint64_t>(uni(0, 5));
  const int steps = uni(1, 4);
  const bool by_reset = uni(0, 1) == 1;
  // How often (percent) a step is an evaluation: plan 2, the takes alone.
  const int eval_percent = pick({0, 0, 0, 25, 50});
  std::ostringstream params;
  params << "arena " << cfg.arena_slots << " ring " << cfg.ring_slots << " write slots "
         << cfg.write_slots << ", delays h2d/d2h/d2d " << delays.h2d.count() << "/"
         << delays.d2h.count() << "/" << delays.d2d.count() << " us, lag " << lag
         << " us, disk " << read_delay << "/" << write_delay << " us (+" << jitter << "), "
         << n << " chunks, sites " << take_sites << "/" << put_sites << ", version " << v0
         << ", " << steps << " steps, " << eval_percent << "% evaluations"
         << (all_read_only ? ", every chunk read-only" : "");

  struct Op {
    bool take;
    int chunk;
    int site;
  };
  std::vector<Op> prog;
  for (int c = 0; c < n; ++c) {
    if (kind[c] != kWO) prog.push_back({true, c, uni(0, take_sites - 1)});
    if (kind[c] != kRO) prog.push_back({false, c, uni(0, put_sites - 1)});
  }
  std::shuffle(prog.begin(), prog.end(), rng);
  for (int c = 0; c < n; ++c) {
    if (kind[c] != kRW) continue;
    size_t t = 0, p = 0;
    for (size_t i = 0; i < prog.size(); ++i) {
      if (prog[i].chunk == c) (prog[i].take ? t : p) = i;
    }
    if (p < t) std::swap(prog[p], prog[t]);
  }
  auto ref = [&](int c, int slot) {
    return ChunkRef{c % 2, static_cast<uint64_t>(2 * c + slot) * kStride, size[c]};
  };
  auto read_ref = [&](int c, uint64_t v) { return ref(c, kind[c] == kRO ? 0 : int(v % 2)); };
  auto write_ref = [&](int c, uint64_t v) { return ref(c, int((v + 1) % 2)); };
  // The plan of a step reading version v: the program's calls, or (an evaluation) its takes.
  auto variant = [&](uint64_t v, bool eval = false) {
    StepPlan p;
    for (const Op& op : prog) {
      if (op.take) {
        p.reads.push_back(read_ref(op.chunk, v));
        p.read_sites.push_back(op.site);
      } else if (!eval) {
        p.writes.push_back(write_ref(op.chunk, v));
        p.write_sites.push_back(op.site);
      }
    }
    return p;
  };

  std::unique_ptr<SimDeviceOps> sim;
  HostDeviceOps host_ops;
  DeviceOps* ops = &host_ops;
  if (!host_mode) {
    sim = std::make_unique<SimDeviceOps>(delays);
    ops = sim.get();
  }
  FakeChunkIo io(io_threads, us(read_delay), us(write_delay), sim.get());
  io.SetJitter(us(jitter), seed);
  DeviceOps::Stream xla = sim ? sim->CreateStream() : nullptr;
  if (sim) sim->SetStreamLag(xla, us(lag));

  // The model: committed bytes per (chunk, slot), checksums, version; and what the pager must
  // have counted: steps committed, read-only steps ended, syncs run, commit callback calls.
  std::map<std::pair<int, int>, std::vector<char>> store;
  GpuPager::Crcs crcs;
  uint64_t version = v0;
  uint64_t want_commits = 0, want_read_only = 0, want_syncs = 0;
  int want_calls = 0;
  for (int c = 0; c < n; ++c) {
    if (kind[c] == kWO) continue;
    const ChunkRef r = read_ref(c, v0);
    auto bytes = RandomBytes(size[c], seed * 131 + c);
    io.Put(r.file, r.offset, bytes);
    crcs[{r.file, r.offset}] = Crc32c(bytes.data(), bytes.size());
    store[{c, kind[c] == kRO ? 0 : int(v0 % 2)}] = std::move(bytes);
  }

  // What the commit callback must see (set before each step, read on the pager thread).
  struct Expect {
    bool may_commit = false;
    bool fail = false;
    uint64_t version = 0;
    GpuPager::Crcs crcs;
    std::vector<std::pair<ChunkRef, std::vector<char>>> writes;
  };
  std::mutex mu;
  Expect expect;
  int commit_calls = 0;
  std::string commit_problem;
  auto commit = [&](uint64_t nv, const GpuPager::Crcs& step_crcs) -> IoStatus {
    std::lock_guard<std::mutex> lock(mu);
    ++commit_calls;
    auto bad = [&](const std::string& m) {
      if (commit_problem.empty()) commit_problem = m;
    };
    if (!expect.may_commit) bad("a step that must not commit reached its commit callback");
    if (nv != expect.version) bad("commit of version " + std::to_string(nv));
    if (step_crcs != expect.crcs) bad("the step's checksums are wrong");
    for (const auto& [r, bytes] : expect.writes) {
      if (io.Durable(r.file, r.offset, r.bytes) != bytes) bad("a write is not durable at commit");
    }
    if (expect.fail) {
      IoStatus st;
      st.err = EIO;
      st.message = "injected commit error";
      return st;
    }
    return {};
  };
  {
    std::unique_ptr<GpuPager> pager;
    if (by_reset) {
      pager = std::make_unique<GpuPager>(ops, &io, cfg, commit);
      CHECK(pager->Reset(v0, crcs).ok());
    } else {
      pager = std::make_unique<GpuPager>(ops, &io, cfg, commit, v0);
      for (const auto& [k, crc] : crcs) pager->SetChecksum({k.first, k.second, 0}, crc);
    }
    pager->RegisterPlan(1, variant(0), variant(1));
    pager->RegisterPlan(2, variant(0, true), variant(1, true));
    std::vector<std::unique_ptr<int32_t>> words;  // version words' host sources
    std::vector<void*> device_words;
    // The error the last unsettled step leaves for the next Begin or Settle ("" for none),
    // and the faults to lift once it is reported.
    std::string pending;
    std::function<void()> lift;
    auto report = [&](const IoStatus& st, const char* where) {
      if (pending.empty()) {
        if (!st.ok()) std::cerr << "seed " << seed << ": " << where << ": " << st.message << "\n";
        CHECK(st.ok());
      } else {
        CHECK_CONTAINS(st.message, pending);
      }
      pending.clear();
      if (lift) lift();
      lift = nullptr;
    };
    for (int step = 0; step < steps; ++step) {
      const uint64_t v = version;
      Fault fault = Fault::kNone;
      if (uni(0, 9) >= 6) fault = static_cast<Fault>(uni(1, 6));
      const bool eval = uni(1, 100) <= eval_percent;
      const int64_t plan_id = eval ? 2 : 1;
      std::vector<size_t> takes, puts;  // the step's calls (an evaluation makes no puts)
      for (size_t i = 0; i < prog.size(); ++i) {
        if (prog[i].take) {
          takes.push_back(i);
        } else if (!eval) {
          puts.push_back(i);
        }
      }
      // A step without writes: it syncs nothing and never reaches the commit callback.
      const bool read_only = puts.empty();
      if ((fault == Fault::kRead && takes.empty()) ||
          ((fault == Fault::kWrite || fault == Fault::kSync || fault == Fault::kCommit) &&
           read_only) ||
          (fault == Fault::kAbort && prog.empty())) {
        fault = Fault::kNone;
      }
      ++FaultTally()[FaultName(fault)];
      if (read_only) ++ReadOnlySteps().run;
      size_t fault_op = 0;
      if (fault == Fault::kRead) fault_op = takes[rng() % takes.size()];
      if (fault == Fault::kWrite) fault_op = puts[rng() % puts.size()];
      if (fault == Fault::kAbort) fault_op = rng() % prog.size();
      // The step's data.
      std::vector<std::vector<char>> put_data(prog.size());
      Expect e;
      e.may_commit = !read_only && (fault == Fault::kNone || fault == Fault::kCommit);
      e.fail = fault == Fault::kCommit;
      e.version = v + 1;
      for (size_t i : puts) {
        const ChunkRef r = write_ref(prog[i].chunk, v);
        put_data[i] = RandomBytes(r.bytes, seed * 7919 + step * 101 + i);
        e.crcs[{r.file, r.offset}] = Crc32c(put_data[i].data(), r.bytes);
        e.writes.emplace_back(r, put_data[i]);
      }
      int32_t claimed = static_cast<int32_t>(v);
      if (fault == Fault::kStale) claimed = v > 0 && uni(0, 1) ? claimed - 1 : claimed + uni(1, 2);
      void* word;
      if (sim) {
        word = VersionWord(*sim, xla, claimed, &words);
      } else {
        words.push_back(std::make_unique<int32_t>(claimed));
        word = words.back().get();
      }
      device_words.push_back(sim ? word : nullptr);
      // A read fault is armed before Begin, or the read-ahead could beat it. (Reads of an
      // earlier step still in flight may hit it too: their bytes are dropped anyway.)
      if (fault == Fault::kRead) io.FailRead(read_ref(prog[fault_op].chunk, v).offset);
      IoStatus b = pager->Begin(plan_id, xla, word);
      if (!pending.empty()) {
        // The previous step's error comes first; the step is begun again.
        report(b, "Begin");
        b = pager->Begin(plan_id, xla, word);
      }
      // Only now may the previous step's faults be lifted and this step's be armed: the
      // previous step is settled.
      {
        std::lock_guard<std::mutex> lock(mu);
        expect = e;
      }
      if (fault == Fault::kStale && host_mode) {
        CHECK_EQ(b.err, ESTALE);
        continue;
      }
      if (!b.ok()) std::cerr << "seed " << seed << ": Begin: " << b.message << "\n";
      CHECK(b.ok());
      if (!b.ok()) break;
      if (fault == Fault::kWrite) io.FailWrite(write_ref(prog[fault_op].chunk, v).offset);
      if (fault == Fault::kSync) io.FailSync();
      std::vector<std::pair<void*, std::vector<char>>> taken;  // buffer, expected bytes
      std::vector<void*> bufs;
      bool aborted = false;
      for (size_t i = 0; i < prog.size() && !aborted; ++i) {
        const Op& op = prog[i];
        if (fault == Fault::kAbort && i == fault_op) {
          aborted = true;
          break;
        }
        if (eval && !op.take) continue;
        const int c = op.chunk;
        if (op.take) {
          void* d = ops->AllocDevice(size[c]);
          bufs.push_back(d);
          IoStatus st = pager->Take(op.site, xla, d, size[c]);
          if (fault == Fault::kRead && i == fault_op) {
            CHECK_CONTAINS(st.message, "injected read error");
            aborted = true;  // XLA abandons the program at the failed call
            break;
          }
          if (!st.ok()) std::cerr << "seed " << seed << ": take: " << st.message << "\n";
          CHECK(st.ok());
          if (!st.ok()) {
            aborted = true;
            break;
          }
          taken.emplace_back(d, store.at({c, kind[c] == kRO ? 0 : int(v % 2)}));
        } else {
          void* s = ops->AllocDevice(size[c]);
          bufs.push_back(s);
          std::memcpy(s, put_data[i].data(), size[c]);
          IoStatus st = pager->Put(op.site, xla, s, size[c]);
          if (!st.ok()) std::cerr << "seed " << seed << ": put: " << st.message << "\n";
          CHECK(st.ok());
        }
      }
      if (!aborted) {
        // A step already known to fail (its write failed, its version check ran) is refused
        // at Commit too; its error still comes from the next Begin or Settle.
        const IoStatus st = pager->Commit();
        if (fault == Fault::kNone || fault == Fault::kCommit) CHECK(st.ok());
      }
      if (sim) sim->SynchronizeStream(xla);
      for (const auto& [d, want] : taken) {
        if (std::memcmp(d, want.data(), want.size()) != 0) {
          std::cerr << "seed " << seed << ": a take delivered the wrong bytes\n";
          CHECK(false);
        }
      }
      for (void* p : bufs) ops->FreeDevice(p);
      // The read fault did its work: lift it before the next step reads that chunk again.
      if (fault == Fault::kRead) io.FailRead(read_ref(prog[fault_op].chunk, v).offset, false);
      const bool commits = fault == Fault::kNone && !read_only;
      // A read-only step that runs to its end ends without a version; failed or aborted, it
      // is no more counted than a failed step with writes is committed.
      if (fault == Fault::kNone && read_only) {
        ++want_read_only;
        ++ReadOnlySteps().ended;
      }
      if (commits) ++want_commits;
      if (!read_only && (fault == Fault::kNone || fault == Fault::kCommit)) ++want_calls;
      if (!read_only && (fault == Fault::kNone || fault == Fault::kCommit ||
                         fault == Fault::kSync)) {
        ++want_syncs;
      }
      switch (fault) {
        case Fault::kWrite: pending = "injected write error"; break;
        case Fault::kSync: pending = "injected sync error"; break;
        case Fault::kCommit: pending = "injected commit error"; break;
        case Fault::kStale: pending = "the state is stale"; break;
        default: break;
      }
      lift = [&, fault, off = fault == Fault::kWrite ? write_ref(prog[fault_op].chunk, v).offset : 0] {
        if (fault == Fault::kWrite) io.FailWrite(off, false);
        if (fault == Fault::kSync) io.FailSync(false);
      };
      if (uni(0, 1) == 1) {
        report(pager->Settle(), "Settle");
        CHECK_EQ(pager->version(), commits ? v + 1 : v);
        const auto st = pager->Stats();
        CHECK_EQ(st.commits, want_commits);
        CHECK_EQ(st.read_only_steps, want_read_only);
      }
      if (commits) {
        version = v + 1;
        for (size_t i : puts) {
          const ChunkRef r = write_ref(prog[i].chunk, v);
          store[{prog[i].chunk, int((v + 1) % 2)}] = put_data[i];
          crcs[{r.file, r.offset}] = Crc32c(put_data[i].data(), r.bytes);
        }
        // Read-only chunks keep their slot 0 (read_ref); nothing else changes.
      }
    }
    report(pager->Settle(), "Settle");
    CHECK_EQ(pager->version(), version);
    const auto st = pager->Stats();
    CHECK_EQ(st.commits, want_commits);
    CHECK_EQ(st.read_only_steps, want_read_only);
    CHECK_EQ(st.syncs, want_syncs);
    CHECK_EQ(io.syncs(), want_syncs);
    if (pager->Checksums() != crcs) {
      std::cerr << "seed " << seed << ": the checksum table is not the committed versions'\n";
      CHECK(false);
    }
    for (int c = 0; c < n; ++c) {
      if (kind[c] == kWO) continue;
      const ChunkRef r = read_ref(c, version);
      if (io.Durable(r.file, r.offset, r.bytes) !=
          store.at({c, kind[c] == kRO ? 0 : int(version % 2)})) {
        std::cerr << "seed " << seed << ": chunk " << c << " of the committed version is not "
                  << "durable\n";
        CHECK(false);
      }
    }
    if (sim) sim->SynchronizeStream(xla);
    for (void* w : device_words) {
      if (w != nullptr) ops->FreeDevice(w);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!commit_problem.empty()) std::cerr << "seed " << seed << ": " << commit_problem << "\n";
    CHECK(commit_problem.empty());
    CHECK_EQ(commit_calls, want_calls);
  }
  if (sim) {
    const uint64_t hazards = sim->Stats().hazards;
    if (hazards != 0) std::cerr << "seed " << seed << ": " << sim->FirstHazard() << "\n";
    CHECK_EQ(hazards, uint64_t{0});
    sim->DestroyStream(xla);
  }
  if (jaxoff::aio::testing::FailureCount() != failures_before) {
    std::cerr << "random schedule failed: seed " << seed << " on "
              << (host_mode ? "host memory" : "the simulated device") << " (" << params.str()
              << "); rerun with JAXOFF_PAGER_SEED=" << seed << std::endl;
  }
}

TEST(RandomSchedulesDeliverTheCommittedBytesAndNeverCommitAFailedStep) {
  // JAXOFF_PAGER_SEED=n runs that seed alone (both memories).
  std::vector<uint32_t> seeds;
  if (const char* one = std::getenv("JAXOFF_PAGER_SEED")) {
    seeds.push_back(static_cast<uint32_t>(std::atoi(one)));
  } else {
    for (int s = 1; s <= RandomSeeds(); ++s) seeds.push_back(static_cast<uint32_t>(s));
  }
  for (uint32_t seed : seeds) {
    for (bool host_mode : {false, true}) {
      const std::string what = "random schedule, seed " + std::to_string(seed) +
                               (host_mode ? " (host memory)" : " (simulated device)");
      Within(120, what.c_str(), [&] { RandomSchedule(seed, host_mode); });
    }
  }
  std::cout << seeds.size() << " seeds, steps by fault:";
  for (const auto& [name, count] : FaultTally()) std::cout << " " << name << " " << count << ",";
  std::cout << " read-only steps " << ReadOnlySteps().run << " (" << ReadOnlySteps().ended
            << " ended without a version)" << std::endl;
  // The schedules did make steps without writes, and ran some of them to their end.
  if (seeds.size() >= 20) CHECK(ReadOnlySteps().ended > 0);
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
    const uint64_t syncs_before = jaxoff::aio::FileSyncCount();
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
    // The writing step synced its file and committed version 1; the reading one had nothing
    // to sync and ended without a version.
    CHECK_EQ(commits, 1);
    CHECK_EQ(pager.version(), uint64_t{1});
    CHECK_EQ(pager.Stats().syncs, uint64_t{1});
    CHECK_EQ(pager.Stats().read_only_steps, uint64_t{1});
    CHECK(jaxoff::aio::FileSyncCount() >= syncs_before + 1);
    for (void* b : bufs) ops.FreeDevice(b);
  }
  ops.DestroyStream(xla);
}

TEST(FileSyncCountCountsEveryFileSyncAndEngineChunkIoSyncsEachFile) {
  const std::string dir = jaxoff::aio::testing::TempDir();
  auto a = std::make_shared<File>(std::vector<std::string>{dir + "/a"}, true, true, false);
  auto b = std::make_shared<File>(std::vector<std::string>{dir + "/b"}, true, true, false);
  const uint64_t before = jaxoff::aio::FileSyncCount();
  a->Sync();
  CHECK_EQ(jaxoff::aio::FileSyncCount() - before, uint64_t{1});
  EngineConfig c;
  c.backend = jaxoff::aio::testing::SelectedBackend();
  EngineChunkIo io(std::make_shared<Engine>(c), {a, b});
  CHECK(io.Sync({0, 1}).ok());
  CHECK_EQ(jaxoff::aio::FileSyncCount() - before, uint64_t{3});
  CHECK(io.Sync({}).ok());
  CHECK_EQ(jaxoff::aio::FileSyncCount() - before, uint64_t{3});
}

TEST(EngineChunkIoRoundTripThroughTheSimulatedDevice) {
  SimDeviceOps ops({microseconds(100), microseconds(100), microseconds(50)});
  EngineRoundTrip(ops);
  CHECK_EQ(ops.Stats().hazards, uint64_t{0});
}

}  // namespace
