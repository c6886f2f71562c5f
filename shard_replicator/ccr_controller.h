// CcrController: the leader's controller of ClusterCachedResources. For each CCR it decides
// whether replication can run, runs one ReplicationController while it can, keeps the CCR's own
// copy in the cache, handles deletion, and writes the CCR's status.
//
// One CcrController lives for one leadership term, with a fresh work queue. Each reconcile of a
// CCR computes everything from the current state (the informers' caches and the replication
// controller's real state), never from what an earlier reconcile concluded:
//   - finalizer: added to every CCR that is not being deleted;
//   - validity: a malformed spec or label selector, or an earlier CCR in the same cluster for the
//     same group and resource, makes it invalid (ResourceValid=False): no replication;
//   - served: when the shard store does not serve the resource, no controller runs, the copies
//     are purged from the cache, phase Initializing, ReplicationStarted=False
//     (ResourceNotServed); the key is retried with backoff;
//   - otherwise a ReplicationController runs for the current spec (replaced when the spec
//     changes, or when it stopped because an informer stopped); ReplicationStarted=True once it
//     has synced; phase Ready;
//   - deletion: the controller stops, phase Deleting, the copies are purged, phase Deleted, the
//     finalizer is removed;
//   - the CCR itself is copied to the cache (and its copy removed once it is gone);
//   - Synced: True when the running replication controller has no pending key (the cache holds
//     the whole projection); else False, reason Pending or CacheUnavailable (the writer cannot
//     reach the cache), with the number of pending objects; False with WaitingForSync,
//     NotReplicating or Deleting when nothing is replicated;
//   - the status (phase, conditions, resourceCounts, observedGeneration, and `epoch`, the term
//     that writes it) is written only when it differs from the stored one, stamped with
//     lastUpdateTime. A new term thus rewrites every status once (its epoch differs); while
//     nobody leads, nothing writes it, and a reader tells it is the last known one by comparing
//     its epoch with the lease (docs/replicator-design.md, "Status semantics").
// When a resource becomes served again (its definition came back) the CCRs that name it are
// enqueued at once with their backoff reset. A replication controller that stops enqueues its CCR.
//
// Threads: Start and Stop from the owner's thread; everything else runs on the controller's
// workers and on informer threads. Stop the term's CacheWriter before destroying the controller:
// write answers and WhenAvailable callbacks refer to it.
#ifndef SHARDCACHE_SHARD_REPLICATOR_CCR_CONTROLLER_H_
#define SHARDCACHE_SHARD_REPLICATOR_CCR_CONTROLLER_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/client/dynamic_informer_factory.h"
#include "common/client/shared_informer.h"
#include "common/client/store_client.h"
#include "common/client/work_queue.h"
#include "common/clock.h"
#include "shard_replicator/cache_writer.h"
#include "shard_replicator/cluster_cached_resource.h"
#include "shard_replicator/replication_controller.h"
#include "shard_replicator/replicator_metrics.h"
#include "shard_replicator/shard_store_writer.h"

namespace shardcache {

class CcrController {
 public:
  struct Options {
    std::string shard;
    // The term's epoch: fences the writes to the shard store too.
    int64_t epoch = 0;
    int workers = 4;
    absl::Duration resync_period = absl::ZeroDuration();
    const Clock* clock = RealClock::Get();
    // Not owned; all must outlive the controller.
    // The CCRs' finalizer and status writes.
    ShardStoreWriter* shard_writer = nullptr;
    DynamicInformerFactory* shard_informers = nullptr;
    DynamicInformerFactory* cache_informers = nullptr;
    CacheWriterInterface* writer = nullptr;
    ReplicatorMetrics* metrics = nullptr;
    // CCRs in the shard store (every cluster), and their copies in the cache (this shard).
    std::shared_ptr<SharedInformer> ccrs;
    std::shared_ptr<SharedInformer> cache_ccrs;
    std::shared_ptr<prometheus::Registry> registry;
    // The shard store rejected a write as fenced (IsFenced, common/error_info.h).
    std::function<void(const absl::Status&)> on_fenced;
  };

  static absl::StatusOr<std::unique_ptr<CcrController>> Start(Options options);
  ~CcrController();
  CcrController(const CcrController&) = delete;
  CcrController& operator=(const CcrController&) = delete;

  // Stops writing to the shard store (waiting for a write in flight), removes the handlers, shuts
  // the queue down, joins the workers and stops every replication controller. Idempotent.
  void Stop();

 private:
  // What a reconcile concluded about retrying its key.
  enum class Next { kDone, kRetry, kSoon };

