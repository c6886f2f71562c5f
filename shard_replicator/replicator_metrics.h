// ReplicatorMetrics: the Prometheus metrics of a shard_replicator, registered in one registry.
//
//   shardcache_replicator_epoch                          the current term's epoch (0: not leading)
//   shardcache_replicator_fenced_total                   writes the cache rejected as fenced
//   shardcache_replicator_cache_unavailable              1 while the leader's writes to the cache
//                                                        stop because it cannot be reached
//   shardcache_replicator_write_errors_total{code}       failed cache writes, by gRPC code name
//   shardcache_replicator_writes_total{operation}        acknowledged cache writes (upsert, delete)
//   shardcache_replicator_reconcile_duration_seconds{controller}
//                                                        one reconcile (clustercachedresources,
//                                                        replication)
//   shardcache_replicator_replication_lag_seconds        local change seen -> cache write acked
//   shardcache_replicator_cache_objects{cluster,name}    copies in the cache per CCR
//   shardcache_replicator_replication_controllers        replication controllers running
//
// Leadership itself is exported by the LeaderElector (shardcache_leader_election_leading and
// shardcache_leader_election_terms_total) and queue depths by each WorkQueue
// (shardcache_workqueue_depth{name}).
//
// Thread-safe: prometheus-cpp metrics are; the struct is constant after construction.
#ifndef SHARDCACHE_SHARD_REPLICATOR_REPLICATOR_METRICS_H_
#define SHARDCACHE_SHARD_REPLICATOR_REPLICATOR_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace shardcache {

class ReplicatorMetrics {
 public:
  explicit ReplicatorMetrics(std::shared_ptr<prometheus::Registry> registry);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  void WriteAcknowledged(const std::string& operation);
  void WriteFailed(const std::string& code_name);
  void ObserveReconcile(const std::string& controller, double seconds);
  void ObserveLag(double seconds);
  // The copies in the cache for one CCR; Remove drops the series (the CCR is gone).
  void SetCacheObjects(const std::string& cluster, const std::string& name, int64_t count);
  void RemoveCacheObjects(const std::string& cluster, const std::string& name);

  prometheus::Gauge& epoch;
  prometheus::Counter& fenced;
  prometheus::Gauge& cache_unavailable;
  prometheus::Gauge& replication_controllers;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& writes_;
  prometheus::Family<prometheus::Counter>& write_errors_;
  prometheus::Family<prometheus::Histogram>& reconcile_seconds_;
  prometheus::Histogram& lag_;
  prometheus::Family<prometheus::Gauge>& cache_objects_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_SHARD_REPLICATOR_REPLICATOR_METRICS_H_
