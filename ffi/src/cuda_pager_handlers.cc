#include "cuda_pager_handlers.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "crc32c.h"
#include "cuda_device_ops.h"
#include "worker_pool.h"

namespace ffi = xla::ffi;

namespace jaxoff::cuda_pager {

namespace {

using aio::ChunkIo;
using aio::ChunkRef;
using aio::GpuPager;
using aio::IoStatus;

// ChunkIo over jaxoff._ffi's file table (host_paging_api.h): each request runs a synchronous
// host read or write on one of the pager's I/O threads, never on XLA's thread. A read's
// crc32c is taken on that thread, over the pinned arena slot it filled.
class HostApiChunkIo final : public ChunkIo {
 public:
  HostApiChunkIo(const host_api::Api* api, void* table, int threads)
      : api_(api), table_(table), pool_(threads) {}

  void Read(const ChunkRef& ref, void* dst, Done done) override {
    Post([this, ref, dst, done = std::move(done)] {
      host_api::Status st;
      IoStatus out;
      if (api_->read("jaxoff GPU pager (read)", table_, ref.file,
                     static_cast<int64_t>(ref.offset), dst, ref.bytes, /*verify=*/false, 0,
                     &st) != host_api::kOk) {
        out.err = EIO;
        out.message = st.message;
      } else {
        out.crc32c = aio::Crc32c(dst, ref.bytes);
      }
      done(out);
    });
  }

  void Write(const ChunkRef& ref, const void* src, Done done) override {
    Post([this, ref, src, done = std::move(done)] {
      host_api::Status st;
      IoStatus out;
      uint32_t crc = 0;
      if (api_->write("jaxoff GPU pager (write)", table_, ref.file,
                      static_cast<int64_t>(ref.offset), src, ref.bytes, /*write_behind=*/false,
                      &crc, &st) != host_api::kOk) {
        out.err = EIO;
        out.message = st.message;
      } else {
        out.crc32c = crc;
      }
      done(out);
    });
  }

 private:
  void Post(std::function<void()> fn) { pool_.Post(std::move(fn)); }

  const host_api::Api* api_;
  void* table_;
  aio::WorkerPool pool_;  // last: joined before the members its tasks use go
};

// One open pager: its device interface, disk side and the pager itself, for one file table.
struct PagerEntry {
  std::string table;
  int device = 0;
  const host_api::Api* api = nullptr;
  void* handle = nullptr;  // keeps the file table alive
  std::unique_ptr<aio::DeviceOps> ops;
  std::unique_ptr<HostApiChunkIo> io;
  std::unique_ptr<GpuPager> pager;
  ~PagerEntry() {
    pager.reset();  // waits for its copies and writes
    io.reset();
    ops.reset();
    if (handle != nullptr) api->release(handle);
  }
};

std::mutex g_mu;
std::map<std::string, std::shared_ptr<PagerEntry>>& Registry() {
  static auto* r = new std::map<std::string, std::shared_ptr<PagerEntry>>();  // leaked: no
  return *r;  // teardown after CUDA's
}

std::shared_ptr<PagerEntry> Find(const std::string& table) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Registry().find(table);
  return it == Registry().end() ? nullptr : it->second;
}

std::shared_ptr<PagerEntry> Need(const std::string& table) {
  auto e = Find(table);
  if (e == nullptr) {
    throw std::invalid_argument("no GPU pager is open for file table '" + table +
                                "': open it (jaxoff._ffi_cuda.pager_open) first");
  }
  return e;
}

std::vector<ChunkRef> Refs(const std::vector<PlanIo>& ios, std::vector<int>* sites) {
  std::vector<ChunkRef> refs;
  for (const auto& [site, file, offset, bytes] : ios) {
    refs.push_back({static_cast<int>(file), offset, static_cast<size_t>(bytes)});
    sites->push_back(site);
  }
  return refs;
}

}  // namespace

void OpenPager(const host_api::Api* api, const std::string& table, int device,
               const aio::PagerConfig& config, int io_threads) {
  if (api == nullptr) {
    throw std::runtime_error("jaxoff._ffi_cuda is not bound to jaxoff._ffi; call "
                             "jaxoff.aio.register_targets() first");
  }
  config.Validate();
  auto entry = std::make_shared<PagerEntry>();
  entry->table = table;
  entry->device = device;
  entry->api = api;
  host_api::Status st;
  entry->handle = api->acquire("jaxoff GPU pager", table.c_str(), &st);
  if (entry->handle == nullptr) throw std::runtime_error(st.message);
  try {
    entry->ops = aio::MakeCudaDeviceOps(device);
    entry->io = std::make_unique<HostApiChunkIo>(api, entry->handle, io_threads);
    entry->pager = std::make_unique<GpuPager>(
        entry->ops.get(), entry->io.get(), config,
        [api, handle = entry->handle](uint64_t, const GpuPager::Crcs&) -> IoStatus {
          // The step's writes are all done: make them durable before the step counts.
          host_api::Status fst;
          IoStatus out;
          if (api->flush("jaxoff GPU pager (commit)", handle, /*fsync=*/true, &fst) !=
              host_api::kOk) {
            out.err = EIO;
            out.message = fst.message;
          }
          return out;
        });
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot open the GPU pager of file table '" + table +
                             "' on CUDA device " + std::to_string(device) + ": " + e.what());
  }
  std::shared_ptr<PagerEntry> old;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    old = std::move(Registry()[table]);
    Registry()[table] = std::move(entry);
  }
}

