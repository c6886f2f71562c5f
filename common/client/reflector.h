// Reflector: the list/watch loop of one resource (client-go's cache.Reflector). It lists every
// page, hands the snapshot to its sink, then watches from the list's revision and hands each
// event to the sink. It knows nothing of event handlers.
//
// resourceVersion bookkeeping: the reflector keeps the last revision it has seen (from the list,
// every event, and the store's periodic BOOKMARKs, which keep it fresh while nothing changes; the
// store sends them only to a watch that asks, as StoreListerWatcher's do). When a watch
// ends (the server restarted, the connection dropped, the watch deadline passed), it watches
// again from that revision, WITHOUT listing again. It lists again only when the store answers
// OUT_OF_RANGE ("too old resource version": the revision left the store's history window). A
// paged list whose snapshot leaves the window between two pages (a long list under many writes)
// is done again at once in one page, which needs no history (client-go's pager does the same).
//
// Errors: between failed attempts it waits, on its Clock, for the delay of a Backoff
// (common/backoff.h: 800 ms doubling to 30 s, with jitter, reset after a healthy period). A watch
// that ended cleanly after delivering events (its deadline passed) is resumed at once. A relist
// after "too old" starts at once, unless the watch that failed was the first after a list. Some
// errors cannot be cured by retrying, and stop the reflector for good:
//   NOT_FOUND         the resource is not served (its definition was deleted, or never existed);
//   INVALID_ARGUMENT  the request is malformed (e.g. a bad label selector);
//   UNIMPLEMENTED     the server does not serve the Store API.
// A stopped reflector never restarts: its owner makes a new one if the resource comes back.
//
// Store identity: every List answer and watch event names the store that sent it (store_id, made
// when the store's data was created). A revision means something only in the store that gave it:
// a store whose data directory was wiped and refilled may be past the reflector's revision and
// would "resume" a watch with none of the changes in between. So the reflector remembers the
// identity of its last list, and when a watch names another store (in its response headers,
// WatchEventStream::StoreId(), or else at its first event) it drops the stream without applying
// anything and lists again (at once, unless the watch was the first after a list, which backs
// off), logged at warning and counted (store_changes()).
//
// Liveness: a watch that has received neither an event nor a bookmark for
// Options::watch_idle_timeout (on the Clock) is taken for dead (a half-open connection, a paused
// server): a watchdog (a thread of its own, or a wake-up on Options::pool's timer) cancels it, and
// the reflector waits its backoff delay and watches again from its last revision (listing again if
// the store changed), logged at warning and counted (watch_idle_restarts()). The store sends a
// bookmark every few seconds (cache_server
// --bookmark-interval) to an idle watch that asked for them (WatchRequest.allow_bookmarks, which
// StoreListerWatcher sets), so the timeout should be a few of those intervals. Over a
// ListerWatcher whose watches do not ask, every idle watch would be taken for dead.
//
// Threads: Start() runs the loop on a thread of its own (and the watchdog on another, when
// watch_idle_timeout is set and there is no Options::pool); every ReflectorSink method is called
// from the loop's thread, one at a time, in order. All public methods are thread-safe.
#ifndef SHARDCACHE_COMMON_CLIENT_REFLECTOR_H_
#define SHARDCACHE_COMMON_CLIENT_REFLECTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/backoff.h"
#include "common/client/lister_watcher.h"
#include "common/client/thread_safe_store.h"
#include "common/client/worker_pool.h"
#include "common/clock.h"
#include "prometheus/registry.h"

namespace shardcache {

// Where a Reflector delivers what it sees (client-go's Store / DeltaFIFO side). All methods are
// called from the reflector's thread, one at a time; they should not block for long (Stop()
// waits for the one in progress).
class ReflectorSink {
 public:
  virtual ~ReflectorSink() = default;
  // The complete content after a list, a consistent snapshot at `resource_version`. Everything
  // not in `objects` is gone. Called after the first list and after every relist.
  virtual void Replace(std::vector<ObjectRef> objects, const std::string& resource_version) = 0;
  virtual void Add(ObjectRef object) = 0;
  virtual void Update(ObjectRef object) = 0;
  // `object` is the object's last state.
  virtual void Delete(ObjectRef object) = 0;
  // Every change up to `resource_version` has been delivered.
  virtual void Bookmark(const std::string& resource_version) = 0;
  // Called right after a Replace whose list came from another store than the previous list
  // (the first list included): `store_id` is the new store's identity. What a sink learnt from
  // the previous store (e.g. that a write of its own was applied there) no longer holds.
  virtual void StoreChanged(const std::string& store_id) { (void)store_id; }
  // The reflector has stopped for good, for `reason` (the terminal error, or CANCELLED after
  // Stop()). Called exactly once, last.
  virtual void Stopped(const absl::Status& reason) = 0;
};

class Reflector {
 public:
  struct Options {
    // A name for logs and messages; empty: the ListerWatcher's Describe().
    std::string name;
    // Objects per List page (0: no limit, one page).
    int64_t page_size = 500;
    // Delays between failed attempts.
    Backoff::Options backoff;
    // The clock of the backoff waits and of the watch liveness timer: both wait on it, so a
    // FakeClock's Advance drives them. Must outlive the reflector.
    const Clock* clock = RealClock::Get();
    // A watch that has received neither an event nor a bookmark for this long is taken for dead:
    // cancelled and opened again. A few times the store's bookmark interval (cache_server's
    // --bookmark-interval, 5 s by default). Zero: never.
    absl::Duration watch_idle_timeout = absl::Seconds(15);
    // Where the reflector's metrics go, labelled name=<the reflector's name>:
    //   shardcache_reflector_watch_idle_restarts_total  watches taken for dead (see Liveness)
    //   shardcache_reflector_store_changes_total        lists forced by a change of store
    // Null: no metrics.
    std::shared_ptr<prometheus::Registry> registry;
    // Set: the watchdog is a wake-up on this pool's timer thread instead of a thread of its own
    // (the pool's clock must be `clock`). Not owned; must outlive the reflector.
    WorkerPool* pool = nullptr;
  };

