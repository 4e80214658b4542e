#include "cuda_pager_handlers.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "pager_registry.h"

namespace ffi = xla::ffi;

namespace jaxoff::pager {

namespace {

std::atomic<const host_api::Api*> g_api{nullptr};

ffi::Error SameDevice(const Entry& e, int32_t device) {
  if (device == e.device) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    std::string(kBegin) + ": the step runs on CUDA device " +
                        std::to_string(device) + " but the pager of table '" + e.table +
                        "' was opened on device " + std::to_string(e.device));
}

ffi::Error BeginImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer version,
                     ffi::Result<ffi::AnyBuffer> token, std::string_view table, int64_t plan) {
  auto found = Lookup(kBegin, table);
  if (!found.has_value()) return found.error();
  Entry& e = **found;
  if (ffi::Error err = SameDevice(e, device); err.failure()) return err;
  if (ffi::Error err = VersionOperand(version); err.failure()) return err;
  // The version is checked on the pager's stream (D2D on XLA's, D2H on its own): no wait.
  return Begin(e, stream, version.untyped_data(), *token, plan);
}

ffi::Error TakeImpl(cudaStream_t stream, ffi::AnyBuffer /*token*/, ffi::Result<ffi::AnyBuffer> out,
                    ffi::Result<ffi::AnyBuffer> token, std::string_view table, int64_t plan,
                    int64_t site) {
  auto found = Lookup(kTake, table);
  if (!found.has_value()) return found.error();
  return Take(**found, stream, *out, *token, plan, site);
}

ffi::Error OutImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer /*token*/,
                   ffi::Result<ffi::AnyBuffer> token, std::string_view table, int64_t plan,
                   int64_t site) {
  auto found = Lookup(kOut, table);
  if (!found.has_value()) return found.error();
  return Out(**found, stream, x, *token, plan, site);
}

ffi::Error CommitImpl(cudaStream_t stream, ffi::AnyBuffer /*token*/,
                      ffi::Result<ffi::AnyBuffer> token, std::string_view table, int64_t plan) {
  auto found = Lookup(kCommit, table);
  if (!found.has_value()) return found.error();
  return Commit(**found, stream, *token, plan);
}

}  // namespace

void BindHostApi(const host_api::Api* api) { g_api.store(api); }
const host_api::Api* BoundHostApi() { return g_api.load(); }

XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPagerBegin, BeginImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // token: the state's store version
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPagerTake, TakeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // the tensor
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan")
                                  .Attr<int64_t>("site"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPagerOut, OutImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // the tensor
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan")
                                  .Attr<int64_t>("site"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaPagerCommit, CommitImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan"));

}  // namespace jaxoff::pager
