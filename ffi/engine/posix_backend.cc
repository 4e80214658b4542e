// Portable backend: a pool of threads each running blocking pread/pwrite.
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "aligned_buffer.h"
#include "backend.h"
#include "error.h"

namespace jaxoff::aio {

size_t ResumePoint(const BlockOp& op) { return op.direct ? AlignDown(op.done) : op.done; }

void NameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

namespace {

class PosixBackend final : public Backend {
 public:
  PosixBackend(int threads, Completion on_done) : on_done_(std::move(on_done)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] {
      NameThisThread("jaxoff-io");
      Run();
    });
  }
  ~PosixBackend() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  const char* name() const override { return "posix"; }
  void Submit(BlockOp* op) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(op);
    }
    cv_.notify_one();
  }

 private:
  static int Transfer(BlockOp* op) {
    while (!IsComplete(*op)) {
      const size_t at = ResumePoint(*op);
      ssize_t r = op->write ? ::pwrite(op->fd, op->buf + at, op->len - at, op->offset + at)
                            : ::pread(op->fd, op->buf + at, op->len - at, op->offset + at);
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return errno;
      }
      if (r == 0) return op->write ? EIO : kErrEof;
      op->done = at + static_cast<size_t>(r);
    }
    return 0;
  }

  void Run() {
    for (;;) {
      BlockOp* op;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = queue_.front();
        queue_.pop_front();
      }
      on_done_(op, Transfer(op));
    }
  }

  Completion on_done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<BlockOp*> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<Backend> MakePosixBackend(int threads, Backend::Completion on_done) {
  return std::make_unique<PosixBackend>(threads, std::move(on_done));
}

}  // namespace jaxoff::aio
