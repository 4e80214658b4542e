#pragma once
// Split-phase I/O on top of an Engine: reads that start now and are taken later (prefetch
// tickets), and writes that return once their bytes are in staging (write-behind), so that the
// disk works on the engine's threads while the caller computes, whatever the caller's
// scheduler does between the two phases.
//
// Both kinds of request keep their bytes in 4 KiB-aligned staging owned here, bounded by one
// budget (`budget_bytes`, the table's EngineConfig::pool_bytes; separate from the engine's
// per-block pool, so that staged bytes can never starve the blocks of plain requests).
//
// Ordering: a write waits for in-flight prefetches and write-behind writes that overlap it, and
// a read waits for overlapping write-behind writes, so a chain of requests ordered by its caller
// (a token) sees each write exactly as if it had been synchronous. Outside this object (another
// engine, another process) a write-behind write is only visible after Flush().
//
// Budget: a write-behind write that does not fit waits for older writes (they finish on their
// own); one that cannot fit even then is refused (the caller writes synchronously instead). A
// prefetch that does not fit waits for write-behind writes, then reclaims tickets that were
// never taken and are older than `stale_seconds`, and is otherwise refused with a message that
// names pool_bytes: waiting for a ticket to be taken could deadlock a caller that takes it
// later on the same thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "engine.h"
#include "error.h"
#include "file_handle.h"

namespace jaxoff::aio {

struct StagedIoStats {
  size_t tickets = 0;            // prefetched, not yet taken (or reclaimed)
  size_t reads_in_flight = 0;    // prefetch reads not yet complete
  size_t writes_in_flight = 0;   // write-behind writes not yet on disk
  size_t staging_in_use = 0;     // bytes held by tickets and write-behind writes
  size_t staging_allocated = 0;  // bytes allocated: in use + cached for reuse (<= budget)
  size_t budget = 0;
  uint64_t reclaimed = 0;        // tickets dropped without a take (drain, stale)
  uint64_t takes = 0;            // successful takes, and the time they spent:
  uint64_t take_wait_ns = 0;     //   waiting for their read (I/O not hidden)
  uint64_t take_copy_ns = 0;     //   copying out of staging
  // Other time callers spent blocked on I/O (overlapping requests, staging, write-behind):
  uint64_t prefetch_wait_ns = 0;  //   in prefetches
  uint64_t write_wait_ns = 0;     //   in write-behind writes
  uint64_t flush_wait_ns = 0;     //   in flushes (waiting for write-behind writes)
};

class StagedIo {
 public:
  StagedIo(std::shared_ptr<Engine> engine, size_t budget_bytes, double stale_seconds = 30.0);
  ~StagedIo();  // waits for reads and writes in flight; untaken tickets are dropped
  StagedIo(const StagedIo&) = delete;
  StagedIo& operator=(const StagedIo&) = delete;

  // Starts reading `size` bytes at `offset` of `file` into staging and returns at once; on
  // success *ticket (> 0) names the read for Take. With `verify`, Take checks the bytes' crc32c
  // against `expected_crc` (computed by the engine's workers as the blocks arrive).
  IoStatus Prefetch(std::shared_ptr<const File> file, uint64_t offset, size_t size, bool verify,
                    uint32_t expected_crc, int32_t* ticket);
  // Blocks until `ticket`'s read is done, checks it (size, I/O status, crc32c) and copies its
  // `size` bytes to `dst`. The ticket is released whatever the outcome.
  IoStatus Take(int32_t ticket, void* dst, size_t size);
  // Take without blocking: when the ticket's read is over (or the ticket is unknown), takes it
  // now, stores the outcome in *now and returns true. Otherwise returns false at once and
  // `done` runs with the outcome on the engine's completion thread once the read has ended and
  // its bytes are in `dst` (which must stay valid until then). So an XLA program's thread
  // is not held while the disk works.
  bool TakeAsync(int32_t ticket, void* dst, size_t size, IoStatus* now,
                 std::function<void(const IoStatus&)> done);

  // Copies `size` bytes of `src` into staging (the crc32c, into *crc, is taken during the copy
  // while the bytes are in cache) and starts writing them; `src` may be reused on return.
  // Returns false, having done nothing, when the bytes cannot be staged within the budget.
  bool WriteBehind(std::shared_ptr<const File> file, uint64_t offset, const void* src,
                   size_t size, uint32_t* crc);
  // Blocks until every write-behind write started before the call is on disk (and, with
  // `fsync`, the files they went to are fsynced). Returns the first write error since the last
  // Flush (each is reported once).
  IoStatus Flush(bool fsync);

  // Blocks until no write-behind write overlapping [offset, offset + size) of `file` (and, with
  // `reads`, no prefetch read overlapping it) is in flight: call before a plain read (or write).
  void WaitForOverlaps(const File* file, uint64_t offset, size_t size, bool reads);

  // Waits for every prefetch read in flight and drops every ticket not taken; returns how many.
  size_t Drain();
  StagedIoStats Stats() const;

 private:
  struct State;
  static IoStatus FinishTake(const std::shared_ptr<State>& state, int32_t ticket,
                             const std::shared_ptr<void>& ticket_ptr, void* dst, size_t size,
                             std::chrono::steady_clock::time_point t0);
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<State> state_;  // shared with the completion callbacks
};

}  // namespace jaxoff::aio
