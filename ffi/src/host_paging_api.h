#pragma once
// The disk half of paging as a small C-style table of functions, exported by jaxoff._ffi (as a
// PyCapsule, see module.cc) to the platform module built apart from it (jaxoff._ffi_cuda),
// whose pager reads and writes the page files through it (host_api_chunk_io.h).
//
// Why a table of functions: the file tables (registry, engines, open files) live in
// jaxoff._ffi. A second module that linked the engine itself would hold a second, empty
// registry; one that shared C++ objects across the module boundary would depend on both
// modules being built alike. Through this table the CUDA pager pages exactly the files the
// CPU one does, with the same engine.
//
// Every call is synchronous and thread-safe. Errors return a non-zero code (the absl/XLA status
// code to report) and fill `Status::message` with one line that names `who`.

#include <cstddef>
#include <cstdint>

namespace jaxoff::host_api {

constexpr int kVersion = 2;
constexpr const char* kCapsuleName = "jaxoff.host_paging_api.v2";

// Status codes, numerically equal to xla::ffi::ErrorCode (absl::StatusCode).
enum Code : int {
  kOk = 0,
  kInvalidArgument = 3,
  kFailedPrecondition = 9,
  kInternal = 13,
};

struct Status {
  int code = kOk;
  int err = 0;  // errno of a failed read, write or sync (0 if none)
  char message[2048] = {0};
};

struct Api {
  int version;
  size_t struct_size;
  // A handle that keeps the named file table alive (nullptr and `st` set if none is registered).
  void* (*acquire)(const char* who, const char* table, Status* st);
  void (*release)(void* table);
  // Reads `size` bytes at `offset` of file `file_id` into `dst`; *crc gets their crc32c.
  int (*read)(const char* who, void* table, int64_t file_id, int64_t offset, void* dst,
              size_t size, uint32_t* crc, Status* st);
  // Writes `size` bytes of `src`; *crc gets their crc32c.
  int (*write)(const char* who, void* table, int64_t file_id, int64_t offset, const void* src,
               size_t size, uint32_t* crc, Status* st);
  // Makes what was written to files `file_ids[0..n)` durable (fsync).
  int (*sync)(const char* who, void* table, const int64_t* file_ids, size_t n, Status* st);
};

// The table jaxoff._ffi exports (defined in host_paging.cc).
const Api* GetApi();

}  // namespace jaxoff::host_api
