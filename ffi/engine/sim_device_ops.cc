#include "sim_device_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "aligned_buffer.h"

namespace jaxoff::aio {

struct SimDeviceOps::SimStream {
  std::deque<std::function<void()>> queue;
  size_t pending = 0;  // enqueued, not finished
  bool stop = false;
  std::chrono::microseconds lag{0};
  std::condition_variable cv;
  std::thread thread;
};

SimDeviceOps::SimDeviceOps(SimDelays delays) : delays_(delays) {}

SimDeviceOps::~SimDeviceOps() = default;

DeviceOps::Stream SimDeviceOps::CreateStream() {
  auto* s = new SimStream();
  s->thread = std::thread([this, s] { Run(s); });
  return s;
}

void SimDeviceOps::DestroyStream(Stream stream) {
  auto* s = static_cast<SimStream*>(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    s->stop = true;
  }
  s->cv.notify_all();
  s->thread.join();
  delete s;
}

void SimDeviceOps::SetStreamLag(Stream stream, std::chrono::microseconds lag) {
  std::lock_guard<std::mutex> lock(mu_);
  static_cast<SimStream*>(stream)->lag = lag;
}

void SimDeviceOps::Run(SimStream* s) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
    if (s->queue.empty()) return;  // stopped and drained
    std::function<void()> op = std::move(s->queue.front());
    s->queue.pop_front();
    const auto lag = s->lag;
    lock.unlock();
    if (lag.count() > 0) std::this_thread::sleep_for(lag);
    op();
    lock.lock();
    --s->pending;
    cv_.notify_all();
  }
}

void SimDeviceOps::Enqueue(Stream stream, std::function<void()> op) {
  auto* s = static_cast<SimStream*>(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    s->queue.push_back(std::move(op));
    ++s->pending;
  }
  s->cv.notify_one();
}

DeviceOps::Event SimDeviceOps::CreateEvent() { return new SimEvent(); }

void SimDeviceOps::DestroyEvent(Event event) { delete static_cast<SimEvent*>(event); }

void SimDeviceOps::RecordEvent(Event event, Stream stream) {
  auto* e = static_cast<SimEvent*>(event);
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    target = ++e->recorded;
  }
  Enqueue(stream, [this, e, target] {
    std::lock_guard<std::mutex> lock(mu_);
    e->completed = std::max(e->completed, target);
    cv_.notify_all();
  });
}

void SimDeviceOps::StreamWaitEvent(Stream stream, Event event) {
  auto* e = static_cast<SimEvent*>(event);
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    target = e->recorded;
  }
  Enqueue(stream, [this, e, target] {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return e->completed >= target; });
  });
}

bool SimDeviceOps::EventDone(Event event) {
  auto* e = static_cast<SimEvent*>(event);
  std::lock_guard<std::mutex> lock(mu_);
  return e->completed >= e->recorded;
}

void SimDeviceOps::Start(const Access& mine) {
  for (const Access& a : active_) {
    if (a.begin < mine.end && mine.begin < a.end && (a.write || mine.write)) {
      if (stats_.hazards++ == 0) {
        std::ostringstream os;
        os << mine.what << " (" << (mine.end - mine.begin) << " bytes) "
           << (mine.write ? "writes" : "reads") << " bytes while " << a.what << " "
           << (a.write ? "writes" : "reads") << " them";
        first_hazard_ = os.str();
      }
    }
  }
  active_.push_back(mine);
}

void SimDeviceOps::Finish(const Access& mine) {
  auto it = std::find_if(active_.begin(), active_.end(), [&](const Access& a) {
    return a.begin == mine.begin && a.end == mine.end && a.write == mine.write &&
           a.stream == mine.stream;
  });
  if (it != active_.end()) active_.erase(it);
}

void SimDeviceOps::RunCopy(void* dst, const void* src, size_t bytes, CopyKind kind,
                           const SimStream* s) {
  const char* d = static_cast<const char*>(dst);
  const char* r = static_cast<const char*>(src);
  static const char* const kWhat[3] = {"H2D copy", "D2H copy", "D2D copy"};
  const char* what = kWhat[static_cast<int>(kind)];
  const Access mine[2] = {{d, d + bytes, true, s, what}, {r, r + bytes, false, s, what}};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Access& m : mine) Start(m);
  }
  const auto delay = kind == CopyKind::kHostToDevice   ? delays_.h2d
                     : kind == CopyKind::kDeviceToHost ? delays_.d2h
                                                       : delays_.d2d;
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  std::memmove(dst, src, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (const Access& m : mine) Finish(m);
  const int k = static_cast<int>(kind);
  ++stats_.copies[k];
  stats_.bytes[k] += bytes;
}

void SimDeviceOps::CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                             Stream stream) {
  const auto* s = static_cast<const SimStream*>(stream);
  Enqueue(stream, [=, this] { RunCopy(dst, src, bytes, kind, s); });
}

void SimDeviceOps::MemsetAsync(void* dst, int value, size_t bytes, Stream stream) {
  const auto* s = static_cast<const SimStream*>(stream);
  Enqueue(stream, [=, this] {
    const char* d = static_cast<const char*>(dst);
    const Access mine{d, d + bytes, true, s, "memset"};
    {
      std::lock_guard<std::mutex> lock(mu_);
      Start(mine);
    }
    std::memset(dst, value, bytes);
    std::lock_guard<std::mutex> lock(mu_);
    Finish(mine);
  });
}

void SimDeviceOps::BeginHostAccess(const void* p, size_t n, bool write, const char* what) {
  const char* b = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  Start({b, b + n, write, nullptr, what});
}

void SimDeviceOps::EndHostAccess(const void* p, size_t n, bool write) {
  const char* b = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  Finish({b, b + n, write, nullptr, ""});
}

void SimDeviceOps::LaunchHostFunc(Stream stream, std::function<void()> fn) {
  Enqueue(stream, [this, fn = std::move(fn)] {
    fn();
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.host_funcs;
  });
}

void SimDeviceOps::SynchronizeStream(Stream stream) {
  auto* s = static_cast<SimStream*>(stream);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return s->pending == 0; });
}

void* SimDeviceOps::AllocPinned(size_t bytes) {
  void* p = std::aligned_alloc(kAlign, AlignUp(std::max<size_t>(bytes, 1)));
  if (p == nullptr) throw DeviceError("sim AllocPinned(" + std::to_string(bytes) + ") failed");
  return p;
}

void SimDeviceOps::FreePinned(void* ptr) { std::free(ptr); }

void* SimDeviceOps::AllocDevice(size_t bytes) { return AllocPinned(bytes); }

void SimDeviceOps::FreeDevice(void* ptr) { std::free(ptr); }

SimStats SimDeviceOps::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string SimDeviceOps::FirstHazard() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_hazard_;
}

}  // namespace jaxoff::aio
