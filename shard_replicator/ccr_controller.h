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
//   - the copy as the record: a CCR's copy in the cache names the resource whose copies this
//     shard may hold for it in its cluster, across terms. Before the copy stops naming a
//     resource (the spec now names another one or none, or the CCR is gone from the shard store),
//     the controller of that resource stops and the resource's copies of this shard in the
//     cluster are purged, unless another valid CCR of the cluster, not being deleted, names it
//     and its own copy does too; the reconcile goes no further (the copy is neither updated nor
//     removed) until the cache informer shows none left (while the cache cannot be reached, the
//     key waits for it). A replication controller starts only once the copy names its resource
//     (the cache informer shows it, or the cache acknowledged this term's write of it). So a
//     leader that stops at any point leaves a copy naming every resource it may have copied, and
//     the next term, whose copies' informer lists every CCR copy as an add (each key is
//     reconciled, whether or not its CCR still exists), purges what no CCR names any more;
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
// Threads: Start and Stop from the owner's thread; everything else runs on the WorkerPool
// (Options::pool: the replicator's, shared by this controller and every replication controller
// it starts) and on informer threads. Stop the term's CacheWriter before destroying the controller:
// write answers and WhenAvailable callbacks refer to it.
#ifndef SHARDCACHE_SHARD_REPLICATOR_CCR_CONTROLLER_H_
#define SHARDCACHE_SHARD_REPLICATOR_CCR_CONTROLLER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/client/dynamic_informer_factory.h"
#include "common/client/shared_informer.h"
#include "common/client/store_client.h"
#include "common/client/work_queue.h"
#include "common/client/worker_pool.h"
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
    // How many keys of each queue (this controller's, each replication controller's) are
    // reconciled at once (>= 1).
    int workers = 4;
    // The threads that reconcile them; its clock must be `clock`. Null: a pool of `workers`
    // threads of the controller's own.
    WorkerPool* pool = nullptr;
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
  // the queue down, waits for the reconciles in progress and stops every replication controller.
  // Idempotent.
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
  // One key handed out by the queue (on a pool thread): reconciled, and requeued as it says.
  void Process(const std::string& key);
  // One reconcile of a CCR (see the file comment), in steps:
  Next Reconcile(const std::string& key);
  // The CCR is gone: its controller stops, the resource its copy names is purged (see
  // PurgeFormerResource), then its copy is removed.
  Next ReconcileGone(const std::string& cluster, const std::string& name);
  // The record (see the file comment): when the CCR's copy names a resource that `current` (null:
  // the CCR is gone or its spec is invalid) does not, stops the key's controller unless it runs
  // for `current`, and purges that resource's copies unless another CCR backs them. nullopt once
  // nothing is left to purge: the copy may change; otherwise what to do with the key.
  std::optional<Next> PurgeFormerResource(const std::string& key, const std::string& cluster,
                                          const std::string& name, const CcrSpec* current);
  // The resource that the CCR's copy in the cache names as far as this term knows: the cache
  // informer's copy, or this term's acknowledged write of it when that is newer. nullopt: no
  // copy, or one whose spec names no valid resource.
  std::optional<v1::GroupVersionResource> NamedByCopy(const std::string& cluster,
                                                      const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // True when a CCR of `cluster` other than `name`, not being deleted, validly names `resource`
  // (it is the first for its group and resource) and its own copy names it too.
  bool BackedByAnother(const std::string& cluster, const std::string& name,
                       const v1::GroupVersionResource& resource) const;
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
  // (-1: not known yet). Holds the copies' informer until none is left (purging_).
  int64_t Purge(const v1::GroupVersionResource& resource, const std::string& cluster);
  // The Synced condition of a running, synced replication with `pending` keys.
  void SetSynced(int64_t pending, CcrState* state) const;
  // Writes `ccr`'s status for `state` if it differs; returns the CCR as now stored.
  absl::StatusOr<v1::Object> WriteStatus(const v1::Object& ccr, const CcrState& state);
  // Makes the CCR's copy in the cache equal to `ccr` (null: absent).
  void SyncCopy(const std::string& cluster, const std::string& name, const v1::Object* ccr);
  // The cache acknowledged a write of the CCR's copy, now at `resource_version`, naming `names`;
  // a reconcile that waits for the copy is enqueued.
  void CopyWritten(const std::string& key, int64_t resource_version,
                   std::optional<v1::GroupVersionResource> names) ABSL_LOCKS_EXCLUDED(mu_);
  // Enqueues `key` (its backoff forgotten) once the cache can be reached again; one wait per key.
  void RequeueWhenAvailable(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
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
  std::unique_ptr<WorkerPool> own_pool_;  // when Options::pool is null
  WorkerPool* pool_ = nullptr;            // Options::pool or own_pool_

  // Held shared by each write to the shard store; Stop closes it, so that no write is sent once
  // Stop has begun.
  absl::Mutex write_gate_;
  bool writes_open_ ABSL_GUARDED_BY(write_gate_) = true;

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<ReplicationController>> controllers_ ABSL_GUARDED_BY(mu_);
  // CCRs that wait for the cache to be reachable again (one WhenAvailable each).
  std::set<std::string> waiting_for_cache_ ABSL_GUARDED_BY(mu_);
  // This term's acknowledged writes of CCR copies, by CCR key (NamedByCopy trusts one while the
  // cache informer shows an older copy).
  struct WrittenCopy {
    int64_t resource_version = 0;
    std::optional<v1::GroupVersionResource> names;
  };
  std::map<std::string, WrittenCopy> copies_written_ ABSL_GUARDED_BY(mu_);
  // CCRs whose replication waits for their copy to name its resource.
  std::set<std::string> awaiting_copy_ ABSL_GUARDED_BY(mu_);
  // The copies' informers of the purges not seen complete yet, by "group/version/resource|cluster":
  // held so that the factory keeps them running between attempts (a CCR's own informers are
  // held by the replicator only while the CCR names them). Dropped when the purge is complete or
  // the term ends.
  std::map<std::string, std::shared_ptr<SharedInformer>> purging_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_SHARD_REPLICATOR_CCR_CONTROLLER_H_
