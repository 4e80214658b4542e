#pragma once
// ChunkIo in memory for the pager's tests: worker threads, an injected delay per request (plus
// an optional seeded random jitter), and injected read failures, corruptions, write failures
// and sync failures.
//
// Durability is modelled: a completed write changes what later reads see (the page cache),
// and only Sync makes a file's bytes durable (Durable() reads those), so a test tells a step
// committed before its writes were synced from one committed after.
//
// Given the SimDeviceOps the pager runs on, every request declares the host memory it touches
// for its whole duration (the injected delay and the copy): a read writes its destination
// (an arena slot), a write reads its source (a pinned write slot). The simulator then counts
// a copy in flight over those bytes as a hazard, e.g. an arena slot refilled while its H2D
// copy still reads it, or a disk write reading a slot its D2H copy still fills.

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crc32c.h"
#include "gpu_pager.h"
#include "sim_device_ops.h"
#include "worker_pool.h"

namespace jaxoff::aio::testing {

class FakeChunkIo final : public ChunkIo {
 public:
  explicit FakeChunkIo(int threads = 2, std::chrono::microseconds read_delay = {},
                       std::chrono::microseconds write_delay = {}, SimDeviceOps* sim = nullptr)
      : read_delay_(read_delay), write_delay_(write_delay), sim_(sim), pool_(threads) {}

  void Read(const ChunkRef& ref, void* dst, Done done) override {
    Post([this, ref, dst, done = std::move(done)] {
      IoStatus st;
      {
        SimDeviceOps::HostAccess access(sim_, dst, ref.bytes, /*write=*/true,
                                        "a disk read into pinned memory");
        std::this_thread::sleep_for(read_delay_ + Jitter());
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (fail_reads_.count(ref.offset)) {
            st.err = EIO;
            st.message = "injected read error at offset " + std::to_string(ref.offset);
          } else {
            std::vector<char>& f = files_[ref.file];
            if (f.size() < ref.offset + ref.bytes) f.resize(ref.offset + ref.bytes);
            std::memcpy(dst, f.data() + ref.offset, ref.bytes);
          }
        }
        if (st.ok()) st.crc32c = Crc32c(dst, ref.bytes);
      }
      done(st);
    });
  }

  void Write(const ChunkRef& ref, const void* src, Done done) override {
    Post([this, ref, src, done = std::move(done)] {
      IoStatus st;
      {
        SimDeviceOps::HostAccess access(sim_, src, ref.bytes, /*write=*/false,
                                        "a disk write from pinned memory");
        std::this_thread::sleep_for(write_delay_ + Jitter());
        std::lock_guard<std::mutex> lock(mu_);
        if (fail_writes_.count(ref.offset)) {
          st.err = ENOSPC;
          st.message = "injected write error at offset " + std::to_string(ref.offset);
        } else {
          std::vector<char>& f = files_[ref.file];
          if (f.size() < ref.offset + ref.bytes) f.resize(ref.offset + ref.bytes);
          std::memcpy(f.data() + ref.offset, src, ref.bytes);
          st.crc32c = Crc32c(src, ref.bytes);
          ++writes_done_;
        }
      }
      done(st);
    });
  }

  IoStatus Sync(const std::vector<int>& files) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++syncs_;
    IoStatus st;
    if (fail_sync_) {
      st.err = EIO;
      st.message = "injected sync error";
      return st;
    }
    for (int f : files) {
      synced_files_.push_back(f);
      durable_[f] = files_[f];
    }
    return st;
  }

  // Stores bytes directly (a store written before the pager opened): visible and durable.
  void Put(int file, uint64_t offset, const std::vector<char>& bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* m : {&files_, &durable_}) {
      std::vector<char>& f = (*m)[file];
      if (f.size() < offset + bytes.size()) f.resize(offset + bytes.size());
      std::memcpy(f.data() + offset, bytes.data(), bytes.size());
    }
  }
  // What a read sees now.
  std::vector<char> Get(int file, uint64_t offset, size_t n) { return Slice(files_, file, offset, n); }
  // What survives a crash: the bytes as of the file's last Sync.
  std::vector<char> Durable(int file, uint64_t offset, size_t n) {
    return Slice(durable_, file, offset, n);
  }
  void FailRead(uint64_t offset, bool on = true) { Toggle(fail_reads_, offset, on); }
  void FailWrite(uint64_t offset, bool on = true) { Toggle(fail_writes_, offset, on); }
  void FailSync(bool on = true) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_sync_ = on;
  }
  // Each request sleeps a further uniform [0, max) drawn from a generator seeded with `seed`.
  void SetJitter(std::chrono::microseconds max, uint32_t seed) {
    std::lock_guard<std::mutex> lock(mu_);
    jitter_ = max;
    rng_.seed(seed);
  }
  uint64_t writes_done() {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_done_;
  }
  uint64_t syncs() {
    std::lock_guard<std::mutex> lock(mu_);
    return syncs_;
  }
  // Every file passed to a successful Sync, in call order.
  std::vector<int> synced_files() {
    std::lock_guard<std::mutex> lock(mu_);
    return synced_files_;
  }

 private:
  std::vector<char> Slice(std::map<int, std::vector<char>>& m, int file, uint64_t offset,
                          size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<char>& f = m[file];
    if (f.size() < offset + n) f.resize(offset + n);
    return std::vector<char>(f.begin() + offset, f.begin() + offset + n);
  }
  std::chrono::microseconds Jitter() {
    std::lock_guard<std::mutex> lock(mu_);
    if (jitter_.count() <= 0) return std::chrono::microseconds(0);
    return std::chrono::microseconds(rng_() % jitter_.count());
  }
  void Toggle(std::set<uint64_t>& s, uint64_t offset, bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    if (on) {
      s.insert(offset);
    } else {
      s.erase(offset);
    }
  }
  void Post(std::function<void()> fn) { pool_.Post(std::move(fn)); }

  const std::chrono::microseconds read_delay_, write_delay_;
  SimDeviceOps* const sim_;
  std::mutex mu_;
  std::map<int, std::vector<char>> files_, durable_;
  std::set<uint64_t> fail_reads_, fail_writes_;
  bool fail_sync_ = false;
  uint64_t writes_done_ = 0;
  uint64_t syncs_ = 0;
  std::vector<int> synced_files_;
  std::chrono::microseconds jitter_{0};
  std::mt19937 rng_;
  WorkerPool pool_;  // last: joined before the members its tasks use go
};

}  // namespace jaxoff::aio::testing
