// WorkQueue: a controller's queue of keys to reconcile (client-go's util/workqueue: queue.go,
// delaying_queue.go and rate_limiting_queue.go in one type). It holds keys, never objects: a
// worker reads the current object from an informer's cache when it processes the key.
//
//   WorkQueue::Options options;
//   options.name = "ccr";
//   options.registry = registry;
//   ASSIGN_OR_RETURN(std::unique_ptr<WorkQueue> queue, WorkQueue::Create(std::move(options)));
//
//   queue->Add(key);                                         // event handlers
//
//   while (std::optional<std::string> key = queue->Get()) {  // each worker thread
//     if (Reconcile(*key).ok()) queue->Forget(*key);
//     else queue->AddRateLimited(*key);
//     queue->Done(*key);
//   }
//
// Guarantees:
// - A key waits in the queue at most once: adding a key that is already waiting does nothing.
// - A key is processed by one worker at a time: Get() hands it out and puts it in "processing"
//   until Done(key). A key added while it is processing is handed out again after Done, once,
//   however many times it was added meanwhile.
// - Keys are handed out in the order they (first) became waiting.
// - AddAfter(key, d) makes the key wait once the queue's clock reaches now + d. While the key is
//   waiting for its time, a second AddAfter can only bring that time forward.
// - AddRateLimited(key) is AddAfter(key, rate_limiter->When(key)); Forget(key) resets the key's
//   backoff; both only touch the limiter, never the queue's contents.
// - ShutDown(): later adds are ignored and keys still waiting for their time are dropped; Get()
//   returns the keys already waiting, then std::nullopt to every caller (blocked ones too).
//   ShutDownWithDrain() also waits until every key handed out has been Done.
//
// Workers: either threads of the owner's that call Get() and Done() (as above), or, when the queue
// is on a WorkerPool (Options::pool), the pool's threads: Process(max_parallel, fn) runs fn(key)
// for each key handed out and then Done(key), at most max_parallel keys of this queue at once,
// and the queue has no thread of its own (worker_pool.h).
//
// Time: AddAfter's delays and the metrics use Options::clock, and so do all the queue's waits. A
// delayed key whose time has come is waiting for every method that looks (Len, Get); a background
// "ticker" thread (the pool's timer thread for a queue on a pool) waits on the clock for the
// earliest delayed key (and at least every tick_period while keys are processing, for the gauges
// below) so that a blocked Get() or the pool wakes when it is due. On a FakeClock,
// FakeClock::Advance is all a test needs: nothing depends on real time.
//
// Metrics (when Options::registry is set), labelled name=<Options::name>, as client-go's:
//   shardcache_workqueue_depth                               keys waiting to be handed out
//   shardcache_workqueue_adds_total                          keys that became waiting
//   shardcache_workqueue_retries_total                       AddAfter / AddRateLimited calls
//   shardcache_workqueue_queue_duration_seconds              histogram: from Add to Get
//   shardcache_workqueue_work_duration_seconds               histogram: from Get to Done
//   shardcache_workqueue_unfinished_work_seconds             sum of the ages of keys in processing
//   shardcache_workqueue_longest_running_processor_seconds   the oldest of them
// (the last two refreshed by the ticker every tick_period). Queues with the same name in one
// registry share the series, so a queue created again under the same name (a new leadership term)
// continues them.
//
// Thread-safe: every method may be called from any thread, concurrently. Get(),
// ShutDownWithDrain() and ShutDownAndWait() block; the others do not. A worker must not call
// ShutDownWithDrain() or ShutDownAndWait() while it holds a key (it would wait for itself).
#ifndef SHARDCACHE_COMMON_CLIENT_WORK_QUEUE_H_
#define SHARDCACHE_COMMON_CLIENT_WORK_QUEUE_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/client/rate_limiter.h"
#include "common/client/worker_pool.h"
#include "common/clock.h"
#include "prometheus/registry.h"

