// WatchCache: fans the store's events out to its watchers, in revision order, off the write
// path, and never holds a writer back for a watcher.
//
// Three parts (docs/design.md, "The watch fan-out"):
// - this class: publication and registration. The store's committer publishes each event once
//   it is durable (Publish), which hands it to every dispatcher's inbox and returns: it never
//   waits for a dispatcher or a watcher. A watcher is registered with one dispatcher (the one
//   whose completion queue its stream completes on, or else the one with the fewest watchers).
// - Dispatcher (dispatcher.h): one thread per share of the watchers, its inbox, its gRPC
//   completion queue and wake-ups.
// - FanOut (fan_out.h): the policy: who gets what, parking a watcher whose queue is full and
//   catching it up later from the store's history (with no gap and no duplicate), ending it when
//   that history has moved on, bookmarks and sweeps.
//
// The events' encodings (EventForms) are made at most once per type in which watchers see them
// and shared by every dispatcher and watcher; the WatchCache keeps the forms of the most recent
// events (Options::kept_forms), so that parked watchers catching up from the history send the
// same bytes rather than encoding each event again. The encodings of one resource's events lie
// side by side in shared chunks (event_chunks.h), so that a watcher that is behind holds a run
// of them as one slice.
//
// A watcher is registered by the store under the store's lock together with its starting
// revision and its initial events, so that no event falls between the two: the fan-out skips
// events at or below a watcher's starting revision.
//
// Thread-safety: all methods are thread-safe. Watcher callbacks are called from the watcher's
// dispatcher thread (End also from Shutdown's caller) and must never block.
#ifndef SHARDCACHE_CACHE_SERVER_WATCH_CACHE_H_
#define SHARDCACHE_CACHE_SERVER_WATCH_CACHE_H_

#include <grpcpp/completion_queue.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/dispatcher.h"
#include "cache_server/event.h"
#include "cache_server/event_chunks.h"
#include "cache_server/fan_out.h"
#include "cache_server/socket_cork.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watcher.h"
#include "common/clock.h"

namespace shardcache {

class WatchCache : private FanOut::Source {
 public:
  using Completion = shardcache::Completion;

  struct Options {
    // A watcher that has been sent nothing for about this long receives a bookmark (see
    // FanOut::kBookmarkSlots).
    absl::Duration bookmark_interval = absl::Seconds(5);
    // Dispatcher threads (at least 1).
    int dispatchers = 2;
    // Read by each watcher (WatchCall): the bytes of live events that may wait for it; a watcher
    // whose queue is full is parked and caught up from the history later. A parked watcher
    // whose client has not taken a message for `stall_timeout` (its stream's flow control stays
    // closed) is ended with RESOURCE_EXHAUSTED.
    size_t watcher_queue_bytes = 1 << 20;
    absl::Duration stall_timeout = absl::Seconds(20);
    // The forms of this many of the most recent events are kept for watchers catching up (set
    // it to the history window's size), and at most about `kept_forms_bytes` of them.
    size_t kept_forms = 10000;
    size_t kept_forms_bytes = 64 << 20;
    // Events that may wait for one dispatcher before it skips them (Dispatcher::Options).
    size_t max_queued_events = 1 << 16;
    // The time of the bookmarks and sweeps (and of Watcher::Sweep's `now`); not owned, outlives
    // the cache.
    const Clock* clock = RealClock::Get();
    // A dispatcher waiting on its completion queue waits in real time: with a `clock` other than
    // the real one (a test's), it looks at that clock this often.
    absl::Duration other_clock_poll_interval = absl::Milliseconds(5);
    // Each dispatcher corks the TCP connections of the watch streams it writes to during one
    // pass of its loop, and uncorks them before it waits again (socket_cork.h): the messages of
    // one pass leave each connection in a few segments rather than one each.
    bool cork_writes = true;
  };

  WatchCache(Options options, StoreMetrics* metrics);
  // Stops the dispatchers. Watchers still registered are not ended: call Shutdown first.
  ~WatchCache() override;
  WatchCache(const WatchCache&) = delete;
  WatchCache& operator=(const WatchCache&) = delete;

  const Options& options() const { return options_; }

