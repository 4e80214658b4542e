#include "host_api_chunk_io.h"

#include <cerrno>
#include <utility>

namespace jaxoff::pager {

namespace {

aio::IoStatus StatusOf(int rc, const host_api::Status& st, uint32_t crc) {
  aio::IoStatus out;
  if (rc != host_api::kOk) {
    out.err = st.err != 0 ? st.err : EIO;
    out.message = st.message;
  } else {
    out.crc32c = crc;
  }
  return out;
}

}  // namespace

void HostApiChunkIo::Read(const aio::ChunkRef& ref, void* dst, Done done) {
  pool_.Post([this, ref, dst, done = std::move(done)] {
    host_api::Status st;
    uint32_t crc = 0;
    const int rc = api_->read("jaxoff pager (read)", table_, ref.file,
                              static_cast<int64_t>(ref.offset), dst, ref.bytes, &crc, &st);
    done(StatusOf(rc, st, crc));
  });
}

void HostApiChunkIo::Write(const aio::ChunkRef& ref, const void* src, Done done) {
  pool_.Post([this, ref, src, done = std::move(done)] {
    host_api::Status st;
    uint32_t crc = 0;
    const int rc = api_->write("jaxoff pager (write)", table_, ref.file,
                               static_cast<int64_t>(ref.offset), src, ref.bytes, &crc, &st);
    done(StatusOf(rc, st, crc));
  });
}

aio::IoStatus HostApiChunkIo::Sync(const std::vector<int>& files) {
  std::vector<int64_t> ids(files.begin(), files.end());
  host_api::Status st;
  const int rc = api_->sync("jaxoff pager (commit)", table_, ids.data(), ids.size(), &st);
  return StatusOf(rc, st, 0);
}

}  // namespace jaxoff::pager