namespace shardcache {

class WorkQueue final : private WorkerPool::Client {
 public:
  struct Options {
    // Names the queue: the `name` label of its metrics. Required when `registry` is set.
    std::string name;
    // The time source of AddAfter and of the metrics. Not owned; must outlive the queue.
    const Clock* clock = RealClock::Get();
    // Decides AddRateLimited's delays. Null: DefaultControllerRateLimiter(clock) (per key 5 ms
    // doubling to 1000 s, overall 10 per second with a burst of 100).
    std::unique_ptr<RateLimiter> rate_limiter;
    // Where the metrics go. Null: no metrics.
    std::shared_ptr<prometheus::Registry> registry;
    // How often (on `clock`) the ticker refreshes the unfinished-work gauges (> 0).
    absl::Duration tick_period = absl::Milliseconds(500);
    // Null: the queue runs a ticker thread of its own, and its owner's threads call Get(). Set:
    // the pool's threads do both (Process). Not owned; must outlive the queue, and its clock must
    // be `clock`.
    WorkerPool* pool = nullptr;
  };

  // INVALID_ARGUMENT for a null clock, a registry without a name, a tick_period <= 0, metrics
  // that the registry refuses (a name taken by another metric type), or a pool on another clock.
  static absl::StatusOr<std::unique_ptr<WorkQueue>> Create(Options options);

