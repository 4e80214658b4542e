#pragma once
// Python face of the engine (numpy futures, file tables, crc32c), bound with nanobind.

#include <nanobind/nanobind.h>

namespace jaxoff::ffi_handlers {

void BindEngine(nanobind::module_& m);

}  // namespace jaxoff::ffi_handlers
