#pragma once
// The Python face of a module's pagers (pager_registry.h), the same for jaxoff._ffi (CPU) and
// jaxoff._ffi_cuda (CUDA): pager_open, pager_plan, pager_reset, pager_settle, pager_checksums,
// pager_stats, pager_close, pager_tables (see jaxoff/aio/_pager.py for their use).

#include <nanobind/nanobind.h>

#include <functional>
#include <memory>
#include <string>

#include "pager_registry.h"

namespace jaxoff::pager {

// Makes the platform's side of a pager for `table` on `device`: table, device, keep, ops and
// io set (`io_threads`: threads of the disk side, where it has its own). Throws one line.
using MakeEntry =
    std::function<std::shared_ptr<Entry>(const std::string& table, int device, int io_threads)>;

void BindPager(nanobind::module_& m, MakeEntry make);

}  // namespace jaxoff::pager
