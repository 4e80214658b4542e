// The GPU pager on the CUDA runtime: the simulated tests' round trip on a real device, and a
// skip (with the runtime's reason) on a machine without one, so the binary builds and runs in
// CI on a CPU machine with the CUDA toolkit.
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

TEST(CudaPagerRoundTripOrSkipWithoutADevice) {
  std::string why;
  const int n = jaxoff::aio::CudaDeviceCount(&why);
  if (n <= 0) {
    std::cout << "no CUDA device (" << (n < 0 ? why : "0 devices") << "): skipped" << std::endl;
    return;
  }
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
    CHECK_EQ(commits, 2);
    for (void* b : bufs) ops->FreeDevice(b);
  }
  ops->DestroyStream(xla);
}

TEST(CudaPagerSitesAndPlanIdsOrSkipWithoutADevice) {
  // Two take sites whose calls come in the other order than the plan's (within the ring),
  // from a plan registered by id, on the device's streams.
  std::string why;
  const int n = jaxoff::aio::CudaDeviceCount(&why);
  if (n <= 0) {
    std::cout << "no CUDA device (" << (n < 0 ? why : "0 devices") << "): skipped" << std::endl;
    return;
  }
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
    CHECK_EQ(pager.committed_step(), uint64_t{2});
    for (void* b : bufs) ops->FreeDevice(b);
  }
  ops->DestroyStream(xla);
}

}  // namespace
