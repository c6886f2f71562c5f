// MemoryTrimmer: see memory_trimmer.h.
#include "common/client/memory_trimmer.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

#include "prometheus/family.h"

namespace shardcache {
namespace {

// This process's resident bytes (/proc/self/statm), or -1.
int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long size = 0, resident = 0;
  int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  if (n != 2) return -1;
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

}  // namespace

MemoryTrimmer::MemoryTrimmer(WorkerPool* pool, Options options)
    : pool_(pool), options_(std::move(options)) {
  if (options_.registry != nullptr) {
    trims_counter_ = &prometheus::BuildCounter()
                          .Name("shardcache_memory_trims_total")
                          .Help("Times the process returned its freed heap memory to the system")
                          .Register(*options_.registry)
                          .Add({});
    released_counter_ = &prometheus::BuildCounter()
                             .Name("shardcache_memory_trim_released_bytes_total")
                             .Help("Resident bytes returned to the system by those trims")
                             .Register(*options_.registry)
                             .Add({});
  }
  next_ = pool_->clock()->Now() + options_.interval;
  pool_->WakeAt(this, next_);
}

MemoryTrimmer::~MemoryTrimmer() { pool_->Detach(this); }

void MemoryTrimmer::Tick(absl::Time now) {
  if (now < next_) {
    pool_->WakeAt(this, next_);
    return;
  }
  // The walk of the heap is a worker's job, not the timer's.
  pool_->Schedule(this);
}

void MemoryTrimmer::RunTurn() {
  int64_t before = ResidentBytes();
  if (options_.trim) {
    options_.trim();
  } else {
    malloc_trim(0);
  }
  int64_t after = ResidentBytes();
  trims_.fetch_add(1);
  if (trims_counter_ != nullptr) {
    trims_counter_->Increment();
    if (before >= 0 && after >= 0 && before > after) {
      released_counter_->Increment(static_cast<double>(before - after));
    }
  }
  next_ = pool_->clock()->Now() + options_.interval;
  pool_->WakeAt(this, next_);
}

}  // namespace shardcache
