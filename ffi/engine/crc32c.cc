#include "crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace jaxoff::aio {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

constexpr Tables kTables{};

// a(x) * b(x) modulo the polynomial, bit-reflected (zlib's multmodp).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

struct PowerTable {
  std::array<uint32_t, 32> x2n{};  // x^(2^k) mod p
  PowerTable() {
    uint32_t p = 1u << 30;  // x^1
    for (auto& v : x2n) {
      v = p;
      p = MultModP(p, p);
    }
  }
};

const PowerTable& Powers() {  // on first use: safe from static initialisation order
  static const PowerTable table;
  return table;
}

// x^(n * 2^k) mod p.
uint32_t X2nModP(uint64_t n, unsigned k) {
  uint32_t p = 1u << 31;  // x^0
  while (n) {
    if (n & 1) p = MultModP(Powers().x2n[k & 31], p);
    n >>= 1;
    ++k;
  }
  return p;
}


#if defined(__x86_64__)
// One crc32 instruction per 8-byte word. The instruction's latency is three cycles and one
// can start every cycle, so a single chain runs at a third of the unit's speed: runs of
// 3 x kStream bytes are taken as three independent chains, folded together with two
// multiplications by x^(8 kStream) (CRC registers are linear: crc(A B) from register r is
// crc(A) shifted by |B| bytes, xor crc(B) from 0).
constexpr size_t kStream = 8 << 10;

uint32_t ShiftStream(uint32_t c) {  // c * x^(8 kStream) mod P
  static const uint32_t k = X2nModP(kStream, 3);
  return MultModP(k, c);
}

// The register `c` extended over `n` bytes at `p`; with kCopy, the bytes are also stored to
// `d` as they are read (one pass through memory for the copy and the checksum).
template <bool kCopy>
__attribute__((target("sse4.2"))) uint32_t ExtendHw(uint32_t c, const unsigned char* p,
                                                    unsigned char* d, size_t n) {
  uint64_t c0 = c;
  while (n >= 3 * kStream) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStream; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kStream + i, 8);
      std::memcpy(&w2, p + 2 * kStream + i, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
      if constexpr (kCopy) {
        std::memcpy(d + i, &w0, 8);
        std::memcpy(d + kStream + i, &w1, 8);
        std::memcpy(d + 2 * kStream + i, &w2, 8);
      }
    }
    c0 = ShiftStream(ShiftStream(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
         static_cast<uint32_t>(c2);
    p += 3 * kStream;
    if constexpr (kCopy) d += 3 * kStream;
    n -= 3 * kStream;
  }
  if constexpr (kCopy) std::memcpy(d, p, n);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c0 = _mm_crc32_u64(c0, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c0);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool DetectHw() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
const bool kHaveHw = DetectHw();
#else
const bool kHaveHw = false;
#endif

uint32_t ExtendTable(uint32_t c, const unsigned char* p, size_t n) {
  const auto& t = kTables.t;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;  // little-endian only (x86-64, aarch64)
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size) {
  return ~ExtendTable(~crc, static_cast<const unsigned char*>(data), size);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (kHaveHw) return ~ExtendHw<false>(~crc, p, nullptr, size);
#endif
  return ~ExtendTable(~crc, p, size);
}

bool Crc32cIsHardware() { return kHaveHw; }

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return MultModP(X2nModP(len_b, 3), crc_a) ^ crc_b;
}

uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t size) {
#if defined(__x86_64__)
  if (kHaveHw) {
    return ~ExtendHw<true>(~crc, static_cast<const unsigned char*>(src),
                           static_cast<unsigned char*>(dst), size);
  }
#endif
  constexpr size_t kPiece = 64 << 10;  // fits L2 with room to spare
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  while (size > 0) {
    const size_t n = size < kPiece ? size : kPiece;
    std::memcpy(d, s, n);
    crc = Crc32cExtend(crc, s, n);
    d += n;
    s += n;
    size -= n;
  }
  return crc;
}

}  // namespace jaxoff::aio
