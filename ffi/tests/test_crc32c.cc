#include <algorithm>
#include <cstring>
#include <string>

#include "crc32c.h"
#include "test_util.h"

using jaxoff::aio::Crc32c;
using jaxoff::aio::Crc32cExtend;
using jaxoff::aio::Crc32cExtendPortable;
using jaxoff::aio::testing::RandomBytes;

TEST(Crc32cKnownVectors) {
  // RFC 3720 (iSCSI) test vectors and the classic check value.
  CHECK_EQ(Crc32c("", 0), 0u);
  CHECK_EQ(Crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff');
  CHECK_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  CHECK_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
}

TEST(Crc32cHardwareMatchesTable) {
  auto data = RandomBytes(1 << 16, 7);
  for (size_t start : {0, 1, 3, 7}) {
    // 24576 = three streams of 8 KiB, the smallest run the hardware path interleaves
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 4095, 4097, 24575, 24576, 24577, 49157, 60000}) {
      const char* p = data.data() + start;
      CHECK_EQ(Crc32cExtend(0, p, n), Crc32cExtendPortable(0, p, n));
    }
  }
}

TEST(Crc32cExtendIsConcatenation) {
  auto data = RandomBytes(10000, 11);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut : {0, 1, 4096, 9999, 10000}) {
    uint32_t c = Crc32cExtend(0, data.data(), cut);
    c = Crc32cExtend(c, data.data() + cut, data.size() - cut);
    CHECK_EQ(c, whole);
  }
}

TEST(Crc32cCombineIsConcatenation) {
  using jaxoff::aio::Crc32cCombine;
  auto data = RandomBytes(3 << 20, 13);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4096}, size_t{1 << 20}, size_t{(3 << 20) - 7},
                     size_t{3 << 20}}) {
    const uint32_t a = Crc32c(data.data(), cut);
    const uint32_t b = Crc32c(data.data() + cut, data.size() - cut);
    CHECK_EQ(Crc32cCombine(a, b, data.size() - cut), whole);
  }
  // Many uneven blocks folded left to right, as the engine does.
  uint32_t c = 0;
  size_t pos = 0;
  for (size_t n = 1; pos < data.size(); n = n * 3 + 4093) {
    n = std::min(n, data.size() - pos);
    c = Crc32cCombine(c, Crc32c(data.data() + pos, n), n);
    pos += n;
  }
  CHECK_EQ(c, whole);
}

TEST(Crc32cCopyCopiesAndChecksums) {
  using jaxoff::aio::Crc32cCopy;
  auto data = RandomBytes((1 << 20) + 77, 17);
  for (size_t start : {0, 1, 64}) {
    for (size_t n : {size_t{0}, size_t{5}, size_t{24575}, size_t{24576}, size_t{24583},
                     size_t{65536}, size_t{65537}, size_t{1 << 20}}) {
      std::string out(n + 1, '\x5a');
      const char* src = data.data() + start;
      CHECK_EQ(Crc32cCopy(0, out.data(), src, n), Crc32c(src, n));
      CHECK(std::memcmp(out.data(), src, n) == 0);
      CHECK_EQ(out[n], '\x5a');
    }
  }
}
