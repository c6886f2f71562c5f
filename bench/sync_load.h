// SyncLoad: how many syncs a second the disk allows. One thread writes a block to a file and
// syncs it (fdatasync or fsync), in a loop, for a fixed time; each sync is timed alone.
//
// This is the ceiling of a store that syncs once per write, and what group commit divides among
// concurrent writers: a store that shares each sync among N writes can acknowledge up to N times
// this many writes a second.
//
// Thread-compatible: call RunSyncLoad from one thread at a time.
#ifndef SHARDCACHE_BENCH_SYNC_LOAD_H_
#define SHARDCACHE_BENCH_SYNC_LOAD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"

namespace shardcache::bench {

struct SyncLoadOptions {
  enum class Call { kFdatasync, kFsync };
  Call call = Call::kFdatasync;
  // true: each write appends a block, as a write-ahead log does (the file's size changes, so the
  // filesystem commits its journal on every sync); false: each write overwrites the same block.
  bool append = true;
  // The directory the file is made in (and removed from afterwards).
  std::string dir;
  // Bytes written before each sync.
  int64_t block_bytes = 4096;
  // An appended file is truncated to empty when it reaches this size (rarely: once in 16,384
  // syncs of 4 KiB), so that a run needs little disk space.
  int64_t max_file_bytes = 64 << 20;
  absl::Duration duration = absl::Seconds(10);
};

struct SyncLoadResult {
  int64_t syncs = 0;
  double seconds = 0;
  LatencySummary sync_latency;   // of the sync call alone
  LatencySummary write_latency;  // of the write call before it (to the page cache)
  // Cache flushes the device completed during the run (whole device; see ReadDiskFlushes).
  DiskFlushes flushes_before;
  DiskFlushes flushes_after;
};

// Runs the loop; fails if the file cannot be made or a write or sync fails.
absl::StatusOr<SyncLoadResult> RunSyncLoad(const SyncLoadOptions& options);

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_SYNC_LOAD_H_
