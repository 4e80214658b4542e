#include "pager_registry.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace ffi = xla::ffi;

namespace jaxoff::pager {

namespace {

using aio::ChunkRef;
using aio::GpuPager;
using aio::IoStatus;

std::mutex g_mu;
std::map<std::string, std::shared_ptr<Entry>>& Registry() {
  static auto* r = new std::map<std::string, std::shared_ptr<Entry>>();  // leaked: no
  return *r;  // teardown race with XLA's or CUDA's at exit
}

aio::StepPlan MakePlan(const std::vector<PlanIo>& reads, const std::vector<PlanIo>& writes) {
  aio::StepPlan plan;
  for (const auto& [site, file, offset, bytes] : reads) {
    plan.reads.push_back({static_cast<int>(file), offset, static_cast<size_t>(bytes)});
    plan.read_sites.push_back(static_cast<int>(site));
  }
  for (const auto& [site, file, offset, bytes] : writes) {
    plan.writes.push_back({static_cast<int>(file), offset, static_cast<size_t>(bytes)});
    plan.write_sites.push_back(static_cast<int>(site));
  }
  return plan;
}

GpuPager::Crcs CrcMap(const std::vector<CrcRow>& crcs) {
  GpuPager::Crcs out;
  for (const auto& [file, offset, crc] : crcs) out[{static_cast<int>(file), offset}] = crc;
  return out;
}

// The call belongs to the step begun last: a program begun with another plan (or none) is a
// lowering error, reported rather than paging the wrong chunks.
ffi::Error SamePlan(const char* who, const GpuPager& pager, int64_t plan) {
  const int64_t current = pager.plan_id();
  if (current == plan) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    std::string(who) + " of plan " + std::to_string(plan) + " runs in a step " +
                        (current < 0 ? std::string("not begun by jaxoff_pager_begin")
                                     : "of plan " + std::to_string(current)) +
                        ": a program's paging calls must follow its own page_begin");
}

ffi::Error Token(const char* who, Entry& e, aio::DeviceOps::Stream stream,
                 ffi::AnyBuffer& token) {
  try {
    e.ops->MemsetAsync(token.untyped_data(), 0, token.size_bytes(), stream);
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string(who) + ": token: " + err.what());
  }
  return ffi::Error::Success();
}

ffi::Error Guard(const char* who, const std::exception& e) {
  return ffi::Error(ffi::ErrorCode::kInternal, std::string(who) + ": " + e.what());
}

// JAXOFF_FAULT parsed once: name -> the visit that kills.
struct Faults {
  std::mutex mu;
  std::map<std::string, long> armed, seen;
  Faults() {
    const char* only = std::getenv("JAXOFF_FAULT_PROCESS");
    const char* me = std::getenv("JAX_PROCESS_ID");
    if (only != nullptr && std::string(only) != std::string(me != nullptr ? me : "0")) return;
    const char* spec = std::getenv("JAXOFF_FAULT");
    if (spec == nullptr) return;
    std::string s(spec);
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t end = s.find(',', pos);
      if (end == std::string::npos) end = s.size();
      std::string item = s.substr(pos, end - pos);
      const size_t colon = item.find(':');
      std::string name = item.substr(0, colon);
      while (!name.empty() && name.front() == ' ') name.erase(name.begin());
      while (!name.empty() && name.back() == ' ') name.pop_back();
      const long n = colon == std::string::npos ? 1 : std::atol(item.c_str() + colon + 1);
      if (name.rfind("pager.", 0) == 0) armed[name] = n;
      pos = end + 1;
    }
  }
};

Faults& TheFaults() {
  static auto* f = new Faults();
  return *f;
}

}  // namespace

Entry::~Entry() {
  pager.reset();  // completes a pending commit, waits for its copies and writes
  waiter.reset();
  io.reset();
  ops.reset();
}

