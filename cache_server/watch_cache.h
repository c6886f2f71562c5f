// WatchCache: fans the store's events out to its watchers, in revision order, off the write path.
//
// The ObjectStore's committer thread publishes each event once it is durable, in revision order;
// a single dispatcher thread delivers them to every watcher of the event's resource whose
// filters the object matches before or after the change. An update that makes an object stop
// matching is delivered as DELETED, one that makes it start matching as ADDED (as Kubernetes'
// watch cache does). The dispatcher also sends periodic bookmarks, and ends the watchers of a
// resource that stops being served, after that resource's last events.
//
// A watcher is registered by the store under the store's lock together with its starting
// revision and its initial events, so that no event falls between the two: the dispatcher skips
// events at or below a watcher's starting revision.
//
// Thread-safety: all methods are thread-safe. Watcher callbacks (Deliver, Bookmark, End) are
// called from the dispatcher thread (End also from Shutdown's caller) and must never block.
#ifndef SHARDCACHE_CACHE_SERVER_WATCH_CACHE_H_
#define SHARDCACHE_CACHE_SERVER_WATCH_CACHE_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/object_filter.h"
#include "cache_server/store_metrics.h"

namespace shardcache {

// One committed change.
struct Event {
  int64_t revision = 0;
  v1::WatchEvent::Type type = v1::WatchEvent::TYPE_UNSPECIFIED;  // ADDED, MODIFIED or DELETED
  std::string group_resource;
  ObjectPtr object;  // the object after the change; for DELETED its last state
  ObjectPtr prev;    // the object before the change; null for ADDED
  absl::Time time;   // when it was committed (for the history window's age limit)
};
using EventPtr = std::shared_ptr<const Event>;

// What a watcher watches. Set once, before registration.
struct WatchSpec {
  std::string group_resource;
  std::string version;
  ObjectFilter filter;
  // The watcher has (in its initial events) everything up to and including this revision.
  int64_t start_revision = 0;
};

// One event as a watcher receives it: its type for that watcher, the object, and the WatchEvent
// message already serialized (once per event and type, shared by every watcher that gets it).
struct Delivery {
  v1::WatchEvent::Type type;
  ObjectPtr object;
  grpc::ByteBuffer encoded;
};

// Serializes a WatchEvent of `type` carrying `object`.
grpc::ByteBuffer EncodeWatchEvent(v1::WatchEvent::Type type, const v1::Object& object);

// The receiving end of a watch, implemented by the Watch RPC's reactor (and by tests).
class Watcher {
 public:
  virtual ~Watcher() = default;
  // The events the watcher must send before any live event: for a watch from a revision, the
  // history after it; for a watch from now, one ADDED per object and then the initial-events-end
  // BOOKMARK. Called once by the store, under its lock, before registration; must not block.
  virtual void Init(WatchSpec spec,
                    std::vector<std::pair<v1::WatchEvent::Type, ObjectPtr>> initial) = 0;
  virtual const WatchSpec& spec() const = 0;
  // An event for this watcher, with its type as the watcher sees it.
  virtual void Deliver(const Delivery& delivery) = 0;
  // Every event up to `revision` has been delivered.
  virtual void Bookmark(int64_t revision) = 0;
  // The watch is over with this status; nothing is delivered after it.
  virtual void End(const absl::Status& status) = 0;
};

// The type of `event` as a watcher with `filter` sees it (an update that crosses the filter
// becomes ADDED or DELETED), or TYPE_UNSPECIFIED when the watcher must not see it.
v1::WatchEvent::Type EffectiveType(const Event& event, const ObjectFilter& filter);
// The object a watcher receives for `event` seen as `type`: the object after the change, except
// for an update that made it stop matching, which is seen (as Kubernetes does) as the DELETED of
// its previous state at the event's revision.
ObjectPtr EffectiveObject(const Event& event, v1::WatchEvent::Type type);

class WatchCache {
 public:
  struct Options {
    // How often every watcher receives a bookmark.
    absl::Duration bookmark_interval = absl::Seconds(5);
  };

  WatchCache(Options options, StoreMetrics* metrics);
  // Stops the dispatcher. Watchers still registered are not ended: call Shutdown first.
  ~WatchCache();
  WatchCache(const WatchCache&) = delete;
  WatchCache& operator=(const WatchCache&) = delete;

  // Queues committed events for dispatch. REQUIRES: called in revision order, from one thread.
  // Blocks while kMaxQueuedEvents wait for the dispatcher: the publisher (the store's committer)
  // then slows the writers down instead of letting the backlog grow without bound.
  void Publish(std::vector<EventPtr> events);
  // After the events published so far, ends the watchers of `group_resource` (only those of
  // `version`, when it is not empty) that started before `revision`, with `status`.
  void PublishResourceGone(const std::string& group_resource, const std::string& version,
                           int64_t revision, absl::Status status);

  static constexpr size_t kMaxQueuedEvents = 100000;

  // Adds a watcher. REQUIRES: the caller holds the store's lock, so that no event with a revision
  // above watcher->spec().start_revision has been published yet. Fails with UNAVAILABLE once
  // Shutdown has begun.
  absl::Status Register(Watcher* watcher);
  // Removes a watcher; after it returns no callback will reach it. Safe to call twice.
  void Unregister(Watcher* watcher);

  // Ends every watcher with UNAVAILABLE ("server shutting down"), refuses new ones, and waits
  // up to `timeout` for all of them to unregister. Returns how many were still registered.
  size_t Shutdown(absl::Duration timeout);

  // The number of registered watchers.
  size_t watcher_count() const;

 private:
  struct Item {
    EventPtr event;             // set for an event
    std::string gone_resource;  // set for a resource-gone marker
    std::string gone_version;
    int64_t gone_revision = 0;
    absl::Status gone_status;
  };

  void Run();
  void Dispatch(const Item& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(watchers_mu_);
  void SendBookmarks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watchers_mu_);

  // Constant after construction.
  const Options options_;
  StoreMetrics* const metrics_;

  mutable absl::Mutex queue_mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;

  // Lock order: watchers_mu_ before any watcher's own lock.
  mutable absl::Mutex watchers_mu_;
  std::map<std::string, std::set<Watcher*>> watchers_ ABSL_GUARDED_BY(watchers_mu_);
  size_t watcher_count_ ABSL_GUARDED_BY(watchers_mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(watchers_mu_) = false;
  // The highest revision delivered to every watcher.
  int64_t dispatched_revision_ ABSL_GUARDED_BY(watchers_mu_) = 0;

  std::thread dispatcher_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_WATCH_CACHE_H_
