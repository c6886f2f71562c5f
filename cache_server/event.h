// Event: one committed change of the store, as the storage layer records it and the watch
// fan-out delivers it; WatchSpec: what one watcher watches; EventHistory: the store's window of
// recent events, read by the fan-out to catch up a watcher that fell behind.
//
// This header is the whole of what the storage layer (storage.h, rocksdb_storage.h) knows of
// watching: it includes no gRPC header.
//
// Thread-safety: an Event is immutable once published (shared read-only through EventPtr);
// WatchSpec is set once before a watcher is registered and read-only afterwards; the free
// functions may be called from any thread.
#ifndef SHARDCACHE_CACHE_SERVER_EVENT_H_
#define SHARDCACHE_CACHE_SERVER_EVENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache_server/object_filter.h"
#include "common/object_key.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

// One committed change.
struct Event {
  int64_t revision = 0;
  v1::WatchEvent::Type type = v1::WatchEvent::TYPE_UNSPECIFIED;  // ADDED, MODIFIED or DELETED
  std::string group_resource;
  ObjectRef object;  // the object after the change; for DELETED its last state
  ObjectRef prev;    // the object before the change; null for ADDED
  absl::Time time;   // when it was committed (for the history window's age limit)
};
using EventPtr = std::shared_ptr<const Event>;

// How a watch event carries its object: as the Object message (WatchEvent.object), or as the
// object's JSON (WatchEvent.object_json, for a watch with json_objects).
enum class ObjectEncoding { kProto = 0, kJson = 1 };
constexpr int kObjectEncodings = 2;

// What a watcher watches. Set once, before registration.
struct WatchSpec {
  std::string group_resource;
  std::string version;
  ObjectFilter filter;
  // The watcher has (in its initial events) everything up to and including this revision.
  int64_t start_revision = 0;
  // How its events carry their objects.
  ObjectEncoding encoding = ObjectEncoding::kProto;
  // Whether it asked for periodic bookmarks (WatchRequest.allow_bookmarks).
  bool periodic_bookmarks = false;
};

// The type of `event` as a watcher with `filter` sees it (an update that crosses the filter
// becomes ADDED or DELETED), or TYPE_UNSPECIFIED when the watcher must not see it.
v1::WatchEvent::Type EffectiveType(const Event& event, const ObjectFilter& filter);
// The object a watcher receives for `event` seen as `type`: the object after the change, except
// for an update that made it stop matching, which is seen (as Kubernetes does) as the DELETED of
// its previous state at the event's revision.
ObjectRef EffectiveObject(const Event& event, v1::WatchEvent::Type type);

// The store's history window, as the watch fan-out reads it (the ObjectStore implements it).
// Thread-safe; may take the store's lock, so it is never called under a lock of the fan-out's.
class EventHistory {
 public:
  virtual ~EventHistory() = default;
  // Appends to `out`, in revision order, the events of `group_resource` with a revision above
  // `after` and at most `up_to`, stopping once `max_events` have been appended. Fails with
  // OUT_OF_RANGE (appending nothing) when events above `after` have left the window.
  virtual absl::Status ReadHistory(const std::string& group_resource, int64_t after, int64_t up_to,
                                   size_t max_events, std::vector<EventPtr>* out) const = 0;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_EVENT_H_
