#include "cuda_page_handlers.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace ffi = xla::ffi;

namespace jaxoff::cuda_handlers {

struct CudaPageState {
  static ffi::TypeId id;
  const host_api::Api* api = nullptr;
  void* table = nullptr;  // host_api handle: keeps the file table alive
  ~CudaPageState() {
    if (table != nullptr) api->release(table);
  }
};
ffi::TypeId CudaPageState::id = {};

namespace {

const ffi::TypeInfo kCudaPageStateTypeInfo = ffi::MakeTypeInfo<CudaPageState>();
std::atomic<const host_api::Api*> g_api{nullptr};

ffi::Error ToError(const host_api::Status& st) {
  return ffi::Error(static_cast<ffi::ErrorCode>(st.code), st.message);
}

ffi::Error CudaError(const char* who, const char* what, cudaError_t e) {
  return ffi::Error(ffi::ErrorCode::kInternal, std::string(who) + ": " + what + " failed: " +
                                                   cudaGetErrorName(e) + " (" +
                                                   cudaGetErrorString(e) + ")");
}

std::string MiB(size_t bytes) {
  return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB";
}

// Page-locked staging buffers shared by every call site. A buffer is busy while a handler
// uses it; released, it carries an event recorded on the stream of its last copy, and is only
// reused once that copy is done. The handlers are synchronous, so the buffers held are about
// (largest chunk) x (handlers running at once).
class PinnedPool {
 public:
  struct Buffer {
    void* ptr = nullptr;
    size_t size = 0;
    cudaEvent_t done = nullptr;
    bool busy = false;
  };

  static PinnedPool& Get() {
    static auto* pool = new PinnedPool();  // leaked on purpose: no teardown after CUDA's
    return *pool;
  }

  // A buffer of at least `size` bytes, or an error that says how much was asked and what to do.
  ffi::Error Acquire(const char* who, size_t size, Buffer** out) {
    std::lock_guard<std::mutex> lk(mu_);
    Buffer* best = nullptr;
    for (auto& b : buffers_) {
      if (b->busy || b->size < size) continue;
      if (cudaEventQuery(b->done) == cudaSuccess && (best == nullptr || b->size < best->size)) {
        best = b.get();
      }
    }
    if (best == nullptr) {
      // None idle yet: wait for the smallest that fits, if any, rather than pinning more.
      for (auto& b : buffers_) {
        if (!b->busy && b->size >= size && (best == nullptr || b->size < best->size)) {
          best = b.get();
        }
      }
      if (best != nullptr) {
        cudaError_t e = cudaEventSynchronize(best->done);
        if (e != cudaSuccess) return CudaError(who, "cudaEventSynchronize (staging)", e);
      }
    }
    if (best == nullptr) {
      const size_t want = RoundUp(size);
      if (cap_ != 0 && held_ + want > cap_) FreeIdle();
      if (cap_ != 0 && held_ + want > cap_) {
        return ffi::Error(
            ffi::ErrorCode::kResourceExhausted,
            std::string(who) + ": " + MiB(want) + " of page-locked staging would exceed " +
                "JAXOFF_CUDA_PINNED_MAX_BYTES (" + MiB(cap_) + ", " + MiB(held_) +
                " held): raise it, or page smaller chunks (jaxoff.paged(..., chunk_bytes=...))");
      }
      void* p = nullptr;
      cudaError_t e = cudaHostAlloc(&p, want, cudaHostAllocPortable);
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        FreeIdle();  // give back what is idle and try once more
        e = cudaHostAlloc(&p, want, cudaHostAllocPortable);
      }
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ffi::Error(
            ffi::ErrorCode::kResourceExhausted,
            std::string(who) + ": cannot allocate " + MiB(want) +
                " of page-locked host memory for staging (cudaHostAlloc: " +
                cudaGetErrorName(e) + "; jaxoff already holds " + MiB(held_) +
                "): page smaller chunks (jaxoff.paged(..., chunk_bytes=...)), or free "
                "page-locked memory held by other processes or by host-placed arrays");
      }
      auto b = std::make_unique<Buffer>();
      b->ptr = p;
      b->size = want;
      e = cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming);
      if (e != cudaSuccess) {
        cudaFreeHost(p);
        return CudaError(who, "cudaEventCreate", e);
      }
      held_ += want;
      best = b.get();
      buffers_.push_back(std::move(b));
    }
    best->busy = true;
    *out = best;
    return ffi::Error::Success();
  }

  // Gives a buffer back once the copies queued on `stream` that use it are done.
  ffi::Error Release(const char* who, Buffer* b, cudaStream_t stream) {
    cudaError_t e = cudaEventRecord(b->done, stream);
    std::lock_guard<std::mutex> lk(mu_);
    b->busy = false;
    if (e != cudaSuccess) {
      // Cannot know when the copy is done: wait for the stream before reuse.
      cudaStreamSynchronize(stream);
      return CudaError(who, "cudaEventRecord (staging)", e);
    }
    return ffi::Error::Success();
  }

  size_t held() {
    std::lock_guard<std::mutex> lk(mu_);
    return held_;
  }
  size_t cap() const { return cap_; }

 private:
  PinnedPool() {
    if (const char* v = std::getenv("JAXOFF_CUDA_PINNED_MAX_BYTES")) {
      cap_ = static_cast<size_t>(std::strtoull(v, nullptr, 10));
    }
  }
  static size_t RoundUp(size_t n) {
    constexpr size_t kGrain = size_t{2} << 20;  // few distinct sizes, so buffers get reused
    n = n == 0 ? 1 : n;
    return (n + kGrain - 1) / kGrain * kGrain;
  }
  // Frees every idle buffer (after its last copy). Called with mu_ held.
  void FreeIdle() {
    std::vector<std::unique_ptr<Buffer>> keep;
    for (auto& b : buffers_) {
      if (b->busy) {
        keep.push_back(std::move(b));
        continue;
      }
      cudaEventSynchronize(b->done);
      cudaEventDestroy(b->done);
      cudaFreeHost(b->ptr);
      held_ -= b->size;
    }
    buffers_ = std::move(keep);
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  size_t held_ = 0;
  size_t cap_ = 0;
};

