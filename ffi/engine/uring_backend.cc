// io_uring backend: callers submit under a lock; one reaper thread owns the completion queue,
// resubmits short transfers and reports finished blocks.
#include <cerrno>

#include "backend.h"
#include "error.h"

#ifdef JAXOFF_HAVE_URING
#include <liburing.h>

#include <mutex>
#include <thread>

namespace jaxoff::aio {
namespace {

class UringBackend final : public Backend {
 public:
  UringBackend(int queue_depth, Completion on_done) : on_done_(std::move(on_done)) {
    unsigned entries = 8;
    while (entries < static_cast<unsigned>(queue_depth) + 1) entries *= 2;
    int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) throw JAXOFF_IO_ERROR("io_uring_queue_init", std::string("<io_uring>"), 0, -1, -rc);
    reaper_ = std::thread([this] {
      NameThisThread("jaxoff-uring");
      Reap();
    });
  }

  ~UringBackend() override {
    {
      std::lock_guard<std::mutex> lk(sq_mu_);
      io_uring_sqe* sqe = GetSqe();
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);  // the stop signal
      io_uring_submit(&ring_);
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }

  const char* name() const override { return "io_uring"; }

  void Submit(BlockOp* op) override {
    std::lock_guard<std::mutex> lk(sq_mu_);
    Prep(op);
    int rc;
    do rc = io_uring_submit(&ring_);
    while (rc == -EINTR || rc == -EAGAIN);
    if (rc < 0) {
      // The sqe is consumed or dropped; report the failure for this op.
      on_done_(op, -rc);
    }
  }

 private:
  io_uring_sqe* GetSqe() {
    io_uring_sqe* sqe;
    while ((sqe = io_uring_get_sqe(&ring_)) == nullptr) io_uring_submit(&ring_);
    return sqe;
  }

  void Prep(BlockOp* op) {
    const size_t at = ResumePoint(*op);
    io_uring_sqe* sqe = GetSqe();
    if (op->write) {
      io_uring_prep_write(sqe, op->fd, op->buf + at, static_cast<unsigned>(op->len - at),
                          op->offset + at);
    } else {
      io_uring_prep_read(sqe, op->fd, op->buf + at, static_cast<unsigned>(op->len - at),
                         op->offset + at);
    }
    io_uring_sqe_set_data(sqe, op);
  }

  void Reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) continue;  // transient; the kernel keeps the completion
      auto* op = static_cast<BlockOp*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (op == nullptr) return;
      if (res < 0) {
        if (res == -EINTR || res == -EAGAIN) {
          Submit(op);
          continue;
        }
        on_done_(op, -res);
        continue;
      }
      if (res == 0 && !IsComplete(*op)) {
        on_done_(op, op->write ? EIO : kErrEof);
        continue;
      }
      op->done = ResumePoint(*op) + static_cast<size_t>(res);
      if (IsComplete(*op)) {
        on_done_(op, 0);
      } else {
        Submit(op);  // short transfer: continue where it stopped
      }
    }
  }

  Completion on_done_;
  io_uring ring_{};
  std::mutex sq_mu_;
  std::thread reaper_;
};

}  // namespace

std::unique_ptr<Backend> MakeUringBackend(int queue_depth, Backend::Completion on_done) {
  return std::make_unique<UringBackend>(queue_depth, std::move(on_done));
}
bool UringCompiledIn() { return true; }

}  // namespace jaxoff::aio

#else  // !JAXOFF_HAVE_URING

namespace jaxoff::aio {
std::unique_ptr<Backend> MakeUringBackend(int, Backend::Completion) {
  throw JAXOFF_IO_ERROR("io_uring", std::string("<io_uring>"), 0, -1, ENOSYS);
}
bool UringCompiledIn() { return false; }
}  // namespace jaxoff::aio

#endif
