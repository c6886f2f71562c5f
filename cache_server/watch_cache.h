// WatchCache: fans the store's events out to its watchers, in revision order, off the write path.
//
// The ObjectStore's committer thread publishes each event once it is durable, in revision order.
// The watchers are shared out among `Options::dispatchers` dispatcher threads (each watcher is
// given, when it registers, to the thread it is pinned to, or else to the one with the fewest),
// and every dispatcher receives every event: it delivers it to those of its watchers of the
// event's resource whose filters the object matches before or after the change. An update that
// makes an object stop matching is delivered as DELETED, one that makes it start matching as
// ADDED (as Kubernetes' watch cache does). Each dispatcher also sends bookmarks to its idle
// watchers, asks them about every kSweepInterval whether their clients still read
// (Watcher::Sweep), and ends the watchers of a resource that stops being served, after that
// resource's last events.
//
// An event is serialized at most once per type in which watchers see it (usually once), by
// whichever dispatcher needs it first; every watcher that sees it that way shares those bytes.
// The encodings of one resource's events are written side by side in shared chunks
// (event_chunks.h), so that a watcher that is behind holds a run of them as one slice.
//
// A watcher is registered by the store under the store's lock together with its starting
// revision and its initial events, so that no event falls between the two: the dispatcher skips
// events at or below a watcher's starting revision.
//
// Backpressure: `Publish` blocks while a dispatcher has kMaxQueuedEvents waiting, or while the
// watchers' queues hold more than `Options::backlog_bytes` together (the server is not sending as
// fast as events come; a client that stopped reading holds at most its own bound, and not for
// longer than the stall timeout). The publisher, the store's committer, then holds back
// acknowledgements: writers are slowed, and no reading watcher is ended for the server's lag.
//
// Each dispatcher keeps a SocketCork scope: the watch streams' writes that it starts during one
// pass of its loop leave each connection together, when it uncorks them before waiting again
// (Options::cork_writes).
//
// gRPC's completions on the dispatchers' threads: a server that serves watches with gRPC's async
// API gives each dispatcher a completion queue (StartCompletionQueues). The dispatcher then
// waits on that queue instead of on a condition, and runs whatever completes there (Completion
// tags) itself: the writes of its watchers' streams are started by it and their completions
// come back to it, so that sending an event to a watcher that keeps up costs no thread
// hand-off. Publish wakes a waiting dispatcher with an alarm on its queue.
//
// Thread-safety: all methods are thread-safe. Watcher callbacks (Deliver, Flush, Bookmark, Sweep,
// End) are called from the watcher's dispatcher thread (End also from Shutdown's caller) and must
// never block. Completions run on their queue's dispatcher thread, under none of its locks.
#ifndef SHARDCACHE_CACHE_SERVER_WATCH_CACHE_H_
#define SHARDCACHE_CACHE_SERVER_WATCH_CACHE_H_

#include <grpcpp/alarm.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/support/slice.h>

#include <atomic>
#include <chrono>
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
#include "cache_server/event_chunks.h"
#include "cache_server/object_filter.h"
#include "cache_server/socket_cork.h"
#include "cache_server/store_metrics.h"
#include "common/clock.h"

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

// What a watcher watches. Set once, before registration.
struct WatchSpec {
  std::string group_resource;
  std::string version;
  ObjectFilter filter;
  // The watcher has (in its initial events) everything up to and including this revision.
  int64_t start_revision = 0;
};

// One event as a watcher receives it: its type for that watcher, the object, and the WatchEvent
// message (type and object, no store_id) already serialized, once per event and type, into the
// WatchCache's EventChunks: the slices are reference-counted and shared by every watcher that
// gets it.
struct Delivery {
  v1::WatchEvent::Type type;
  ObjectRef object;
  grpc::Slice encoded;  // the WatchEvent: a message of its own
  grpc::Slice element;  // the same as one element of a batch (tag, length, WatchEvent)
};

// The receiving end of a watch, implemented by the Watch RPC's reactor (and by tests).
class Watcher {
 public:
  virtual ~Watcher() = default;
  // The events the watcher must send before any live event: for a watch from a revision, the
  // history after it; for a watch from now, one ADDED per object and then the initial-events-end
  // BOOKMARK. Called once by the store, under its lock, before registration; must not block.
  virtual void Init(WatchSpec spec,
                    std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial) = 0;
  virtual const WatchSpec& spec() const = 0;
  // An event for this watcher, with its type as the watcher sees it. The watcher may hold it
  // until Flush, so that the events of one run go out together.
  virtual void Deliver(const Delivery& delivery) = 0;
  // Called after the Deliver calls of one run of events (at least once after any Deliver).
  virtual void Flush() {}
  // Every event up to `revision` has been delivered.
  virtual void Bookmark(int64_t revision) = 0;
  // Called about every WatchCache::kSweepInterval: a watcher whose client has stopped reading
  // may end itself here, even when no event comes to it any more (the writers may be held back).
  virtual void Sweep(absl::Time /*now*/) {}
  // The watch is over with this status; nothing is delivered after it.
  virtual void End(const absl::Status& status) = 0;
  // The dispatcher that must serve this watcher (the one whose completion queue its stream
  // completes on), or -1: the one with the fewest watchers.
  virtual int pinned_dispatcher() const { return -1; }

