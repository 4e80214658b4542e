#pragma once
// ChunkIo over jaxoff._ffi's file tables through the host paging API (host_paging_api.h): the
// disk side of the CUDA module's pager. Each request runs a synchronous engine read or write
// on one of its own threads, never on XLA's; crc32c is taken by the engine's workers.

#include <memory>
#include <vector>

#include "gpu_pager.h"
#include "host_paging_api.h"
#include "worker_pool.h"

namespace jaxoff::pager {

class HostApiChunkIo final : public aio::ChunkIo {
 public:
  // `table`: a handle from api->acquire, released by the caller after this object is gone.
  HostApiChunkIo(const host_api::Api* api, void* table, int threads)
      : api_(api), table_(table), pool_(threads) {}

  void Read(const aio::ChunkRef& ref, void* dst, Done done) override;
  void Write(const aio::ChunkRef& ref, const void* src, Done done) override;
  aio::IoStatus Sync(const std::vector<int>& files) override;

 private:
  const host_api::Api* api_;
  void* table_;
  aio::WorkerPool pool_;  // last: joined before the members its tasks use go
};

}  // namespace jaxoff::pager
