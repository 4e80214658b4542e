#include "page_handlers.h"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>

#include "aligned_buffer.h"
#include "backend.h"
#include "file_table.h"

namespace ffi = xla::ffi;

namespace jaxoff::ffi_handlers {

struct PageState {
  static ffi::TypeId id;
  std::shared_ptr<FileTable> table;
};
ffi::TypeId PageState::id = {};

namespace {

const ffi::TypeInfo kPageStateTypeInfo = ffi::MakeTypeInfo<PageState>();

// Completes futures off the engine's threads. XLA runs the rest of the program on the thread
// that completes a future: were that an engine thread, compute would stall the I/O, and a
// jaxoff_page_take (or flush) waiting there for a read would wait for itself.
class Notifier {
 public:
  static Notifier& Get() {
    static auto* n = new Notifier();  // leaked on purpose: no destruction-order race at exit
    return *n;
  }
  void Post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  Notifier() {
    std::thread([this] {
      aio::NameThisThread("jaxoff-notify");
      for (;;) {
        std::function<void()> fn;
        {
          std::unique_lock<std::mutex> lk(mu_);
          cv_.wait(lk, [this] { return !queue_.empty(); });
          fn = std::move(queue_.front());
          queue_.pop_front();
        }
        fn();
      }
    }).detach();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

void Complete(ffi::Promise promise) {
  Notifier::Get().Post([promise]() mutable { promise.SetAvailable(); });
}
void Fail(ffi::Promise promise, ffi::Error error) {
  Notifier::Get().Post([promise, error = std::move(error)]() mutable {
    promise.SetError(std::move(error));
  });
}

ffi::Future ReadyError(ffi::ErrorCode code, std::string message) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(ffi::Error(code, std::move(message)));
  return future;
}

ffi::ErrorOr<std::unique_ptr<PageState>> Instantiate(const char* target, std::string_view table) {
  auto found = FindFileTable(std::string(table));
  if (!found) {
    return ffi::Unexpected<ffi::Error>(ffi::Error(
        ffi::ErrorCode::kFailedPrecondition,
                      std::string(target) + ": file table '" + std::string(table) +
                          "' is not registered; call jaxoff.aio.register_file_table(...) (the "
                          "PageStore does) before running the program"));
  }
  auto state = std::make_unique<PageState>();
  state->table = std::move(found);
  return ffi::ErrorOr<std::unique_ptr<PageState>>(std::move(state));
}

// An integer scalar operand (int32/uint32/int64/uint64), or an offset as uint32[2] = lo, hi
// (how 64-bit offsets travel when jax_enable_x64 is off).
bool ReadInteger(const ffi::AnyBuffer& b, int64_t* out) {
  const void* p = b.untyped_data();
  const size_t n = b.element_count();
  switch (b.element_type()) {
    case ffi::DataType::S32:
      if (n != 1) return false;
      *out = *static_cast<const int32_t*>(p);
      return true;
    case ffi::DataType::U32: {
      const auto* u = static_cast<const uint32_t*>(p);
      if (n == 1) *out = u[0];
      else if (n == 2) *out = static_cast<int64_t>(u[0] | (static_cast<uint64_t>(u[1]) << 32));
      else return false;
      return true;
    }
    case ffi::DataType::S64:
      if (n != 1) return false;
      *out = *static_cast<const int64_t*>(p);
      return true;
    case ffi::DataType::U64:
      if (n != 1) return false;
      *out = static_cast<int64_t>(*static_cast<const uint64_t*>(p));
      return true;
    default:
      return false;
  }
}

// Resolves (file_id, offset) to a file of the table, or an error message.
std::string Locate(const char* target, const PageState* state, const ffi::AnyBuffer& file_id,
                   const ffi::AnyBuffer& offset, std::shared_ptr<const aio::File>* file,
                   int64_t* off) {
  int64_t id = 0;
  if (!ReadInteger(file_id, &id)) {
    return std::string(target) + ": file_id must be an int32 scalar";
  }
  if (!ReadInteger(offset, off) || *off < 0) {
    return std::string(target) +
           ": offset must be a non-negative integer scalar (int32/int64) or uint32[2] (lo, hi)";
  }
  const auto& files = state->table->files;
  if (id < 0 || static_cast<size_t>(id) >= files.size()) {
    return std::string(target) + ": file_id " + std::to_string(id) + " is out of range: table '" +
           state->table->name + "' has " + std::to_string(files.size()) + " files";
  }
  *file = files[static_cast<size_t>(id)];
  return {};
}

std::string Hex(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

ffi::Future PageIn(PageState* state, ffi::AnyBuffer file_id, ffi::AnyBuffer offset,
                   ffi::AnyBuffer expected_crc, ffi::AnyBuffer /*token*/,
                   ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> out_token,
                   std::string_view /*table*/, bool verify) {
  try {
    std::shared_ptr<const aio::File> file;
    int64_t off = 0;
    std::string err = Locate("jaxoff_page_in", state, file_id, offset, &file, &off);
    if (!err.empty()) return ReadyError(ffi::ErrorCode::kInvalidArgument, err);
    int64_t expected = 0;
    if (verify && (!ReadInteger(expected_crc, &expected) ||
                   expected_crc.element_type() != ffi::DataType::U32)) {
      return ReadyError(ffi::ErrorCode::kInvalidArgument,
                        "jaxoff_page_in: expected_crc must be a uint32 scalar");
    }
    std::memset(out_token->untyped_data(), 0, out_token->size_bytes());
    void* dst = out->untyped_data();
    const size_t size = out->size_bytes();
    // Read-after-write: a write-behind write of these bytes ordered before us must land first.
    state->table->staged->WaitForOverlaps(file.get(), static_cast<uint64_t>(off), size, false);
    // XLA hands us a freshly allocated output each run: huge pages make its first touch cheap.
    aio::AdviseHugePages(dst, size);
    ffi::Promise promise;
    ffi::Future future(promise);
    // The crc32c is taken by the engine's workers block by block while each block is in cache
    // (folded into the staging copy), then combined: no second pass over the tensor.
    aio::IoOptions options;
    options.crc32c = verify;
    state->table->engine->Read(
        file, static_cast<uint64_t>(off), dst, size,
        [promise, file, off, size, verify, expected](const aio::IoStatus& s) mutable {
          if (!s.ok()) {
            Fail(promise, ffi::Error(ffi::ErrorCode::kInternal, "jaxoff_page_in: " + s.message));
            return;
          }
          if (verify && s.crc32c != static_cast<uint32_t>(expected)) {
            Fail(promise, ffi::Error(
                ffi::ErrorCode::kDataLoss,
                "jaxoff_page_in: checksum mismatch in " + file->path() + " at offset " +
                    std::to_string(off) + " (" + std::to_string(size) +
                    " bytes): expected crc32c " + Hex(static_cast<uint32_t>(expected)) +
                    ", read " + Hex(s.crc32c) +
                    ". The page file is corrupt or was written by a crashed run; restore the "
                    "store from the last checkpoint (resume), or delete the store to start "
                    "over"));
            return;
          }
          Complete(promise);
        },
        options);
    return future;
  } catch (const std::exception& e) {
    return ReadyError(ffi::ErrorCode::kInternal, std::string("jaxoff_page_in: ") + e.what());
  }
}

ffi::Future PageOut(PageState* state, ffi::AnyBuffer file_id, ffi::AnyBuffer offset,
                    ffi::AnyBuffer x, ffi::AnyBuffer /*token*/,
                    ffi::Result<ffi::AnyBuffer> crc_out, ffi::Result<ffi::AnyBuffer> out_token,
                    std::string_view /*table*/, bool write_behind) {
  try {
    std::shared_ptr<const aio::File> file;
    int64_t off = 0;
    std::string err = Locate("jaxoff_page_out", state, file_id, offset, &file, &off);
    if (!err.empty()) return ReadyError(ffi::ErrorCode::kInvalidArgument, err);
    if (crc_out->element_type() != ffi::DataType::U32 || crc_out->element_count() != 1) {
      return ReadyError(ffi::ErrorCode::kInvalidArgument,
                        "jaxoff_page_out: the crc result must be a uint32 scalar");
    }
    const void* src = x.untyped_data();
    const size_t size = x.size_bytes();
    auto* crc = static_cast<uint32_t*>(crc_out->untyped_data());
    std::memset(out_token->untyped_data(), 0, out_token->size_bytes());
    aio::StagedIo& staged = *state->table->staged;
    if (write_behind && staged.WriteBehind(file, static_cast<uint64_t>(off), src, size, crc)) {
      // The bytes (and their crc32c, taken during the copy) are in staging: XLA may reuse x
      // while the disk write proceeds; jaxoff_page_flush waits for it and reports its errors.
      ffi::Promise promise;
      ffi::Future future(promise);
      promise.SetAvailable();
      return future;
    }
    // Synchronous path (or staging is short): keep the order with staged reads and writes.
    staged.WaitForOverlaps(file.get(), static_cast<uint64_t>(off), size, true);
    ffi::Promise promise;
    ffi::Future future(promise);
    // The crc32c comes from the engine's workers, folded into the staging copy of each block:
    // the handler returns at once and the tensor is read from memory once.
    aio::IoOptions options;
    options.crc32c = true;
    state->table->engine->Write(
        file, static_cast<uint64_t>(off), src, size,
        [promise, crc](const aio::IoStatus& s) mutable {
          if (s.ok()) {
            *crc = s.crc32c;  // XLA reads results only once the future is available
            Complete(promise);
          } else {
            Fail(promise, ffi::Error(ffi::ErrorCode::kInternal, "jaxoff_page_out: " + s.message));
          }
        },
        options);
    return future;
  } catch (const std::exception& e) {
    return ReadyError(ffi::ErrorCode::kInternal, std::string("jaxoff_page_out: ") + e.what());
  }
}

ffi::ErrorOr<std::unique_ptr<PageState>> PageInInstantiateImpl(std::string_view table, bool) {
  return Instantiate("jaxoff_page_in", table);
}
ffi::ErrorOr<std::unique_ptr<PageState>> PageOutInstantiateImpl(std::string_view table, bool) {
  return Instantiate("jaxoff_page_out", table);
}

// Split phase, first half: starts the read into staging and returns its ticket at once.
ffi::Error PagePrefetch(PageState* state, ffi::AnyBuffer file_id, ffi::AnyBuffer offset,
                        ffi::AnyBuffer expected_crc, ffi::AnyBuffer /*token*/,
                        ffi::Result<ffi::AnyBuffer> ticket_out, std::string_view /*table*/,
                        int64_t nbytes, bool verify) {
  constexpr const char* kName = "jaxoff_page_prefetch";
  try {
    std::shared_ptr<const aio::File> file;
    int64_t off = 0;
    std::string err = Locate(kName, state, file_id, offset, &file, &off);
    if (!err.empty()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, err);
    int64_t expected = 0;
    if (verify && (!ReadInteger(expected_crc, &expected) ||
                   expected_crc.element_type() != ffi::DataType::U32)) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string(kName) + ": expected_crc must be a uint32 scalar");
    }
    if (nbytes < 0) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string(kName) + ": nbytes must be non-negative");
    }
    if (ticket_out->element_type() != ffi::DataType::S32 || ticket_out->element_count() != 1) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string(kName) + ": the ticket result must be an int32 scalar");
    }
    int32_t ticket = 0;
    aio::IoStatus s = state->table->staged->Prefetch(
        file, static_cast<uint64_t>(off), static_cast<size_t>(nbytes), verify,
        static_cast<uint32_t>(expected), &ticket);
    if (!s.ok()) {
      return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                        std::string(kName) + " (table '" + state->table->name + "'): " + s.message);
    }
    *static_cast<int32_t*>(ticket_out->untyped_data()) = ticket;
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string(kName) + ": " + e.what());
  }
}