 private:
  friend class WatchCache;
  // The dispatcher that serves this watcher; -1 while it is not registered. Written by Register
  // before the watcher can be unregistered.
  int dispatcher_ = -1;
  // Delivered to since the last Flush; only touched by its dispatcher, under its watchers_mu.
  bool unflushed_ = false;
  // When the dispatcher last gave it something to send (its registration, a run of events, a
  // bookmark), and which of the dispatcher's bookmark slots it is in; under watchers_mu.
  absl::Time last_sent_;
  int bookmark_slot_ = 0;
};

// The type of `event` as a watcher with `filter` sees it (an update that crosses the filter
// becomes ADDED or DELETED), or TYPE_UNSPECIFIED when the watcher must not see it.
v1::WatchEvent::Type EffectiveType(const Event& event, const ObjectFilter& filter);
// The object a watcher receives for `event` seen as `type`: the object after the change, except
// for an update that made it stop matching, which is seen (as Kubernetes does) as the DELETED of
// its previous state at the event's revision.
ObjectRef EffectiveObject(const Event& event, v1::WatchEvent::Type type);

class WatchCache {
 public:
  // A tag of an operation started on a dispatcher's completion queue: the dispatcher calls
  // Complete once the operation is done (`ok` as gRPC reports it).
  class Completion {
   public:
    virtual void Complete(bool ok) = 0;
    // The tag that stands for this completion in a gRPC operation, and back. gRPC's completion
    // queue orders the start of an operation before its completion, but it is not built with
    // ThreadSanitizer, which AsTag and FromTag tell of that order.
    void* AsTag();
    static Completion* FromTag(void* tag);

   protected:
    ~Completion() = default;
  };

  struct Options {
    // A watcher that has been sent nothing for about this long receives a bookmark (see
    // kBookmarkSlots).
    absl::Duration bookmark_interval = absl::Seconds(5);
    // Dispatcher threads (at least 1).
    int dispatchers = 2;
    // Read by each watcher (WatchReactor): the bytes of live events that may wait for it before
    // it counts as behind; a watcher behind whose client has not taken a message for
    // `stall_timeout` (its stream's flow control stays closed) is ended with RESOURCE_EXHAUSTED.
    size_t watcher_queue_bytes = 1 << 20;
    absl::Duration stall_timeout = absl::Seconds(5);
    // The bytes of live events waiting in all watchers' queues together (each event counted once
    // per watcher; the bytes themselves are shared) before Publish blocks (backpressure).
    size_t backlog_bytes = 64 << 20;
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
  ~WatchCache();
  WatchCache(const WatchCache&) = delete;
  WatchCache& operator=(const WatchCache&) = delete;

  const Options& options() const { return options_; }

  // Queues committed events for dispatch. REQUIRES: called in revision order, from one thread.
  // Blocks while the dispatchers or the watchers are too far behind (see Backpressure above).
  void Publish(std::vector<EventPtr> events);
  // After the events published so far, ends the watchers of `group_resource` (only those of
  // `version`, when it is not empty) that started before `revision`, with `status`.
  void PublishResourceGone(const std::string& group_resource, const std::string& version,
                           int64_t revision, absl::Status status);

  // Events that may wait for one dispatcher before Publish blocks.
  static constexpr size_t kMaxQueuedEvents = 256;
  // Publish hands events to the dispatchers in chunks of this many, each once the backlog has
  // room, so that what the watchers hold overshoots Options::backlog_bytes by at most about
  // kMaxQueuedEvents + kPublishChunk events each.
  static constexpr size_t kPublishChunk = 128;
  // How often each dispatcher calls Watcher::Sweep.
  static constexpr absl::Duration kSweepInterval = absl::Milliseconds(250);
  // Periodic bookmarks are spread over time: each dispatcher deals its watchers into this many
  // slots and, every bookmark_interval / kBookmarkSlots, turns to the next slot and bookmarks
  // those of its watchers that have been sent nothing for half an interval. So each watcher is
  // looked at once an interval, one that receives events gets no bookmark, an idle one gets one
  // every interval, and never goes longer than about one and a half intervals without a word;
  // and thousands of idle watchers do not all get theirs in the same instant, ahead of the
  // events that follow.
  static constexpr int kBookmarkSlots = 10;

  // Adds a watcher. REQUIRES: the caller holds the store's lock, so that no event with a revision
  // above watcher->spec().start_revision has been published yet. Fails with UNAVAILABLE once
  // Shutdown has begun.
  absl::Status Register(Watcher* watcher);
  // Removes a watcher; after it returns no callback will reach it. Safe to call twice.
  void Unregister(Watcher* watcher);

  // The bytes queued for a watcher changed by `delta` (WatchReactor). Thread-safe, lock-free.
  void AddBacklog(int64_t delta) { backlog_.fetch_add(delta, std::memory_order_relaxed); }