void RegisterPagerPlan(const std::string& table, int64_t id, const std::vector<PlanIo>& reads,
                       const std::vector<PlanIo>& writes) {
  auto e = Need(table);
  aio::StepPlan plan;
  plan.reads = Refs(reads, &plan.read_sites);
  plan.writes = Refs(writes, &plan.write_sites);
  e->pager->RegisterPlan(id, std::move(plan));
}

void SetPagerChecksums(const std::string& table,
                       const std::vector<std::tuple<int64_t, uint64_t, uint32_t>>& crcs) {
  auto e = Need(table);
  for (const auto& [file, offset, crc] : crcs) {
    e->pager->SetChecksum({static_cast<int>(file), offset, 0}, crc);
  }
}

std::vector<std::tuple<int64_t, uint64_t, uint32_t>> PagerChecksums(const std::string& table) {
  auto e = Need(table);
  std::vector<std::tuple<int64_t, uint64_t, uint32_t>> out;
  for (const auto& [key, crc] : e->pager->Checksums()) out.emplace_back(key.first, key.second, crc);
  return out;
}

aio::PagerStats PagerStatsOf(const std::string& table, uint64_t* committed_step) {
  auto e = Need(table);
  *committed_step = e->pager->committed_step();
  return e->pager->Stats();
}

bool ClosePager(const std::string& table) {
  std::shared_ptr<PagerEntry> e;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = Registry().find(table);
    if (it == Registry().end()) return false;
    e = std::move(it->second);
    Registry().erase(it);
  }
  return true;  // closed when the last program holding it is gone
}

// ---- XLA FFI handlers ------------------------------------------------------------------

struct PagerState {
  static ffi::TypeId id;
  std::shared_ptr<PagerEntry> entry;  // the pager open when the program was instantiated
};
ffi::TypeId PagerState::id = {};

namespace {

const ffi::TypeInfo kPagerStateTypeInfo = ffi::MakeTypeInfo<PagerState>();

constexpr const char* kBegin = "jaxoff_gpu_page_begin";
constexpr const char* kTake = "jaxoff_gpu_page_take";
constexpr const char* kOut = "jaxoff_gpu_page_out";
constexpr const char* kCommit = "jaxoff_gpu_page_commit";

ffi::Error ToError(const char* who, const IoStatus& st) {
  ffi::ErrorCode code = ffi::ErrorCode::kInternal;
  if (st.err == EINVAL) code = ffi::ErrorCode::kInvalidArgument;
  if (st.err == EBADMSG) code = ffi::ErrorCode::kDataLoss;
  if (st.err == ETIMEDOUT) code = ffi::ErrorCode::kDeadlineExceeded;
  return ffi::Error(code, std::string(who) + ": " + st.message);
}

ffi::Error Guard(const char* who, const std::exception& e) {
  return ffi::Error(ffi::ErrorCode::kInternal, std::string(who) + ": " + e.what());
}

// The token result: a memset enqueued on XLA's stream (no host memory involved, no wait).
ffi::Error ZeroToken(const char* who, cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& token) {
  cudaError_t e = cudaMemsetAsync(token->untyped_data(), 0, token->size_bytes(), stream);
  if (e != cudaSuccess) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      std::string(who) + ": cudaMemsetAsync (token) failed: " +
                          cudaGetErrorName(e) + " (an error of XLA's stream may come from "
                          "earlier work on it)");
  }
  return ffi::Error::Success();
}

// The call belongs to the step begun last: a program begun with another plan (or none) is a
// lowering error, reported rather than paging the wrong chunks.
ffi::Error SamePlan(const char* who, const GpuPager& pager, int64_t plan) {
  const int64_t current = pager.plan_id();
  if (current == plan) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    std::string(who) + " of plan " + std::to_string(plan) + " runs in a step " +
                        (current < 0 ? std::string("not begun by jaxoff_gpu_page_begin")
                                     : "of plan " + std::to_string(current)));
}

ffi::ErrorOr<std::unique_ptr<PagerState>> Instantiate(const char* who, std::string_view table) {
  auto entry = Find(std::string(table));
  if (entry == nullptr) {
    return ffi::Unexpected<ffi::Error>(ffi::Error(
        ffi::ErrorCode::kFailedPrecondition,
        std::string(who) + ": no GPU pager is open for file table '" + std::string(table) +
            "': open it (jaxoff._ffi_cuda.pager_open) before compiling the step"));
  }
  auto state = std::make_unique<PagerState>();
  state->entry = std::move(entry);
  return ffi::ErrorOr<std::unique_ptr<PagerState>>(std::move(state));
}

