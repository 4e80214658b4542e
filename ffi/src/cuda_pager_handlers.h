#pragma once
// The GPU pager's paging targets for platform CUDA (module jaxoff._ffi_cuda): calls that never
// wait for the GPU (design §4, rule I1).
//
//   jaxoff_gpu_page_begin  (token) -> token            attrs: table, plan
//   jaxoff_gpu_page_take   (token) -> (tensor, token)  attrs: table, plan, site
//   jaxoff_gpu_page_out    (tensor, token) -> token    attrs: table, plan, site
//   jaxoff_gpu_page_commit (token) -> token            attrs: table, plan
//
// No operand carries metadata: which chunk a call moves comes from the step plan registered
// on the host (RegisterPagerPlan, built from jaxoff.optim.StepPlan at trace time) and the
// pager's per-site cursor, advanced per call and reset by page_begin. The bytes move on the
// pager's own copy streams between a pinned arena and a device ring (ffi/engine/gpu_pager.h);
// on XLA's stream a handler only enqueues an event wait, a device-to-device copy, an event
// record and a memset of its token. The disk side goes through jaxoff._ffi's file table
// (host_paging_api.h) on the pager's I/O threads.
//
// These targets are separate from the five legacy targets (cuda_page_handlers.h), which keep
// their device-scalar operands until the Python lowering moves to these.

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

#include "gpu_pager.h"
#include "host_paging_api.h"

namespace jaxoff::cuda_pager {

// A plan element: (site, file id, byte offset, bytes).
using PlanIo = std::tuple<int, int64_t, uint64_t, uint64_t>;

// Opens the pager of file table `table` on CUDA device `device` (its streams, pinned arena,
// device ring and write slots, and `io_threads` disk threads), replacing one already open.
// Throws std::runtime_error (one line: the runtime's error, e.g. no driver) when it cannot.
void OpenPager(const host_api::Api* api, const std::string& table, int device,
               const aio::PagerConfig& config, int io_threads);
// Registers step plan `id` for `table`'s pager (std::invalid_argument if it cannot run).
void RegisterPagerPlan(const std::string& table, int64_t id, const std::vector<PlanIo>& reads,
                       const std::vector<PlanIo>& writes);
// Expected checksums for chunks on disk ((file, offset, crc32c)), e.g. from the store.
void SetPagerChecksums(const std::string& table,
                       const std::vector<std::tuple<int64_t, uint64_t, uint32_t>>& crcs);
// The checksums the pager holds (committed writes and those set).
std::vector<std::tuple<int64_t, uint64_t, uint32_t>> PagerChecksums(const std::string& table);
aio::PagerStats PagerStatsOf(const std::string& table, uint64_t* committed_step);
// Closes the pager (waits for its copies and writes); false if none was open.
bool ClosePager(const std::string& table);

XLA_FFI_TypeId* PagerStateTypeId();
const XLA_FFI_TypeInfo* PagerStateTypeInfo();

XLA_FFI_DECLARE_HANDLER_SYMBOL(GpuPageBeginInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GpuPageBeginExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GpuPageTakeInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GpuPageTakeExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GpuPageOutInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GpuPageOutExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GpuPageCommitInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(GpuPageCommitExecute);

}  // namespace jaxoff::cuda_pager