  // Shuts the queue down and stops the ticker (on a pool: ShutDownAndWait).
  // REQUIRES: no other thread is inside, or will call, a method of this queue (shut it down and
  // join the workers first).
  ~WorkQueue();

  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Makes `key` waiting, unless it already is or the queue is shutting down. A key that is
  // processing is handed out again after its Done.
  void Add(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until a key is waiting, and hands it out (it is now processing), or returns
  // std::nullopt once the queue is shutting down and no key is waiting.
  std::optional<std::string> Get() ABSL_LOCKS_EXCLUDED(mu_);

  // The worker has finished `key` (returned by Get). If it was added meanwhile it waits again.
  // Does nothing for a key that is not processing.
  void Done(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  // The number of keys that Get() can hand out now (not those processing, nor those delayed whose
  // time has not come).
  size_t Len() ABSL_LOCKS_EXCLUDED(mu_);

  // Adds `key` once the clock reaches now + delay (at once if delay <= 0). Counts a retry.
  void AddAfter(const std::string& key, absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_);
  // AddAfter(key, rate_limiter->When(key)): one more failure of `key`.
  void AddRateLimited(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // `key` succeeded: its next AddRateLimited starts from the smallest delay again.
  void Forget(const std::string& key);
  // The failures of `key` counted by the rate limiter since it was last forgotten.
  int NumRequeues(const std::string& key);

  // Ignore later adds, drop delayed keys, and let Get() return the waiting keys, then
  // std::nullopt. Wakes every blocked Get(), and ends a ShutDownWithDrain() that is waiting.
  void ShutDown() ABSL_LOCKS_EXCLUDED(mu_);
  // ShutDown, then block until every key handed out has been Done (or ShutDown() is called).
  void ShutDownWithDrain() ABSL_LOCKS_EXCLUDED(mu_);
  bool ShuttingDown() const ABSL_LOCKS_EXCLUDED(mu_);

  // Only for a queue on a pool, once: from now on the pool's threads hand out the queue's keys,
  // calling process(key) and then Done(key) for each, at most `max_parallel` (>= 1) at once. Keys
  // added before the call wait for it. After ShutDown the keys already waiting are still
  // processed, as Get() would hand them out.
  void Process(int max_parallel, std::function<void(const std::string& key)> process)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Shuts the queue down, drops the keys still waiting, and returns once no key is processing
  // (on a pool: once the pool will never call this queue again; the queue, which never calls
  // the pool again either, may then outlive the pool). Unlike ShutDownWithDrain, the keys that
  // were waiting are not handed out: nothing is processed after it returns.
  void ShutDownAndWait() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Metrics;

  WorkQueue(Options options, std::unique_ptr<Metrics> metrics);

  // Hands out the first waiting key (it is now processing), if any.
  std::optional<std::string> TakeLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DoneLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On a pool: how many more turns the pool must give this queue for its waiting keys (counted
  // as queued turns by the call).
  int TurnsNeededLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the pool for `turns` turns and, when `wake` is finite, a Tick at `wake`.
  void CallPool(int turns, absl::Time wake) ABSL_LOCKS_EXCLUDED(mu_);
  // WorkerPool::Client: one turn of a worker (one key processed, if one is waiting).
  void RunTurn() override ABSL_LOCKS_EXCLUDED(mu_);
  // WorkerPool::Client, on the pool's timer: delayed keys due at `now` become waiting, the gauges
  // are refreshed, and the next wake-up is asked for.
  void Tick(absl::Time now) override ABSL_LOCKS_EXCLUDED(mu_);

  void AddLocked(const std::string& key, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ShutDownLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delayed keys whose time has come (as of `now`) become waiting.
  void PromoteDueLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the unfinished-work gauges as of `now`.
  void RefreshGaugesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunTicker() ABSL_LOCKS_EXCLUDED(mu_);

  // Conditions for mu_.Await.
  bool CanGetLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || shutting_down_;
  }
  bool DrainedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return processing_.empty() || !draining_;
  }
  bool TickerWakeupLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ticker_wakeup_ || ticker_stop_;
  }

  // Constant after construction.
  const std::string name_;
  const Clock* const clock_;
  const absl::Duration tick_period_;
  const std::unique_ptr<RateLimiter> rate_limiter_;  // provides its own synchronization
  const std::unique_ptr<Metrics> metrics_;           // null: no metrics; thread-safe

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);  // waiting keys, in order; each in dirty_
  absl::flat_hash_set<std::string> dirty_ ABSL_GUARDED_BY(mu_);       // keys waiting
  absl::flat_hash_set<std::string> processing_ ABSL_GUARDED_BY(mu_);  // keys handed out
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // a ShutDownWithDrain() is waiting
  bool discarding_ ABSL_GUARDED_BY(mu_) =
      false;  // ShutDownAndWait: keys are dropped, not handed out

  // Delayed keys: when each is due, and the same ordered by time.
  absl::flat_hash_map<std::string, absl::Time> delayed_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, std::string>> delayed_by_time_ ABSL_GUARDED_BY(mu_);

  // For the metrics: when each waiting key was added, and each processing key handed out.
  absl::flat_hash_map<std::string, absl::Time> added_at_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Time> started_at_ ABSL_GUARDED_BY(mu_);

  bool ticker_wakeup_ ABSL_GUARDED_BY(mu_) = false;  // the earliest delayed key changed
  bool ticker_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;  // none on a pool

  // On a pool (constant after construction; process_ and max_parallel_ set once by Process).
  WorkerPool* const pool_;
  std::function<void(const std::string&)> process_ ABSL_GUARDED_BY(mu_);
  int max_parallel_ ABSL_GUARDED_BY(mu_) = 0;   // 0: Process not called yet
  int queued_turns_ ABSL_GUARDED_BY(mu_) = 0;   // asked of the pool, not started
  int running_turns_ ABSL_GUARDED_BY(mu_) = 0;  // in RunTurn
  absl::Time next_refresh_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // of the gauges
  // ShutDownAndWait detached the queue from the pool: the queue never calls the pool again, so
  // it may outlive it (e.g. kept alive by callbacks that only Add to the shut-down queue).
  absl::Mutex detach_mu_ ABSL_ACQUIRED_AFTER(mu_);
  bool detached_ ABSL_GUARDED_BY(detach_mu_) = false;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_WORK_QUEUE_H_