// Split phase, second half: waits for the ticket's read, verifies it, copies it out. Asynchronous
// when the read is still in flight: XLA's thread goes on with other work (e.g. a layer's matmuls
// beside its neighbour's paged update) and the result is ready when the read completes.
ffi::Future PageTake(PageState* state, ffi::AnyBuffer ticket, ffi::AnyBuffer /*token*/,
                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> out_token,
                     std::string_view /*table*/) {
  constexpr const char* kName = "jaxoff_page_take";
  try {
    if (ticket.element_type() != ffi::DataType::S32 || ticket.element_count() != 1) {
      return ReadyError(ffi::ErrorCode::kInvalidArgument,
                        std::string(kName) + ": the ticket must be an int32 scalar from "
                        "jaxoff_page_prefetch");
    }
    std::memset(out_token->untyped_data(), 0, out_token->size_bytes());
    void* dst = out->untyped_data();
    const size_t size = out->size_bytes();
    aio::AdviseHugePages(dst, size);
    auto error = [table = state->table->name](const aio::IoStatus& s) {
      const bool corrupt = s.message.find("checksum mismatch") != std::string::npos;
      return ffi::Error(corrupt ? ffi::ErrorCode::kDataLoss : ffi::ErrorCode::kInternal,
                        std::string(kName) + " (table '" + table + "'): " + s.message);
    };
    ffi::Promise promise;
    ffi::Future future(promise);
    aio::IoStatus now;
    const bool ready = state->table->staged->TakeAsync(
        *static_cast<const int32_t*>(ticket.untyped_data()), dst, size, &now,
        [promise, error](const aio::IoStatus& s) mutable {
          if (s.ok()) {
            Complete(promise);
          } else {
            Fail(promise, error(s));
          }
        });
    if (ready) {
      if (now.ok()) {
        promise.SetAvailable();
      } else {
        promise.SetError(error(now));
      }
    }
    return future;
  } catch (const std::exception& e) {
    return ReadyError(ffi::ErrorCode::kInternal, std::string(kName) + ": " + e.what());
  }
}

