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
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache_server/group_committer.h"
#include "cache_server/object_filter.h"
#include "cache_server/resource_registry.h"
#include "cache_server/storage.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watch_cache.h"
#include "common/clock.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class ObjectStore : public EventHistory, private GroupCommitter::Owner {
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

  // Reads, at the durable revision. Errors as the Store service documents.
  absl::StatusOr<ObjectRef> Get(const v1::GetRequest& request) const;
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

  // Provides its own synchronization; its lock is taken after mu_, never before.
  GroupCommitter committer_;
};

// The response header (gRPC initial metadata) that carries store_id() on Watch and Get.
inline constexpr char kStoreIdMetadataKey[] = "shardcache-store-id";

// The annotation that marks the bookmark at the end of a watch's initial events.
inline constexpr char kInitialEventsEndAnnotation[] = "k8s.io/initial-events-end";

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_OBJECT_STORE_H_
