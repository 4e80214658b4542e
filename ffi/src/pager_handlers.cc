#include "pager_handlers.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "backend.h"
#include "pager_registry.h"

namespace ffi = xla::ffi;

namespace jaxoff::pager {

namespace {

// Completes futures off the pager's threads. XLA runs the rest of the program on the thread
// that completes a future: were that the pager's waiting thread, compute would hold up the
// next call handed to it.
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

ffi::Future Done(ffi::Error error) {
  ffi::Promise promise;
  ffi::Future future(promise);
  if (error.success()) {
    promise.SetAvailable();
  } else {
    promise.SetError(std::move(error));
  }
  return future;
}

// Runs `call` on the pager's waiting thread; the future completes with its error.
ffi::Future Later(const std::shared_ptr<Entry>& e, std::function<ffi::Error()> call) {
  ffi::Promise promise;
  ffi::Future future(promise);
  e->waiter->Post([e, promise, call = std::move(call)]() mutable {
    ffi::Error error = call();
    Notifier::Get().Post([promise, error = std::move(error)]() mutable {
      if (error.success()) {
        promise.SetAvailable();
      } else {
        promise.SetError(std::move(error));
      }
    });
  });
  return future;
}

ffi::Future BeginImpl(ffi::AnyBuffer version, ffi::Result<ffi::AnyBuffer> token,
                      std::string_view table, int64_t plan) {
  auto found = Lookup(kBegin, table);
  if (!found.has_value()) return Done(found.error());
  std::shared_ptr<Entry> e = *found;
  if (ffi::Error err = VersionOperand(version); err.failure()) return Done(std::move(err));
  // Begin waits for the previous step's writes and commit: not on XLA's thread, which may
  // run the forward pass meanwhile (nothing of it depends on this call).
  auto value = std::make_shared<int32_t>(*static_cast<const int32_t*>(version.untyped_data()));
  ffi::AnyBuffer out = *token;
  return Later(e, [e, value, out, plan] { return Begin(*e, nullptr, value.get(), out, plan); });
}

ffi::Future TakeImpl(ffi::AnyBuffer /*token*/, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> token,
                     std::string_view table, int64_t plan, int64_t site) {
  auto found = Lookup(kTake, table);
  if (!found.has_value()) return Done(found.error());
  std::shared_ptr<Entry> e = *found;
  ffi::AnyBuffer x = *out, t = *token;
  if (e->pager->TakeReady(static_cast<int>(site))) return Done(Take(*e, nullptr, x, t, plan, site));
  return Later(e, [e, x, t, plan, site] { return Take(*e, nullptr, x, t, plan, site); });
}

ffi::Error OutImpl(ffi::AnyBuffer x, ffi::AnyBuffer /*token*/, ffi::Result<ffi::AnyBuffer> token,
                   std::string_view table, int64_t plan, int64_t site) {
  auto found = Lookup(kOut, table);
  if (!found.has_value()) return found.error();
  return Out(**found, nullptr, x, *token, plan, site);
}

ffi::Error CommitImpl(ffi::AnyBuffer /*token*/, ffi::Result<ffi::AnyBuffer> token,
                      std::string_view table, int64_t plan) {
  auto found = Lookup(kCommit, table);
  if (!found.has_value()) return found.error();
  return Commit(**found, nullptr, *token, plan);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuPagerBegin, BeginImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // token: the state's store version
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuPagerTake, TakeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // token (unread)
                                  .Ret<ffi::AnyBuffer>()  // the tensor
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan")
                                  .Attr<int64_t>("site"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuPagerOut, OutImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // the tensor
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan")
                                  .Attr<int64_t>("site"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuPagerCommit, CommitImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // token
                                  .Ret<ffi::AnyBuffer>()  // token
                                  .Attr<std::string_view>("table")
                                  .Attr<int64_t>("plan"));

}  // namespace jaxoff::pager
