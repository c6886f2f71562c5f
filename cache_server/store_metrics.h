// StoreMetrics: the Prometheus metrics of a cache_server, registered in one registry.
//
// prometheus-cpp metrics are thread-safe; the struct is constant after construction.
#ifndef SHARDCACHE_CACHE_SERVER_STORE_METRICS_H_
#define SHARDCACHE_CACHE_SERVER_STORE_METRICS_H_

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace shardcache {

class StoreMetrics {
 public:
  explicit StoreMetrics(std::shared_ptr<prometheus::Registry> registry);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // One RPC finished: method name, status code name, and duration (negative for streams, which
  // are counted but not timed).
  void ObserveRequest(const std::string& method, const std::string& code, double seconds);

  prometheus::Gauge& revision;             // the store's current revision
  prometheus::Gauge& objects;              // live objects, all resources
  prometheus::Gauge& history_events;       // events in the watch history window
  prometheus::Gauge& watchers;             // open watch streams
  prometheus::Counter& events_dispatched;  // events handed to watchers
  prometheus::Counter& watchers_too_slow;  // watchers ended: their clients stopped reading
  prometheus::Counter& writes;             // committed writes
  // How long each durable commit took: one batch of writes written and synced to disk.
  prometheus::Histogram& commit_seconds;
  // Where the committer's time goes, per batch (shardcache_store_commit_phase_seconds{phase}):
  // taking the batch (waiting for the owner's operation lock included), writing it (serialized
  // into the storage's form and written, not yet synced), syncing it, publishing it (the owner's
  // OnDurable, with its compaction, and the WatchCache), and running its completions.
  prometheus::Histogram& commit_take_seconds;
  prometheus::Histogram& commit_write_seconds;
  prometheus::Histogram& commit_sync_seconds;
  prometheus::Histogram& commit_publish_seconds;
  prometheus::Histogram& commit_complete_seconds;
  // Events per committed batch.
  prometheus::Histogram& commit_batch_events;
  // Watchers parked (their queue filled; caught up from the history later), watchers ended
  // because the history moved past them, and events delivered to parked watchers from it.
  prometheus::Gauge& watchers_parked;
  prometheus::Counter& watchers_too_old;
  prometheus::Counter& watch_catch_up_events;
  // 1 while creates and updates are refused for want of disk space (Storage::CheckSpace).
  prometheus::Gauge& writes_refused_no_space;
  // Storage on etcd: each write transaction's round trip; transactions whose compares failed
  // (the write is decided again); the revision the replica's watch has reached and etcd's
  // compacted revision as this replica last set it; how long each consistent read waited for
  // the watch (its lag as readers see it); consistent reads refused because the replica did not
  // catch up in time; writes of the progress key.
  prometheus::Histogram& etcd_txn_seconds;
  prometheus::Counter& etcd_txn_retries;
  prometheus::Gauge& etcd_watch_revision;
  prometheus::Gauge& etcd_compacted_revision;
  prometheus::Histogram& etcd_read_wait_seconds;
  prometheus::Counter& etcd_stale_reads_refused;
  prometheus::Counter& etcd_progress_writes;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_seconds_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_STORE_METRICS_H_
