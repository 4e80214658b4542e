#pragma once
// The four paging targets for platform CPU (module jaxoff._ffi): XLA FFI binds over the bodies
// in pager_registry.h, with host memory as the device (HostDeviceOps). A begin, and a take
// whose chunk is still on its way from the disk, hand XLA's thread back (an ffi::Future): the
// pager's waiting thread finishes the call and completes the future.

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace jaxoff::pager {

XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuPagerBegin);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuPagerTake);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuPagerOut);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuPagerCommit);

}  // namespace jaxoff::pager
