// Watcher: the receiving end of one watch, as the fan-out (fan_out.h) sees it; Delivery: one
// event as a watcher receives it; EventForms: the serialized forms of one event, made once and
// shared by every watcher (and every dispatcher) that delivers it.
//
// The Watch RPC's call object (watch_call.h) implements Watcher; the fan-out's tests implement it
// with fakes.
//
// Thread-safety: EventForms is thread-safe. A Watcher's methods are called by the fan-out of the
// dispatcher it is registered with, on that dispatcher's thread (End also from the thread of
// WatchCache::Shutdown), except Init, which the store calls once before registration. None of
// them may block.
#ifndef SHARDCACHE_CACHE_SERVER_WATCHER_H_
#define SHARDCACHE_CACHE_SERVER_WATCHER_H_

#include <grpcpp/support/slice.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache_server/event.h"
#include "cache_server/event_chunks.h"

namespace shardcache {

// One event as a watcher receives it: its type for that watcher, the object, and the WatchEvent
// message (type and object, no store_id) already serialized into shared EventChunks: the slices
// are reference-counted and shared by every watcher that gets it.
struct Delivery {
  v1::WatchEvent::Type type;
  ObjectRef object;
  grpc::Slice encoded;  // the WatchEvent: a message of its own
  grpc::Slice element;  // the same as one element of a batch (tag, length, WatchEvent)
};

// The forms of one event: serialized at most once per type in which watchers see it (usually
// once) and object encoding that they asked for, by whichever thread needs it first, into `chunks`
// (which must outlive it).
class EventForms {
 public:
  EventForms(EventPtr event, EventChunks* chunks) : event_(std::move(event)), chunks_(chunks) {}
  EventForms(const EventForms&) = delete;
  EventForms& operator=(const EventForms&) = delete;

  const EventPtr& event() const { return event_; }
  // The event as watchers that see it as `type` (ADDED, MODIFIED or DELETED) and want its
  // object in `encoding` receive it.
  const Delivery& Get(v1::WatchEvent::Type type, ObjectEncoding encoding = ObjectEncoding::kProto);

 private:
  const EventPtr event_;
  EventChunks* const chunks_;
  // std::call_once (pthread_once) rather than absl::call_once: a thread that waits for another's
  // call in absl's version waits inside Debian's abseil, where ThreadSanitizer cannot see the
  // edge.
  std::once_flag once_[kObjectEncodings][4];
  std::optional<Delivery> deliveries_[kObjectEncodings][4];
};
using EventFormsPtr = std::shared_ptr<EventForms>;

class Watcher {
 public:
  virtual ~Watcher() = default;
  // The events the watcher must send before any live event: for a watch from a revision, the
  // history after it; for a watch from now, one ADDED per object and then the initial-events-end
  // BOOKMARK. Called once by the store, under its lock, before registration; must not block.
  virtual void Init(WatchSpec spec,
                    std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial) = 0;
  virtual const WatchSpec& spec() const = 0;
  // An event for this watcher, with its type as the watcher sees it. Returns false, and keeps
  // nothing, when the watcher's queue is full (at or past its bound): the fan-out then parks it
  // and later delivers this event and the ones after it from the history. A watcher that is
  // ending takes (and drops) everything. The watcher may hold what it took until Flush, so that
  // the events of one run go out together.
  virtual bool Deliver(const Delivery& delivery) = 0;
  // Whether a parked watcher has drained enough of its queue to be caught up (its queue is at
  // most half full, or it is ending).
  virtual bool HasRoom() const = 0;
  // Called after the Deliver calls of one run of events (at least once after any Deliver).
  virtual void Flush() {}
  // Every event up to `revision` has been delivered.
  virtual void Bookmark(int64_t revision) = 0;
  // Called about every FanOut::kSweepInterval: a watcher whose client has stopped reading
  // ends itself here, even when no event comes to it any more.
  virtual void Sweep(absl::Time /*now*/) {}
  // The watch is over with this status; nothing is delivered after it.
  virtual void End(const absl::Status& status) = 0;
  // The dispatcher that must serve this watcher (the one whose completion queue its stream
  // completes on), or -1: the one with the fewest watchers.
  virtual int pinned_dispatcher() const { return -1; }
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_WATCHER_H_