// Waits for the table's write-behind writes (fsync if asked): what a commit must follow.
ffi::Error PageFlush(PageState* state, ffi::AnyBuffer /*token*/,
                     ffi::Result<ffi::AnyBuffer> out_token, std::string_view /*table*/,
                     bool fsync) {
  try {
    std::memset(out_token->untyped_data(), 0, out_token->size_bytes());
    aio::IoStatus s = state->table->staged->Flush(fsync);
    if (!s.ok()) {
      return ffi::Error(ffi::ErrorCode::kInternal,
                        "jaxoff_page_flush (table '" + state->table->name +
                            "'): a write-behind write failed: " + s.message);
    }
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("jaxoff_page_flush: ") + e.what());
  }
}

ffi::ErrorOr<std::unique_ptr<PageState>> PagePrefetchInstantiateImpl(std::string_view table,
                                                                      int64_t, bool) {
  return Instantiate("jaxoff_page_prefetch", table);
}
ffi::ErrorOr<std::unique_ptr<PageState>> PageTakeInstantiateImpl(std::string_view table) {
  return Instantiate("jaxoff_page_take", table);
}
ffi::ErrorOr<std::unique_ptr<PageState>> PageFlushInstantiateImpl(std::string_view table, bool) {
  return Instantiate("jaxoff_page_flush", table);
}

}  // namespace

