// Round trips, odd sizes, alignment, striping and error paths of the engine, for the backend
// chosen with --backend.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include "aligned_buffer.h"
#include "crc32c.h"
#include "engine.h"
#include "test_util.h"

namespace {

using jaxoff::aio::AlignedBuffer;
using jaxoff::aio::Engine;
using jaxoff::aio::EngineConfig;
using jaxoff::aio::File;
using jaxoff::aio::IoError;
using jaxoff::aio::IoStatus;
using jaxoff::aio::testing::RandomBytes;
using jaxoff::aio::testing::SelectedBackend;
using jaxoff::aio::testing::TempDir;

EngineConfig Config(bool o_direct, size_t block = 64 << 10, int qd = 4, size_t pool = 256 << 10) {
  EngineConfig c;
  c.block_size = block;
  c.queue_depth = qd;
  c.threads = 2;
  c.o_direct = o_direct;
  c.pool_bytes = pool;
  c.backend = SelectedBackend();
  return c;
}

std::shared_ptr<File> Open(const std::string& path, bool o_direct, bool create = true) {
  return std::make_shared<File>(std::vector<std::string>{path}, true, create, o_direct);
}

// Copies `src` into memory at `misalign` bytes past a 4 KiB boundary.
struct Placed {
  AlignedBuffer storage;
  char* p;
  Placed(size_t n, size_t misalign) : storage(n + misalign + 1), p(storage.data() + misalign) {}
};

// With `with_crc`, both requests also checksum their bytes (IoOptions::crc32c): the engine's
// block-wise, combined crc32c must equal the crc32c of the whole buffer.
void RoundTrip(bool o_direct, size_t n, size_t misalign, uint64_t offset, bool with_crc = false) {
  Engine engine(Config(o_direct));
  jaxoff::aio::IoOptions opts;
  opts.crc32c = with_crc;
  auto path = TempDir() + "/rt.bin";
  auto file = Open(path, o_direct);
  auto data = RandomBytes(n, static_cast<uint32_t>(n + misalign));
  Placed src(n, misalign), dst(n, misalign);
  std::memcpy(src.p, data.data(), n);
  std::memset(dst.p, 0x5A, n + 1);
  const IoStatus w = engine.Write(file, offset, src.p, n, opts)->Wait();
  CHECK(w.ok());
  const IoStatus r = engine.Read(file, offset, dst.p, n, opts)->Wait();
  CHECK(r.ok());
  if (with_crc) {
    const uint32_t want = jaxoff::aio::Crc32c(data.data(), n);
    CHECK_EQ(w.crc32c, want);
    CHECK_EQ(r.crc32c, want);
  }
  if (!w.ok() || !r.ok()) std::cerr << w.message << r.message << std::endl;
  const bool same = std::memcmp(dst.p, data.data(), n) == 0;
  if (!same) std::cerr << "mismatch: n=" << n << " misalign=" << misalign << std::endl;
  CHECK(same);
  CHECK_EQ(static_cast<int>(dst.p[n]), 0x5A);  // never writes past the caller's buffer
}

TEST(RoundTripOddSizes) {
  for (bool direct : {true, false}) {
    for (size_t n : {size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{65536},
                     size_t{(1 << 20) + 3}, size_t{(3 << 20) + 5}}) {
      RoundTrip(direct, n, 0, 0);
      RoundTrip(direct, n, 1, 0);     // unaligned caller memory -> staging
      RoundTrip(direct, n, 64, 8192); // XLA-like 64-byte alignment at an aligned offset
      for (size_t misalign : {0, 1, 64, 512}) RoundTrip(direct, n, misalign, 4096, true);
    }
  }
}

TEST(RoundTripUnalignedOffset) {
  for (bool direct : {true, false}) {
    RoundTrip(direct, 100000, 0, 123);
    RoundTrip(direct, 100000, 64, 123, true);
  }
}

TEST(DirectReadOfUnpaddedTail) {
  // A file written without O_DIRECT ends exactly at n: O_DIRECT reads must not need padding.
  const size_t n = 4097 + 65536;
  auto path = TempDir() + "/tail.bin";
  auto data = RandomBytes(n, 3);
  {
    std::ofstream f(path, std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(n));
  }
  Engine engine(Config(true));
  auto file = Open(path, true, false);
  CHECK(file->has_direct());
  std::vector<char> out(n);
  const IoStatus r = engine.Read(file, 0, out.data(), n)->Wait();
  CHECK(r.ok());
  CHECK(out == data);
}

TEST(PaddedWriteOccupiesAlignedSlot) {
  Engine engine(Config(true));
  auto path = TempDir() + "/pad.bin";
  auto file = Open(path, true);
  auto data = RandomBytes(4097, 5);
  CHECK(engine.Write(file, 0, data.data(), data.size())->Wait().ok());
  CHECK_EQ(file->Size(), uint64_t{8192});  // documented: the tail is padded to 4 KiB
}

TEST(ManyConcurrentRequestsSmallPool) {
  // 2 staging buffers, queue depth 4, 12 requests in flight at once.
  Engine engine(Config(true, 64 << 10, 4, 128 << 10));
  CHECK_EQ(engine.pool_buffers(), size_t{2});
  auto file = Open(TempDir() + "/many.bin", true);
  const size_t n = 300000, slot = 303104;  // slot: n rounded up to 4 KiB
  std::vector<std::vector<char>> data, out;
  std::vector<std::shared_ptr<jaxoff::aio::Completion>> done;
  for (int i = 0; i < 12; ++i) data.push_back(RandomBytes(n, 100 + i));
  for (int i = 0; i < 12; ++i) done.push_back(engine.Write(file, i * slot, data[i].data() + 0, n));
  for (auto& c : done) CHECK(c->Wait().ok());
  done.clear();
  out.assign(12, std::vector<char>(n));
  for (int i = 0; i < 12; ++i) done.push_back(engine.Read(file, i * slot, out[i].data(), n));
  for (auto& c : done) CHECK(c->Wait().ok());
  for (int i = 0; i < 12; ++i) CHECK(out[i] == data[i]);
}

TEST(StripedRoundTrip) {
  const uint64_t stripe = 64 << 10;
  std::vector<std::string> paths;
  for (int i = 0; i < 3; ++i) {
    std::string d = TempDir();
    paths.push_back(d + "/striped.bin");
  }
  auto file = std::make_shared<File>(paths, true, true, true, stripe);
  Engine engine(Config(true, 1 << 20, 4, 2 << 20));
  const size_t n = (1 << 20) + 3;
  auto data = RandomBytes(n, 9);
  CHECK(engine.Write(file, 0, data.data(), n)->Wait().ok());
  std::vector<char> out(n);
  CHECK(engine.Read(file, 0, out.data(), n)->Wait().ok());
  CHECK(out == data);
  // Blocks cut at stripe boundaries still combine into the crc32c of the whole request.
  jaxoff::aio::IoOptions crc;
  crc.crc32c = true;
  std::vector<char> out2(n);
  const IoStatus rc = engine.Read(file, 1000, out2.data(), n - 1000, crc)->Wait();
  CHECK(rc.ok());
  CHECK_EQ(rc.crc32c, jaxoff::aio::Crc32c(data.data() + 1000, n - 1000));
  // Stripe 1 of the logical file is the first chunk of the second path.
  std::ifstream f(paths[1], std::ios::binary);
  std::vector<char> chunk(stripe);
  f.read(chunk.data(), static_cast<std::streamsize>(stripe));
  CHECK(std::memcmp(chunk.data(), data.data() + stripe, stripe) == 0);
  // 17 stripes (16 full + the 3-byte tail padded to 4 KiB) spread 6/6/5.
  struct stat st;
  CHECK(stat(paths[2].c_str(), &st) == 0 && st.st_size == static_cast<off_t>(5 * stripe));
}

TEST(MissingDirectoryNamesPathAndErrno) {
  const std::string path = TempDir() + "/no/such/dir/file.bin";
  bool threw = false;
  try {
    Open(path, true);
  } catch (const IoError& e) {
    threw = true;
    CHECK_EQ(e.err(), ENOENT);
    CHECK_EQ(e.path(), path);
    CHECK_CONTAINS(e.what(), path);
    CHECK_CONTAINS(e.what(), "ENOENT");
    CHECK_CONTAINS(e.what(), "file_handle.cc:");
  }
  CHECK(threw);
}

TEST(ReadPastEofReportsPathAndOffset) {
  for (bool direct : {true, false}) {
    Engine engine(Config(direct));
    auto path = TempDir() + "/short.bin";
    auto file = Open(path, direct);
    auto data = RandomBytes(10000, 1);
    CHECK(engine.Write(file, 0, data.data(), data.size())->Wait().ok());
    std::vector<char> out(200000);
    const IoStatus r = engine.Read(file, 0, out.data(), out.size())->Wait();
    CHECK(!r.ok());
    CHECK_EQ(r.err, jaxoff::aio::kErrEof);
    CHECK_CONTAINS(r.message, path);
    CHECK_CONTAINS(r.message, "at offset");
    CHECK_CONTAINS(r.message, "past the end");
  }
}

TEST(FileSizeLimitGivesEfbig) {
  // RLIMIT_FSIZE in a child process: the write must fail with EFBIG and a clear message.
  const std::string path = TempDir() + "/big.bin";
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &lim);
    int code = 0;
    try {
      Engine engine(Config(true, 256 << 10, 4, 1 << 20));
      auto file = Open(path, true);
      auto data = RandomBytes(4 << 20, 2);
      const IoStatus w = engine.Write(file, 0, data.data(), data.size())->Wait();
      if (w.ok()) code = 10;
      else if (w.err != EFBIG) code = 11;
      else if (w.message.find("EFBIG") == std::string::npos ||
               w.message.find(path) == std::string::npos ||
               w.message.find("RLIMIT_FSIZE") == std::string::npos) code = 12;
      if (code) std::cerr << "child: " << w.message << std::endl;
    } catch (const std::exception& e) {
      std::cerr << "child: " << e.what() << std::endl;
      code = 13;
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
}

TEST(ErrnoDescriptionsForDiskFull) {
  CHECK_CONTAINS(jaxoff::aio::DescribeErrno(ENOSPC), "ENOSPC");
  CHECK_CONTAINS(jaxoff::aio::DescribeErrno(ENOSPC), "disk is full");
  CHECK_CONTAINS(jaxoff::aio::DescribeErrno(EFBIG), "EFBIG");
}

TEST(ConfigValidation) {
  auto bad = [](EngineConfig c) {
    try {
      c.Validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EngineConfig c = Config(true);
  CHECK(bad(c).empty());
  c.block_size = 1000;
  CHECK_CONTAINS(bad(c), "block_size");
  c = Config(true);
  c.queue_depth = 0;
  CHECK_CONTAINS(bad(c), "queue_depth");
  c = Config(true);
  c.pool_bytes = 4096;
  CHECK_CONTAINS(bad(c), "pool_bytes");
}

TEST(BackendIsTheOneAskedFor) {
  Engine engine(Config(true));
  const std::string name = engine.backend_name();
  switch (SelectedBackend()) {
    case jaxoff::aio::BackendKind::kPosix: CHECK_EQ(name, std::string("posix")); break;
    case jaxoff::aio::BackendKind::kIoUring: CHECK_EQ(name, std::string("io_uring")); break;
    default: CHECK(name == "posix" || name == "io_uring");
  }
}

}  // namespace
