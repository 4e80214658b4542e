#pragma once
// Move-only file descriptors, and a logical File that may be striped over several paths.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace jaxoff::aio {

// One open file descriptor; closed by the destructor.
class FileHandle {
 public:
  FileHandle() = default;
  // Opens `path` (throws IoError naming path and errno). With `o_direct`, a filesystem that
  // refuses O_DIRECT (EINVAL, e.g. tmpfs) gets a buffered descriptor instead: see direct().
  FileHandle(const std::string& path, bool writable, bool create, bool o_direct);
  ~FileHandle();
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  FileHandle(FileHandle&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), direct_(o.direct_), path_(std::move(o.path_)) {}
  FileHandle& operator=(FileHandle&& o) noexcept;

  int fd() const noexcept { return fd_; }
  bool direct() const noexcept { return direct_; }
  const std::string& path() const noexcept { return path_; }
  // Current size in bytes (fstat).
  uint64_t Size() const;

 private:
  void Close() noexcept;
  int fd_ = -1;
  bool direct_ = false;
  std::string path_;
};

// Where a piece of a logical file lives.
struct Extent {
  int fd;                    // descriptor to use
  bool direct;               // fd was opened with O_DIRECT
  uint64_t offset;           // physical offset in that file
  size_t len;                // bytes of this extent (<= requested)
  const std::string* path;   // for error messages
};

// A logical file: one path, or `paths.size()` stripes of `stripe_bytes` placed round-robin
// (stripe k of the logical file is chunk k / n of paths[k % n]). Each stripe keeps an O_DIRECT
// descriptor and a buffered one; requests that are not 4 KiB aligned use the buffered one.
class File;
void SyncFiles(const std::vector<const File*>& files);

class File {
 public:
  File(std::vector<std::string> paths, bool writable, bool create, bool o_direct,
       uint64_t stripe_bytes = 0);

  // The extent holding logical byte `offset`, at most `max_len` long. Uses the direct descriptor
  // when `aligned` (offset and buffer meet O_DIRECT's rules) and one exists.
  Extent Map(uint64_t offset, size_t max_len, bool aligned) const;

  const std::string& path() const { return paths_.front(); }
  size_t num_stripes() const { return paths_.size(); }
  uint64_t stripe_bytes() const { return stripe_bytes_; }
  bool has_direct() const { return !direct_.empty() && direct_.front().direct(); }
  // Logical size: sum over stripes (exact for files written through this class).
  uint64_t Size() const;
  // fsync of every stripe (throws IoError naming the path and errno). Counted by
  // FileSyncCount().
  void Sync() const;

 private:
  friend void SyncFiles(const std::vector<const File*>& files);
  std::vector<std::string> paths_;
  uint64_t stripe_bytes_;
  std::vector<FileHandle> direct_;    // empty when O_DIRECT is off
  std::vector<FileHandle> buffered_;
};

// Makes every file of `files` durable: one syncfs(2) per filesystem holding them (it flushes
// the data, the metadata and the device's cache for all at once, where an fsync of each would
// flush the device's cache once a file), counted as one sync of each file by FileSyncCount().
// Throws IoError naming a path of the filesystem and errno.
void SyncFiles(const std::vector<const File*>& files);

// Files made durable in this process so far (File::Sync calls and the files of SyncFiles),
// failed ones included: a test hook (a commit must have made its step's files durable).
uint64_t FileSyncCount();

}  // namespace jaxoff::aio
