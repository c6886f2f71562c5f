// ReplicationController: keeps the cache equal to one ClusterCachedResource's projection of the
// shard: every local object of the CCR's resource in the CCR's cluster that matches its selector
// has an equal copy in the cache (see ProjectCopy), and no other copy of that resource and
// cluster from this shard exists there.
//
// It lives inside one leadership term, for one CCR spec. It takes two running informers from
// the process's DynamicInformerFactories (which outlive it): `local` (the resource in the CCR's
// cluster, in the shard store) and `cache` (the copies: same resource, this shard and cluster,
// in the cache). It holds both (they are the factories' handles) until it is destroyed, so that
// neither is released while it runs. Start adds its event handlers to both; every change on
// either side enqueues the object's key, and a worker reconciles the key from the two caches:
//   local matches, copy missing or different -> upsert the copy (restores a copy that someone
//                                                else changed or deleted)
//   no matching local object, copy present    -> delete the copy (local deletes, selector
//                                                changes, copies that nothing backs)
// A new term (or a new controller) starts with the informers' full lists as adds: a full resync.
// No key is reconciled before both informers have listed (client-go's WaitForCacheSync): the
// keys that come earlier wait, so that an object not yet listed is never taken for deleted.
//
// It stops by itself when one of its informers stops (e.g. the resource's definition was
// deleted): the queue is shut down at once (no write is sent after that), and `on_stopped` tells
// the owner, who destroys it and creates a new one when that becomes possible. Stop() (or the
// destructor) removes the handlers, shuts the queue down and waits for the reconciles in
// progress. The reconciles run on a WorkerPool, normally the replicator's, which all the
// controllers share: a controller has no thread of its own.
//
// Writes go through the term's CacheWriter, without waiting for their answers (pipelined); a key
// with a write in flight is reconciled again after its answer if it changed meanwhile. A write
// that fails is never dropped while the term lasts (the term's end is the writer's Stopped(),
// whatever the status code): one that failed because the cache cannot be reached (UNAVAILABLE)
// is parked and requeued, its backoff forgotten, as soon as the writer can write again
// (CacheWriter::WhenAvailable), so that the backlog flows at once when the cache comes back;
// any other failure is retried with the queue's per-key backoff.
//
// The acknowledged writes that the cache informer has not shown yet are trusted only while the
// informer lists the same store: when it lists another one (the cache was replaced behind its
// address), every key is reconciled again against it, and an answer to a write sent before is
// not taken for a copy held by the new store.
//
// Pending() counts the keys whose copy is not known to be equal to the projection (changed on
// either side and not yet found up to date, written and not yet acknowledged, or parked): zero
// means the cache holds the whole projection, as far as the controller knows. on_change is also
// called when a write is parked and when the last pending key is acknowledged.
//
// Threads: Start, Stop and the destructor from the owner's thread (not from on_stopped or
// on_change); the accessors from any thread. on_stopped and on_change run on informer threads and
// must not block.
#ifndef SHARDCACHE_SHARD_REPLICATOR_REPLICATION_CONTROLLER_H_
#define SHARDCACHE_SHARD_REPLICATOR_REPLICATION_CONTROLLER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/client/shared_informer.h"
#include "common/client/work_queue.h"
#include "common/client/worker_pool.h"
#include "common/clock.h"
#include "shard_replicator/cache_writer.h"
#include "shard_replicator/cluster_cached_resource.h"
#include "shard_replicator/replicator_metrics.h"

namespace shardcache {

class ReplicationController {
 public:
  struct Options {
    // This shard (the copies' metadata.shard).
    std::string shard;
    // The CCR's logical cluster and name (for logs and metrics).
    std::string cluster;
    std::string ccr_name;
    CcrSpec spec;
    // How many of its keys are reconciled at once (>= 1).
    int workers = 4;
    // The threads that reconcile them: the replicator's pool, shared by every controller (its
    // clock must be `clock`). Null: a pool of `workers` threads of the controller's own.
    WorkerPool* pool = nullptr;
    // Every object is reconciled again this often (0: never).
    absl::Duration resync_period = absl::ZeroDuration();
    const Clock* clock = RealClock::Get();
    // Not owned; must outlive the controller.
    CacheWriterInterface* writer = nullptr;
    ReplicatorMetrics* metrics = nullptr;
    // For the queue's metrics (name "replication"); may be null.
    std::shared_ptr<prometheus::Registry> registry;
    // An informer stopped, so the controller did (with the informer's reason).
    std::function<void(const absl::Status&)> on_stopped;
    // Something that the CCR's status counts changed.
    std::function<void()> on_change;
  };

  // Adds the handlers and starts the workers. FAILED_PRECONDITION when an informer has stopped
  // already (the caller tries again later with new informers).
  static absl::StatusOr<std::unique_ptr<ReplicationController>> Start(
      Options options, std::shared_ptr<SharedInformer> local,
      std::shared_ptr<SharedInformer> cache);

  ~ReplicationController();
  ReplicationController(const ReplicationController&) = delete;
  ReplicationController& operator=(const ReplicationController&) = delete;

  // Removes the handlers, shuts the queue down and waits for the reconciles in progress; none
  // starts after it returns. Idempotent.
  void Stop();

  // True once both handlers have received their informer's initial list.
  bool HasSynced() const;
  // True once an informer stopped (or Stop was called); StopReason says why.
  bool Stopped() const;
  absl::Status StopReason() const;

  // Local objects that match the selector, and copies in the cache: from the informers' caches.
  int64_t LocalCount() const;
  int64_t CacheCount() const;
  // Keys not known to be in sync with the cache (see the file comment).
  int64_t Pending() const;

  const CcrSpec& spec() const { return options_.spec; }

 private:
  struct Shared;  // what write answers need, kept alive by them

  ReplicationController(Options options, std::shared_ptr<SharedInformer> local,
                        std::shared_ptr<SharedInformer> cache);
  std::shared_ptr<ResourceEventHandler> Handler(bool local_side);
  void InformerStopped(const absl::Status& reason);
  // The cache informer listed another store (the cache was replaced behind its address, e.g.
  // restarted without its data): nothing learnt from the previous one holds, so every key is
  // pending and reconciled again, and answers to writes sent before are not trusted.
  void CacheStoreChanged(const std::string& store_id);
  // One key handed out by the queue (on a pool thread).
  void Process(const std::string& key);
  // Reconciles one object ("namespace\0name"); false to retry it with backoff.
  bool Reconcile(const std::string& key);
  // The key's copy equals the projection: it is no longer pending.
  void UpToDate(const std::string& key);
  bool Matches(const v1::Object& object) const;

  // Constant after construction.
  const Options options_;
  const std::shared_ptr<SharedInformer> local_;
  const std::shared_ptr<SharedInformer> cache_;
  std::shared_ptr<Shared> shared_;

  // Set by Start, then constant until Stop.
  std::unique_ptr<SharedInformer::Registration> local_registration_;
  std::unique_ptr<SharedInformer::Registration> cache_registration_;
  Subscription local_stopped_;
  Subscription cache_stopped_;
  Subscription cache_store_changed_;
  std::unique_ptr<WorkerPool> own_pool_;  // when Options::pool is null
  bool processing_ = false;               // the queue's keys are being handed out

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stop_reason_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
};

}  // namespace shardcache

#endif  // SHARDCACHE_SHARD_REPLICATOR_REPLICATION_CONTROLLER_H_