XLA_FFI_TypeId* PageStateTypeId() { return &PageState::id; }
const XLA_FFI_TypeInfo* PageStateTypeInfo() { return &kPageStateTypeInfo; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(PageInInstantiate, PageInInstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("verify"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PageInExecute, PageIn,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<PageState>>()
                                  .Arg<ffi::AnyBuffer>()  // file_id
                                  .Arg<ffi::AnyBuffer>()  // offset
                                  .Arg<ffi::AnyBuffer>()  // expected_crc
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // the tensor
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("verify"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PageOutInstantiate, PageOutInstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("write_behind"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PageOutExecute, PageOut,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<PageState>>()
                                  .Arg<ffi::AnyBuffer>()  // file_id
                                  .Arg<ffi::AnyBuffer>()  // offset
                                  .Arg<ffi::AnyBuffer>()  // the tensor
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // crc32c (uint32 scalar)
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("write_behind"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PagePrefetchInstantiate, PagePrefetchInstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("nbytes")
                                  .Attr<bool>("verify"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PagePrefetchExecute, PagePrefetch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<PageState>>()
                                  .Arg<ffi::AnyBuffer>()  // file_id
                                  .Arg<ffi::AnyBuffer>()  // offset
                                  .Arg<ffi::AnyBuffer>()  // expected_crc
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // ticket (int32 scalar)
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("nbytes")
                                  .Attr<bool>("verify"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PageTakeInstantiate, PageTakeInstantiateImpl,
                              ffi::Ffi::BindInstantiate().Attr<std::string_view>("table"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PageTakeExecute, PageTake,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<PageState>>()
                                  .Arg<ffi::AnyBuffer>()  // ticket
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // the tensor
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PageFlushInstantiate, PageFlushInstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("fsync"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PageFlushExecute, PageFlush,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<PageState>>()
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<bool>("fsync"));

}  // namespace jaxoff::ffi_handlers
