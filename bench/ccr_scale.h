// CcrScale: how one shard_replicator's threads and memory grow with the number of
// ClusterCachedResources (CCRs) it serves, and whether they come back when the CCRs are deleted.
//
// It starts a cache (cache_server --role=cache), shard "a"'s store (cache_server --role=shard)
// and one shard_replicator for shard "a" between them, on loopback ports they pick themselves
// (StartReplicatorProcesses), waits until the replicator is ready and leads, and reads the
// replicator's Threads and VmRSS (/proc/PID/status), its threads by name (/proc/PID/task/*/comm),
// its shardcache_replicator_replication_controllers gauge and, where it has them, its
// shardcache_informer_factory_informers gauges, at each of these moments:
//   1. idle: leading, nothing defined, read `settle` after the replicator began to lead;
//   2. objects, no CCR: `resources` ResourceDefinitions defined in the shard store
//      (widgets, widgets1, ... in group bench.shardcache.io) and `objects_per_resource` objects of
//      `object_bytes` each written, over one Write stream, into every (cluster, resource) pair of
//      `clusters` = ceil(ccrs / resources) logical clusters ("bench-0", "bench-1", ...); read
//      `settle` after the last write;
//   3. converged: `ccrs` CCRs created (over one Write stream), CCR i in cluster i / resources for
//      resource i % resources, so that no (cluster, resource) pair has two; read once every CCR's
//      phase is Ready and a listing of the cache shows every copy (objects_per_resource copies of
//      shard "a" in each pair that has a CCR, none in the others, and one copy of each CCR);
//   4. after delete: every CCR deleted (over one Write stream); read `settle` after the shard
//      store has no CCR left and the cache no copy of an object or of a CCR. Meanwhile it polls
//      the replicator's thread count every 500 ms and keeps when it last changed: the factory
//      releases an informer that nobody holds only after a grace period (10 s), so `settle` must
//      be longer than that for the reading to show the release.
// The waits for 3 and 4 poll every 500 ms and are bounded (converge_timeout, delete_timeout); a
// wait that times out ends the run (the readings taken so far are kept). While converging it also
// keeps the highest thread count that a poll saw.
//
// Thread-compatible: call RunCcrScale from one thread at a time.
#ifndef SHARDCACHE_BENCH_CCR_SCALE_H_
#define SHARDCACHE_BENCH_CCR_SCALE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/bench_util.h"

namespace shardcache::bench {

struct CcrScaleOptions {
  // The binaries, their extra flags and the bounds on their start.
  ReplicatorProcessOptions processes;
  // CCRs to create, resources (ResourceDefinitions) to spread them over, and the objects of each
  // resource in each cluster, each padded to about `object_bytes` as sent.
  int ccrs = 50;
  int resources = 20;
  int objects_per_resource = 20;
  int64_t object_bytes = 1024;
  // Writes in flight on each Write stream (objects, CCR creates, CCR deletes).
  int window = 256;
  // Bound on each stream of writes.
  absl::Duration write_timeout = absl::Minutes(10);
  // Bound on the wait for every CCR Ready and every copy in the cache, and on the wait for every
  // CCR and copy gone.
  absl::Duration converge_timeout = absl::Minutes(10);
  absl::Duration delete_timeout = absl::Minutes(10);
  // How long the replicator is left alone before each reading but "converged".
  absl::Duration settle = absl::Seconds(15);
  // Deadline of each unary call (lists, metrics).
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Names the run's objects.
  std::string run_id;
};

// The replicator at one moment.
struct CcrScaleReading {
  std::string phase;  // "idle", "objects, no CCR", "converged", "after delete"
  // The wait that ended the phase, in seconds: the writes and settle (objects), the first CCR
  // create sent to everything converged, the first delete sent to everything gone; 0 for idle.
  double seconds = 0;
  ProcStats replicator;
  std::map<std::string, int64_t> thread_names;  // /proc/PID/task/*/comm -> threads
  double replication_controllers = -1;          // the gauge; -1: not read
  // shardcache_informer_factory_informers of the factory on the shard store and of the one on
  // the cache; -1: the replicator has no such gauge.
  double shard_informers = -1;
  double cache_informers = -1;
};

// What the last poll of a wait saw.
struct CcrScaleCounts {
  int64_t ccrs = 0;        // CCRs in the shard store
  int64_t ccrs_ready = 0;  // of which phase Ready
  std::string not_ready;   // one CCR that is not Ready, and its phase
  // The cache was listed (the converge wait lists it only once every CCR is Ready).
  bool cache_listed = false;
  int64_t copies = 0;       // copies of the benchmark resources from shard "a" in the cache
  int64_t wrong_pairs = 0;  // (cluster, resource) pairs whose copies are not as expected
  int64_t ccr_copies = 0;   // copies of CCRs from shard "a" in the cache
  std::string error;        // a list failed
};

struct CcrScaleResult {
  std::string setup_error;  // non-empty: the processes did not start, or were not ready or leading
  int clusters = 0;
  int64_t objects = 0;  // objects written into the shard store
  int64_t object_bytes_sent = 0;
  int64_t expected_copies = 0;
  double ready_seconds = 0;  // replicator start to /readyz 200
  double leading_seconds = 0;
  double objects_seconds = 0;  // the objects' writes, from the first sent to the last answered
  double create_seconds = 0;   // the CCR creates, likewise
  double delete_seconds = 0;   // the CCR deletes, likewise
  // From the first CCR create sent: every CCR Ready; also every copy in the cache (-1: not seen).
  double all_ready_seconds = -1;
  double converged_seconds = -1;
  double gone_seconds = -1;  // from the first delete sent: no CCR and no copy left
  // From then: when the replicator's thread count last changed during the `settle` that follows
  // (-1: it did not change).
  double threads_changed_seconds = -1;
  int64_t peak_threads = 0;  // the replicator's highest Threads seen while converging
  std::vector<CcrScaleReading> readings;
  CcrScaleCounts converge_counts;  // the converge wait's last poll
  CcrScaleCounts delete_counts;    // the delete wait's last poll
  std::string failure;             // a write that failed or a wait that timed out
  ProcStats shard_end;             // the shard store and the cache at the end
  ProcStats cache_end;
  LogWarnings replicator_warnings;
  int replicator_exit = -1;  // waitpid status after SIGTERM; -1: killed or not started
  std::string logs;          // tails of the processes' logs, when something failed

  bool Verified() const;
};

CcrScaleResult RunCcrScale(const CcrScaleOptions& options);

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_CCR_SCALE_H_
