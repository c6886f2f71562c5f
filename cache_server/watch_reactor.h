// WatchReactor: the server side of one Watch stream (gRPC callback API).
//
// The stream is registered as a raw (ByteBuffer) method, so that each event is serialized once by
// the WatchCache and the same bytes (a reference-counted slice) are sent to every watcher that
// receives it: a message is assembled from shared slices, never copied or re-serialized. A
// watcher that asked for batches keeps consecutive events that lie side by side in one of the
// cache's chunks (event_chunks.h) as one slice: its queue, and its messages, hold one slice per
// run of events rather than one per event.
//
// Modelled on gRPC's own health-watch reactor: at most one write in flight; events wait in a
// queue under the reactor's lock; Finish is called exactly once, after the queue has drained (or
// at once for a watcher whose client stopped reading). The initial events (snapshot or history)
// are sent first and are not bounded.
//
// Batches: when the client asked for them (WatchRequest.batch_events) and several events wait
// as a write completes, they go out in one message (WatchEvent.events, up to kMaxBatchBytes);
// one waiting event goes out as itself. Without batch_events every message is one event, as a
// grpcurl user expects.
//
// Slow clients: live events are bounded in bytes (WatchCache::Options::watcher_queue_bytes, and
// optionally in events, `max_pending_events`). A watcher past its bound is ended with
// RESOURCE_EXHAUSTED only when its own client has stopped reading: its write in flight has not
// completed for WatchCache::Options::stall_timeout (HTTP/2 flow control holds it). A watcher past
// its bound whose client reads is the server's lag, not the client's: the bytes waiting in every
// watcher's queue, and in its message in flight, count towards the WatchCache's backlog, which
// slows the writers instead.
//
// Every message carries the store's identity (WatchEvent.store_id): the message's slices are
// followed by the encoding of that one field (a protobuf message parses the concatenation of two
// encodings as their merge), so the shared encodings stay as they are.
//
// Thread-safety: the Watcher methods are called from the WatchCache's dispatchers; the reactions
// from gRPC's threads. All state is guarded by mu_; no gRPC operation is started under it.
#ifndef SHARDCACHE_CACHE_SERVER_WATCH_REACTOR_H_
#define SHARDCACHE_CACHE_SERVER_WATCH_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watch_cache.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class WatchReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public Watcher {
 public:
  // The most bytes of events put in one batched message (a single event may be larger).
  static constexpr size_t kMaxBatchBytes = 64 << 10;

  // `max_pending_events`: a bound in events on top of the cache's bound in bytes (0: none).
  // `store_id`: the store's identity, set on every message sent (empty: not set).
  WatchReactor(WatchCache* cache, StoreMetrics* metrics, size_t max_pending_events,
               const std::string& store_id = "");

  // Whether several events may go in one message (WatchRequest.batch_events). REQUIRES: called
  // before Begin.
  void set_batch_events(bool batch) { batch_ = batch; }
  // Starts sending, once the store has initialized and registered the watcher.
  void Begin();
  // Ends the stream at once with `status` (used when the watch could not start).
  void Reject(const grpc::Status& status);

  // Watcher.
  void Init(WatchSpec spec,
            std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial) override;
  const WatchSpec& spec() const override { return spec_; }
  void Deliver(const Delivery& delivery) override;
  void Flush() override;
  void Bookmark(int64_t revision) override;
  void Sweep(absl::Time now) override;
  void End(const absl::Status& status) override;

  // ServerWriteReactor.
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  enum class Action { kNone, kWrite, kFinish };

  void RequestFinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every event waiting (the stream is ending without them); `done`: the stream is over,
  // and the message in flight is released too.
  void ClearLocked(bool done = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the watch as too slow if it is past its bound and its client has stopped reading.
  void CheckStalledLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the WatchCache's backlog in step with live_bytes_.
  void UpdateBacklogLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides what to start next; the caller starts it with Act after releasing mu_.
  Action NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the gRPC operation decided (StartWrite or Finish). Never under mu_.
  void Act(Action action) ABSL_LOCKS_EXCLUDED(mu_);

  WatchCache* const cache_;
  StoreMetrics* const metrics_;
  const size_t max_pending_events_;
  const size_t max_queue_bytes_;
  const absl::Duration stall_timeout_;
  // The WatchCache's clock, which also gives Sweep its `now`.
  const Clock* const clock_;
  // The encoding of a WatchEvent with only store_id set, appended to every message; empty when
  // there is no identity to send.
  const grpc::Slice store_id_suffix_;
  // Set before Begin (batch_) or once by Init, before registration (spec_); read-only afterwards.
  bool batch_ = false;
  WatchSpec spec_;

  absl::Mutex mu_;
  std::deque<std::pair<v1::WatchEvent::Type, ObjectRef>> initial_ ABSL_GUARDED_BY(mu_);
  // What waits to be sent: bare WatchEvents, or (for a watcher that asked for batches) runs of
  // batch elements, each one slice of an EventChunks chunk.
  struct Pending {
    grpc::Slice bytes;
    size_t events = 0;
    bool elements = false;  // bytes are batch elements (WatchEvent.events), not a WatchEvent
  };
  std::deque<Pending> live_ ABSL_GUARDED_BY(mu_);
  size_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t live_events_ ABSL_GUARDED_BY(mu_) = 0;
  // The bytes of the message in flight (also part of the backlog until its write completes).
  size_t writing_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // live_bytes_ + writing_bytes_, as last added to the cache's backlog.
  size_t backlog_ ABSL_GUARDED_BY(mu_) = 0;
  // Past its bound: Sweep looks at this watcher (read without the lock).
  std::atomic<bool> over_bound_{false};
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time write_started_ ABSL_GUARDED_BY(mu_);
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  // The message being written; only touched while writing_ is false or by the writer.
  grpc::ByteBuffer out_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_WATCH_REACTOR_H_
