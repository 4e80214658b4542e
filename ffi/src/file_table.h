#pragma once
// Named file tables: the files a compiled program pages to, registered from Python.
// One table = one engine (its ring, its block pool) + the open files, addressed by file_id.
// The registry is mutex-guarded; FFI state holds a shared_ptr, so unregistering a table
// while an executable still uses it is safe (the files close when the last user goes).

#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "file_handle.h"

namespace jaxoff::ffi_handlers {

struct FileTable {
  std::string name;
  std::shared_ptr<aio::Engine> engine;
  std::vector<std::shared_ptr<const aio::File>> files;
};

// Opens (creating) every file; each entry of `files` is one logical file: one path, or the
// stripes of a striped file. Replaces a table of the same name. Throws IoError / invalid_argument.
void RegisterFileTable(const std::string& name, const std::vector<std::vector<std::string>>& files,
                       const aio::EngineConfig& config, uint64_t stripe_bytes);
// False if no such table (its files close once no pager holds it).
bool UnregisterFileTable(const std::string& name);
// nullptr if no such table.
std::shared_ptr<FileTable> FindFileTable(const std::string& name);
std::vector<std::string> FileTableNames();

}  // namespace jaxoff::ffi_handlers
