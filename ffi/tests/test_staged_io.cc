// Prefetch tickets, write-behind and flush (StagedIo), for the backend chosen with --backend.
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "crc32c.h"
#include "engine.h"
#include "staged_io.h"
#include "test_util.h"

namespace {

using jaxoff::aio::Crc32c;
using jaxoff::aio::Engine;
using jaxoff::aio::EngineConfig;
using jaxoff::aio::File;
using jaxoff::aio::IoStatus;
using jaxoff::aio::StagedIo;
using jaxoff::aio::testing::RandomBytes;
using jaxoff::aio::testing::SelectedBackend;
using jaxoff::aio::testing::TempDir;

std::shared_ptr<Engine> MakeEngine(bool o_direct = true) {
  EngineConfig c;
  c.block_size = 64 << 10;
  c.queue_depth = 4;
  c.threads = 2;
  c.o_direct = o_direct;
  c.pool_bytes = 256 << 10;
  c.backend = SelectedBackend();
  return std::make_shared<Engine>(c);
}

std::shared_ptr<File> Open(const std::string& path, bool o_direct = true) {
  return std::make_shared<File>(std::vector<std::string>{path}, true, true, o_direct);
}

void WriteFile(const std::string& path, const std::vector<char>& data) {
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

TEST(PrefetchTakeRoundTripOddSizesManyOutstanding) {
  for (bool direct : {true, false}) {
    auto engine = MakeEngine(direct);
    StagedIo io(engine, 4 << 20);
    const std::string path = TempDir() + "/f";
    const std::vector<size_t> sizes = {1, 4095, 4096, 4097, 65536 + 3, 300001};
    std::vector<std::vector<char>> parts;
    std::vector<char> all;
    std::vector<uint64_t> offs;
    for (size_t i = 0; i < sizes.size(); ++i) {
      offs.push_back(all.size());
      parts.push_back(RandomBytes(sizes[i], static_cast<uint32_t>(i + 1)));
      all.insert(all.end(), parts.back().begin(), parts.back().end());
      all.resize(jaxoff::aio::AlignUp(all.size()));  // 4 KiB slots
    }
    WriteFile(path, all);
    auto file = Open(path, direct);
    std::vector<int32_t> tickets(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {  // all outstanding at once
      IoStatus s = io.Prefetch(file, offs[i], sizes[i], true, Crc32c(parts[i].data(), sizes[i]),
                               &tickets[i]);
      CHECK(s.ok());
    }
    CHECK_EQ(io.Stats().tickets, sizes.size());
    for (size_t k = sizes.size(); k-- > 0;) {  // taken in reverse order
      std::vector<char> out(sizes[k]);
      IoStatus s = io.Take(tickets[k], out.data(), out.size());
      CHECK(s.ok());
      CHECK(out == parts[k]);
    }
    auto st = io.Stats();
    CHECK_EQ(st.tickets, size_t{0});
    CHECK_EQ(st.staging_in_use, size_t{0});
    CHECK(st.staging_allocated <= st.budget);
  }
}

TEST(TakeDetectsChecksumMismatchAndReadErrors) {
  auto engine = MakeEngine();
  StagedIo io(engine, 1 << 20);
  const std::string path = TempDir() + "/f";
  auto data = RandomBytes(10000, 7);
  WriteFile(path, data);
  auto file = Open(path);
  int32_t t = 0;
  CHECK(io.Prefetch(file, 0, data.size(), true, Crc32c(data.data(), data.size()) ^ 1, &t).ok());
  std::vector<char> out(data.size());
  IoStatus s = io.Take(t, out.data(), out.size());
  CHECK(!s.ok());
  CHECK_CONTAINS(s.message, "checksum mismatch");
  CHECK_CONTAINS(s.message, path);
  // Past the end of the file: the error comes at take, with path and offset.
  CHECK(io.Prefetch(file, 1 << 20, 4096, false, 0, &t).ok());
  s = io.Take(t, out.data(), 4096);
  CHECK(!s.ok());
  CHECK_CONTAINS(s.message, path);
  CHECK_CONTAINS(s.message, "1048576");
  // Taking twice, or a size the prefetch did not read.
  s = io.Take(t, out.data(), 4096);
  CHECK_CONTAINS(s.message, "unknown");
  CHECK(io.Prefetch(file, 0, 100, false, 0, &t).ok());
  s = io.Take(t, out.data(), 99);
  CHECK_CONTAINS(s.message, "shape and dtype");
  CHECK_EQ(io.Stats().staging_in_use, size_t{0});
}

TEST(PrefetchBeyondBudgetIsRefusedNamingPoolBytes) {
  auto engine = MakeEngine();
  StagedIo io(engine, 64 << 10);
  const std::string path = TempDir() + "/f";
  WriteFile(path, RandomBytes(128 << 10, 3));
  auto file = Open(path);
  int32_t a = 0, b = 0;
  CHECK(io.Prefetch(file, 0, 40 << 10, false, 0, &a).ok());
  IoStatus s = io.Prefetch(file, 40 << 10, 40 << 10, false, 0, &b);
  CHECK(!s.ok());
  CHECK_CONTAINS(s.message, "pool_bytes");
  CHECK_CONTAINS(s.message, "1 prefetched chunks not yet taken");
  // A ticket never taken is reclaimed by Drain; the budget is whole again.
  CHECK_EQ(io.Drain(), size_t{1});
  CHECK_EQ(io.Stats().staging_in_use, size_t{0});
  CHECK(io.Prefetch(file, 40 << 10, 40 << 10, false, 0, &b).ok());
  std::vector<char> out(40 << 10);
  CHECK(io.Take(b, out.data(), out.size()).ok());
}

TEST(StaleTicketsAreReclaimedUnderPressure) {
  auto engine = MakeEngine();
  StagedIo io(engine, 64 << 10, /*stale_seconds=*/0.05);
  const std::string path = TempDir() + "/f";
  WriteFile(path, RandomBytes(128 << 10, 3));
  auto file = Open(path);
  int32_t a = 0, b = 0;
  CHECK(io.Prefetch(file, 0, 40 << 10, false, 0, &a).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(io.Prefetch(file, 0, 40 << 10, false, 0, &b).ok());
  CHECK_EQ(io.Stats().reclaimed, uint64_t{1});
  std::vector<char> out(40 << 10);
  CHECK_CONTAINS(io.Take(a, out.data(), out.size()).message, "unknown");
  CHECK(io.Take(b, out.data(), out.size()).ok());
}

TEST(WriteBehindFlushThenReadSeesData) {
  for (bool direct : {true, false}) {
    auto engine = MakeEngine(direct);
    StagedIo io(engine, 1 << 20);
    const std::string path = TempDir() + "/f";
    auto file = Open(path, direct);
    std::vector<std::vector<char>> parts;
    for (int i = 0; i < 6; ++i) {
      parts.push_back(RandomBytes(100000 + i, static_cast<uint32_t>(10 + i)));
      std::vector<char> src = parts.back();
      uint32_t crc = 0;
      CHECK(io.WriteBehind(file, static_cast<uint64_t>(i) * (128 << 10), src.data(), src.size(),
                           &crc));
      CHECK_EQ(crc, Crc32c(parts.back().data(), parts.back().size()));
      std::memset(src.data(), 0, src.size());  // the source may be reused at once
    }
    // Overwrite slot 0 while the first write may still be in flight: the last write wins.
    parts[0] = RandomBytes(100000, 99);
    uint32_t crc = 0;
    CHECK(io.WriteBehind(file, 0, parts[0].data(), parts[0].size(), &crc));
    // Read-after-write through a prefetch: waits for the overlapping write.
    int32_t t = 0;
    CHECK(io.Prefetch(file, 0, parts[0].size(), true, crc, &t).ok());
    std::vector<char> out(parts[0].size());
    CHECK(io.Take(t, out.data(), out.size()).ok());
    CHECK(out == parts[0]);
    CHECK(io.Flush(/*fsync=*/true).ok());
    CHECK_EQ(io.Stats().writes_in_flight, size_t{0});
    std::ifstream f(path, std::ios::binary);  // another reader sees every write after Flush
    for (int i = 0; i < 6; ++i) {
      std::vector<char> got(parts[static_cast<size_t>(i)].size());
      f.seekg(static_cast<std::streamoff>(i) * (128 << 10));
      f.read(got.data(), static_cast<std::streamsize>(got.size()));
      CHECK(got == parts[static_cast<size_t>(i)]);
    }
    CHECK_EQ(io.Stats().staging_in_use, size_t{0});
  }
}

TEST(WriteBehindTooLargeForBudgetIsRefused) {
  auto engine = MakeEngine();
  StagedIo io(engine, 64 << 10);
  auto file = Open(TempDir() + "/f");
  auto data = RandomBytes(100000, 1);
  uint32_t crc = 0;
  CHECK(!io.WriteBehind(file, 0, data.data(), data.size(), &crc));
  // Staging held by a ticket: refused too (never waits on something only a later take frees).
  auto small = RandomBytes(40 << 10, 2);
  CHECK(io.WriteBehind(file, 0, small.data(), small.size(), &crc));
  CHECK(io.Flush(false).ok());
  int32_t t = 0;
  CHECK(io.Prefetch(file, 0, small.size(), true, crc, &t).ok());
  CHECK(!io.WriteBehind(file, 1 << 20, small.data(), small.size(), &crc));
  std::vector<char> out(small.size());
  CHECK(io.Take(t, out.data(), out.size()).ok());
  CHECK(out == small);
}

TEST(FlushReportsWriteErrorsOnce) {
  auto engine = MakeEngine(false);
  StagedIo io(engine, 1 << 20);
  const std::string path = TempDir() + "/ro";
  WriteFile(path, RandomBytes(10, 1));
  // A read-only descriptor: the write fails with EBADF, reported by the next Flush only.
  auto file = std::make_shared<File>(std::vector<std::string>{path}, false, false, false);
  auto data = RandomBytes(5000, 2);
  uint32_t crc = 0;
  CHECK(io.WriteBehind(file, 0, data.data(), data.size(), &crc));
  IoStatus s = io.Flush(false);
  CHECK(!s.ok());
  CHECK_CONTAINS(s.message, path);
  CHECK(io.Flush(false).ok());
}

}  // namespace