void FaultPoint(const char* name) {
  Faults& f = TheFaults();
  if (f.armed.empty()) return;
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.armed.find(name);
  if (it == f.armed.end()) return;
  if (++f.seen[name] == it->second) kill(getpid(), SIGKILL);
}

uint64_t Open(std::shared_ptr<Entry> entry, const aio::PagerConfig& config, uint64_t version,
              const std::vector<CrcRow>& crcs, GpuPager::CommitFn commit) {
  static std::atomic<uint64_t> serials{0};
  config.Validate();
  entry->pager = std::make_unique<GpuPager>(entry->ops.get(), entry->io.get(), config,
                                            std::move(commit), version);
  for (const auto& [file, offset, crc] : crcs) {
    entry->pager->SetChecksum({static_cast<int>(file), offset, 0}, crc);
  }
  if (entry->ops->host_memory()) entry->waiter = std::make_unique<aio::WorkerPool>(1);
  const uint64_t serial = entry->serial = ++serials;
  std::shared_ptr<Entry> old;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    old = std::move(Registry()[entry->table]);
    Registry()[entry->table] = std::move(entry);
  }
  return serial;  // `old` closes here, outside the lock (or later, with the last call holding it)
}

std::shared_ptr<Entry> Find(const std::string& table) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Registry().find(table);
  return it == Registry().end() ? nullptr : it->second;
}

std::shared_ptr<Entry> Need(const std::string& table, uint64_t serial) {
  auto e = Find(table);
  if (e == nullptr || (serial != 0 && e->serial != serial)) {
    throw std::invalid_argument(
        e == nullptr ? "no pager is open for file table '" + table +
                           "': its page store was closed (open it again, e.g. by the "
                           "optimizer's init or restore)"
                     : "the pager of file table '" + table + "' this owner opened was "
                           "replaced by another owner's (a store opened again under the "
                           "same name): it is closed");
  }
  return e;
}

void RegisterPlan(const std::string& table, uint64_t serial, int64_t id,
                  const std::vector<PlanIo>& even_reads, const std::vector<PlanIo>& even_writes,
                  const std::vector<PlanIo>& odd_reads, const std::vector<PlanIo>& odd_writes) {
  Need(table, serial)->pager->RegisterPlan(id, MakePlan(even_reads, even_writes),
                                           MakePlan(odd_reads, odd_writes));
}

IoStatus Reset(const std::string& table, uint64_t serial, uint64_t version,
               const std::vector<CrcRow>& crcs) {
  return Need(table, serial)->pager->Reset(version, CrcMap(crcs));
}

IoStatus Settle(const std::string& table, uint64_t serial) {
  return Need(table, serial)->pager->Settle();
}

std::vector<CrcRow> Checksums(const std::string& table, uint64_t serial) {
  std::vector<CrcRow> out;
  for (const auto& [key, crc] : Need(table, serial)->pager->Checksums()) {
    out.emplace_back(key.first, key.second, crc);
  }
  return out;
}

aio::PagerStats Stats(const std::string& table, uint64_t serial, uint64_t* version) {
  auto e = Need(table, serial);
  *version = e->pager->version();
  return e->pager->Stats();
}

bool Close(const std::string& table, uint64_t serial) {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = Registry().find(table);
    if (it == Registry().end() || (serial != 0 && it->second->serial != serial)) return false;
    e = std::move(it->second);
    Registry().erase(it);
  }
  return true;  // `e` closes here, or with the last call that holds it
}

std::vector<std::string> Tables() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::string> out;
  for (const auto& kv : Registry()) out.push_back(kv.first);
  return out;
}

