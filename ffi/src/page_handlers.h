#pragma once
// XLA FFI targets jaxoff_page_in / jaxoff_page_out (asynchronous reads and writes of XLA
// buffers; page_out optionally write-behind), jaxoff_page_prefetch / jaxoff_page_take (split-phase
// reads through staging) and jaxoff_page_flush, through a registered file table (see file_table.h and jaxoff/aio/_ffi_calls.py).

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace jaxoff::ffi_handlers {

// Per-call-site state (stateful FFI): the file table the call site names, resolved once when
// the executable is instantiated, then kept alive for as long as the executable lives.
struct PageState;

// The state type's id and info, registered from Python with jax.ffi.register_ffi_type.
XLA_FFI_TypeId* PageStateTypeId();
const XLA_FFI_TypeInfo* PageStateTypeInfo();

XLA_FFI_DECLARE_HANDLER_SYMBOL(PageInInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PageInExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PageOutInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PageOutExecute);
// Split-phase paging: jaxoff_page_prefetch / jaxoff_page_take, and jaxoff_page_flush.
XLA_FFI_DECLARE_HANDLER_SYMBOL(PagePrefetchInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PagePrefetchExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PageTakeInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PageTakeExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PageFlushInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(PageFlushExecute);

}  // namespace jaxoff::ffi_handlers
