#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "crc32c.h"

namespace jaxoff::aio {

struct Engine::Request {
  std::shared_ptr<const File> file;
  bool write = false;
  bool want_crc = false;
  char* user = nullptr;
  size_t size = 0;
  uint64_t offset = 0;
  size_t next = 0;      // bytes handed to the backend so far
  size_t inflight = 0;  // blocks in flight
  bool failed = false;
  bool completed = false;
  IoStatus status;
  std::vector<std::pair<uint32_t, size_t>> crcs;  // (crc32c, bytes) of each block, in order
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
  // queue_depth slots in I/O plus one per worker being copied: copies never stall the disk.
  slots_.resize(static_cast<size_t>(config.queue_depth + config.threads));
  for (auto& s : slots_) free_slots_.push_back(&s);
  for (int i = 0; i < config.threads; ++i) workers_.emplace_back([this] {
      NameThisThread("jaxoff-copy");
      Work();
    });
}

Engine::~Engine() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    idle_cv_.wait(lk, [this] { return in_flight_ == 0 && pending_.empty(); });
  }
  {
    std::lock_guard<std::mutex> lk(work_mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
  backend_.reset();  // joins the backend threads before the members they use go away
}

void Engine::Read(std::shared_ptr<const File> file, uint64_t offset, void* dst, size_t size,
                  Callback done, IoOptions options) {
  auto r = std::make_shared<Request>();
  r->want_crc = options.crc32c;
  r->file = std::move(file);
  r->user = static_cast<char*>(dst);
  r->size = size;
  r->offset = offset;
  r->done = std::move(done);
  Enqueue(std::move(r));
}

void Engine::Write(std::shared_ptr<const File> file, uint64_t offset, const void* src,
                   size_t size, Callback done, IoOptions options) {
  auto r = std::make_shared<Request>();
  r->want_crc = options.crc32c;
  r->file = std::move(file);
  r->write = true;
  r->user = const_cast<char*>(static_cast<const char*>(src));  // only read from
  r->size = size;
  r->offset = offset;
  r->done = std::move(done);
  Enqueue(std::move(r));
}

std::shared_ptr<Completion> Engine::Read(std::shared_ptr<const File> file, uint64_t offset,
                                         void* dst, size_t size, IoOptions options) {
  auto c = std::make_shared<Completion>();
  Read(std::move(file), offset, dst, size, [c](const IoStatus& s) { c->Set(s); }, options);
  return c;
}

std::shared_ptr<Completion> Engine::Write(std::shared_ptr<const File> file, uint64_t offset,
                                          const void* src, size_t size, IoOptions options) {
  auto c = std::make_shared<Completion>();
  Write(std::move(file), offset, src, size, [c](const IoStatus& s) { c->Set(s); }, options);
  return c;
}

void Engine::Enqueue(std::shared_ptr<Request> req) {
  if (req->size == 0) {
    IoStatus empty;
    empty.crc32c = 0;  // crc32c of no bytes
    req->done(empty);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.push_back(std::move(req));
  }
  Pump();
}

// Starts as many blocks as I/O credits, free slots and staging buffers allow (FIFO over
// requests). Writes that need a staging copy or a checksum go to the workers first; everything
// else is submitted right here.
void Engine::Pump() {
  std::vector<Slot*> start;
  {
    std::lock_guard<std::mutex> lk(mu_);
    while (!pending_.empty() && !free_slots_.empty() &&
           io_in_flight_ < static_cast<size_t>(config_.queue_depth)) {
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
      s->crc = 0;
      s->err = 0;
      s->index = req->crcs.size();
      if (req->want_crc) req->crcs.emplace_back(0, n);
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
      if (io_in_flight_++ == 0) busy_since_ = std::chrono::steady_clock::now();
      if (req->next >= req->size) pending_.pop_front();
      start.push_back(s);
    }
  }
  for (Slot* s : start) {
    if (s->op.write && (s->staging || s->req->want_crc)) {
      Post(s);
    } else {
      backend_->Submit(&s->op);
    }
  }
}

void Engine::Post(Slot* s) {
  {
    std::lock_guard<std::mutex> lk(work_mu_);
    work_.push_back(s);
  }
  work_cv_.notify_one();
}

// A worker: blocks (never spins) until a slot needs its staging copy and/or checksum.
void Engine::Work() {
  for (;;) {
    Slot* s;
    {
      std::unique_lock<std::mutex> lk(work_mu_);
      work_cv_.wait(lk, [this] { return stop_ || !work_.empty(); });
      if (work_.empty()) return;
      s = work_.front();
      work_.pop_front();
    }
    const Request& req = *s->req;
    char* user = req.user + s->req_pos;
    if (s->op.write) {
      if (s->staging) {
        if (req.want_crc) {
          s->crc = Crc32cCopy(0, s->staging, user, s->bytes);
        } else {
          std::memcpy(s->staging, user, s->bytes);
        }
        std::memset(s->staging + s->bytes, 0, s->op.len - s->bytes);  // zero pad to 4 KiB
      } else {
        s->crc = Crc32c(user, s->bytes);
      }
      backend_->Submit(&s->op);
    } else {
      if (s->staging) {
        if (req.want_crc) {
          s->crc = Crc32cCopy(0, user, s->staging, s->bytes);
        } else {
          std::memcpy(user, s->staging, s->bytes);
        }
      } else {
        s->crc = Crc32c(user, s->bytes);
      }
      Finish(s);
    }
  }
}

// From a backend thread: the block's I/O is over. Its I/O credit goes back at once (the next
// block starts while this one is copied); a read that needs a copy or crc goes to the workers.
void Engine::OnBlockDone(BlockOp* op, int err) {
  Slot* s = static_cast<Slot*>(op->user);
  s->err = err;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (--io_in_flight_ == 0) {
      busy_ns_ += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::steady_clock::now() - busy_since_)
                                            .count());
    }
    if (err == 0) (op->write ? write_bytes_ : read_bytes_) += s->bytes;
  }
  if (err == 0 && !op->write && (s->staging || s->req->want_crc)) {
    Pump();
    Post(s);
    return;
  }
  Finish(s);
}

