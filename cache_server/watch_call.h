// WatchCall: the server side of one Watch call (gRPC's async API, on a WatchCache dispatcher's
// completion queue), and the Watcher that the fan-out delivers to.
//
// Watch is served with gRPC's async API so that a call lives on one WatchCache dispatcher: the
// dispatcher delivers its events and starts its writes, and the writes complete on that
// dispatcher's completion queue (Dispatcher::StartCompletionQueue), where the same thread
// follows them up. An event sent to a watcher that keeps up costs no thread hand-off and no
// lock that another thread contends for.
//
// The stream is registered as a raw (ByteBuffer) method, so that each event is serialized once by
// the WatchCache and the same bytes (a reference-counted slice) are sent to every watcher that
// receives it: a message is assembled from shared slices, never copied or re-serialized. A
// watcher that asked for batches keeps consecutive events that lie side by side in one of the
// cache's chunks (event_chunks.h) as one slice: its queue, and its messages, hold one slice per
// run of events rather than one per event.
//
// At most one write in flight; events wait in a queue under the call's lock; Finish is called
// exactly once, after the queue has drained (or at once for a watcher whose client stopped
// reading, or that cancelled). The initial events (snapshot or history) are sent first and are
// not bounded.
//
// Batches: when the client asked for them (WatchRequest.batch_events) and several events wait
// as a write completes, they go out in one message (WatchEvent.events, up to kMaxBatchBytes);
// one waiting event goes out as itself. Without batch_events every message is one event, as a
// grpcurl user expects.
//
// Slow clients: the live events waiting are bounded in bytes (WatchCache::Options::
// watcher_queue_bytes, and optionally in events, `max_pending_events`). A watcher at its bound
// refuses the next event (Deliver returns false): the fan-out parks it and catches it up from
// the store's history once its queue has drained to half (HasRoom), or ends it with OUT_OF_RANGE
// if the history has moved past it (fan_out.h). Its memory stays within its bound, and nobody
// waits for it. A full watcher whose client has stopped reading (its write in flight has not
// completed for WatchCache::Options::stall_timeout: HTTP/2 flow control holds it) is ended with
// RESOURCE_EXHAUSTED.
//
// The writes that a dispatcher starts hold the call's connection corked until the dispatcher's
// pass ends (socket_cork.h), so that one event sent to many streams of a connection leaves it in
// a few segments.
//
// Every message carries the store's identity (WatchEvent.store_id): the message's slices are
// followed by the encoding of that one field (a protobuf message parses the concatenation of two
// encodings as their merge), so the shared encodings stay as they are.
//
// Life: the StoreService asks gRPC for the next Watch call into a new WatchCall (context(),
// request(), writer(), accepted_tag()). When the call arrives, the WatchCall hands itself to
// `on_accepted`, which starts it with Begin or Reject (when gRPC gives the request back unused,
// the server is shutting down, and the WatchCall deletes itself). It deletes itself once the
// call is over: its Finish has completed, gRPC has reported the call done (AsyncNotifyWhenDone),
// and none of its operations is in flight. It then unregisters from the WatchCache first.
//
// Thread-safety: the Watcher methods are called from its dispatcher (End also from the thread of
// WatchCache::Shutdown); the completions of the call's operations run on its dispatcher's thread,
// the accepted one (and so Begin and Reject) on the StoreService's acceptor thread. All state is
// guarded by mu_; no gRPC operation is started under it.
#ifndef SHARDCACHE_CACHE_SERVER_WATCH_CALL_H_
#define SHARDCACHE_CACHE_SERVER_WATCH_CALL_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/async_stream.h>

