// ObjectStore: the in-memory, multi-version object store behind the Store service.
//
// What it guarantees:
// - One revision counter, starting at 1 and raised by every successful write; an object's
//   resourceVersion is the revision of its last change.
// - Kubernetes semantics for writes: uid, generation (raised on spec changes), timestamps,
//   finalizers that hold a deleted object (deletionTimestamp set), optimistic concurrency on
//   resourceVersion (and uid), status as a subresource where the resource says so, fencing
//   by per-shard epoch. A write that fails changes nothing.
// - Every version of every object since the oldest event of the history window is kept
//   (multi-version, as etcd does), so that a paginated List stays a consistent snapshot at its
//   first page's revision, and a Watch can start from any revision inside the window. Older
//   versions are compacted away as events leave the window (by count).
// - Each committed change is published to the WatchCache in revision order, under the same lock
//   that orders the writes; a watcher is registered under that lock with its starting snapshot.
// - Shard role: deleting a ResourceDefinition deletes every object of its resource (one DELETED
//   event each) and then ends the resource's watches with NOT_FOUND.
//
// Thread-safety: every method is thread-safe. Writes are serialized by one lock; reads share it.
#ifndef SHARDCACHE_CACHE_SERVER_OBJECT_STORE_H_
#define SHARDCACHE_CACHE_SERVER_OBJECT_STORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache_server/object_filter.h"
#include "cache_server/resource_registry.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watch_cache.h"
#include "common/clock.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class ObjectStore {
 public:
  struct Options {
    // Which resources are served (see ResourceRegistry).
    Role role = Role::kCache;
    // Objects larger than this (serialized) are refused with RESOURCE_EXHAUSTED.
    int64_t max_object_bytes = 1536 * 1024;
    // How many events the history window keeps; a watch or a continued list from a revision
    // older than the window fails with OUT_OF_RANGE.
    int64_t history_events = 10000;
    // Source of creation and deletion timestamps. Not owned; must outlive the store.
    Clock* clock = RealClock::Get();
  };

  struct DeleteResult {
    ObjectPtr object;
    bool deleted = false;
  };

  // `watch_cache` and `metrics` are not owned and must outlive the store.
  ObjectStore(Options options, WatchCache* watch_cache, StoreMetrics* metrics);
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // Each returns the object as stored, or an error as the Store service documents.
  absl::StatusOr<ObjectPtr> Get(const v1::GetRequest& request) const;
  absl::StatusOr<v1::ListResponse> List(const v1::ListRequest& request) const;
  absl::StatusOr<ObjectPtr> Create(const v1::CreateRequest& request);
  absl::StatusOr<ObjectPtr> Update(const v1::UpdateRequest& request);
  absl::StatusOr<ObjectPtr> UpdateStatus(const v1::UpdateRequest& request);
  absl::StatusOr<ObjectPtr> Upsert(const v1::UpdateRequest& request);
  absl::StatusOr<DeleteResult> Delete(const v1::DeleteRequest& request);

  // Validates a watch request and, if it is valid, gives `watcher` its spec and initial events
  // (Watcher::Init) and registers it with the WatchCache, all under the store's lock.
  absl::Status StartWatch(const v1::WatchRequest& request, Watcher* watcher);

  int64_t revision() const;

 private:
  enum class UpdateKind { kUpdate, kStatus, kUpsert };

  struct Version {
    int64_t revision;
    ObjectPtr object;  // null: deleted at this revision
  };
  struct ResourceData {
    std::map<std::string, std::vector<Version>> keys;
  };

  absl::StatusOr<ObjectPtr> UpdateImpl(const v1::UpdateRequest& request, UpdateKind kind);
  absl::StatusOr<ObjectPtr> CreateLocked(const ResourceInfo& info,
                                         const v1::GroupVersionResource& gvr, v1::Object object)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckFenceLocked(const v1::Fence& fence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live object at `key`, or null.
  ObjectPtr CurrentLocked(const std::string& group_resource, const std::string& key) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Records a change at revision revision_+1 and publishes its event. `object` must carry that
  // revision as its resourceVersion; for DELETED it is the object's last state.
  void CommitLocked(const std::string& group_resource, v1::WatchEvent::Type type, ObjectPtr object,
                    ObjectPtr prev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shard role: keeps the registry in step with a ResourceDefinition change.
  void OnDefinitionChangedLocked(const ObjectPtr& before, const ObjectPtr& after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PurgeResourceLocked(const std::string& group_resource) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const Options options_;
  WatchCache* const watch_cache_;
  StoreMetrics* const metrics_;

  mutable absl::Mutex mu_;
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1;
  // Events with a revision at or below this have left the history window.
  int64_t compacted_revision_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t live_objects_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<EventPtr> history_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ResourceData> resources_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> epochs_ ABSL_GUARDED_BY(mu_);
  ResourceRegistry registry_ ABSL_GUARDED_BY(mu_);
};

// The annotation that marks the bookmark at the end of a watch's initial events.
inline constexpr char kInitialEventsEndAnnotation[] = "k8s.io/initial-events-end";

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_OBJECT_STORE_H_
