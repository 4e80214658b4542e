#pragma once
// Errors of the I/O engine: every failure names the file, the offset and errno, plus the
// engine source line that detected it, and says what to do when the cause is common.

#include <cstdint>
#include <stdexcept>
#include <string>

namespace jaxoff::aio {

// errno value the engine uses for "the file ended before the requested bytes".
inline constexpr int kErrEof = -1;

// A failed I/O operation (also thrown for failed opens and bad arguments).
class IoError : public std::runtime_error {
 public:
  IoError(std::string message, int err, std::string path, int64_t offset, const char* src_file,
          int src_line);

  int err() const noexcept { return err_; }
  const std::string& path() const noexcept { return path_; }
  int64_t offset() const noexcept { return offset_; }
  const char* src_file() const noexcept { return src_file_; }
  int src_line() const noexcept { return src_line_; }

 private:
  int err_;
  std::string path_;
  int64_t offset_;
  const char* src_file_;
  int src_line_;
};

// "No space left on device (ENOSPC, errno 28): <advice>" — a readable description of `err`.
std::string DescribeErrno(int err);

// Builds the full message: "<op> <path> at offset <offset> (<bytes> bytes): <errno text> [src:line]".
std::string FormatIoMessage(const std::string& op, const std::string& path, int64_t offset,
                            int64_t bytes, int err, const char* src_file, int src_line);

// Outcome of an asynchronous request: ok, or errno + a full message.
struct IoStatus {
  int err = 0;
  std::string message;
  uint32_t crc32c = 0;  // of the request's bytes, when IoOptions::crc32c asked for it and ok()
  bool ok() const noexcept { return err == 0 && message.empty(); }
};

}  // namespace jaxoff::aio

#define JAXOFF_IO_ERROR(op, path, offset, bytes, err)                                          \
  ::jaxoff::aio::IoError(                                                                     \
      ::jaxoff::aio::FormatIoMessage((op), (path), (offset), (bytes), (err), __FILE__, __LINE__), \
      (err), (path), (offset), __FILE__, __LINE__)