ffi::Error PageBegin(cudaStream_t stream, int32_t device, PagerState* state,
                     ffi::AnyBuffer /*token*/, ffi::Result<ffi::AnyBuffer> out_token,
                     std::string_view /*table*/, int64_t plan) {
  try {
    if (device != state->entry->device) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        std::string(kBegin) + ": the step runs on CUDA device " +
                            std::to_string(device) + " but the pager was opened on device " +
                            std::to_string(state->entry->device));
    }
    // Waits on the host only for the previous step's disk writes and commit (rule I2).
    IoStatus st = state->entry->pager->Begin(plan);
    if (!st.ok()) return ToError(kBegin, st);
    return ZeroToken(kBegin, stream, out_token);
  } catch (const std::exception& e) {
    return Guard(kBegin, e);
  }
}

ffi::Error PageTake(cudaStream_t stream, PagerState* state, ffi::AnyBuffer /*token*/,
                    ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> out_token,
                    std::string_view /*table*/, int64_t plan, int64_t site) {
  try {
    GpuPager& pager = *state->entry->pager;
    if (auto err = SamePlan(kTake, pager, plan); err.failure()) return err;
    // Enqueues on XLA's stream: wait for the ring slot's H2D, D2D into `out`, record `free`.
    IoStatus st = pager.Take(static_cast<int>(site), stream, out->untyped_data(),
                             out->size_bytes());
    if (!st.ok()) return ToError(kTake, st);
    return ZeroToken(kTake, stream, out_token);
  } catch (const std::exception& e) {
    return Guard(kTake, e);
  }
}

ffi::Error PageOut(cudaStream_t stream, PagerState* state, ffi::AnyBuffer x,
                   ffi::AnyBuffer /*token*/, ffi::Result<ffi::AnyBuffer> out_token,
                   std::string_view /*table*/, int64_t plan, int64_t site) {
  try {
    GpuPager& pager = *state->entry->pager;
    if (auto err = SamePlan(kOut, pager, plan); err.failure()) return err;
    // Enqueues on XLA's stream: D2D of `x` into a write slot, record `ready`; the D2H and the
    // disk write run on the pager's stream and threads.
    IoStatus st = pager.Put(static_cast<int>(site), stream, x.untyped_data(), x.size_bytes());
    if (!st.ok()) return ToError(kOut, st);
    return ZeroToken(kOut, stream, out_token);
  } catch (const std::exception& e) {
    return Guard(kOut, e);
  }
}

ffi::Error PageCommit(cudaStream_t stream, PagerState* state, ffi::AnyBuffer /*token*/,
                      ffi::Result<ffi::AnyBuffer> out_token, std::string_view /*table*/,
                      int64_t plan) {
  try {
    GpuPager& pager = *state->entry->pager;
    if (auto err = SamePlan(kCommit, pager, plan); err.failure()) return err;
    // Returns at once; the pager commits once the step's writes are on disk.
    IoStatus st = pager.Commit();
    if (!st.ok()) return ToError(kCommit, st);
    return ZeroToken(kCommit, stream, out_token);
  } catch (const std::exception& e) {
    return Guard(kCommit, e);
  }
}

ffi::ErrorOr<std::unique_ptr<PagerState>> BeginInstantiate(std::string_view table, int64_t) {
  return Instantiate(kBegin, table);
}
ffi::ErrorOr<std::unique_ptr<PagerState>> TakeInstantiate(std::string_view table, int64_t,
                                                          int64_t) {
  return Instantiate(kTake, table);
}
ffi::ErrorOr<std::unique_ptr<PagerState>> OutInstantiate(std::string_view table, int64_t,
                                                         int64_t) {
  return Instantiate(kOut, table);
}
ffi::ErrorOr<std::unique_ptr<PagerState>> CommitInstantiate(std::string_view table, int64_t) {
  return Instantiate(kCommit, table);
}

}  // namespace

XLA_FFI_TypeId* PagerStateTypeId() { return &PagerState::id; }
const XLA_FFI_TypeInfo* PagerStateTypeInfo() { return &kPagerStateTypeInfo; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuPageBeginInstantiate, BeginInstantiate,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuPageBeginExecute, PageBegin,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::State<PagerState>>()
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuPageTakeInstantiate, TakeInstantiate,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan")
                                  .Attr<int64_t>("site"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuPageTakeExecute, PageTake,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<PagerState>>()
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // the tensor
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan")
                                  .Attr<int64_t>("site"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuPageOutInstantiate, OutInstantiate,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan")
                                  .Attr<int64_t>("site"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuPageOutExecute, PageOut,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<PagerState>>()
                                  .Arg<ffi::AnyBuffer>()  // the tensor
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan")
                                  .Attr<int64_t>("site"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuPageCommitInstantiate, CommitInstantiate,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuPageCommitExecute, PageCommit,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<PagerState>>()
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan"));

}  // namespace jaxoff::cuda_pager
