// WatchReactor: the server side of one Watch stream (gRPC callback API).
//
// The stream is registered as a raw (ByteBuffer) method, so that each event is serialized once by
// the WatchCache and the same bytes are sent to every watcher that receives it.
//
// Modelled on gRPC's own health-watch reactor: at most one write in flight; events wait in a
// queue under the reactor's lock; Finish is called exactly once, after the queue has drained (or
// at once for a watcher that fell behind). The initial events (snapshot or history) are sent
// first and are not bounded; live events are bounded by `max_pending`: a watcher that has that
// many events waiting is ended with RESOURCE_EXHAUSTED and its queue freed, so a slow client
// never holds unbounded memory. OnDone unregisters from the WatchCache and deletes the reactor.
//
// Every message carries the store's identity (WatchEvent.store_id): the encoded event, shared by
// every watcher, is sent followed by the bytes of that one field (a protobuf message parses the
// concatenation of two encodings as their merge), so the shared encoding stays as it is.
//
// Thread-safety: the Watcher methods are called from the WatchCache's dispatcher; the reactions
// from gRPC's threads. All state is guarded by mu_; no gRPC operation is started under it.
#ifndef SHARDCACHE_CACHE_SERVER_WATCH_REACTOR_H_
#define SHARDCACHE_CACHE_SERVER_WATCH_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watch_cache.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class WatchReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public Watcher {
 public:
  // `store_id`: the store's identity, set on every event sent (empty: not set).
  WatchReactor(WatchCache* cache, StoreMetrics* metrics, size_t max_pending,
               const std::string& store_id = "");

  // Starts sending, once the store has initialized and registered the watcher.
  void Begin();
  // Ends the stream at once with `status` (used when the watch could not start).
  void Reject(const grpc::Status& status);

  // Watcher.
  void Init(WatchSpec spec,
            std::vector<std::pair<v1::WatchEvent::Type, ObjectPtr>> initial) override;
  const WatchSpec& spec() const override { return spec_; }
  void Deliver(const Delivery& delivery) override;
  void Bookmark(int64_t revision) override;
  void End(const absl::Status& status) override;

  // ServerWriteReactor.
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // An event to send: already encoded (live events), or encoded when its turn comes (initial
  // events and bookmarks).
  struct Item {
    v1::WatchEvent::Type type;
    ObjectPtr object;
    std::optional<grpc::ByteBuffer> encoded;
  };
  enum class Action { kNone, kWrite, kFinish };

  void RequestFinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides what to start next; the caller starts it after releasing mu_.
  Action NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Act(Action action);

  WatchCache* const cache_;
  StoreMetrics* const metrics_;
  const size_t max_pending_;
  // The encoding of a WatchEvent with only store_id set, appended to every message; empty when
  // there is no identity to send.
  const std::string store_id_suffix_;
  // Set once by Init, before registration; read-only afterwards.
  WatchSpec spec_;

  absl::Mutex mu_;
  std::deque<Item> initial_ ABSL_GUARDED_BY(mu_);
  std::deque<Item> live_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  // The message being written; only touched while writing_ is false or by the writer.
  grpc::ByteBuffer out_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_WATCH_REACTOR_H_
