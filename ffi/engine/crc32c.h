#pragma once
// CRC-32C (Castagnoli), the checksum of page-file chunks. Equals Python's
// `crc32c.crc32c(data)`; Extend() continues a checksum over more bytes.

#include <cstddef>
#include <cstdint>

namespace jaxoff::aio {

// crc32c of `data` appended to bytes whose crc32c is `crc` (0 for none).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

// crc32c of A followed by B, from crc32c(A), crc32c(B) and B's length (zlib's crc32_combine
// for the Castagnoli polynomial): lets blocks be checksummed independently, in any order.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// memcpy(dst, src, size) that also returns Crc32cExtend(crc, src, size): the checksum is taken
// piece by piece right after each piece was copied, while it is still in cache, so the bytes
// travel through memory once rather than twice.
uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t size);

// True when the SSE4.2 crc32 instruction is used (else a table-driven fallback).
bool Crc32cIsHardware();

// The portable table implementation (exposed for tests that compare both paths).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);

}  // namespace jaxoff::aio