  explicit CcrController(Options options);
  void Enqueue(const v1::ObjectMeta& ccr);
  // Enqueues the CCRs in `cluster` (all of them: validity depends on each other).
  void EnqueueCluster(const std::string& cluster);
  // Enqueues the CCRs whose spec names `resource`; `reset` forgets their backoff.
  void EnqueueNaming(const v1::GroupVersionResource& resource, bool reset);
  void Worker();
  // One reconcile of a CCR (see the file comment), in steps:
  Next Reconcile(const std::string& key);
  // The CCR is gone: its controller stops, its copy is removed.
  Next ReconcileGone(const std::string& cluster, const std::string& name);
  // Validity: sets ResourceValid; returns the earlier CCR for the same resource, if any.
  ObjectRef Validate(const v1::Object& ccr, const absl::StatusOr<CcrSpec>& spec,
                     const CcrInvalid& invalid, CcrState* state) const;
  // The finalizer, added to a CCR that is not being deleted.
  Next AddFinalizer(const v1::Object& ccr);
  // Replication: retires a controller that no longer fits, then sets ReplicationStarted (and
  // Synced once replicating) from whether the resource is served and the controller runs.
  Next ReconcileReplication(const std::string& key, const v1::Object& ccr,
                            const absl::StatusOr<CcrSpec>& spec, const ObjectRef& duplicate_of,
                            CcrState* state);
  // Stops and removes the key's controller when its spec changed, the CCR became invalid, or
  // it stopped by itself; purges the copies that the CCR no longer names. Returns why the
  // controller had stopped by itself (OK otherwise).
  absl::Status RetireController(const std::string& key, const std::string& cluster,
                                const absl::StatusOr<CcrSpec>& spec, const CcrState& state,
                                const ObjectRef& duplicate_of);
  // Served: no controller, copies purged, ReplicationStarted=False (ResourceNotServed), retried.
  Next ReconcileUnserved(const CcrSpec& spec, const std::string& cluster, CcrState* state);
  // Served: the controller runs; ReplicationStarted once it has synced.
  Next ReconcileServed(const std::string& key, const v1::Object& ccr, const CcrSpec& spec,
                       const absl::Status& old_stop_reason, CcrState* state);
  // The key's running controller, started if there is none.
  absl::StatusOr<ReplicationController*> EnsureController(const std::string& key,
                                                          const v1::Object& ccr,
                                                          const CcrSpec& spec);
  // Synced when nothing is replicated: WaitingForSync or NotReplicating.
  static void SetNotSynced(CcrState* state);
  // The status write (when it differs) and the CCR's copy; returns the CCR as now stored.
  absl::StatusOr<v1::Object> Publish(const v1::Object& ccr, const CcrState& state);
  // Deletion: Deleting, copies purged, Deleted, finalizer removed.
  Next ReconcileDeleting(const v1::Object& ccr, const absl::StatusOr<CcrSpec>& spec, bool owner,
                         CcrState* state);
  Next RemoveFinalizer(const v1::Object& ccr);
  // The earliest other CCR of `ccr`'s cluster for the same group and resource, or null.
  ObjectRef EarlierDuplicate(const v1::Object& ccr, const CcrSpec& spec) const;
  // The cache informer of `resource`'s copies in `cluster` from this shard.
  absl::StatusOr<std::shared_ptr<SharedInformer>> CacheInformer(
      const v1::GroupVersionResource& resource, const std::string& cluster);
  // Deletes every copy of `resource` in `cluster` from this shard; returns how many are left
  // (-1: not known yet).
  int64_t Purge(const v1::GroupVersionResource& resource, const std::string& cluster);
  // The Synced condition of a running, synced replication with `pending` keys.
  void SetSynced(int64_t pending, CcrState* state) const;
  // Writes `ccr`'s status for `state` if it differs; returns the CCR as now stored.
  absl::StatusOr<v1::Object> WriteStatus(const v1::Object& ccr, const CcrState& state);
  // Makes the CCR's copy in the cache equal to `ccr` (null: absent).
  void SyncCopy(const std::string& cluster, const std::string& name, const v1::Object* ccr);
  // The key's replication controller, removed from the map; destroy it outside mu_.
  std::unique_ptr<ReplicationController> TakeController(const std::string& key);
  v1::Fence Fence() const;
  // Update (or UpdateStatus) at the shard store, unless Stop has begun (CANCELLED).
  absl::StatusOr<v1::Object> WriteShardStore(const v1::UpdateRequest& request, bool status)
      ABSL_LOCKS_EXCLUDED(write_gate_);
  // A write to the shard store failed: tell on_fenced when it was fenced.
  void CheckFenced(const absl::Status& status);

  // Constant after construction.
  const Options options_;
  std::unique_ptr<WorkQueue> queue_;  // set by Start, then constant; thread-safe

  std::unique_ptr<SharedInformer::Registration> ccrs_registration_;
  std::unique_ptr<SharedInformer::Registration> cache_ccrs_registration_;
  Subscription resources_subscription_;
  Subscription cache_store_subscription_;
  std::vector<std::thread> workers_;

  // Held shared by each write to the shard store; Stop closes it, so that no write is sent once
  // Stop has begun.
  absl::Mutex write_gate_;
  bool writes_open_ ABSL_GUARDED_BY(write_gate_) = true;

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<ReplicationController>> controllers_ ABSL_GUARDED_BY(mu_);
  // CCRs whose copy waits for the cache to be reachable again (one WhenAvailable each).
  std::set<std::string> copies_waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_SHARD_REPLICATOR_CCR_CONTROLLER_H_