ffi::Error ToError(const char* who, const IoStatus& st) {
  ffi::ErrorCode code = ffi::ErrorCode::kInternal;
  switch (st.err) {
    case EINVAL: code = ffi::ErrorCode::kInvalidArgument; break;
    case EBADMSG: code = ffi::ErrorCode::kDataLoss; break;
    case ETIMEDOUT: code = ffi::ErrorCode::kDeadlineExceeded; break;
    case ESTALE: code = ffi::ErrorCode::kFailedPrecondition; break;
    case ENOSPC: code = ffi::ErrorCode::kResourceExhausted; break;
    default: break;
  }
  return ffi::Error(code, std::string(who) + ": " + st.message);
}

ffi::ErrorOr<std::shared_ptr<Entry>> Lookup(const char* who, std::string_view table) {
  auto e = Find(std::string(table));
  if (e == nullptr) {
    return ffi::Unexpected<ffi::Error>(ffi::Error(
        ffi::ErrorCode::kFailedPrecondition,
        std::string(who) + ": no pager is open for file table '" + std::string(table) +
            "': its page store was closed; open it again (the optimizer's init or restore) "
            "before running the step"));
  }
  return ffi::ErrorOr<std::shared_ptr<Entry>>(std::move(e));
}

ffi::Error VersionOperand(const ffi::AnyBuffer& version) {
  if (version.element_type() == ffi::DataType::S32 && version.element_count() == 1) {
    return ffi::Error::Success();
  }
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    std::string(kBegin) + ": the token must be the int32 store version the "
                    "optimizer state describes");
}

ffi::Error Begin(Entry& e, aio::DeviceOps::Stream stream, const void* version,
                 ffi::AnyBuffer token_out, int64_t plan) {
  try {
    FaultPoint("pager.begin");
    // Waits on the host only for the previous step's writes and commit (rule I2).
    IoStatus st = e.pager->Begin(plan, stream, version);
    if (st.err == ESTALE && !e.stale_hint.empty()) st.message += ". " + e.stale_hint;
    if (!st.ok()) return ToError(kBegin, st);
    return Token(kBegin, e, stream, token_out);
  } catch (const std::exception& err) {
    return Guard(kBegin, err);
  }
}

ffi::Error Take(Entry& e, aio::DeviceOps::Stream stream, ffi::AnyBuffer out,
                ffi::AnyBuffer token_out, int64_t plan, int64_t site) {
  try {
    FaultPoint("pager.take");
    if (auto err = SamePlan(kTake, *e.pager, plan); err.failure()) return err;
    IoStatus st = e.pager->Take(static_cast<int>(site), stream, out.untyped_data(),
                                out.size_bytes());
    if (!st.ok()) return ToError(kTake, st);
    return Token(kTake, e, stream, token_out);
  } catch (const std::exception& err) {
    return Guard(kTake, err);
  }
}

ffi::Error Out(Entry& e, aio::DeviceOps::Stream stream, const ffi::AnyBuffer& x,
               ffi::AnyBuffer token_out, int64_t plan, int64_t site) {
  try {
    FaultPoint("pager.put");
    if (auto err = SamePlan(kOut, *e.pager, plan); err.failure()) return err;
    // Copies `x` into a write slot (on `stream`) and returns; the disk write runs behind.
    IoStatus st = e.pager->Put(static_cast<int>(site), stream, x.untyped_data(), x.size_bytes());
    if (!st.ok()) return ToError(kOut, st);
    return Token(kOut, e, stream, token_out);
  } catch (const std::exception& err) {
    return Guard(kOut, err);
  }
}

ffi::Error Commit(Entry& e, aio::DeviceOps::Stream stream, ffi::AnyBuffer token_out,
                  int64_t plan) {
  try {
    if (auto err = SamePlan(kCommit, *e.pager, plan); err.failure()) return err;
    // Returns at once; the pager commits once the step's writes are durable.
    IoStatus st = e.pager->Commit();
    if (!st.ok()) return ToError(kCommit, st);
    FaultPoint("pager.commit");
    return Token(kCommit, e, stream, token_out);
  } catch (const std::exception& err) {
    return Guard(kCommit, err);
  }
}

}  // namespace jaxoff::pager
