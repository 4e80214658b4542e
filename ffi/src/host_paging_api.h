#pragma once
// The host half of paging as a small C-style table of functions, exported by jaxoff._ffi (as a
// PyCapsule, see module.cc) to the platform handlers built as other modules (jaxoff._ffi_cuda).
//
// Why a table of functions: the file tables (registry, engines, staging, write-behind order)
// live in jaxoff._ffi. A second module that linked the engine itself would hold a second,
// empty registry; one that shared C++ objects across the module boundary would depend on both
// modules being built alike. Through this table a CUDA handler pages exactly as the CPU one
// does (same files, same checksums, same ordering against write-behind writes) and only moves
// bytes between the host staging and the device.
//
// Every call is synchronous and thread-safe. Errors return a non-zero code (the absl/XLA status
// code to report) and fill `Status::message` with one line that names `who` (the FFI target).

#include <cstddef>
#include <cstdint>

namespace jaxoff::host_api {

constexpr int kVersion = 1;
constexpr const char* kCapsuleName = "jaxoff.host_paging_api.v1";

// Status codes, numerically equal to xla::ffi::ErrorCode (absl::StatusCode).
enum Code : int {
  kOk = 0,
  kInvalidArgument = 3,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kInternal = 13,
  kDataLoss = 15,
};

struct Status {
  int code = kOk;
  char message[2048] = {0};
};

struct Api {
  int version;
  size_t struct_size;
  // A handle that keeps the named file table alive (nullptr and `st` set if none is registered).
  void* (*acquire)(const char* who, const char* table, Status* st);
  void (*release)(void* table);
  // Reads `size` bytes at `offset` of file `file_id` into `dst` (after any overlapping
  // write-behind write); with `verify`, their crc32c must equal `expected_crc` (kDataLoss).
  int (*read)(const char* who, void* table, int64_t file_id, int64_t offset, void* dst,
              size_t size, bool verify, uint32_t expected_crc, Status* st);
  // Writes `size` bytes of `src`; *crc gets their crc32c. With `write_behind`, returns once they
  // are in the table's staging (synchronous when the staging cannot take them).
  int (*write)(const char* who, void* table, int64_t file_id, int64_t offset, const void* src,
               size_t size, bool write_behind, uint32_t* crc, Status* st);
  // Split-phase read: starts it and returns its ticket; take waits, verifies and copies out.
  int (*prefetch)(const char* who, void* table, int64_t file_id, int64_t offset, size_t size,
                  bool verify, uint32_t expected_crc, int32_t* ticket, Status* st);
  int (*take)(const char* who, void* table, int32_t ticket, void* dst, size_t size, Status* st);
  // Waits for the table's write-behind writes (and fsyncs their files with `fsync`).
  int (*flush)(const char* who, void* table, bool fsync, Status* st);
};

// The table jaxoff._ffi exports (defined in host_paging.cc).
const Api* GetApi();

}  // namespace jaxoff::host_api