EngineStats Engine::Stats() {
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats st;
  st.busy_ns = busy_ns_;
  if (io_in_flight_ > 0) {
    st.busy_ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::steady_clock::now() - busy_since_)
                                            .count());
  }
  st.read_bytes = read_bytes_;
  st.write_bytes = write_bytes_;
  return st;
}

void Engine::Finish(Slot* s) {
  std::shared_ptr<Request> req = std::move(s->req);
  const int err = s->err;
  Callback cb;
  IoStatus status;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (s->staging) pool_.Release(s->staging);
    if (err != 0 && !req->failed) {
      req->failed = true;
      req->status.err = err;
      req->status.message = FormatIoMessage(req->write ? "write" : "read", *s->path,
                                            static_cast<int64_t>(s->op.offset),
                                            static_cast<int64_t>(s->bytes), err, __FILE__,
                                            __LINE__);
    }
    if (req->want_crc && err == 0) req->crcs[s->index].first = s->crc;
    free_slots_.push_back(s);
    --in_flight_;
    --req->inflight;
    if (req->inflight == 0 && (req->failed || req->next >= req->size) && !req->completed) {
      req->completed = true;
      cb = std::move(req->done);
      status = req->status;
    }
  }
  if (cb) {
    if (req->want_crc && status.ok()) {
      uint32_t crc = 0;
      for (const auto& [c, n] : req->crcs) crc = Crc32cCombine(crc, c, n);
      status.crc32c = crc;
    }
    cb(status);
  }
  Pump();
  std::lock_guard<std::mutex> lk(mu_);
  if (in_flight_ == 0 && pending_.empty()) idle_cv_.notify_all();
}

}  // namespace jaxoff::aio
