#pragma once
// The pagers of one module and the bodies of the four paging targets, the same code for both
// platforms: jaxoff._ffi (CPU: HostDeviceOps, the file table's engine) and jaxoff._ffi_cuda
// (CUDA: CudaDeviceOps, the host paging API) each compile this file and keep their own pagers.
//
//   jaxoff_pager_begin  (token) -> token            attrs: table, plan
//   jaxoff_pager_take   (token) -> (tensor, token)  attrs: table, plan, site
//   jaxoff_pager_out    (tensor, token) -> token    attrs: table, plan, site
//   jaxoff_pager_commit (token) -> token            attrs: table, plan
//
// No operand carries paging metadata. Which chunk a call moves comes from the step plan
// registered on the host (two variants, by the parity of the store version the step reads)
// and the pager's per-site cursor; file ids, offsets, checksums and the version live in the
// pager (ffi/engine/gpu_pager.h). page_begin's token is the int32 store version the caller's
// optimizer state describes: the pager checks it against the version it holds (on the CPU
// before the step starts, on a GPU without waiting for the device); every other token's
// value is meaningless. A handler looks its pager up by the table's name at every call, so
// a program compiled before a pager was closed and opened again pages through the new one.

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "xla/ffi/api/ffi.h"

#include "device_ops.h"
#include "gpu_pager.h"
#include "worker_pool.h"

namespace jaxoff::pager {

// A plan element: (site, file id, byte offset, bytes).
using PlanIo = std::tuple<int64_t, int64_t, uint64_t, int64_t>;
// A checksum: (file id, byte offset, crc32c).
using CrcRow = std::tuple<int64_t, uint64_t, uint32_t>;

constexpr const char* kBegin = "jaxoff_pager_begin";
constexpr const char* kTake = "jaxoff_pager_take";
constexpr const char* kOut = "jaxoff_pager_out";
constexpr const char* kCommit = "jaxoff_pager_commit";

// One open pager: its device side, its disk side and the pager over both.
struct Entry {
  std::string table;
  int device = 0;
  std::shared_ptr<void> keep;  // keeps the disk side alive (a file table, a host-API handle)
  std::unique_ptr<aio::DeviceOps> ops;
  std::unique_ptr<aio::ChunkIo> io;
  std::unique_ptr<aio::GpuPager> pager;
  // CPU: begins, and takes whose chunk is still on its way, run here while XLA's thread goes
  // on (one thread: the calls of a step come in token order anyway).
  std::unique_ptr<aio::WorkerPool> waiter;
  // Appended to the message of a stale state (what its owner's user should do).
  std::string stale_hint;
  uint64_t serial = 0;  // which opening this is (set by Open): an owner's calls name it
  ~Entry();
};

// Opens `entry` (its table, device, keep, ops and io set) as the pager of its table: the
// store version it holds and the checksums of that version's chunks; `commit` runs on the
// pager's thread once a step's writes are durable. Replaces a pager open under that name
// (which closes once no call uses it). Throws std::invalid_argument for a bad config.
// Returns the opening's serial number, which the calls below take: a call naming an opening
// that was replaced since (another owner opened a pager under the same name) is refused, so a
// late owner never settles, resets or closes the pager of the one that replaced it (0: any).
uint64_t Open(std::shared_ptr<Entry> entry, const aio::PagerConfig& config, uint64_t version,
              const std::vector<CrcRow>& crcs, aio::GpuPager::CommitFn commit);
// The pager of `table`, or nullptr / std::invalid_argument naming what to do.
std::shared_ptr<Entry> Find(const std::string& table);
std::shared_ptr<Entry> Need(const std::string& table, uint64_t serial = 0);
// Registers plan `id`: the reads and writes of a step that reads an even / odd version.
void RegisterPlan(const std::string& table, uint64_t serial, int64_t id,
                  const std::vector<PlanIo>& even_reads, const std::vector<PlanIo>& even_writes,
                  const std::vector<PlanIo>& odd_reads, const std::vector<PlanIo>& odd_writes);
// The pager's store version and checksums set anew (the store was written from outside).
aio::IoStatus Reset(const std::string& table, uint64_t serial, uint64_t version,
                    const std::vector<CrcRow>& crcs);
// Waits for the last step's writes and commit; their first error (once).
aio::IoStatus Settle(const std::string& table, uint64_t serial);
std::vector<CrcRow> Checksums(const std::string& table, uint64_t serial);
aio::PagerStats Stats(const std::string& table, uint64_t serial, uint64_t* version);
// Forgets the pager of `table` if it is still opening `serial` (it closes, waiting for its
// writes and a pending commit, once no call holds it); false if that one is not open.
bool Close(const std::string& table, uint64_t serial);
std::vector<std::string> Tables();

// The bodies of the targets. `stream` is the platform's stream (nullptr on the CPU); a
// token result is filled with DeviceOps::MemsetAsync on it.
// `version`: the begin token's data (an int32, checked by `VersionOperand`).
xla::ffi::Error Begin(Entry& e, aio::DeviceOps::Stream stream, const void* version,
                      xla::ffi::AnyBuffer token_out, int64_t plan);
xla::ffi::Error VersionOperand(const xla::ffi::AnyBuffer& version);
xla::ffi::Error Take(Entry& e, aio::DeviceOps::Stream stream, xla::ffi::AnyBuffer out,
                     xla::ffi::AnyBuffer token_out, int64_t plan, int64_t site);
xla::ffi::Error Out(Entry& e, aio::DeviceOps::Stream stream, const xla::ffi::AnyBuffer& x,
                    xla::ffi::AnyBuffer token_out, int64_t plan, int64_t site);
xla::ffi::Error Commit(Entry& e, aio::DeviceOps::Stream stream, xla::ffi::AnyBuffer token_out,
                       int64_t plan);
// The pager of the attribute `table`, or the error a handler returns.
xla::ffi::ErrorOr<std::shared_ptr<Entry>> Lookup(const char* who, std::string_view table);
xla::ffi::Error ToError(const char* who, const aio::IoStatus& st);

// Fault points of the paging targets, for crash tests: JAXOFF_FAULT="pager.take:3" kills the
// process with SIGKILL at the third take (names and format as jaxoff/_faults.py's).
void FaultPoint(const char* name);

}  // namespace jaxoff::pager
