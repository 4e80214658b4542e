// The GPU pager on the CUDA runtime: the simulated tests' round trip on a real device, and a
// skip (with the runtime's reason, exit status 77: CTest reports it skipped, never passed) on
// a machine without one, so the binary builds and runs in CI on a CPU machine with the CUDA
// toolkit.
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_device_ops.h"
#include "engine.h"
#include "gpu_pager.h"
#include "test_util.h"

namespace {

using jaxoff::aio::ChunkRef;
using jaxoff::aio::CopyKind;
using jaxoff::aio::DeviceOps;
using jaxoff::aio::Engine;
using jaxoff::aio::EngineChunkIo;
using jaxoff::aio::EngineConfig;
using jaxoff::aio::File;
using jaxoff::aio::GpuPager;
using jaxoff::aio::IoStatus;
using jaxoff::aio::PagerConfig;
using jaxoff::aio::StepPlan;
using jaxoff::aio::testing::RandomBytes;

// Why there is no usable device, or "" when device 0 is there.
std::string NoDevice() {
  std::string why;
  const int n = jaxoff::aio::CudaDeviceCount(&why);
  if (n < 0) return "no CUDA device (" + why + ")";
  if (n == 0) return "no CUDA device (0 devices)";
  return "";
}

TEST(CudaPagerRoundTripOrSkipWithoutADevice) {
  if (const std::string why = NoDevice(); !why.empty()) SKIP_TEST(why);
  auto ops = jaxoff::aio::MakeCudaDeviceOps(0);
  EngineConfig c;
  c.backend = jaxoff::aio::testing::SelectedBackend();
  auto engine = std::make_shared<Engine>(c);
  auto file = std::make_shared<File>(
      std::vector<std::string>{jaxoff::aio::testing::TempDir() + "/pages"}, true, true, true);
  EngineChunkIo io(engine, {file});
  PagerConfig pc;
  pc.slot_bytes = 4 << 20;
  pc.arena_slots = 4;
  pc.ring_slots = 2;
  pc.write_slots = 2;
  int commits = 0;
  auto xla = ops->CreateStream();
  {
    GpuPager pager(ops.get(), &io, pc, [&](uint64_t, const GpuPager::Crcs&) -> IoStatus {
      ++commits;
      return {};
    });
    std::vector<ChunkRef> refs;
    for (int i = 0; i < 16; ++i) refs.push_back({0, uint64_t(i) * (4 << 20), size_t(3 << 20) + 4096 * i});
    std::vector<std::vector<char>> data;
    std::vector<void*> bufs;
    CHECK(pager.Begin(StepPlan{{}, refs}).ok());
    for (size_t i = 0; i < refs.size(); ++i) {
      data.push_back(RandomBytes(refs[i].bytes, 42 + i));
      bufs.push_back(ops->AllocDevice(refs[i].bytes));
      ops->CopyAsync(bufs.back(), data.back().data(), refs[i].bytes, CopyKind::kHostToDevice, xla);
      CHECK(pager.Put(xla, bufs.back(), refs[i].bytes).ok());
    }
    CHECK(pager.Commit().ok());
    CHECK(pager.Begin(StepPlan{refs, {}}).ok());
    std::vector<std::vector<char>> host(refs.size());
    for (size_t i = 0; i < refs.size(); ++i) {
      CHECK(pager.Take(xla, bufs[i], refs[i].bytes).ok());
      host[i].resize(refs[i].bytes);
      ops->CopyAsync(host[i].data(), bufs[i], refs[i].bytes, CopyKind::kDeviceToHost, xla);
    }
    CHECK(pager.Commit().ok());
    ops->SynchronizeStream(xla);
    for (size_t i = 0; i < refs.size(); ++i) CHECK(host[i] == data[i]);
    CHECK(pager.Begin(StepPlan{}).ok());
    // The writing step committed version 1; the reading one (no writes) made no version.
    CHECK_EQ(commits, 1);
    CHECK_EQ(pager.version(), uint64_t{1});
    CHECK_EQ(pager.Stats().syncs, uint64_t{1});
    CHECK_EQ(pager.Stats().read_only_steps, uint64_t{1});
    for (void* b : bufs) ops->FreeDevice(b);
  }
  ops->DestroyStream(xla);
}

TEST(CudaPagerSitesAndPlanIdsOrSkipWithoutADevice) {
  // Two take sites whose calls come in the other order than the plan's (within the ring),
  // from a plan registered by id, on the device's streams.
  if (const std::string why = NoDevice(); !why.empty()) SKIP_TEST(why);
  auto ops = jaxoff::aio::MakeCudaDeviceOps(0);
  EngineConfig c;
  c.backend = jaxoff::aio::testing::SelectedBackend();
  auto engine = std::make_shared<Engine>(c);
  auto file = std::make_shared<File>(
      std::vector<std::string>{jaxoff::aio::testing::TempDir() + "/pages"}, true, true, true);
  EngineChunkIo io(engine, {file});
  PagerConfig pc;
  pc.slot_bytes = 1 << 20;
  pc.ring_slots = 2;
  auto xla = ops->CreateStream();
  {
    GpuPager pager(ops.get(), &io, pc);
    StepPlan write, read;
    for (int i = 0; i < 8; ++i) {
      const ChunkRef ref{0, uint64_t(i) << 20, size_t(1) << 20};
      write.writes.push_back(ref);
      read.reads.push_back(ref);
      read.read_sites.push_back(i % 2);
    }
    pager.RegisterPlan(1, write);
    pager.RegisterPlan(2, read);
    std::vector<std::vector<char>> data;
    std::vector<void*> bufs;
    CHECK(pager.Begin(int64_t{1}).ok());
    for (int i = 0; i < 8; ++i) {
      data.push_back(RandomBytes(1 << 20, 77 + i));
      bufs.push_back(ops->AllocDevice(1 << 20));
      ops->CopyAsync(bufs.back(), data.back().data(), 1 << 20, CopyKind::kHostToDevice, xla);
      CHECK(pager.Put(xla, bufs.back(), 1 << 20).ok());
    }
    CHECK(pager.Commit().ok());
    CHECK(pager.Begin(int64_t{2}).ok());
    std::vector<std::vector<char>> host(8, std::vector<char>(1 << 20));
    for (int pair = 0; pair < 4; ++pair) {
      for (int site : {1, 0}) {
        const int i = 2 * pair + site;
        CHECK(pager.Take(site, xla, bufs[i], 1 << 20).ok());
        ops->CopyAsync(host[i].data(), bufs[i], 1 << 20, CopyKind::kDeviceToHost, xla);
      }
    }
    CHECK(pager.Commit().ok());
    ops->SynchronizeStream(xla);
    for (int i = 0; i < 8; ++i) CHECK(host[i] == data[i]);
    CHECK(pager.Begin(StepPlan{}).ok());
    // Plan 1 wrote version 1; plan 2 only read it and made no version.
    CHECK_EQ(pager.version(), uint64_t{1});
    CHECK_EQ(pager.Stats().read_only_steps, uint64_t{1});
    for (void* b : bufs) ops->FreeDevice(b);
  }
  ops->DestroyStream(xla);
}

TEST(CudaPagerVersionCheckAndTokenMemsetOrSkipWithoutADevice) {
  // page_begin's version check on the device: the word is copied on the caller's stream and
  // compared on the pager's d2h stream; a stale one fails the step (ESTALE) at the next
  // Settle, and the step never commits. MemsetAsync fills a token on the stream.
  if (const std::string why = NoDevice(); !why.empty()) SKIP_TEST(why);
  auto ops = jaxoff::aio::MakeCudaDeviceOps(0);
  EngineConfig c;
  c.backend = jaxoff::aio::testing::SelectedBackend();
  auto engine = std::make_shared<Engine>(c);
  auto file = std::make_shared<File>(
      std::vector<std::string>{jaxoff::aio::testing::TempDir() + "/pages"}, true, true, true);
  EngineChunkIo io(engine, {file});
  PagerConfig pc;
  pc.slot_bytes = 1 << 20;
  auto xla = ops->CreateStream();
  {
    std::vector<uint64_t> commits;
    GpuPager pager(ops.get(), &io, pc,
                   [&](uint64_t v, const GpuPager::Crcs&) -> IoStatus {
                     commits.push_back(v);
                     return {};
                   },
                   /*version=*/5);
    const ChunkRef ref{0, 0, size_t(1) << 20};
    pager.RegisterPlan(1, StepPlan{{}, {ref}}, StepPlan{{}, {ChunkRef{0, 1 << 20, 1 << 20}}});
    void* word = ops->AllocDevice(sizeof(int32_t));
    void* buf = ops->AllocDevice(1 << 20);
    int32_t v = 5;
    ops->CopyAsync(word, &v, sizeof(v), CopyKind::kHostToDevice, xla);
    ops->SynchronizeStream(xla);
    CHECK(pager.Begin(1, xla, word).ok());
    CHECK(pager.Put(xla, buf, 1 << 20).ok());
    CHECK(pager.Commit().ok());
    CHECK(pager.Settle().ok());
    CHECK_EQ(pager.version(), uint64_t{6});
    // The state still says 5: stale.
    CHECK(pager.Begin(1, xla, word).ok());
    CHECK(pager.Put(xla, buf, 1 << 20).ok());
    CHECK(pager.Commit().ok());
    IoStatus st = pager.Settle();
    CHECK_EQ(st.err, ESTALE);
    CHECK_CONTAINS(st.message, "describes version 5 of its page store, but the store holds version 6");
    CHECK_EQ(pager.version(), uint64_t{6});
    CHECK_EQ(commits.size(), size_t{1});
    CHECK_EQ(pager.Stats().stale_steps, uint64_t{1});
    // A token filled on the stream.
    std::vector<char> host(64, 1);
    ops->MemsetAsync(buf, 0, 64, xla);
    ops->CopyAsync(host.data(), buf, 64, CopyKind::kDeviceToHost, xla);
    ops->SynchronizeStream(xla);
    CHECK(host == std::vector<char>(64, 0));
    ops->FreeDevice(word);
    ops->FreeDevice(buf);
  }
  ops->DestroyStream(xla);
}

}  // namespace