  // Validates the options (INVALID_ARGUMENT). `sink` must outlive the reflector.
  static absl::StatusOr<std::unique_ptr<Reflector>> Create(std::unique_ptr<ListerWatcher> lw,
                                                           ReflectorSink* sink, Options options);
  // Stops the reflector and waits for its thread. REQUIRES: not called from a sink method.
  ~Reflector();
  Reflector(const Reflector&) = delete;
  Reflector& operator=(const Reflector&) = delete;

  // Starts the loop on its own thread. Only the first call does anything; after Stop() it does
  // nothing.
  void Start();
  // Stops the loop: cancels the List or watch in flight and interrupts a backoff wait; the sink
  // then gets Stopped(CANCELLED). Waits for the thread to exit, except when called from a sink
  // method (then it returns at once and the loop ends after that method returns). Idempotent.
  void Stop();

  // True once the first list has been handed to the sink.
  bool HasSynced() const;
  // The last revision seen (list, event or bookmark); empty before the first list.
  std::string LastResourceVersion() const;
  // True once the loop has ended (Stop() or a terminal error).
  bool IsStopped() const;
  // Why it stopped; OK while it runs.
  absl::Status StopReason() const;
  const std::string& name() const { return name_; }

  // Counters, for tests and diagnostics: Lists begun (each relist counts; the pages of one list
  // count once), watches opened, and backoff waits begun.
  int64_t lists_started() const { return lists_started_.load(); }
  int64_t watches_started() const { return watches_started_.load(); }
  int64_t backoff_waits() const { return backoff_waits_.load(); }
  // Watches cancelled for lack of events and bookmarks (see Liveness).
  int64_t watch_idle_restarts() const { return watch_idle_restarts_.load(); }
  // Watches dropped because they named another store than the last list's.
  int64_t store_changes() const { return store_changes_.load(); }
  // The identity of the store of the last list (empty before it, or if the store has none).
  std::string StoreId() const;

 private:
  struct WatchResult {
    absl::Status status;
    int64_t events = 0;          // events and bookmarks received
    bool idle = false;           // cancelled by the watchdog
    bool store_changed = false;  // dropped: it named another store
  };
  struct Metrics;

  Reflector(std::unique_ptr<ListerWatcher> lw, ReflectorSink* sink, Options options,
            Backoff backoff, std::unique_ptr<Metrics> metrics);

  void Run();
  absl::Status Loop();
  // Lists every page and hands the snapshot to the sink.
  absl::Status ListAll();
  // Watches from last_rv_ until the stream ends.
  WatchResult WatchOnce();
  // Waits for the next backoff delay. False if Stop() was called.
  bool WaitBackoff();
  bool StopRequested() const;
  // Records an event's revision (when set) and that the watch is alive.
  void SawEvent(const std::string& rv);
  // The watchdog's loop: cancels the open watch once it has been idle for watch_idle_timeout.
  void RunWatchdog();
  bool WatchdogShouldWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The watchdog's check at `now`: cancels the open watch if it has been idle for
  // watch_idle_timeout, else returns when to look again (InfiniteFuture: when a watch opens).
  absl::Time WatchdogCheckLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The watchdog on the pool's timer: the check, and the next wake-up.
  void WatchdogTick(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const std::unique_ptr<ListerWatcher> lw_;
  ReflectorSink* const sink_;
  const Options options_;
  const std::string name_;
  const std::unique_ptr<Metrics> metrics_;  // null: no metrics; thread-safe

  // Used only by the loop's thread.
  Backoff backoff_;

  std::atomic<int64_t> lists_started_{0};
  std::atomic<int64_t> watches_started_{0};
  std::atomic<int64_t> backoff_waits_{0};
  std::atomic<int64_t> watch_idle_restarts_{0};
  std::atomic<int64_t> store_changes_{0};

  // Serializes Start/Stop's thread handling.
  absl::Mutex thread_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
  std::thread watchdog_ ABSL_GUARDED_BY(thread_mu_);

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stop_reason_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  std::string last_rv_ ABSL_GUARDED_BY(mu_);
  std::string store_id_ ABSL_GUARDED_BY(mu_);
  // The open watch, so that Stop() and the watchdog can cancel it.
  WatchEventStream* current_stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Liveness of the open watch: when it last opened or received something (on the clock), how
  // many watches have opened (the watchdog wakes when it changes), and whether the watchdog
  // cancelled the open one.
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_);
  int64_t stream_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t watchdog_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool idle_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id loop_thread_id_ ABSL_GUARDED_BY(mu_);

  // The watchdog on Options::pool: its Tick is the watchdog's wake-up.
  class PoolWatchdog final : public WorkerPool::Client {
   public:
    explicit PoolWatchdog(Reflector* reflector) : reflector_(reflector) {}
    void RunTurn() override {}
    void Tick(absl::Time now) override { reflector_->WatchdogTick(now); }

   private:
    Reflector* const reflector_;
  };
  PoolWatchdog pool_watchdog_{this};
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_REFLECTOR_H_
