#include "error.h"

#include <cerrno>
#include <cstring>
#include <sstream>

namespace jaxoff::aio {
namespace {

const char* ErrnoName(int err) {
  switch (err) {
    case ENOSPC: return "ENOSPC";
    case EFBIG: return "EFBIG";
    case ENOENT: return "ENOENT";
    case EACCES: return "EACCES";
    case EINVAL: return "EINVAL";
    case EIO: return "EIO";
    case EBADF: return "EBADF";
    case EROFS: return "EROFS";
    case EDQUOT: return "EDQUOT";
    case EISDIR: return "EISDIR";
    case EMFILE: return "EMFILE";
    case ENOMEM: return "ENOMEM";
    default: return "errno";
  }
}

const char* Advice(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return "the disk is full; free space or point the page store at a larger volume";
    case EFBIG:
      return "the file would exceed the maximum file size allowed for this process "
             "(ulimit -f / RLIMIT_FSIZE) or filesystem; raise the limit or use smaller files";
    case ENOENT:
      return "the file or its directory does not exist; create the directory first";
    case EACCES:
      return "permission denied; check the directory's owner and mode";
    case EINVAL:
      return "invalid argument; with O_DIRECT, buffers, offsets and lengths must be "
             "4096-byte aligned (the filesystem may not support O_DIRECT)";
    case EROFS:
      return "the filesystem is read-only";
    case EIO:
      return "the device reported an I/O error; check dmesg";
    default:
      return nullptr;
  }
}

}  // namespace

IoError::IoError(std::string message, int err, std::string path, int64_t offset,
                 const char* src_file, int src_line)
    : std::runtime_error(std::move(message)),
      err_(err),
      path_(std::move(path)),
      offset_(offset),
      src_file_(src_file),
      src_line_(src_line) {}

std::string DescribeErrno(int err) {
  std::ostringstream os;
  if (err == kErrEof) {
    os << "read past the end of the file (the file is shorter than offset + size: it was "
          "truncated or never fully written)";
    return os.str();
  }
  os << std::strerror(err) << " (" << ErrnoName(err) << ", errno " << err << ")";
  if (const char* advice = Advice(err)) os << ": " << advice;
  return os.str();
}

std::string FormatIoMessage(const std::string& op, const std::string& path, int64_t offset,
                            int64_t bytes, int err, const char* src_file, int src_line) {
  const char* base = std::strrchr(src_file, '/');
  std::ostringstream os;
  os << op << " " << path << " at offset " << offset;
  if (bytes >= 0) os << " (" << bytes << " bytes)";
  os << " failed: " << DescribeErrno(err) << " [" << (base ? base + 1 : src_file) << ":"
     << src_line << "]";
  return os.str();
}

}  // namespace jaxoff::aio