  // Ends every watcher with UNAVAILABLE ("server shutting down"), refuses new ones, and waits
  // up to `timeout` for all of them to unregister. Returns how many were still registered.
  size_t Shutdown(absl::Duration timeout);

  // The number of registered watchers.
  size_t watcher_count() const;

  // Finds the sockets of the watch streams' connections (for Options::cork_writes).
  ConnectionSockets* sockets() { return &sockets_; }

  // Gives each dispatcher a completion queue of its own, which it waits on and whose
  // completions it runs from then on. The queues do not poll: gRPC's other threads do the I/O.
  // Call once, before any operation is started on them.
  void StartCompletionQueues();
  int dispatcher_count() const { return static_cast<int>(dispatchers_.size()); }
  // The completion queue of dispatcher `index` (null before StartCompletionQueues).
  grpc::CompletionQueue* completion_queue(int index) const { return dispatchers_[index]->cq.get(); }
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
  // Serialized forms of one event, made at most once per type (by the first dispatcher to need
  // one) and shared by all dispatchers.
  struct Encodings;
  struct Item {
    EventPtr event;                    // set for an event
    std::shared_ptr<Encodings> forms;  // with the event
    std::string gone_resource;         // set for a resource-gone marker
    std::string gone_version;
    int64_t gone_revision = 0;
    absl::Status gone_status;
  };
  // Where a dispatcher's completion queue stands.
  enum class QueueState { kNone, kOpen, kShuttingDown, kDrained };
  struct Dispatcher;
  // Completes the alarm that wakes a dispatcher waiting on its completion queue.
  struct WakeTag : Completion {
    Dispatcher* d = nullptr;
    void Complete(bool ok) override;
  };
  // One dispatcher thread and its watchers.
  struct Dispatcher {
    absl::Mutex queue_mu;
    std::deque<Item> queue ABSL_GUARDED_BY(queue_mu);
    bool stopping ABSL_GUARDED_BY(queue_mu) = false;

    // The completion queue (set once by StartCompletionQueues) and its state.
    std::unique_ptr<grpc::CompletionQueue> cq;
    QueueState cq_state ABSL_GUARDED_BY(queue_mu) = QueueState::kNone;
    // The thread waits on cq (it is open, or shut down and not yet drained), not on the condition.
    bool OnCompletionQueue() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu) {
      return cq_state == QueueState::kOpen || cq_state == QueueState::kShuttingDown;
    }
    // The thread waits on cq with nothing queued: Enqueue must wake it (with `alarm`).
    bool sleeping ABSL_GUARDED_BY(queue_mu) = false;
    bool wake_pending ABSL_GUARDED_BY(queue_mu) = false;
    grpc::Alarm alarm;
    WakeTag wake;

    // Lock order: WatchCache::reg_mu_, then watchers_mu, then any watcher's own lock.
    absl::Mutex watchers_mu;
    std::map<std::string, std::set<Watcher*>> watchers ABSL_GUARDED_BY(watchers_mu);
    std::atomic<size_t> count{0};
    // The highest revision delivered to every watcher of this dispatcher.
    int64_t dispatched_revision ABSL_GUARDED_BY(watchers_mu) = 0;
    // Watchers registered so far: deals the bookmark slots.
    uint64_t registered ABSL_GUARDED_BY(watchers_mu) = 0;

    std::thread thread;
  };

  void Run(Dispatcher* d);
  // Waits until d's queue has items or the clock reaches `deadline`, running d's completions
  // meanwhile. Returns false when the dispatcher is stopping.
  bool Wait(Dispatcher* d, absl::Time deadline);
  // Waits on d's completion queue until `deadline` (real time) for one completion and runs it;
  // returns what gRPC answered (SHUTDOWN once the queue has been shut down and drained).
  grpc::CompletionQueue::NextStatus RunCompletion(Dispatcher* d,
                                                  std::chrono::system_clock::time_point deadline);
  // Runs the completions ready on d's queue now, without waiting.
  void RunReadyCompletions(Dispatcher* d);
  // Delivers one item; appends the watchers it delivered to first since their last Flush to
  // `unflushed`.
  void Dispatch(Dispatcher* d, const Item& item, std::vector<Watcher*>* unflushed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->watchers_mu);
  void Enqueue(std::vector<Item> items);
  // Waits while the watchers hold more than Options::backlog_bytes.
  void WaitForBacklog();
  void CountChanged(Dispatcher* d, int delta);

  // Constant after construction.
  const Options options_;
  StoreMetrics* const metrics_;
  std::vector<std::unique_ptr<Dispatcher>> dispatchers_;

  // Bytes queued for watchers, summed (see AddBacklog).
  std::atomic<int64_t> backlog_{0};
  std::atomic<int64_t> watcher_count_{0};
  // Where the dispatchers write the events' encodings; the first dispatcher lets idle chunks go
  // at each sweep.
  EventChunks chunks_;
  ConnectionSockets sockets_;

  absl::Mutex holders_mu_;
  int holders_ ABSL_GUARDED_BY(holders_mu_) = 0;

  mutable absl::Mutex reg_mu_;
  bool shutting_down_ ABSL_GUARDED_BY(reg_mu_) = false;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_WATCH_CACHE_H_