#include <atomic>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watch_cache.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class WatchCall : public Watcher {
 public:
  // The most bytes of events put in one batched message (a single event may be larger).
  static constexpr size_t kMaxBatchBytes = 64 << 10;
  // Starts an accepted call: ends with Begin or Reject.
  using AcceptedCallback = std::function<void(WatchCall*)>;

  // `max_pending_events`: a bound in events on top of the cache's bound in bytes (0: none).
  // `store_id`: the store's identity, set on every message sent (empty: not set).
  // `dispatcher`: the WatchCache dispatcher on whose completion queue the call's operations
  // complete (the new_call_cq of the request); the watcher is registered with it.
  WatchCall(WatchCache* cache, StoreMetrics* metrics, size_t max_pending_events,
            const std::string& store_id, int dispatcher, AcceptedCallback on_accepted);

  // Where gRPC puts the call it hands over (for the service's RequestWatch).
  grpc::ServerContext* context() { return &ctx_; }
  grpc::ByteBuffer* request() { return &request_; }
  grpc::ServerAsyncWriter<grpc::ByteBuffer>* writer() { return &writer_; }
  void* accepted_tag() { return accepted_.get(); }

  // Whether several events may go in one message (WatchRequest.batch_events). REQUIRES: called
  // before Begin.
  void set_batch_events(bool batch) { batch_ = batch; }
  // Sends the response headers now, before any event (the caller has added its metadata to
  // context()). At most once, before Begin.
  void SendInitialMetadata();
  // Starts sending, once the store has initialized and registered the watcher.
  void Begin();
  // Ends the stream at once with `status` (used when the watch could not start).
  void Reject(const grpc::Status& status);

  // Watcher.
  void Init(WatchSpec spec,
            std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial) override;
  const WatchSpec& spec() const override { return spec_; }
  bool Deliver(const Delivery& delivery) override;
  bool HasRoom() const override;
  void Flush() override;
  void Bookmark(int64_t revision) override;
  void Sweep(absl::Time now) override;
  void End(const absl::Status& status) override;
  int pinned_dispatcher() const override { return dispatcher_; }

 private:
  enum class Action { kNone, kWrite, kFinish };

  // A completion of one of the call's operations: runs `on(ok)` on the reactor.
  class Tag final : public WatchCache::Completion {
   public:
    Tag(WatchCall* reactor, void (WatchCall::*on)(bool)) : reactor_(reactor), on_(on) {}
    void Complete(bool ok) override { (reactor_->*on_)(ok); }
    void* get() { return AsTag(); }

   private:
    WatchCall* const reactor_;
    void (WatchCall::*const on_)(bool);
  };

  // Reactions to the completions.
  void OnAccepted(bool ok);
  void OnMetadataSent(bool ok);
  void OnWriteDone(bool ok);
  void OnFinished(bool ok);
  void OnDone(bool ok);

  // The reactor is kept by its starter (until Begin or Reject), by the done notification (which
  // comes for every call that arrived, possibly before the call is started) and by each
  // operation in flight; the last to let go deletes it (Unref is the last thing each does).
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref();

  void RequestFinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every event waiting (the stream is ending without them).
  void ClearLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the watch as too slow if it is full and its client has stopped reading.
  void CheckStalledLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the queue holds at least 1/divisor of its bound (HasRoom asks with 2).
  bool FullLocked(size_t divisor = 1) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides what to start next; the caller starts it with Act after releasing mu_.
  Action NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the gRPC operation decided (Write or Finish). Never under mu_.
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
  const int dispatcher_;
  const AcceptedCallback on_accepted_;
  // Keeps the completion queues open until the call below is gone (declared before it, so
  // destroyed after it).
  WatchCache::CompletionQueueHold hold_;

  grpc::ServerContext ctx_;
  grpc::ByteBuffer request_;
  grpc::ServerAsyncWriter<grpc::ByteBuffer> writer_;
  Tag accepted_{this, &WatchCall::OnAccepted};
  Tag metadata_sent_{this, &WatchCall::OnMetadataSent};
  Tag write_done_{this, &WatchCall::OnWriteDone};
  Tag finished_tag_{this, &WatchCall::OnFinished};
  Tag done_{this, &WatchCall::OnDone};
  std::atomic<int> refs_{2};  // the starter's and the done notification's

  // Set before Begin (batch_) or once by Init, before registration (spec_); read-only afterwards.
  bool batch_ = false;
  WatchSpec spec_;

  mutable absl::Mutex mu_;
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
  // It refused an event since its queue last drained to half: Sweep looks at this watcher (read
  // without the lock).
  std::atomic<bool> full_{false};
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time write_started_ ABSL_GUARDED_BY(mu_);
  // Begin or Reject has been called: until then nothing is sent (the starter sends first).
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  // The message being written; only touched while writing_ is false or by the writer.
  grpc::ByteBuffer out_;
  // The socket of the call's connection, corked while the dispatcher writes
  // (WatchCache::Options::cork_writes), or -1. Set when the call arrives, before registration.
  int socket_ = -1;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_WATCH_CALL_H_
