#pragma once
// The paging targets for platform CUDA (module jaxoff._ffi_cuda): the same names, operands,
// attributes and results as the CPU handlers (page_handlers.h), so one Python wrapper serves
// both. The disk side (files, staging, checksums, write-behind order) is jaxoff._ffi's, through
// host_paging_api.h; these handlers only move bytes between the device buffers XLA hands them
// and page-locked host staging, with cudaMemcpyAsync on XLA's stream.

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

#include "host_paging_api.h"

namespace jaxoff::cuda_handlers {

// Binds the host half (jaxoff._ffi's table); must happen before any program instantiates.
void BindHostApi(const host_api::Api* api);
bool HostApiBound();
const host_api::Api* BoundHostApi();  // nullptr until bound

// State type (one per call site): the file table, resolved when the executable is instantiated.
XLA_FFI_TypeId* CudaPageStateTypeId();
const XLA_FFI_TypeInfo* CudaPageStateTypeInfo();

// The page-locked staging jaxoff holds (bytes) and its cap (JAXOFF_CUDA_PINNED_MAX_BYTES, 0 = none).
size_t PinnedBytesHeld();
size_t PinnedBytesCap();

XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPageInInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPageInExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPageOutInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPageOutExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPagePrefetchInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPagePrefetchExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPageTakeInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPageTakeExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPageFlushInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaPageFlushExecute);

}  // namespace jaxoff::cuda_handlers