// Scoped staging buffer: released (event on `stream`) when the handler returns.
class Staging {
 public:
  Staging(const char* who, cudaStream_t stream) : who_(who), stream_(stream) {}
  ~Staging() {
    if (buf_ != nullptr) (void)PinnedPool::Get().Release(who_, buf_, stream_);
  }
  ffi::Error Acquire(size_t size) { return PinnedPool::Get().Acquire(who_, size, &buf_); }
  void* data() const { return buf_->ptr; }

 private:
  const char* who_;
  cudaStream_t stream_;
  PinnedPool::Buffer* buf_ = nullptr;
};

// Integer operands live on the device: copy them to the host (a device-to-pageable copy returns
// once done, i.e. after the stream's earlier work), then decode as the CPU handlers do.
struct HostScalar {
  ffi::DataType type;
  size_t count = 0;
  uint64_t words[2] = {0, 0};
};

ffi::Error Fetch(const char* who, cudaStream_t stream, const ffi::AnyBuffer& b, HostScalar* out) {
  out->type = b.element_type();
  out->count = b.element_count();
  if (b.size_bytes() > sizeof(out->words)) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(who) + ": an integer operand has " +
                          std::to_string(b.size_bytes()) + " bytes; expected a scalar");
  }
  if (b.size_bytes() == 0) return ffi::Error::Success();
  cudaError_t e = cudaMemcpyAsync(out->words, b.untyped_data(), b.size_bytes(),
                                  cudaMemcpyDeviceToHost, stream);
  if (e != cudaSuccess) return CudaError(who, "cudaMemcpyAsync (operand)", e);
  return ffi::Error::Success();
}

bool Decode(const HostScalar& s, int64_t* out) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(s.words);
  switch (s.type) {
    case ffi::DataType::S32: {
      if (s.count != 1) return false;
      int32_t v;
      std::memcpy(&v, bytes, 4);
      *out = v;
      return true;
    }
    case ffi::DataType::U32: {
      uint32_t u[2];
      std::memcpy(u, bytes, 8);
      if (s.count == 1) *out = u[0];
      else if (s.count == 2) *out = static_cast<int64_t>(u[0] | (static_cast<uint64_t>(u[1]) << 32));
      else return false;
      return true;
    }
    case ffi::DataType::S64:
    case ffi::DataType::U64: {
      if (s.count != 1) return false;
      int64_t v;
      std::memcpy(&v, bytes, 8);
      *out = v;
      return true;
    }
    default:
      return false;
  }
}

ffi::Error Sync(const char* who, cudaStream_t stream) {
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return CudaError(who, "cudaStreamSynchronize", e);
  return ffi::Error::Success();
}

