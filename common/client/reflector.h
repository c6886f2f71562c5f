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
// AsyncWatchEventStream::StoreId(), or else at its first event) it drops the stream without
// applying anything and lists again (at once, unless the watch was the first after a list, which
// backs off), logged at warning and counted (store_changes()).
//
// Liveness: a watch that has received neither an event nor a bookmark for
// Options::watch_idle_timeout (on the Clock) is taken for dead (a half-open connection, a paused
// server): the reflector's timer cancels it, and the reflector waits its backoff delay and
// watches again from its last revision (listing again if the store changed), logged at warning
// and counted (watch_idle_restarts()). The store sends a bookmark every few seconds (cache_server
// --bookmark-interval) to an idle watch that asked for them (WatchRequest.allow_bookmarks, which
// StoreListerWatcher sets), so the timeout should be a few of those intervals. Over a
// ListerWatcher whose watches do not ask, every idle watch would be taken for dead.
//
// Threads: the loop is a state machine (list, watch, back off) that runs in steps, and a watch is
// read without blocking (AsyncWatchEventStream: gRPC's threads only buffer one message and wake
// the reflector). What runs the steps:
//   - Options::pool null: a thread of its own, which also waits out the backoff delays and the
//     watch's idle timeout on the Clock.
//   - Options::pool set: NO thread of its own. Each step is a turn on the pool's workers (a list
//     is one turn, its pages read by blocking unary calls: lists are short, and at most the
//     pool's size of them run at once; a watch step hands the sink at most kEventsPerTurn events,
//     then the reflector goes to the back of the pool's line), and the backoff delays and the
//     idle timeout are wake-ups on the pool's timer. A process's threads then do not grow with
//     its reflectors.
// Either way every ReflectorSink method is called one at a time, in order, never concurrently:
// from the reflector's thread or turns, except Stopped, which may also be called from the thread
// that calls Stop() (on a pool) or Stop() before Start(). All public methods are thread-safe.
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
#include "absl/synchronization/notification.h"
#include "common/backoff.h"
#include "common/client/async_watch_stream.h"
#include "common/client/lister_watcher.h"
#include "common/client/thread_safe_store.h"
#include "common/client/worker_pool.h"
#include "common/clock.h"
#include "prometheus/registry.h"

