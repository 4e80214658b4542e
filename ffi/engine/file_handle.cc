#include "file_handle.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "aligned_buffer.h"
#include "error.h"

namespace jaxoff::aio {

FileHandle::FileHandle(const std::string& path, bool writable, bool create, bool o_direct)
    : path_(path) {
  int flags = (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | (create ? O_CREAT : 0);
  if (o_direct) {
    fd_ = ::open(path.c_str(), flags | O_DIRECT, 0644);
    if (fd_ >= 0) {
      direct_ = true;
      return;
    }
    if (errno != EINVAL) throw JAXOFF_IO_ERROR("open (O_DIRECT)", path, 0, -1, errno);
  }
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) throw JAXOFF_IO_ERROR("open", path, 0, -1, errno);
}

FileHandle::~FileHandle() { Close(); }

FileHandle& FileHandle::operator=(FileHandle&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = std::exchange(o.fd_, -1);
    direct_ = o.direct_;
    path_ = std::move(o.path_);
  }
  return *this;
}

void FileHandle::Close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

uint64_t FileHandle::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw JAXOFF_IO_ERROR("fstat", path_, 0, -1, errno);
  return static_cast<uint64_t>(st.st_size);
}

File::File(std::vector<std::string> paths, bool writable, bool create, bool o_direct,
           uint64_t stripe_bytes)
    : paths_(std::move(paths)), stripe_bytes_(stripe_bytes) {
  if (paths_.empty()) throw std::invalid_argument("File: no path given");
  if (paths_.size() > 1 && (stripe_bytes_ == 0 || stripe_bytes_ % kAlign != 0)) {
    throw std::invalid_argument("File: striping over " + std::to_string(paths_.size()) +
                                " paths needs stripe_bytes, a positive multiple of 4096 (got " +
                                std::to_string(stripe_bytes_) + ")");
  }
  for (const auto& p : paths_) {
    buffered_.emplace_back(p, writable, create, /*o_direct=*/false);
    if (o_direct) {
      FileHandle d(p, writable, /*create=*/false, /*o_direct=*/true);
      if (d.direct()) direct_.push_back(std::move(d));
    }
  }
  if (direct_.size() != buffered_.size()) direct_.clear();
}

Extent File::Map(uint64_t offset, size_t max_len, bool aligned) const {
  const bool use_direct = aligned && !direct_.empty();
  const auto& fds = use_direct ? direct_ : buffered_;
  if (paths_.size() == 1) {
    return Extent{fds[0].fd(), use_direct, offset, max_len, &paths_[0]};
  }
  const uint64_t n = paths_.size();
  const uint64_t chunk = offset / stripe_bytes_;
  const uint64_t within = offset % stripe_bytes_;
  const size_t k = static_cast<size_t>(chunk % n);
  const uint64_t physical = (chunk / n) * stripe_bytes_ + within;
  const uint64_t room = stripe_bytes_ - within;
  return Extent{fds[k].fd(), use_direct, physical,
                static_cast<size_t>(std::min<uint64_t>(room, max_len)), &paths_[k]};
}

namespace {
std::atomic<uint64_t> g_file_syncs{0};
}  // namespace

uint64_t FileSyncCount() { return g_file_syncs.load(std::memory_order_relaxed); }

void File::Sync() const {
  g_file_syncs.fetch_add(1, std::memory_order_relaxed);
  for (const auto& f : buffered_) {
    if (::fsync(f.fd()) != 0) throw JAXOFF_IO_ERROR("fsync", f.path(), 0, -1, errno);
  }
}

void SyncFiles(const std::vector<const File*>& files) {
  g_file_syncs.fetch_add(files.size(), std::memory_order_relaxed);
  std::map<dev_t, std::pair<int, std::string>> one_per_fs;  // device -> (fd, path)
  for (const File* f : files) {
    for (const auto& h : f->buffered_) {
      struct stat st;
      if (::fstat(h.fd(), &st) != 0) throw JAXOFF_IO_ERROR("fstat", h.path(), 0, -1, errno);
      one_per_fs.emplace(st.st_dev, std::make_pair(h.fd(), h.path()));
    }
  }
  for (const auto& [dev, fd_path] : one_per_fs) {
    if (::syncfs(fd_path.first) != 0) {
      throw JAXOFF_IO_ERROR("syncfs of the filesystem of", fd_path.second, 0, -1, errno);
    }
  }
}

uint64_t File::Size() const {
  uint64_t total = 0;
  for (const auto& f : buffered_) total += f.Size();
  return total;
}

}  // namespace jaxoff::aio