// (file_id, offset[, crc]) from device operands to host integers.
ffi::Error Locate(const char* who, cudaStream_t stream, const ffi::AnyBuffer& file_id,
                  const ffi::AnyBuffer& offset, const ffi::AnyBuffer* crc, int64_t* id,
                  int64_t* off, int64_t* expected) {
  HostScalar sid, soff, scrc;
  if (auto err = Fetch(who, stream, file_id, &sid); err.failure()) return err;
  if (auto err = Fetch(who, stream, offset, &soff); err.failure()) return err;
  if (crc != nullptr) {
    if (auto err = Fetch(who, stream, *crc, &scrc); err.failure()) return err;
  }
  if (auto err = Sync(who, stream); err.failure()) return err;
  if (!Decode(sid, id)) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(who) + ": file_id must be an int32 scalar");
  }
  if (!Decode(soff, off) || *off < 0) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(who) + ": offset must be a non-negative integer scalar "
                                         "(int32/int64) or uint32[2] (lo, hi)");
  }
  if (crc != nullptr && (scrc.type != ffi::DataType::U32 || !Decode(scrc, expected))) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(who) + ": expected_crc must be a uint32 scalar");
  }
  return ffi::Error::Success();
}

ffi::Error CopyIn(const char* who, cudaStream_t stream, void* dst, const void* src, size_t n) {
  if (n == 0) return ffi::Error::Success();
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) return CudaError(who, "cudaMemcpyAsync (host to device)", e);
  return ffi::Error::Success();
}

ffi::Error ZeroToken(const char* who, cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& token) {
  cudaError_t e = cudaMemsetAsync(token->untyped_data(), 0, token->size_bytes(), stream);
  if (e != cudaSuccess) return CudaError(who, "cudaMemsetAsync (token)", e);
  return ffi::Error::Success();
}

// A scalar result from a host value: a host-to-device copy from pageable memory returns once
// the value is staged by CUDA, so a local variable may go out of scope afterwards.
template <typename T>
ffi::Error PutScalar(const char* who, cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& out,
                     T value) {
  return CopyIn(who, stream, out->untyped_data(), &value, sizeof(T));
}

ffi::Error Guard(const char* who, const std::exception& e) {
  return ffi::Error(ffi::ErrorCode::kInternal, std::string(who) + ": " + e.what());
}

ffi::ErrorOr<std::unique_ptr<CudaPageState>> Instantiate(const char* who,
                                                         std::string_view table) {
  const host_api::Api* api = g_api.load();
  if (api == nullptr) {
    return ffi::Unexpected<ffi::Error>(ffi::Error(
        ffi::ErrorCode::kFailedPrecondition,
        std::string(who) + ": jaxoff._ffi_cuda is not bound to jaxoff._ffi; call "
                           "jaxoff.aio.register_targets() before compiling"));
  }
  host_api::Status st;
  void* handle = api->acquire(who, std::string(table).c_str(), &st);
  if (handle == nullptr) return ffi::Unexpected<ffi::Error>(ToError(st));
  auto state = std::make_unique<CudaPageState>();
  state->api = api;
  state->table = handle;
  return ffi::ErrorOr<std::unique_ptr<CudaPageState>>(std::move(state));
}

constexpr const char* kIn = "jaxoff_page_in (CUDA)";
constexpr const char* kOut = "jaxoff_page_out (CUDA)";
constexpr const char* kPrefetch = "jaxoff_page_prefetch (CUDA)";
constexpr const char* kTake = "jaxoff_page_take (CUDA)";
constexpr const char* kFlush = "jaxoff_page_flush (CUDA)";

// SSD -> page-locked staging (checksum on the host) -> device, on XLA's stream.
ffi::Error PageIn(cudaStream_t stream, CudaPageState* state, ffi::AnyBuffer file_id,
                  ffi::AnyBuffer offset, ffi::AnyBuffer expected_crc, ffi::AnyBuffer /*token*/,
                  ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> out_token,
                  std::string_view /*table*/, bool verify) {
  try {
    int64_t id = 0, off = 0, expected = 0;
    if (auto err = Locate(kIn, stream, file_id, offset, verify ? &expected_crc : nullptr, &id,
                          &off, &expected);
        err.failure()) {
      return err;
    }
    const size_t size = out->size_bytes();
    Staging staging(kIn, stream);
    if (auto err = staging.Acquire(size); err.failure()) return err;
    host_api::Status st;
    if (state->api->read(kIn, state->table, id, off, staging.data(), size, verify,
                         static_cast<uint32_t>(expected), &st) != host_api::kOk) {
      return ToError(st);
    }
    if (auto err = CopyIn(kIn, stream, out->untyped_data(), staging.data(), size); err.failure()) {
      return err;
    }
    return ZeroToken(kIn, stream, out_token);
  } catch (const std::exception& e) {
    return Guard(kIn, e);
  }
}

