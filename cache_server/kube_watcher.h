// KubeWatcher: one watch of the Kubernetes view (kube_api_server.h) as a Watcher of the store's
// fan-out (watcher.h). The fan-out hands it events on a dispatcher's thread; the watch's HTTP
// connection thread takes them (Take), renders them and writes them to its client. It is the
// view's counterpart of WatchCall, and treats a slow reader the same way:
// - the live events waiting are bounded in bytes (WatchCache::Options::watcher_queue_bytes, the
//   size of each event's encoding); a full watcher refuses the next event, and the fan-out parks
//   it and catches it up from the store's history once its queue has drained to half, or ends it
//   with OUT_OF_RANGE once the history has moved past it (fan_out.h). Nobody waits for it.
// - a full watcher whose connection thread has taken nothing for the stall timeout (its client
//   reads nothing, so the thread is blocked writing to it) is ended with RESOURCE_EXHAUSTED.
// A Take hands over at most kMaxTakeBytes of live events (and at most half the queue's bound),
// so that what the connection's thread holds while it writes is bounded as well. The initial
// events (the snapshot, or the history after the watch's revision) are taken first, Options::
// max_take at a time, and are not bounded, as WatchCall's. Periodic bookmarks come only when the
// watch asked for them (WatchSpec::periodic_bookmarks), and only to a watcher with nothing else
// waiting.
//
// An end (End from the fan-out, Cancel from the view) is taken after the events already waiting,
// except an end for a server shutting down (UNAVAILABLE), a stalled reader (RESOURCE_EXHAUSTED)
// or a Cancel, which drop them.
//
// Thread-safety: the Watcher methods are called by the fan-out (on its dispatcher's thread; End
// also on WatchCache::Shutdown's), Take by the connection's thread, Cancel by any thread. All
// state is guarded by mu_.
#ifndef SHARDCACHE_CACHE_SERVER_KUBE_WATCHER_H_
#define SHARDCACHE_CACHE_SERVER_KUBE_WATCHER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watcher.h"
#include "common/clock.h"

namespace shardcache {

class KubeWatcher final : public Watcher {
 public:
  // The most bytes of live events one Take returns (at least one event; at most half the
  // queue's bound).
  static constexpr size_t kMaxTakeBytes = 64 << 10;

  struct Options {
    // The bytes of live events that may wait (WatchCache::Options::watcher_queue_bytes).
    size_t max_queue_bytes = 1 << 20;
    // A full watcher whose events have not been taken for this long is ended.
    absl::Duration stall_timeout = absl::Seconds(20);
    // The fan-out's clock (WatchCache::Options::clock): the stall is timed on it. Not owned.
    const Clock* clock = RealClock::Get();
    // The most events one Take returns.
    size_t max_take = 500;
    // Counts the watchers ended as too slow (watchers_too_slow); null: not counted. Not owned.
    StoreMetrics* metrics = nullptr;
  };

  // What one Take hands over: events in order (a BOOKMARK's object carries only its revision,
  // and the initial-events-end annotation for the bookmark that ends the initial events), then,
  // once nothing is left, why the watch is over.
  struct Taken {
    std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> events;
    std::optional<absl::Status> ended;
  };

  explicit KubeWatcher(Options options) : options_(options) {}

  // Watcher: the fan-out's side.
  void Init(WatchSpec spec,
            std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial) override;
  const WatchSpec& spec() const override { return spec_; }
  bool Deliver(const Delivery& delivery) override;
  bool HasRoom() const override;
  void Flush() override;
  void Bookmark(int64_t revision) override;
  void Sweep(absl::Time now) override;
  void End(const absl::Status& status) override;

  // The connection's side: waits until there is something to take, the watch is over, or
  // `deadline` (real time) passes, and takes it (possibly nothing, at the deadline).
  Taken Take(absl::Time deadline);
  // Ends the watch from the view's side (its client has gone, the view is stopping, its time is
  // up): what waits is dropped, and a Take in progress returns at once.
  void Cancel(const absl::Status& why);

 private:
  struct Live {
    v1::WatchEvent::Type type;
    ObjectRef object;
    size_t bytes;
  };

  void EndLocked(const absl::Status& status, bool drop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FullLocked(size_t divisor = 1) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckStalledLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  // Set once by Init, before registration; read-only afterwards.
  WatchSpec spec_;

  mutable absl::Mutex mu_;
  absl::CondVar ready_;
  std::deque<std::pair<v1::WatchEvent::Type, ObjectRef>> initial_ ABSL_GUARDED_BY(mu_);
  std::deque<Live> live_ ABSL_GUARDED_BY(mu_);
  size_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);
  // When events were last taken (on options_.clock), for the stall.
  absl::Time last_take_ ABSL_GUARDED_BY(mu_) = options_.clock->Now();
  bool taker_waiting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_KUBE_WATCHER_H_
