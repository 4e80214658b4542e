#pragma once
// The four paging targets for platform CUDA (module jaxoff._ffi_cuda): XLA FFI binds over the
// bodies in pager_registry.h, the same as the CPU's, with the CUDA runtime as the device. No
// handler waits for the GPU (design §4, rule I1): on XLA's stream a call only enqueues an event
// wait, a device-to-device copy, an event record and a memset of its token; the bytes cross
// PCIe on the pager's own copy streams, between a pinned arena and a device ring, and the disk
// side goes through jaxoff._ffi's file table (host_api_chunk_io.h) on the pager's threads.

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

#include "host_paging_api.h"

namespace jaxoff::pager {

// The host paging API of jaxoff._ffi, bound once from Python before any pager opens.
void BindHostApi(const host_api::Api* api);
const host_api::Api* BoundHostApi();  // nullptr until bound

XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPagerBegin);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPagerTake);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPagerOut);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPagerCommit);

}  // namespace jaxoff::pager
