// WorkerPool: a fixed set of threads that do the work of many WorkQueues, and one timer thread
// for their delayed keys, so that a process's thread count is set by its configuration and not
// by how many controllers it runs. (client-go gives each controller its own worker goroutines
// and each queue its own; threads are not that cheap, and a replicator runs a controller for
// every ClusterCachedResource.)
//
//   ASSIGN_OR_RETURN(std::unique_ptr<WorkerPool> pool, WorkerPool::Create({.threads = 8}));
//   WorkQueue::Options q;
//   q.pool = pool.get();
//   ASSIGN_OR_RETURN(std::unique_ptr<WorkQueue> queue, WorkQueue::Create(std::move(q)));
//   queue->Process(/*max_parallel=*/4, [](const std::string& key) { Reconcile(key); });
//   ...
//   queue->ShutDownAndWait();   // or destroy the queue: no key is processed after it returns
//
// What it guarantees:
// - At most Options::threads keys are processed at once, over all the queues on the pool, and at
//   most a queue's max_parallel of that queue's (WorkQueue::Process).
// - Fairness: a queue is served one key at a time, and goes to the back of the line after each,
//   so a queue with 100,000 waiting keys delays another queue's key by at most one key of each
//   queue with work, never by its whole backlog.
// - Delayed keys (WorkQueue::AddAfter) become waiting when the pool's Clock reaches their time:
//   one timer thread waits for the earliest one of all the queues. On a FakeClock, Advance is all
//   a test needs.
//
// The pool's side of a queue is private to WorkQueue (Schedule, WakeAt, Detach); users only
// create the pool, hand it to their queues, and destroy it after the queues.
//
// Thread-safety: Create and the destructor from one thread; the rest is called by WorkQueues
// from any thread. The destructor requires that every queue on the pool is gone.
#ifndef SHARDCACHE_COMMON_CLIENT_WORKER_POOL_H_
#define SHARDCACHE_COMMON_CLIENT_WORKER_POOL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shardcache {

class WorkQueue;

class WorkerPool {
 public:
  struct Options {
    // How many keys are processed at once, over every queue on the pool (>= 1).
    int threads = 4;
    // The time of the queues' delayed keys. Not owned; must outlive the pool.
    const Clock* clock = RealClock::Get();
  };

  // INVALID_ARGUMENT for threads < 1 or a null clock.
  static absl::StatusOr<std::unique_ptr<WorkerPool>> Create(Options options);

  // Stops and joins the threads. REQUIRES: every WorkQueue created on the pool is destroyed.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()); }
  const Clock* clock() const { return clock_; }

 private:
  friend class WorkQueue;

  explicit WorkerPool(const Options& options);

  // Runs queue->RunOne() once on a worker thread, after the turns already queued.
  void Schedule(WorkQueue* queue) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls queue->Tick(now) on the timer thread once the clock reaches `when`, or earlier if an
  // earlier time was asked for already (a queue has one wake-up at a time: the earliest; Tick
  // asks for the next one).
  void WakeAt(WorkQueue* queue, absl::Time when) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the queue's turns and wake-up, and waits for a RunOne or Tick of it in progress on
  // another thread (Schedule and WakeAt for it do nothing meanwhile). After it returns, the pool
  // never calls the queue again. REQUIRES: not called from the queue's own RunOne or Tick.
  void Detach(WorkQueue* queue) ABSL_LOCKS_EXCLUDED(mu_);

  void RunWorker() ABSL_LOCKS_EXCLUDED(mu_);
  void RunTimer() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasTurnLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !turns_.empty() || stop_; }
  bool TimerWakeupLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return timer_wakeup_ || stop_;
  }

  const Clock* const clock_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Queues waiting for a worker, one entry per turn.
  std::deque<WorkQueue*> turns_ ABSL_GUARDED_BY(mu_);
  // Wake-ups: each queue's, and the same ordered by time.
  std::map<WorkQueue*, absl::Time> wake_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, WorkQueue*>> wake_by_time_ ABSL_GUARDED_BY(mu_);
  bool timer_wakeup_ ABSL_GUARDED_BY(mu_) = false;  // the earliest wake-up changed
  // Calls in progress per queue (RunOne on a worker, Tick on the timer), for Detach.
  std::map<WorkQueue*, int> running_ ABSL_GUARDED_BY(mu_);
  // Queues that Detach is waiting for: no new turn or wake-up is taken for them.
  absl::flat_hash_set<WorkQueue*> detaching_ ABSL_GUARDED_BY(mu_);

  std::vector<std::thread> workers_;  // set by Create, joined by the destructor
  std::thread timer_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_WORKER_POOL_H_
