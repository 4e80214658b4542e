#include "host_paging_api.h"

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "error.h"
#include "file_table.h"

namespace jaxoff::host_api {
namespace {

using ffi_handlers::FileTable;

struct Handle {
  std::shared_ptr<FileTable> table;
};

int Fail(Status* st, int code, const std::string& message, int err = 0) {
  st->code = code;
  st->err = err;
  std::snprintf(st->message, sizeof(st->message), "%s", message.c_str());
  return code;
}

FileTable& TableOf(void* h) { return *static_cast<Handle*>(h)->table; }

int Locate(const char* who, FileTable& table, int64_t file_id, int64_t offset,
           std::shared_ptr<const aio::File>* file, Status* st) {
  if (offset < 0) {
    return Fail(st, kInvalidArgument, std::string(who) + ": offset must be non-negative");
  }
  if (file_id < 0 || static_cast<size_t>(file_id) >= table.files.size()) {
    return Fail(st, kInvalidArgument,
                std::string(who) + ": file_id " + std::to_string(file_id) +
                    " is out of range: table '" + table.name + "' has " +
                    std::to_string(table.files.size()) + " files");
  }
  *file = table.files[static_cast<size_t>(file_id)];
  return kOk;
}

void* Acquire(const char* who, const char* name, Status* st) {
  try {
    auto found = ffi_handlers::FindFileTable(name);
    if (!found) {
      Fail(st, kFailedPrecondition,
           std::string(who) + ": file table '" + name +
               "' is not registered; call jaxoff.aio.register_file_table(...) (the page "
               "store's owner does) first");
      return nullptr;
    }
    return new Handle{std::move(found)};
  } catch (const std::exception& e) {
    Fail(st, kInternal, std::string(who) + ": " + e.what());
    return nullptr;
  }
}

void Release(void* h) { delete static_cast<Handle*>(h); }

int Transfer(bool read, const char* who, void* h, int64_t file_id, int64_t offset, void* dst,
             const void* src, size_t size, uint32_t* crc, Status* st) {
  try {
    FileTable& table = TableOf(h);
    std::shared_ptr<const aio::File> file;
    if (Locate(who, table, file_id, offset, &file, st) != kOk) return st->code;
    aio::IoOptions options;
    options.crc32c = true;
    const auto off = static_cast<uint64_t>(offset);
    auto done = read ? table.engine->Read(file, off, dst, size, options)
                     : table.engine->Write(file, off, src, size, options);
    const aio::IoStatus& s = done->Wait();
    if (!s.ok()) return Fail(st, kInternal, std::string(who) + ": " + s.message, s.err);
    *crc = s.crc32c;
    return kOk;
  } catch (const std::exception& e) {
    return Fail(st, kInternal, std::string(who) + ": " + e.what());
  }
}

int Read(const char* who, void* h, int64_t file_id, int64_t offset, void* dst, size_t size,
         uint32_t* crc, Status* st) {
  return Transfer(true, who, h, file_id, offset, dst, nullptr, size, crc, st);
}

int Write(const char* who, void* h, int64_t file_id, int64_t offset, const void* src,
          size_t size, uint32_t* crc, Status* st) {
  return Transfer(false, who, h, file_id, offset, nullptr, src, size, crc, st);
}

int Sync(const char* who, void* h, const int64_t* file_ids, size_t n, Status* st) {
  FileTable& table = TableOf(h);
  for (size_t i = 0; i < n; ++i) {
    std::shared_ptr<const aio::File> file;
    if (Locate(who, table, file_ids[i], 0, &file, st) != kOk) return st->code;
    try {
      file->Sync();
    } catch (const aio::IoError& e) {
      return Fail(st, kInternal, std::string(who) + ": " + e.what(), e.err());
    } catch (const std::exception& e) {
      return Fail(st, kInternal, std::string(who) + ": " + e.what());
    }
  }
  return kOk;
}

const Api kApi = {kVersion, sizeof(Api), Acquire, Release, Read, Write, Sync};

}  // namespace

const Api* GetApi() { return &kApi; }

}  // namespace jaxoff::host_api