// Device -> page-locked staging (stream synchronised: the bytes must be there) -> SSD.
ffi::Error PageOut(cudaStream_t stream, CudaPageState* state, ffi::AnyBuffer file_id,
                   ffi::AnyBuffer offset, ffi::AnyBuffer x, ffi::AnyBuffer /*token*/,
                   ffi::Result<ffi::AnyBuffer> crc_out, ffi::Result<ffi::AnyBuffer> out_token,
                   std::string_view /*table*/, bool write_behind) {
  try {
    if (crc_out->element_type() != ffi::DataType::U32 || crc_out->element_count() != 1) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string(kOut) + ": the crc result must be a uint32 scalar");
    }
    int64_t id = 0, off = 0;
    if (auto err = Locate(kOut, stream, file_id, offset, nullptr, &id, &off, nullptr);
        err.failure()) {
      return err;
    }
    const size_t size = x.size_bytes();
    Staging staging(kOut, stream);
    if (auto err = staging.Acquire(size); err.failure()) return err;
    if (size != 0) {
      cudaError_t e = cudaMemcpyAsync(staging.data(), x.untyped_data(), size,
                                      cudaMemcpyDeviceToHost, stream);
      if (e != cudaSuccess) return CudaError(kOut, "cudaMemcpyAsync (device to host)", e);
      if (auto err = Sync(kOut, stream); err.failure()) return err;
    }
    uint32_t crc = 0;
    host_api::Status st;
    if (state->api->write(kOut, state->table, id, off, staging.data(), size, write_behind, &crc,
                          &st) != host_api::kOk) {
      return ToError(st);
    }
    if (auto err = PutScalar(kOut, stream, crc_out, crc); err.failure()) return err;
    return ZeroToken(kOut, stream, out_token);
  } catch (const std::exception& e) {
    return Guard(kOut, e);
  }
}

ffi::Error PagePrefetch(cudaStream_t stream, CudaPageState* state, ffi::AnyBuffer file_id,
                        ffi::AnyBuffer offset, ffi::AnyBuffer expected_crc,
                        ffi::AnyBuffer /*token*/, ffi::Result<ffi::AnyBuffer> ticket_out,
                        std::string_view /*table*/, int64_t nbytes, bool verify) {
  try {
    if (nbytes < 0) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string(kPrefetch) + ": nbytes must be non-negative");
    }
    if (ticket_out->element_type() != ffi::DataType::S32 || ticket_out->element_count() != 1) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string(kPrefetch) + ": the ticket result must be an int32 scalar");
    }
    int64_t id = 0, off = 0, expected = 0;
    if (auto err = Locate(kPrefetch, stream, file_id, offset, verify ? &expected_crc : nullptr,
                          &id, &off, &expected);
        err.failure()) {
      return err;
    }
    int32_t ticket = 0;
    host_api::Status st;
    if (state->api->prefetch(kPrefetch, state->table, id, off, static_cast<size_t>(nbytes),
                             verify, static_cast<uint32_t>(expected), &ticket,
                             &st) != host_api::kOk) {
      return ToError(st);
    }
    return PutScalar(kPrefetch, stream, ticket_out, ticket);
  } catch (const std::exception& e) {
    return Guard(kPrefetch, e);
  }
}

ffi::Error PageTake(cudaStream_t stream, CudaPageState* state, ffi::AnyBuffer ticket,
                    ffi::AnyBuffer /*token*/, ffi::Result<ffi::AnyBuffer> out,
                    ffi::Result<ffi::AnyBuffer> out_token, std::string_view /*table*/) {
  try {
    if (ticket.element_type() != ffi::DataType::S32 || ticket.element_count() != 1) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string(kTake) + ": the ticket must be an int32 scalar from "
                                             "jaxoff_page_prefetch");
    }
    HostScalar s;
    if (auto err = Fetch(kTake, stream, ticket, &s); err.failure()) return err;
    if (auto err = Sync(kTake, stream); err.failure()) return err;
    int64_t t = 0;
    Decode(s, &t);
    const size_t size = out->size_bytes();
    Staging staging(kTake, stream);
    if (auto err = staging.Acquire(size); err.failure()) return err;
    host_api::Status st;
    if (state->api->take(kTake, state->table, static_cast<int32_t>(t), staging.data(), size,
                         &st) != host_api::kOk) {
      return ToError(st);
    }
    if (auto err = CopyIn(kTake, stream, out->untyped_data(), staging.data(), size);
        err.failure()) {
      return err;
    }
    return ZeroToken(kTake, stream, out_token);
  } catch (const std::exception& e) {
    return Guard(kTake, e);
  }
}

