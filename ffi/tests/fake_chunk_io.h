#pragma once
// ChunkIo in memory for the pager's tests: worker threads, an injected delay per request, and
// injected read failures, corruptions and write failures.

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "crc32c.h"
#include "gpu_pager.h"
#include "worker_pool.h"

namespace jaxoff::aio::testing {

class FakeChunkIo final : public ChunkIo {
 public:
  explicit FakeChunkIo(int threads = 2, std::chrono::microseconds read_delay = {},
                       std::chrono::microseconds write_delay = {})
      : read_delay_(read_delay), write_delay_(write_delay), pool_(threads) {}

  void Read(const ChunkRef& ref, void* dst, Done done) override {
    Post([this, ref, dst, done = std::move(done)] {
      std::this_thread::sleep_for(read_delay_);
      IoStatus st;
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
      done(st);
    });
  }

  void Write(const ChunkRef& ref, const void* src, Done done) override {
    Post([this, ref, src, done = std::move(done)] {
      std::this_thread::sleep_for(write_delay_);
      IoStatus st;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (fail_writes_.count(ref.offset)) {
          st.err = ENOSPC;
          st.message = "injected write error at offset " + std::to_string(ref.offset);
        } else {
          std::vector<char>& f = files_[ref.file];
          if (f.size() < ref.offset + ref.bytes) f.resize(ref.offset + ref.bytes);
          std::memcpy(f.data() + ref.offset, src, ref.bytes);
          ++writes_done_;
        }
      }
      if (st.ok()) st.crc32c = Crc32c(src, ref.bytes);
      done(st);
    });
  }

  void Put(int file, uint64_t offset, const std::vector<char>& bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<char>& f = files_[file];
    if (f.size() < offset + bytes.size()) f.resize(offset + bytes.size());
    std::memcpy(f.data() + offset, bytes.data(), bytes.size());
  }
  std::vector<char> Get(int file, uint64_t offset, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<char>& f = files_[file];
    if (f.size() < offset + n) f.resize(offset + n);
    return std::vector<char>(f.begin() + offset, f.begin() + offset + n);
  }
  void FailRead(uint64_t offset, bool on = true) { Toggle(fail_reads_, offset, on); }
  void FailWrite(uint64_t offset, bool on = true) { Toggle(fail_writes_, offset, on); }
  uint64_t writes_done() {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_done_;
  }

 private:
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
  std::mutex mu_;
  std::map<int, std::vector<char>> files_;
  std::set<uint64_t> fail_reads_, fail_writes_;
  uint64_t writes_done_ = 0;
  WorkerPool pool_;  // last: joined before the members its tasks use go
};

}  // namespace jaxoff::aio::testing
