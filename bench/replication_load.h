// ReplicationLoad: how fast one shard_replicator copies a shard's objects into the cache server.
//
// It starts a cache (cache_server --role=cache), shard "a"'s store (cache_server --role=shard)
// and one shard_replicator for shard "a" between them, on loopback ports they pick themselves,
// waits until the replicator is ready (/readyz) and leads (shardcache_leader_election_leading 1),
// defines the benchmark resource in the shard store, creates a ClusterCachedResource for it in
// logical cluster "root" and waits until the CCR is Ready. It then opens a Watch on the cache for
// the resource's copies from shard "a" and runs three passes, each of `objects` writes into the
// shard store over Write streams (WriteLoad): create every object, update every object, delete
// every object. Each pass waits until the watch has shown the matching event (ADDED, MODIFIED,
// DELETED) for every object whose local write was acknowledged, and reports:
//   - end-to-end throughput: objects divided by the time from the first local write sent to the
//     last matching event received;
//   - replication lag per object: its local write's acknowledgement to its event on the cache
//     watch (matched by name);
//   - the local writes' own rate and latency, each process's CPU, the replicator's busiest thread
//     and its memory;
//   - a check after the pass: the cache's copies listed against the shard store's objects.
//
// Every wait has a deadline. Thread-compatible: call RunReplicationLoad from one thread at a time.
#ifndef SHARDCACHE_BENCH_REPLICATION_LOAD_H_
#define SHARDCACHE_BENCH_REPLICATION_LOAD_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/bench_util.h"

namespace shardcache::bench {

struct ReplicationLoadOptions {
  // The binaries to run, and extra flags for both stores and for the replicator (the replicator's
  // come after its defaults: --shard=a, --shard-store, --cache, --identity=bench-0,
  // --lease-duration=3s --renew-deadline=2s --retry-period=500ms).
  std::string cache_server;
  std::string replicator;
  std::vector<std::string> server_args;
  std::vector<std::string> replicator_args;
  // Objects written in each pass, and the size of each as sent (padded with random text).
  int64_t objects = 10000;
  int64_t object_bytes = 1024;
  // Write streams into the shard store, and writes in flight per stream.
  int streams = 4;
  int window = 256;
  // Bound on each process's start.
  absl::Duration start_timeout = absl::Minutes(1);
  // Bound on each setup step: ready, leading, CCR Ready, the watch's initial events.
  absl::Duration setup_timeout = absl::Minutes(1);
  // Bound on each pass's local writes, and then on the copies' arrival after the last answer.
  absl::Duration write_timeout = absl::Minutes(30);
  absl::Duration drain_timeout = absl::Minutes(5);
  // Deadline of each unary call.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Names the run's objects.
  std::string run_id;
};

// The cache's copies against the shard store's objects, from two lists.
struct SyncCheck {
  bool ok = false;  // both lists succeeded
  std::string error;
  int64_t local = 0;    // objects of the run in the shard store
  int64_t copies = 0;   // copies of the run in the cache (shard "a", cluster "root")
  int64_t in_sync = 0;  // copies whose original-resource-version is the local resourceVersion
  int64_t missing = 0;  // local objects without a copy
  int64_t stale = 0;    // copies with another original-resource-version
  int64_t extra = 0;    // copies without a local object
};

struct ReplicationPass {
  std::string name;   // "create", "update", "delete"
  std::string event;  // the event type expected for each object: "ADDED", ...
  int64_t writes_ok = 0;
  int64_t write_errors = 0;
  std::map<std::string, int64_t> error_samples;
  double write_seconds = 0;  // first local write sent to last local answer
  LatencySummary write_latency;
  int64_t events_seen = 0;        // objects written OK whose expected event arrived
  int64_t duplicates = 0;         // further expected events for an object already seen
  int64_t other_events = 0;       // events of the run's objects of another type during the pass
  bool complete = false;          // events_seen == writes_ok within the drain timeout
  double end_to_end_seconds = 0;  // first local write sent to last expected event received
  double drain_seconds = 0;       // last local answer to last expected event received
  int64_t drain_events = 0;       // expected events received after the last local answer
  LatencySummary lag;             // local answer -> event on the cache watch
  // CPU (cores, averaged from the first write to the last event, or the drain timeout).
  double replicator_cores = 0;
  double shard_cores = 0;
  double cache_cores = 0;
  double bench_cores = 0;
  BusiestThread replicator_busiest;
  ProcStats replicator_after;  // once every event arrived (or the drain timed out)
  // Changes of the replicator's counters over the pass (-1: could not be read).
  double replicator_upserts = -1;
  double replicator_deletes = -1;
  double replicator_write_errors = -1;
  double replicator_lag_mean_ms = -1;  // its own lag histogram: change seen -> cache write acked
  SyncCheck check;                     // after the pass
};

struct ReplicationLoadResult {
  std::string setup_error;  // non-empty: setup failed, no pass ran
  // Setup times, in seconds from the replicator's start.
  double ready_seconds = 0;
  double leading_seconds = 0;
  double ccr_ready_seconds = 0;   // from creating the CCR
  int64_t object_bytes_sent = 0;  // one object as sent (serialized)
  ProcStats replicator_idle;      // leading, CCR Ready, before the first pass
  std::vector<ReplicationPass> passes;
  ProcStats replicator_end;  // after the last pass
  ProcStats shard_end;
  ProcStats cache_end;
  // The replicator's failed cache writes over the whole run, by code (its
  // shardcache_replicator_write_errors_total series), and the warnings and errors it logged
  // (the first few, and how many in all).
  std::map<std::string, double> replicator_errors_by_code;
  std::vector<std::string> replicator_warnings;
  int64_t replicator_warning_count = 0;
  std::string watch_error;     // non-empty: the cache watch ended early
  int64_t foreign_events = 0;  // watch events for objects that are not the run's
  int replicator_exit = -1;    // waitpid status after SIGTERM; -1: killed or not started
  // Tails of the processes' logs, when something failed.
  std::string logs;

  bool Verified() const;
};

ReplicationLoadResult RunReplicationLoad(const ReplicationLoadOptions& options);

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_REPLICATION_LOAD_H_
