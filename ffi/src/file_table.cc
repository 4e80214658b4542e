#include "file_table.h"

#include <map>
#include <mutex>

namespace jaxoff::ffi_handlers {
namespace {

std::mutex& Mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, std::shared_ptr<FileTable>>& Tables() {
  static auto* tables = new std::map<std::string, std::shared_ptr<FileTable>>();
  return *tables;  // leaked on purpose: no destruction-order race with XLA at exit
}

}  // namespace

void RegisterFileTable(const std::string& name, const std::vector<std::vector<std::string>>& files,
                       const aio::EngineConfig& config, uint64_t stripe_bytes) {
  auto table = std::make_shared<FileTable>();
  table->name = name;
  table->engine = std::make_shared<aio::Engine>(config);
  table->files.reserve(files.size());
  for (const auto& paths : files) {
    table->files.push_back(std::make_shared<aio::File>(paths, /*writable=*/true, /*create=*/true,
                                                       config.o_direct, stripe_bytes));
  }
  std::lock_guard<std::mutex> lk(Mutex());
  Tables()[name] = std::move(table);
}

bool UnregisterFileTable(const std::string& name) {
  std::shared_ptr<FileTable> table;
  {
    std::lock_guard<std::mutex> lk(Mutex());
    auto it = Tables().find(name);
    if (it == Tables().end()) return false;
    table = std::move(it->second);
    Tables().erase(it);
  }
  return true;
}

std::shared_ptr<FileTable> FindFileTable(const std::string& name) {
  std::lock_guard<std::mutex> lk(Mutex());
  auto it = Tables().find(name);
  return it == Tables().end() ? nullptr : it->second;
}

std::vector<std::string> FileTableNames() {
  std::lock_guard<std::mutex> lk(Mutex());
  std::vector<std::string> names;
  for (const auto& kv : Tables()) names.push_back(kv.first);
  return names;
}

}  // namespace jaxoff::ffi_handlers