ffi::Error PageFlush(cudaStream_t stream, CudaPageState* state, ffi::AnyBuffer /*token*/,
                     ffi::Result<ffi::AnyBuffer> out_token, std::string_view /*table*/,
                     bool fsync) {
  try {
    host_api::Status st;
    if (state->api->flush(kFlush, state->table, fsync, &st) != host_api::kOk) return ToError(st);
    return ZeroToken(kFlush, stream, out_token);
  } catch (const std::exception& e) {
    return Guard(kFlush, e);
  }
}

ffi::ErrorOr<std::unique_ptr<CudaPageState>> PageInInstantiateImpl(std::string_view table, bool) {
  return Instantiate(kIn, table);
}
ffi::ErrorOr<std::unique_ptr<CudaPageState>> PageOutInstantiateImpl(std::string_view table,
                                                                    bool) {
  return Instantiate(kOut, table);
}
ffi::ErrorOr<std::unique_ptr<CudaPageState>> PagePrefetchInstantiateImpl(std::string_view table,
                                                                         int64_t, bool) {
  return Instantiate(kPrefetch, table);
}
ffi::ErrorOr<std::unique_ptr<CudaPageState>> PageTakeInstantiateImpl(std::string_view table) {
  return Instantiate(kTake, table);
}
ffi::ErrorOr<std::unique_ptr<CudaPageState>> PageFlushInstantiateImpl(std::string_view table,
                                                                      bool) {
  return Instantiate(kFlush, table);
}

}  // namespace

void BindHostApi(const host_api::Api* api) { g_api.store(api); }
bool HostApiBound() { return g_api.load() != nullptr; }
const host_api::Api* BoundHostApi() { return g_api.load(); }
XLA_FFI_TypeId* CudaPageStateTypeId() { return &CudaPageState::id; }
const XLA_FFI_TypeInfo* CudaPageStateTypeInfo() { return &kCudaPageStateTypeInfo; }
size_t PinnedBytesHeld() { return PinnedPool::Get().held(); }
size_t PinnedBytesCap() { return PinnedPool::Get().cap(); }

// Same operands, results and attributes as the CPU handlers (page_handlers.cc), plus the stream.
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPageInInstantiate, PageInInstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("verify"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPageInExecute, PageIn,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<CudaPageState>>()
                                  .Arg<ffi::AnyBuffer>()  // file_id
                                  .Arg<ffi::AnyBuffer>()  // offset
                                  .Arg<ffi::AnyBuffer>()  // expected_crc
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // the tensor
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("verify"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPageOutInstantiate, PageOutInstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("write_behind"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPageOutExecute, PageOut,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<CudaPageState>>()
                                  .Arg<ffi::AnyBuffer>()  // file_id
                                  .Arg<ffi::AnyBuffer>()  // offset
                                  .Arg<ffi::AnyBuffer>()  // the tensor
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // crc32c (uint32 scalar)
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("write_behind"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPagePrefetchInstantiate, PagePrefetchInstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("nbytes")
                                  .Attr<bool>("verify"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPagePrefetchExecute, PagePrefetch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<CudaPageState>>()
                                  .Arg<ffi::AnyBuffer>()  // file_id
                                  .Arg<ffi::AnyBuffer>()  // offset
                                  .Arg<ffi::AnyBuffer>()  // expected_crc
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // ticket (int32 scalar)
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("nbytes")
                                  .Attr<bool>("verify"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPageTakeInstantiate, PageTakeInstantiateImpl,
                              ffi::Ffi::BindInstantiate().Attr<std::string_view>("table"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPageTakeExecute, PageTake,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<CudaPageState>>()
                                  .Arg<ffi::AnyBuffer>()  // ticket
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // the tensor
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPageFlushInstantiate, PageFlushInstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("fsync"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPageFlushExecute, PageFlush,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<CudaPageState>>()
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("fsync"));

}  // namespace jaxoff::cuda_handlers