namespace shardcache {

// Where a Reflector delivers what it sees (client-go's Store / DeltaFIFO side). All methods are
// called from the reflector's thread or pool turns (see Threads), one at a time; they should not
// block for long (Stop() waits for the one in progress; on a pool, a worker waits meanwhile).
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
    // Set: the reflector runs as turns on this pool's workers and waits on its timer, with no
    // thread of its own (see Threads; the pool's clock must be `clock`). A sink method then runs
    // on a pool worker: it must not wait for other work of the same pool. Null: a thread of its
    // own. Not owned; must outlive the reflector.
    WorkerPool* pool = nullptr;
  };

  // On a pool, the watch events handed to the sink in one turn before other clients get theirs.
  static constexpr int kEventsPerTurn = 64;

  // Validates the options (INVALID_ARGUMENT). `sink` must outlive the reflector.
  static absl::StatusOr<std::unique_ptr<Reflector>> Create(std::unique_ptr<ListerWatcher> lw,
                                                           ReflectorSink* sink, Options options);
  // Stops the reflector and waits for its thread or turns. REQUIRES: not called from a sink
  // method other than Stopped (the owner of the sink may drop the reflector there).
  ~Reflector();
  Reflector(const Reflector&) = delete;
  Reflector& operator=(const Reflector&) = delete;

  // Starts the loop on its own thread, or its first turn on the pool. Only the first call does
  // anything; after Stop() it does nothing.
  void Start();
  // Stops the loop: cancels the List or watch in flight and interrupts a backoff wait; the sink
  // then gets Stopped(CANCELLED). Waits until the loop has ended: its thread has exited, or no
  // turn of it runs, its watch's gRPC callbacks are over and Stopped has returned. Except when
  // called from a sink method: then it returns at once, and the loop ends after that method
  // returns. Idempotent.
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
  // What the loop does next.
  enum class Phase { kList, kWatch, kBackoff };
  // What a step asks of the thread or the pool that runs it.
  enum class Next {
    kRunAgain,   // run the next step (on a pool: in another turn, at the back of the line)
    kWaitReady,  // run it when woken (the watch has something new)
    kWaitTime,   // run it when the backoff delay is over
    kFinished,   // the loop has ended (the sink may have destroyed the reflector)
  };
  // How reading the open watch went.
  enum class Pumped { kPending, kBudget, kEnded };
  // The pool's clients: turns (the steps) and the timer (backoff and watchdog) apart, so that
  // detaching one from inside the other's call still waits for it.
  class Turns final : public WorkerPool::Client {
   public:
    explicit Turns(Reflector* r) : r_(r) {}
    void RunTurn() override { r_->RunTurn(); }
    void Tick(absl::Time) override {}

   private:
    Reflector* const r_;
  };
  class Timer final : public WorkerPool::Client {
   public:
    explicit Timer(Reflector* r) : r_(r) {}
    void RunTurn() override {}
    void Tick(absl::Time now) override { r_->Tick(now); }

   private:
    Reflector* const r_;
  };

  Reflector(std::unique_ptr<ListerWatcher> lw, ReflectorSink* sink, Options options,
            Backoff backoff, std::unique_ptr<Metrics> metrics);

  // The drivers: the reflector's thread, a turn on the pool, a wake-up of the pool's timer.
  void RunThread();
  void RunTurn() ABSL_LOCKS_EXCLUDED(mu_);
  void Tick(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // The thread's wait for the next step: woken, stopped, or a timer due.
  void WaitForWork() ABSL_LOCKS_EXCLUDED(mu_);

  // The steps of the loop, shared by both drivers; each runs on the one thread or turn.
  Next Step();
  Next StepList();
  Next StepWatch();
  // What follows the end of a watch.
  Next AfterWatch(const WatchResult& watched);
  // Begins a backoff wait, after which the loop goes on with `after`.
  Next StartBackoff(Phase after) ABSL_LOCKS_EXCLUDED(mu_);
  // Lists every page and hands the snapshot to the sink.
  absl::Status ListAll();
  // Opens a watch from last_rv_.
  void OpenWatch() ABSL_LOCKS_EXCLUDED(mu_);
  // Hands the sink what the open watch has, at most kEventsPerTurn events.
  Pumped PumpWatch();
  // Whether `served_by` (when known) is another store than the last list's; if so, cancels the
  // watch: nothing it says may reach the sink.
  bool StoreChanged(const std::string& served_by);
  void Apply(v1::WatchEvent& event);
  // The watch has ended: its result, and the stream released.
  WatchResult EndWatch() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the loop with `reason` (unless it has ended already): releases the watch, and calls
  // the sink's Stopped, last: this object may be gone when it returns.
  void Finish(const absl::Status& reason) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CancelledByStop() const;
  bool StopRequested() const ABSL_LOCKS_EXCLUDED(mu_);
  // Records an event's revision (when set) and that the watch is alive.
  void SawEvent(const std::string& rv) ABSL_LOCKS_EXCLUDED(mu_);

  // Asks for the next step: wakes the thread, or schedules a turn unless one is queued or running
  // (then that turn schedules another when it ends).
  void NotifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify() ABSL_LOCKS_EXCLUDED(mu_);
  bool WokenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_ || stop_requested_; }
  // The timers at `now`: ends a backoff wait that is due (NotifyLocked), and takes the open watch
  // for dead if it has been idle for watch_idle_timeout (*idle: the stream to cancel, with mu_
  // released). Returns when to look again (InfiniteFuture: nothing to wait for).
  absl::Time TimersLocked(absl::Time now, std::shared_ptr<AsyncWatchEventStream>* idle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const std::unique_ptr<ListerWatcher> lw_;
  ReflectorSink* const sink_;
  const Options options_;
  const std::string name_;
  const std::unique_ptr<Metrics> metrics_;  // null: no metrics; thread-safe
  // Notified once the sink's Stopped has returned, for a Stop() on a pool that did not make that
  // call itself. Shared, so that the notifier touches nothing of a reflector its sink destroyed.
  const std::shared_ptr<absl::Notification> stopped_returned_ =
      std::make_shared<absl::Notification>();
  Turns turns_{this};
  Timer timer_{this};

  // Used only by the step in progress (the thread, or the one turn: see scheduled_).
  Backoff backoff_;
  Phase phase_ = Phase::kList;
  Phase after_backoff_ = Phase::kList;
  int watches_since_list_ = 0;
  // The open watch (also in current_stream_), its result so far, the store of the list it
  // follows, and whether its response headers were checked.
  std::shared_ptr<AsyncWatchEventStream> watch_;
  WatchResult watch_result_;
  std::string watch_store_id_;
  bool headers_checked_ = false;

  std::atomic<int64_t> lists_started_{0};
  std::atomic<int64_t> watches_started_{0};
  std::atomic<int64_t> backoff_waits_{0};
  std::atomic<int64_t> watch_idle_restarts_{0};
  std::atomic<int64_t> store_changes_{0};

  // Serializes Start/Stop's thread handling.
  absl::Mutex thread_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish has begun
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;   // set just before the sink's Stopped
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stop_reason_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  std::string last_rv_ ABSL_GUARDED_BY(mu_);
  std::string store_id_ ABSL_GUARDED_BY(mu_);
  // A step is wanted (the watch has news, a backoff wait is over).
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  // On a pool: a turn is queued or running (there is never more than one).
  bool scheduled_ ABSL_GUARDED_BY(mu_) = false;
  // The end of the current backoff wait (InfiniteFuture: none).
  absl::Time backoff_until_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The open watch, so that Stop() and the watchdog can cancel it.
  std::shared_ptr<AsyncWatchEventStream> current_stream_ ABSL_GUARDED_BY(mu_);
  // Liveness of the open watch: when it last opened or received something (on the clock), and
  // whether the watchdog cancelled it.
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_);
  bool idle_cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_REFLECTOR_H_
