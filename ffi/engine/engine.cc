#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

namespace jaxoff::aio {

struct Engine::Request {
  std::shared_ptr<const File> file;
  bool write = false;
  char* user = nullptr;
  size_t size = 0;
  uint64_t offset = 0;
  size_t next = 0;      // bytes handed to the backend so far
  size_t inflight = 0;  // blocks in flight
  bool failed = false;
  bool completed = false;
  IoStatus status;
  Callback done;
};

void Completion::Set(IoStatus status) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    status_ = std::move(status);
    done_ = true;
  }
  cv_.notify_all();
}

const IoStatus& Completion::Wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return done_; });
  return status_;
}

bool Completion::WaitFor(double seconds) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, std::chrono::duration<double>(seconds), [this] { return done_; });
}

bool Completion::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

Engine::Engine(const EngineConfig& config)
    : config_(config),
      pool_((config.Validate(), config.block_size), config.pool_bytes / config.block_size) {
  auto on_done = [this](BlockOp* op, int err) { OnBlockDone(op, err); };
  const BackendKind kind = ResolveBackend(config.backend);
  if (kind == BackendKind::kIoUring) {
    backend_ = MakeUringBackend(config.queue_depth, on_done);
  } else if (kind == BackendKind::kPosix) {
    backend_ = MakePosixBackend(config.threads, on_done);
  } else {
    try {
      backend_ = MakeUringBackend(config.queue_depth, on_done);
    } catch (const IoError&) {
      backend_ = MakePosixBackend(config.threads, on_done);
    }
  }
  slots_.resize(static_cast<size_t>(config.queue_depth));
  for (auto& s : slots_) free_slots_.push_back(&s);
}

Engine::~Engine() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    idle_cv_.wait(lk, [this] { return in_flight_ == 0 && pending_.empty(); });
  }
  backend_.reset();  // joins the backend threads before the members they use go away
}

void Engine::Read(std::shared_ptr<const File> file, uint64_t offset, void* dst, size_t size,
                  Callback done) {
  auto r = std::make_shared<Request>();
  r->file = std::move(file);
  r->user = static_cast<char*>(dst);
  r->size = size;
  r->offset = offset;
  r->done = std::move(done);
  Enqueue(std::move(r));
}

void Engine::Write(std::shared_ptr<const File> file, uint64_t offset, const void* src,
                   size_t size, Callback done) {
  auto r = std::make_shared<Request>();
  r->file = std::move(file);
  r->write = true;
  r->user = const_cast<char*>(static_cast<const char*>(src));  // only read from
  r->size = size;
  r->offset = offset;
  r->done = std::move(done);
  Enqueue(std::move(r));
}

std::shared_ptr<Completion> Engine::Read(std::shared_ptr<const File> file, uint64_t offset,
                                         void* dst, size_t size) {
  auto c = std::make_shared<Completion>();
  Read(std::move(file), offset, dst, size, [c](const IoStatus& s) { c->Set(s); });
  return c;
}

std::shared_ptr<Completion> Engine::Write(std::shared_ptr<const File> file, uint64_t offset,
                                          const void* src, size_t size) {
  auto c = std::make_shared<Completion>();
  Write(std::move(file), offset, src, size, [c](const IoStatus& s) { c->Set(s); });
  return c;
}

void Engine::Enqueue(std::shared_ptr<Request> req) {
  if (req->size == 0) {
    req->done(IoStatus{});
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.push_back(std::move(req));
  }
  Pump();
}

// Starts as many blocks as free slots and staging buffers allow (FIFO over requests).
void Engine::Pump() {
  std::vector<Slot*> start;
  {
    std::lock_guard<std::mutex> lk(mu_);
    while (!pending_.empty() && !free_slots_.empty()) {
      const std::shared_ptr<Request>& req = pending_.front();
      if (req->failed || req->next >= req->size) {
        pending_.pop_front();
        continue;
      }
      const uint64_t off = req->offset + req->next;
      const size_t want = std::min(config_.block_size, req->size - req->next);
      char* user = req->user + req->next;
      const Extent ext = req->file->Map(off, want, off % kAlign == 0);
      const size_t n = ext.len;
      const bool zero_copy = !ext.direct || (IsAligned(user) && n % kAlign == 0);
      char* staging = nullptr;
      if (!zero_copy && (staging = pool_.TryAcquire()) == nullptr) break;
      Slot* s = free_slots_.back();
      free_slots_.pop_back();
      s->req = req;
      s->req_pos = req->next;
      s->bytes = n;
      s->staging = staging;
      s->path = ext.path;
      s->op = BlockOp{};
      s->op.fd = ext.fd;
      s->op.write = req->write;
      s->op.direct = ext.direct;
      s->op.buf = staging ? staging : user;
      s->op.len = ext.direct ? AlignUp(n) : n;
      s->op.need = n;
      s->op.offset = ext.offset;
      s->op.user = s;
      req->next += n;
      ++req->inflight;
      ++in_flight_;
      if (req->next >= req->size) pending_.pop_front();
      start.push_back(s);
    }
  }
  for (Slot* s : start) {
    if (s->op.write && s->staging) {
      std::memcpy(s->staging, s->req->user + s->req_pos, s->bytes);
      std::memset(s->staging + s->bytes, 0, s->op.len - s->bytes);  // zero pad to 4 KiB
    }
    backend_->Submit(&s->op);
  }
}

void Engine::OnBlockDone(BlockOp* op, int err) {
  Slot* s = static_cast<Slot*>(op->user);
  std::shared_ptr<Request> req = std::move(s->req);
  if (err == 0 && !req->write && s->staging) {
    std::memcpy(req->user + s->req_pos, s->staging, s->bytes);
  }
  Callback cb;
  IoStatus status;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (s->staging) pool_.Release(s->staging);
    if (err != 0 && !req->failed) {
      req->failed = true;
      req->status.err = err;
      req->status.message =
          FormatIoMessage(req->write ? "write" : "read", *s->path, static_cast<int64_t>(op->offset),
                          static_cast<int64_t>(s->bytes), err, __FILE__, __LINE__);
    }
    free_slots_.push_back(s);
    --in_flight_;
    --req->inflight;
    if (req->inflight == 0 && (req->failed || req->next >= req->size) && !req->completed) {
      req->completed = true;
      cb = std::move(req->done);
      status = req->status;
    }
  }
  if (cb) cb(status);
  Pump();
  std::lock_guard<std::mutex> lk(mu_);
  if (in_flight_ == 0 && pending_.empty()) idle_cv_.notify_all();
}

}  // namespace jaxoff::aio
