#include "shard_replicator/replicator_metrics.h"

namespace shardcache {
namespace {

const prometheus::Histogram::BucketBoundaries& SecondsBuckets() {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  return kBuckets;
}

}  // namespace

ReplicatorMetrics::ReplicatorMetrics(std::shared_ptr<prometheus::Registry> registry)
    : epoch(prometheus::BuildGauge()
                .Name("shardcache_replicator_epoch")
                .Help("The fencing epoch of the current leadership term; 0 when not leading")
                .Register(*registry)
                .Add({})),
      fenced(prometheus::BuildCounter()
                 .Name("shardcache_replicator_fenced_total")
                 .Help("Writes that the cache rejected as fenced by a newer leader's epoch")
                 .Register(*registry)
                 .Add({})),
      cache_unavailable(prometheus::BuildGauge()
                            .Name("shardcache_replicator_cache_unavailable")
                            .Help("1 while the leader cannot write to the cache because the cache "
                                  "server cannot be reached; 0 otherwise (and when not leading)")
                            .Register(*registry)
                            .Add({})),
      replication_controllers(prometheus::BuildGauge()
                                  .Name("shardcache_replicator_replication_controllers")
                                  .Help("Replication controllers running")
                                  .Register(*registry)
                                  .Add({})),
      registry_(registry),
      writes_(prometheus::BuildCounter()
                  .Name("shardcache_replicator_writes_total")
                  .Help("Writes to the cache that it acknowledged, by operation")
                  .Register(*registry)),
      write_errors_(prometheus::BuildCounter()
                        .Name("shardcache_replicator_write_errors_total")
                        .Help("Writes to the cache that failed, by gRPC status code")
                        .Register(*registry)),
      reconcile_seconds_(prometheus::BuildHistogram()
                             .Name("shardcache_replicator_reconcile_duration_seconds")
                             .Help("How long one reconcile took, by controller")
                             .Register(*registry)),
      lag_(prometheus::BuildHistogram()
               .Name("shardcache_replicator_replication_lag_seconds")
               .Help("From a local change seen by the replicator to the cache acknowledging its "
                     "write")
               .Register(*registry)
               .Add({}, SecondsBuckets())),
      cache_objects_(prometheus::BuildGauge()
                         .Name("shardcache_replicator_cache_objects")
                         .Help("Copies in the cache, per ClusterCachedResource")
                         .Register(*registry)) {}

void ReplicatorMetrics::WriteAcknowledged(const std::string& operation) {
  writes_.Add({{"operation", operation}}).Increment();
}

void ReplicatorMetrics::WriteFailed(const std::string& code_name) {
  write_errors_.Add({{"code", code_name}}).Increment();
}

void ReplicatorMetrics::ObserveReconcile(const std::string& controller, double seconds) {
  reconcile_seconds_.Add({{"controller", controller}}, SecondsBuckets()).Observe(seconds);
}

void ReplicatorMetrics::ObserveLag(double seconds) { lag_.Observe(seconds); }

void ReplicatorMetrics::SetCacheObjects(const std::string& cluster, const std::string& name,
                                        int64_t count) {
  cache_objects_.Add({{"cluster", cluster}, {"name", name}}).Set(static_cast<double>(count));
}

void ReplicatorMetrics::RemoveCacheObjects(const std::string& cluster, const std::string& name) {
  cache_objects_.Remove(&cache_objects_.Add({{"cluster", cluster}, {"name", name}}));
}

}  // namespace shardcache
