// ObjectStore: the multi-version object store behind the Store service. It serves every read and
// watch from memory and makes each write durable through a Storage before acknowledging it.
//
// What it guarantees:
// - One revision counter, starting at 1 and raised by every successful write; an object's
//   resourceVersion is the revision of its last change.
// - Kubernetes semantics for writes: uid, generation (raised on spec changes), timestamps,
//   finalizers that hold a deleted object (deletionTimestamp set), optimistic concurrency on
//   resourceVersion (and uid), status as a subresource where the resource says so, fencing
//   by per-shard epoch. A write that fails changes nothing.
// - Fencing epochs: the highest epoch seen per shard, raised by fenced writes and by ClaimEpoch,
//   durable before any answer that depends on it (GroupCommitter::CompleteWhenDurable).
// - Every version of every object since the oldest event of the history window is kept
//   (multi-version, as etcd does), so that a paginated List stays a consistent snapshot at its
//   first page's revision, and a Watch can start from any revision inside the window. Older
//   versions are compacted away as events leave the window (by count and by age).
// - Durability with group commit (group_committer.h): a write is applied in memory under the
//   store's lock (so later writes see it), then its completion waits for the committer, which
//   writes everything that arrived since it last took a batch as one Storage batch, and syncs it.
//   Only once it is synced is the write acknowledged, its event published to the WatchCache (in
//   revision order), and its revision made visible to readers: Get, List and Watch read at the
//   durable revision, so nobody sees a change that a crash could take back. A failed Storage write
//   or sync stops the process (memory is ahead of disk). While the storage has no room
//   (Storage::CheckSpace), creates and updates are refused with RESOURCE_EXHAUSTED (reason
//   NO_SPACE) before they change anything.
// - A watcher is registered under the store's lock with its starting snapshot at the durable
//   revision, so that no event falls between the two.
// - Identity: a store has an id (store_id()), made when its data was created and kept across
//   restarts, which List answers carry, so that a client can tell a different store (a wiped data
//   directory) behind the same address from the one it knew.
// - Shard role: deleting a ResourceDefinition deletes every object of its resource (one DELETED
//   event each) and then ends the resource's watches with NOT_FOUND.
//
// Storage on etcd (Options::etcd, --storage=etcd): several stores, each a replica, share one
// etcd cluster (docs/design.md, "Replicas on etcd"). Then etcd is the source of truth and its
// revision is the store's: a write is decided against the replica's state as above, then
// proposed as one etcd transaction that compares what it was decided on (etcd_layout.h); when
// the compare fails (another replica changed the key or the shard's epoch first) the replica
// catches up with the answer's revision and decides again (the write may then fail, e.g. with a
// conflict). A write is answered once it is committed in etcd and the replica's own watch has
// applied it, so the writer reads its write and can watch from its revision on that replica.
// The replica's state, history window and watchers are fed by one etcd watch of the prefix (the
// GroupCommitter publishes, as it does for a RocksDB store, with nothing to write); its history
// window begins when it starts. Get and a List without a continue token are consistent reads
// (Kubernetes' KEP-2340): they learn etcd's current revision and wait, up to
// Options::consistent_read_timeout, until the watch has passed it (writing the progress key when
// no change is coming), else fail with UNAVAILABLE rather than answer stale data. Writes to one key
// through one replica are decided and proposed one at a time, in the order they arrive. etcd's
// history is compacted to the revision it had Options::etcd_history_retention ago (checked every
// Options::etcd_compaction_interval), as kube-apiserver compacts, so that another replica's watch
// that reconnects, or a replica that loads, finds the revisions it needs.
//
// Requests are validated by the rules of object_validation.h; a paginated List continues from
// the token of its previous page (list_token.h).
//
// Thread-safety: every method is thread-safe. Writes are serialized by one lock; reads share it.
// Completion callbacks run on the committer thread, or inline in the caller when the result does
// not wait for a sync (errors, and results that are already durable); they must not block.
#ifndef SHARDCACHE_CACHE_SERVER_OBJECT_STORE_H_
#define SHARDCACHE_CACHE_SERVER_OBJECT_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache_server/etcd_client.h"
#include "cache_server/etcd_layout.h"
#include "cache_server/etcd_progress_writer.h"
#include "cache_server/group_committer.h"
#include "cache_server/object_filter.h"
#include "cache_server/resource_registry.h"
#include "cache_server/storage.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watch_cache.h"
#include "common/clock.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class ObjectStore : public EventHistory,
                    private GroupCommitter::Owner,
                    private EtcdClient::WatchHandler {
 public:
  struct Options {
    // Which resources are served (see ResourceRegistry).
    Role role = Role::kCache;
    // Objects larger than this (serialized) are refused with RESOURCE_EXHAUSTED.
    int64_t max_object_bytes = 1536 * 1024;
    // How many events the history window keeps; a watch or a continued list from a revision
    // older than the window fails with OUT_OF_RANGE.
    int64_t history_events = 10000;
    // Events older than this leave the window too (zero: no age limit).
    absl::Duration history_age = absl::ZeroDuration();
    // Source of timestamps and of the history's age. Not owned; must outlive the store.
    Clock* clock = RealClock::Get();
    // Where writes are made durable; null keeps everything in memory only. Not owned.
    Storage* storage = nullptr;
    // Storage on etcd instead (see above); `state` is then LoadEtcdState's. Not owned.
    EtcdClient* etcd = nullptr;
    std::string etcd_prefix;
    absl::Duration consistent_read_timeout = absl::Seconds(3);
    absl::Duration etcd_compaction_interval = absl::Minutes(1);
    absl::Duration etcd_history_retention = absl::Minutes(5);
  };

  struct DeleteResult {
    ObjectRef object;
    bool deleted = false;
  };

  using ObjectCallback = std::function<void(absl::StatusOr<ObjectRef>)>;
  using DeleteCallback = std::function<void(absl::StatusOr<DeleteResult>)>;
  using EpochCallback = std::function<void(absl::StatusOr<int64_t>)>;

  // `watch_cache` and `metrics` are not owned and must outlive the store. `state` is what the
  // storage loaded (a new store's default state when there is no storage).
  ObjectStore(Options options, WatchCache* watch_cache, StoreMetrics* metrics,
              PersistedState state = PersistedState());
  // Makes every pending write durable, completes it, and stops the committer.
  ~ObjectStore() override;
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // Reads, at the durable revision. Errors as the Store service documents. On etcd, Get (with
  // `consistent`) and a List without a continue token first wait for the replica to catch up
  // with etcd (see above), which may take a round trip to etcd and must not hold a thread that
  // the etcd client's callbacks need (gRPC's callback threads); Get without `consistent` reads
  // what the replica has (the authorizer's lease check: the write's fence is what protects).
  absl::StatusOr<ObjectRef> Get(const v1::GetRequest& request, bool consistent = true) const;
  // A List's answer with its objects shared, not copied (the Store service encodes them as they
  // are); List copies them into a ListResponse.
  struct ListPage {
    std::vector<ObjectRef> items;
    // The ListResponse's other fields (no items).
    v1::ListResponse header;
  };
  absl::StatusOr<ListPage> ListObjects(const v1::ListRequest& request) const;
  absl::StatusOr<v1::ListResponse> List(const v1::ListRequest& request) const;

  // Writes. `done` receives the object as stored (or an error as the Store service documents)
  // once the write is durable; it is called exactly once.
  void CreateAsync(const v1::CreateRequest& request, ObjectCallback done);
  void UpdateAsync(const v1::UpdateRequest& request, ObjectCallback done);
  void UpdateStatusAsync(const v1::UpdateRequest& request, ObjectCallback done);
  void UpsertAsync(const v1::UpdateRequest& request, ObjectCallback done);
  void DeleteAsync(const v1::DeleteRequest& request, DeleteCallback done);

  // Claims request.fence's epoch for its shard without writing an object (the ClaimEpoch RPC):
  // records it when it is at least the shard's highest epoch, and gives `done` that epoch once
  // it is durable (a claim with nothing else to write is committed as a batch of epochs alone).
  // Errors as the Store service documents: INVALID_ARGUMENT for a missing or invalid fence.shard
  // or fence.epoch, FAILED_PRECONDITION when a higher epoch is recorded. Raises no revision.
  // `done` is called exactly once.
  void ClaimEpochAsync(const v1::ClaimEpochRequest& request, EpochCallback done);

  // The same writes, blocking until durable (for tests and tools; never on a gRPC thread).
  absl::StatusOr<ObjectRef> Create(const v1::CreateRequest& request);
  absl::StatusOr<ObjectRef> Update(const v1::UpdateRequest& request);
  absl::StatusOr<ObjectRef> UpdateStatus(const v1::UpdateRequest& request);
  absl::StatusOr<ObjectRef> Upsert(const v1::UpdateRequest& request);
  absl::StatusOr<DeleteResult> Delete(const v1::DeleteRequest& request);
  absl::StatusOr<int64_t> ClaimEpoch(const v1::ClaimEpochRequest& request);

  // Validates a watch request and, if it is valid, gives `watcher` its spec and initial events
  // (Watcher::Init) and registers it with the WatchCache, all under the store's lock.
  absl::Status StartWatch(const v1::WatchRequest& request, Watcher* watcher);

  // EventHistory: the events of the history window, for the watch fan-out to catch up a watcher
  // that fell behind. The ObjectStore attaches itself to the WatchCache for that.
  absl::Status ReadHistory(const std::string& group_resource, int64_t after, int64_t up_to,
                           size_t max_events, std::vector<EventPtr>* out) const override
      ABSL_LOCKS_EXCLUDED(mu_);

  // The durable revision: every write up to it is acknowledged or about to be.
  int64_t revision() const;

  // On etcd: whether this replica is in step with etcd's quorum: OK, or UNAVAILABLE when etcd's
  // current revision cannot be read or the replica has not reached it within
  // Options::consistent_read_timeout. OK at once for other storages.
  absl::Status CheckCaughtUp() const ABSL_LOCKS_EXCLUDED(mu_);

  // A resource with live objects at the durable revision, as discovery describes it (the
  // Kubernetes view, kube_api_server.h): its "group/resource" (common/resources.h GroupResource)
  // and whether its first live object has a namespace.
  struct ResourceSummary {
    std::string group_resource;
    bool namespaced = false;
  };
  // Every resource with live objects, ordered by group_resource.
  std::vector<ResourceSummary> Resources() const ABSL_LOCKS_EXCLUDED(mu_);

  // The store's identity (PersistedState::store_id, or one made for this process when the store
  // has no storage). Every List answer carries it, and the Store service sets it on every watch
  // event. Constant.
  const std::string& store_id() const { return store_id_; }

 private:
  enum class UpdateKind { kUpdate, kStatus, kUpsert };

  // On etcd: one write on its way (object_store_etcd.cc). `decide` runs under the store's lock
  // and decides the write against the replica's state (filling proposal_), keeping its result;
  // `answer` gives the result to the caller: the error, or success once the write is committed
  // at `revision` (0: it changed nothing) and applied.
  struct EtcdOp {
    std::string queue_key;
    std::function<absl::Status()> decide;
    std::function<void(absl::Status status, int64_t revision)> answer;
    int attempts = 0;
  };
  using EtcdOpPtr = std::shared_ptr<EtcdOp>;
  bool on_etcd() const { return options_.etcd != nullptr; }
  // Queues `op` behind the writes to its key, and runs it when it is first.
  void StartEtcdOp(EtcdOpPtr op) ABSL_LOCKS_EXCLUDED(mu_, etcd_mu_);
  // Decides and proposes `op`; returns false, having answered nothing, when it was decided as
  // an error (`*error`), so that the caller answers it and starts the next one without
  // recursing.
  bool RunEtcdOp(const EtcdOpPtr& op, absl::Status* error) ABSL_LOCKS_EXCLUDED(mu_, etcd_mu_);
  // Answers `op` and runs the next write of its key.
  void FinishEtcdOp(EtcdOpPtr op, absl::Status status, int64_t revision)
      ABSL_LOCKS_EXCLUDED(mu_, etcd_mu_);
  // The answer to `op`'s transaction (`object_changed`: whether it puts or deletes an object),
  // sent at `sent`.
  void OnTxnAnswer(const EtcdOpPtr& op, bool object_changed, absl::Time sent,
                   absl::StatusOr<etcdserverpb::TxnResponse> answer)
      ABSL_LOCKS_EXCLUDED(mu_, etcd_mu_);
  // EtcdClient::WatchHandler: the replica's watch of the prefix.
  void OnEvents(const std::vector<mvccpb::Event>& events, int64_t revision) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnEnd(absl::Status status) override;
  // Applies `events` and gives the WhenSeen callbacks that they release. The DELETED events of a
  // ResourceDefinition's objects that its deletion purged in the same transaction are not
  // published (its watchers end with NOT_FOUND after it, as they would after those events):
  // the fan-out keeps one event per revision.
  void ApplyEtcdEvents(const std::vector<mvccpb::Event>& events,
                       std::vector<std::function<void()>>* ready) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `then` once the watch has brought every change up to etcd revision `revision` (at once
  // when it has; else from the thread that applies the watch's events). The revision may be
  // another prefix's, or an epoch's, which this store's revision does not follow: the progress
  // key is written, whose event comes after it; when that write fails, `fail` runs instead
  // (UNAVAILABLE), as it does when the store is destroyed first.
  void WhenSeen(int64_t revision, std::function<void()> then,
                std::function<void(absl::Status)> fail) ABSL_LOCKS_EXCLUDED(mu_, etcd_mu_);
  // Writes the progress key (etcd_layout.h), asynchronously (EtcdProgressWriter).
  void WriteProgressKey() const;
  // Get and List: waits until this replica has applied etcd's current revision.
  absl::Status AwaitConsistentRead() const ABSL_LOCKS_EXCLUDED(mu_);
  // Compacts etcd's history to the revision seen etcd_history_retention ago, at most every
  // etcd_compaction_interval and one compaction at a time, without waiting for etcd's answer.
  // Called on the committer thread.
  void MaybeCompactEtcd() ABSL_LOCKS_EXCLUDED(mu_, etcd_mu_);
  // On etcd, a write that changes nothing still checks that the object is still at `cur`.
  void NoteUnchangedLocked(const std::string& group_resource, const ObjectRef& cur)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a change at `revision` (the next one for a RocksDB store; etcd's for a replica):
  // versions, history, the committer's queue, and a ResourceDefinition's effect on the
  // registry.
  void ApplyLocked(int64_t revision, const std::string& group_resource, v1::WatchEvent::Type type,
                   ObjectRef object, ObjectRef prev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The write bodies, shared by both storages.
  absl::StatusOr<ObjectRef> CreateOpLocked(const v1::CreateRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> ClaimEpochLocked(const v1::ClaimEpochRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On etcd: starts `op` for a write whose result is an object (create, update, upsert).
  void EtcdObjectWrite(std::string queue_key, std::function<absl::StatusOr<ObjectRef>()> decide,
                       ObjectCallback done);

  // Storage::CheckSpace: whether creates and updates are accepted (deletes and epoch claims
  // always are, so that space can be freed and a shard's leader can still fence).
  absl::Status CheckSpace() const ABSL_LOCKS_EXCLUDED(space_mu_);

  struct Version {
    int64_t revision;
    ObjectRef object;  // null: deleted at this revision
  };
  struct ResourceData {
    std::map<std::string, std::vector<Version>> keys;
  };

  absl::StatusOr<ObjectRef> UpdateLocked(const v1::UpdateRequest& request, UpdateKind kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<DeleteResult> DeleteLocked(const v1::DeleteRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateAsyncImpl(const v1::UpdateRequest& request, UpdateKind kind, ObjectCallback done);
  void RecoverLocked(PersistedState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GroupCommitter::Owner, on the committer thread: readers read at `revision` from now on, and
  // events that left the window by count or age are compacted away.
  void OnDurable(int64_t revision) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnIdle() override ABSL_LOCKS_EXCLUDED(mu_);
  // The store's lock: every operation adds its changes to the committer under it.
  absl::Mutex* OperationLock() override ABSL_LOCK_RETURNED(mu_) { return &mu_; }
  // Creates `object`; `keep_status` keeps a status even where status is a subresource (upsert).
  absl::StatusOr<ObjectRef> CreateLocked(const ResourceInfo& info,
                                         const v1::GroupVersionResource& gvr, v1::Object object,
                                         const v1::Fence& fence, bool keep_status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a write's fence and records a higher epoch. Called last, just before a write
  // commits, so that a write that fails for any other reason claims nothing. An empty fence
  // passes. `what` names the request in the FAILED_PRECONDITION message ("write", "claim").
  absl::Status CheckFenceLocked(const v1::Fence& fence, const char* what = "write")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live object at `key` including writes not yet durable, or null.
  ObjectRef CurrentLocked(const std::string& group_resource, const std::string& key) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The object at `key` as of the durable revision, or null.
  ObjectRef DurableLocked(const std::string& group_resource, const std::string& key) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Records a change at revision revision_+1 and queues its event for the committer. `object`
  // must carry that revision as its resourceVersion; for DELETED it is the object's last state.
  void CommitLocked(const std::string& group_resource, v1::WatchEvent::Type type, ObjectRef object,
                    ObjectRef prev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shard role: keeps the registry in step with a ResourceDefinition change.
  void OnDefinitionChangedLocked(const ObjectRef& before, const ObjectRef& after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PurgeResourceLocked(const std::string& group_resource) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const Options options_;
  WatchCache* const watch_cache_;
  // Orders the space checks and the metric they set.
  mutable absl::Mutex space_mu_;
  StoreMetrics* const metrics_;
  const std::string store_id_;

  mutable absl::Mutex mu_;
  // The last revision given to a write.
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1;
  // The last revision made durable (raised by the committer, under mu_); readers read at it.
  int64_t durable_revision_ ABSL_GUARDED_BY(mu_) = 1;
  // Events with a revision at or below this have left the history window.
  int64_t compacted_revision_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t live_objects_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<EventPtr> history_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ResourceData> resources_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> epochs_ ABSL_GUARDED_BY(mu_);
  ResourceRegistry registry_ ABSL_GUARDED_BY(mu_);

  // Shard role: the key (ObjectKey) of the ResourceDefinition of each defined resource, by
  // group/resource, so that a write on etcd can compare that its definition is still there.
  std::map<std::string, std::string> definition_keys_ ABSL_GUARDED_BY(mu_);
  // On etcd: the write being decided (CommitLocked and CheckFenceLocked fill it).
  EtcdWrite proposal_ ABSL_GUARDED_BY(mu_);
  // On etcd: the last etcd revision the watch has brought, of any key of the prefix (the store's
  // revision follows objects only, so that epochs and the progress key raise no resourceVersion,
  // as in the RocksDB mode), and what waits for it (WhenSeen).
  int64_t etcd_seen_revision_ ABSL_GUARDED_BY(mu_) = 0;
  struct SeenWaiter {
    std::function<void()> then;
    std::function<void(absl::Status)> fail;
  };
  std::multimap<int64_t, SeenWaiter> seen_waiters_ ABSL_GUARDED_BY(mu_);
  // Fails every WhenSeen waiter whose revision has not been seen.
  void FailSeenWaiters(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // On etcd: the writes of each key, the first one on its way; how many transactions are
  // unanswered; set once the store is being destroyed. A leaf lock.
  mutable absl::Mutex etcd_mu_;
  absl::flat_hash_map<std::string, std::deque<EtcdOpPtr>> etcd_queues_ ABSL_GUARDED_BY(etcd_mu_);
  int etcd_txns_ ABSL_GUARDED_BY(etcd_mu_) = 0;
  bool etcd_stopping_ ABSL_GUARDED_BY(etcd_mu_) = false;
  // To which revision etcd was last compacted, and whether a compaction is on its way.
  int64_t etcd_compacted_revision_ ABSL_GUARDED_BY(etcd_mu_) = 0;
  bool etcd_compacting_ ABSL_GUARDED_BY(etcd_mu_) = false;
  // When etcd's compaction was last considered (committer thread only).
  absl::Time etcd_compacted_at_ = absl::InfinitePast();
  // The revision seen at each check, oldest first, back to etcd_history_retention ago.
  std::deque<std::pair<absl::Time, int64_t>> etcd_seen_at_;

  // Provides its own synchronization; its lock is taken after mu_, never before.
  GroupCommitter committer_;
  // On etcd: writes the progress key for WhenSeen and consistent reads (made before the watch,
  // stopped after it).
  std::unique_ptr<EtcdProgressWriter> progress_writer_;
  // On etcd: the replica's watch of the prefix (started last, stopped first).
  std::unique_ptr<EtcdWatch> etcd_watch_;
};

// The response header (gRPC initial metadata) that carries store_id() on Watch and Get.
inline constexpr char kStoreIdMetadataKey[] = "shardcache-store-id";

// The annotation that marks the bookmark at the end of a watch's initial events.
inline constexpr char kInitialEventsEndAnnotation[] = "k8s.io/initial-events-end";

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_OBJECT_STORE_H_
