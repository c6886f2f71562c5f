#include "cache_server/store_metrics.h"

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace shardcache {
namespace {

prometheus::Gauge& MakeGauge(prometheus::Registry& r, const std::string& name,
                             const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

prometheus::Counter& MakeCounter(prometheus::Registry& r, const std::string& name,
                                 const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Family<prometheus::Histogram>& CommitPhases(prometheus::Registry& r) {
  return prometheus::BuildHistogram()
      .Name("shardcache_store_commit_phase_seconds")
      .Help(
          "Time the committer spends on each batch, by phase: take (the batch taken from the "
          "store), write (serialized and written, not synced), sync, publish (made visible and "
          "handed to the watch cache), complete (the answers).")
      .Register(r);
}

prometheus::Histogram& CommitPhase(prometheus::Registry& r, const std::string& phase) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
      0.0025,  0.005,    0.01,    0.025,  0.05,    0.1,    0.25};
  return CommitPhases(r).Add({{"phase", phase}}, kBuckets);
}

}  // namespace

StoreMetrics::StoreMetrics(std::shared_ptr<prometheus::Registry> registry)
    : revision(MakeGauge(*registry, "shardcache_store_revision", "The store's current revision.")),
      objects(MakeGauge(*registry, "shardcache_store_objects", "Live objects in the store.")),
      history_events(MakeGauge(*registry, "shardcache_store_history_events",
                               "Events held in the watch history window.")),
      watchers(MakeGauge(*registry, "shardcache_store_watchers", "Open watch streams.")),
      events_dispatched(MakeCounter(*registry, "shardcache_store_events_dispatched_total",
                                    "Events handed to watchers.")),
      watchers_too_slow(
          MakeCounter(*registry, "shardcache_store_watchers_too_slow_total",
                      "Watchers ended because their clients read nothing for the stall timeout.")),
      writes(MakeCounter(*registry, "shardcache_store_writes_total", "Committed writes.")),
      commit_seconds(
          prometheus::BuildHistogram()
              .Name("shardcache_store_commit_duration_seconds")
              .Help("Duration of each durable commit: a batch of writes written to "
                    "disk and synced (with --sync).")
              .Register(*registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                               0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                                               5})),
      commit_take_seconds(CommitPhase(*registry, "take")),
      commit_write_seconds(CommitPhase(*registry, "write")),
      commit_sync_seconds(CommitPhase(*registry, "sync")),
      commit_publish_seconds(CommitPhase(*registry, "publish")),
      commit_complete_seconds(CommitPhase(*registry, "complete")),
      commit_batch_events(
          prometheus::BuildHistogram()
              .Name("shardcache_store_commit_batch_events")
              .Help("Events in each committed batch.")
              .Register(*registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128, 256,
                                                               512, 1024, 4096})),
      watchers_parked(MakeGauge(*registry, "shardcache_store_watchers_parked",
                                "Watchers whose queue filled: parked, to be caught up from the "
                                "history window.")),
      watchers_too_old(MakeCounter(*registry, "shardcache_store_watchers_too_old_total",
                                   "Parked watchers ended with OUT_OF_RANGE: the events they "
                                   "needed had left the history window.")),
      watch_catch_up_events(MakeCounter(*registry, "shardcache_store_watch_catch_up_events_total",
                                        "Events delivered from the history window to parked "
                                        "watchers.")),
      writes_refused_no_space(MakeGauge(
          *registry, "shardcache_store_writes_refused_no_space",
          "1 while creates and updates are refused because the disk of the data directory has "
          "less free space than --min-free-disk-bytes.")),
      etcd_txn_seconds(
          prometheus::BuildHistogram()
              .Name("shardcache_store_etcd_txn_duration_seconds")
              .Help("Round trip of each write transaction to etcd (--storage=etcd).")
              .Register(*registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                               0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                                               5})),
      etcd_txn_retries(MakeCounter(
          *registry, "shardcache_store_etcd_txn_retries_total",
          "Write transactions whose compares failed because another writer changed the key or "
          "the shard's epoch first; the write was decided again.")),
      etcd_watch_revision(MakeGauge(
          *registry, "shardcache_store_etcd_watch_revision",
          "The etcd revision of the last change of the store's prefix that this replica's watch "
          "has applied.")),
      etcd_compacted_revision(
          MakeGauge(*registry, "shardcache_store_etcd_compacted_revision",
                    "The revision to which this replica last compacted etcd's history.")),
      etcd_read_wait_seconds(
          prometheus::BuildHistogram()
              .Name("shardcache_store_etcd_read_wait_seconds")
              .Help("How long each consistent read (Get, List, /readyz) waited for this "
                    "replica's watch to reach etcd's current revision: the watch's lag as "
                    "readers see it (--storage=etcd).")
              .Register(*registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                               0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                                               5})),
      etcd_stale_reads_refused(MakeCounter(
          *registry, "shardcache_store_etcd_stale_reads_refused_total",
          "Consistent reads refused (UNAVAILABLE) because this replica had not caught up with "
          "etcd's revision within --consistent-read-timeout.")),
      etcd_progress_writes(MakeCounter(
          *registry, "shardcache_store_etcd_progress_writes_total",
          "Writes of the store's progress key, made when a consistent read or a decided-again "
          "write found no change of the prefix coming (the askers meanwhile share one write).")),
      registry_(std::move(registry)),
      requests_(prometheus::BuildCounter()
                    .Name("shardcache_grpc_requests_total")
                    .Help("RPCs finished, by method and status code.")
                    .Register(*registry_)),
      request_seconds_(prometheus::BuildHistogram()
                           .Name("shardcache_grpc_request_duration_seconds")
                           .Help("Duration of unary RPCs and of each write in a Write stream.")
                           .Register(*registry_)) {}

void StoreMetrics::ObserveRequest(const std::string& method, const std::string& code,
                                  double seconds) {
  requests_.Add({{"method", method}, {"code", code}}).Increment();
  if (seconds < 0) return;
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1};
  request_seconds_.Add({{"method", method}}, kBuckets).Observe(seconds);
}

}  // namespace shardcache
