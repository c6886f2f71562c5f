// MemoryTrimmer: hands the heap memory that a process has freed back to the operating system
// every Options::interval (glibc's malloc_trim), as a client of a WorkerPool.
//
// glibc's malloc keeps what a program frees in its arenas for reuse; after a burst (a resync of
// many objects, informers released when their CCRs are deleted) a long-running process keeps its
// peak RSS for ever. A trim returns the free pages of every arena (madvise), costs a walk of the
// heap (milliseconds for hundreds of MiB), and changes nothing for the program. It runs as a turn
// on the pool's workers (not on its timer thread), so it adds no thread.
//
// Metrics (Options::registry):
//   shardcache_memory_trims_total                 trims done
//   shardcache_memory_trim_released_bytes_total   resident bytes that they returned (RSS before
//                                                 minus after; 0 when RSS grew meanwhile)
//
// Thread-safety: construct and destroy from one thread; the trims run on the pool's threads.
// The destructor waits for a trim in progress (WorkerPool::Detach).
#ifndef SHARDCACHE_COMMON_CLIENT_MEMORY_TRIMMER_H_
#define SHARDCACHE_COMMON_CLIENT_MEMORY_TRIMMER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "common/client/worker_pool.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace shardcache {

class MemoryTrimmer final : private WorkerPool::Client {
 public:
  struct Options {
    // Between two trims, on the pool's clock. Must be positive.
    absl::Duration interval = absl::Seconds(30);
    // Where the metrics go; null: none.
    std::shared_ptr<prometheus::Registry> registry;
    // What a trim does (for tests); empty: malloc_trim(0).
    std::function<void()> trim;
  };

  // Starts at once: the first trim comes one interval from now. `pool` must outlive it.
  MemoryTrimmer(WorkerPool* pool, Options options);
  ~MemoryTrimmer();
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  // Trims done so far (any thread).
  int64_t trims() const { return trims_.load(); }

 private:
  void RunTurn() override;
  void Tick(absl::Time now) override;

  WorkerPool* const pool_;
  const Options options_;
  prometheus::Counter* trims_counter_ = nullptr;
  prometheus::Counter* released_counter_ = nullptr;
  std::atomic<int64_t> trims_{0};
  // The time of the next trim: written before each WakeAt, read by the Tick that it leads to
  // (the pool's lock orders the two).
  absl::Time next_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_MEMORY_TRIMMER_H_