  // Where parked watchers are caught up from: the store's history window (null: none, and a
  // parked watcher is ended as too far behind). The ObjectStore attaches itself when it is
  // made and detaches when it is destroyed. Not owned.
  void SetHistory(const EventHistory* history);

  // Hands committed events to every dispatcher; never blocks. REQUIRES: called in revision
  // order, from one thread.
  void Publish(std::vector<EventPtr> events);
  // After the events published so far, ends the watchers of `group_resource` (only those of
  // `version`, when it is not empty) that started before `revision`, with `status`.
  void PublishResourceGone(const std::string& group_resource, const std::string& version,
                           int64_t revision, absl::Status status);

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

  // Finds the sockets of the watch streams' connections (for Options::cork_writes).
  ConnectionSockets* sockets() { return &sockets_; }

  // Gives each dispatcher a completion queue of its own, which it waits on and whose
  // completions it runs from then on. Call once, before any operation is started on them.
  void StartCompletionQueues();
  int dispatcher_count() const { return static_cast<int>(dispatchers_.size()); }
  // The completion queue of dispatcher `index` (null before StartCompletionQueues).
  grpc::CompletionQueue* completion_queue(int index) const {
    return dispatchers_[index]->completion_queue();
  }
  // The dispatcher with the fewest watchers.
  int LeastLoadedDispatcher() const;
  // A user of the completion queues that may start operations on them (a watch stream, from its
  // creation to its deletion) holds them: ShutdownCompletionQueues waits until none does.
  void HoldCompletionQueues();
  void ReleaseCompletionQueues();
  // Holds the completion queues for its lifetime.
  class CompletionQueueHold {
   public:
    explicit CompletionQueueHold(WatchCache* cache) : cache_(cache) {
      cache_->HoldCompletionQueues();
    }
    ~CompletionQueueHold() { cache_->ReleaseCompletionQueues(); }
    CompletionQueueHold(const CompletionQueueHold&) = delete;
    CompletionQueueHold& operator=(const CompletionQueueHold&) = delete;

   private:
    WatchCache* const cache_;
  };
  // Waits until no one holds the completion queues, shuts them down and waits until every
  // dispatcher has drained its queue; the dispatchers then wait on their conditions again.
  // REQUIRES: the grpc::Server whose calls use them has been shut down (so that every stream
  // ends). Idempotent; the destructor calls it.
  void ShutdownCompletionQueues();

 private:
  // FanOut::Source, from the dispatchers' threads.
  absl::Status ReadHistory(const std::string& group_resource, int64_t after, int64_t up_to,
                           size_t max_events, std::vector<EventPtr>* out) override;
  EventFormsPtr Forms(const EventPtr& event) override;

  void CountChanged(int delta);

  // Constant after construction.
  const Options options_;
  StoreMetrics* const metrics_;
  // Where the events' encodings are written; the first dispatcher lets idle chunks go at each
  // sweep. Declared before the dispatchers, which use it.
  EventChunks chunks_;
  ConnectionSockets sockets_;
  std::vector<std::unique_ptr<Dispatcher>> dispatchers_;

  std::atomic<int64_t> watcher_count_{0};

  // Taken by a dispatcher reading the history (shared) and by SetHistory.
  absl::Mutex history_mu_;
  const EventHistory* history_ ABSL_GUARDED_BY(history_mu_) = nullptr;

  // The forms of the most recent events, in revision order. A leaf lock.
  absl::Mutex forms_mu_;
  struct KeptForms {
    EventFormsPtr forms;
    size_t bytes;  // the object's size, counted towards kept_forms_bytes
  };
  std::deque<KeptForms> kept_forms_ ABSL_GUARDED_BY(forms_mu_);
  size_t kept_forms_bytes_ ABSL_GUARDED_BY(forms_mu_) = 0;

  absl::Mutex holders_mu_;
  int holders_ ABSL_GUARDED_BY(holders_mu_) = 0;

  // Lock order: reg_mu_, then a dispatcher's locks.
  mutable absl::Mutex reg_mu_;
  bool shutting_down_ ABSL_GUARDED_BY(reg_mu_) = false;
  // Which dispatcher each registered watcher is with.
  absl::flat_hash_map<Watcher*, int> registered_ ABSL_GUARDED_BY(reg_mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_WATCH_CACHE_H_
