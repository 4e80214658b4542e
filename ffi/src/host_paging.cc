#include "host_paging_api.h"

#include <cstdio>
#include <exception>
#include <memory>
#include <sstream>
#include <string>

#include "file_table.h"

namespace jaxoff::host_api {
namespace {

using ffi_handlers::FileTable;

struct Handle {
  std::shared_ptr<FileTable> table;
};

int Fail(Status* st, int code, const std::string& message) {
  st->code = code;
  std::snprintf(st->message, sizeof(st->message), "%s", message.c_str());
  return code;
}

std::string Hex(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
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
               "' is not registered; call jaxoff.aio.register_file_table(...) (the PageStore "
               "does) before running the program");
      return nullptr;
    }
    return new Handle{std::move(found)};
  } catch (const std::exception& e) {
    Fail(st, kInternal, std::string(who) + ": " + e.what());
    return nullptr;
  }
}

void Release(void* h) { delete static_cast<Handle*>(h); }

int Read(const char* who, void* h, int64_t file_id, int64_t offset, void* dst, size_t size,
         bool verify, uint32_t expected_crc, Status* st) {
  try {
    FileTable& table = TableOf(h);
    std::shared_ptr<const aio::File> file;
    if (Locate(who, table, file_id, offset, &file, st) != kOk) return st->code;
    const auto off = static_cast<uint64_t>(offset);
    // Read-after-write: a write-behind write of these bytes ordered before us must land first.
    table.staged->WaitForOverlaps(file.get(), off, size, false);
    aio::IoOptions options;
    options.crc32c = verify;
    auto done = table.engine->Read(file, off, dst, size, options);
    const aio::IoStatus& s = done->Wait();
    if (!s.ok()) return Fail(st, kInternal, std::string(who) + ": " + s.message);
    if (verify && s.crc32c != expected_crc) {
      return Fail(st, kDataLoss,
                  std::string(who) + ": checksum mismatch in " + file->path() + " at offset " +
                      std::to_string(offset) + " (" + std::to_string(size) +
                      " bytes): expected crc32c " + Hex(expected_crc) + ", read " +
                      Hex(s.crc32c) +
                      ". The page file is corrupt or was written by a crashed run; restore the "
                      "store from the last checkpoint (resume), or delete the store to start "
                      "over");
    }
    return kOk;
  } catch (const std::exception& e) {
    return Fail(st, kInternal, std::string(who) + ": " + e.what());
  }
}

int Write(const char* who, void* h, int64_t file_id, int64_t offset, const void* src,
          size_t size, bool write_behind, uint32_t* crc, Status* st) {
  try {
    FileTable& table = TableOf(h);
    std::shared_ptr<const aio::File> file;
    if (Locate(who, table, file_id, offset, &file, st) != kOk) return st->code;
    const auto off = static_cast<uint64_t>(offset);
    if (write_behind && table.staged->WriteBehind(file, off, src, size, crc)) return kOk;
    // Synchronous path (or staging is short): keep the order with staged reads and writes.
    table.staged->WaitForOverlaps(file.get(), off, size, true);
    aio::IoOptions options;
    options.crc32c = true;
    auto done = table.engine->Write(file, off, src, size, options);
    const aio::IoStatus& s = done->Wait();
    if (!s.ok()) return Fail(st, kInternal, std::string(who) + ": " + s.message);
    *crc = s.crc32c;
    return kOk;
  } catch (const std::exception& e) {
    return Fail(st, kInternal, std::string(who) + ": " + e.what());
  }
}

int Prefetch(const char* who, void* h, int64_t file_id, int64_t offset, size_t size, bool verify,
             uint32_t expected_crc, int32_t* ticket, Status* st) {
  try {
    FileTable& table = TableOf(h);
    std::shared_ptr<const aio::File> file;
    if (Locate(who, table, file_id, offset, &file, st) != kOk) return st->code;
    aio::IoStatus s = table.staged->Prefetch(file, static_cast<uint64_t>(offset), size, verify,
                                             expected_crc, ticket);
    if (!s.ok()) {
      return Fail(st, kResourceExhausted,
                  std::string(who) + " (table '" + table.name + "'): " + s.message);
    }
    return kOk;
  } catch (const std::exception& e) {
    return Fail(st, kInternal, std::string(who) + ": " + e.what());
  }
}

int Take(const char* who, void* h, int32_t ticket, void* dst, size_t size, Status* st) {
  try {
    FileTable& table = TableOf(h);
    aio::IoStatus s = table.staged->Take(ticket, dst, size);
    if (!s.ok()) {
      const bool corrupt = s.message.find("checksum mismatch") != std::string::npos;
      return Fail(st, corrupt ? kDataLoss : kInternal,
                  std::string(who) + " (table '" + table.name + "'): " + s.message);
    }
    return kOk;
  } catch (const std::exception& e) {
    return Fail(st, kInternal, std::string(who) + ": " + e.what());
  }
}

int Flush(const char* who, void* h, bool fsync, Status* st) {
  try {
    FileTable& table = TableOf(h);
    aio::IoStatus s = table.staged->Flush(fsync);
    if (!s.ok()) {
      return Fail(st, kInternal,
                  std::string(who) + " (table '" + table.name +
                      "'): a write-behind write failed: " + s.message);
    }
    return kOk;
  } catch (const std::exception& e) {
    return Fail(st, kInternal, std::string(who) + ": " + e.what());
  }
}

const Api kApi = {kVersion, sizeof(Api), Acquire, Release, Read, Write, Prefetch, Take, Flush};

}  // namespace

const Api* GetApi() { return &kApi; }

}  // namespace jaxoff::host_api
