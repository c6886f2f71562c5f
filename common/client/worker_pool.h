// WorkerPool: a fixed set of threads that do the work of many WorkQueues, informer handler
// registrations and Reflectors (its Clients), and one timer thread for their timed work (delayed
// keys, periodic resyncs, backoff delays, watch liveness), so that a process's thread count is set
// by its configuration and not by how many controllers, informers and handlers it runs. (client-go
// gives each controller its own worker goroutines and each queue its own; threads are not that
// cheap, and a replicator runs a controller for every ClusterCachedResource.)
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
// Users create the pool, hand it to their queues (WorkQueue::Options::pool) and informers
// (SharedInformer::Options::pool, which their reflectors use too), and destroy it after them. The
// Client side (Schedule, WakeAt, Detach) is for the code that implements a Client.
//
// Thread-safety: Create and the destructor from one thread; Schedule, WakeAt and Detach from any
// thread, also from a Client's own RunTurn or Tick. The destructor requires that every Client
// was detached.
#ifndef SHARDCACHE_COMMON_CLIENT_WORKER_POOL_H_
#define SHARDCACHE_COMMON_CLIENT_WORKER_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
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

  // What the pool runs. A Client asks for turns and wake-ups; the pool calls it back.
  class Client {
   public:
    // One turn on a worker thread: a bounded piece of work (a turn that never ends holds a
    // worker for good).
    virtual void RunTurn() = 0;
    // The wake-up asked for by WakeAt has come (`now` on the pool's clock), on the timer thread.
    virtual void Tick(absl::Time now) = 0;

   protected:
    ~Client() = default;
  };

  // Runs client->RunTurn() once on a worker thread, after the turns already queued (a client
  // with several turns queued may run them side by side on several workers).
  void Schedule(Client* client) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls client->Tick(now) on the timer thread once the clock reaches `when`, or earlier if an
  // earlier time was asked for already (a client has one wake-up at a time: the earliest; Tick
  // asks for the next one).
  void WakeAt(Client* client, absl::Time when) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the client's turns and wake-up, and waits for a RunTurn or Tick of it in progress on
  // another thread (Schedule and WakeAt for it do nothing meanwhile). After it returns, the pool
  // never calls the client again. Called from the client's own RunTurn or Tick, it drops them and
  // returns at once (it cannot wait for itself): the client must then ask for nothing more.
  void Detach(Client* client) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit WorkerPool(const Options& options);

  // Runs call(client) with mu_ released, counted in running_.
  void Call(Client* client, const std::function<void(Client*)>& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunWorker() ABSL_LOCKS_EXCLUDED(mu_);
  void RunTimer() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasTurnLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !turns_.empty() || stop_; }
  bool TimerWakeupLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return timer_wakeup_ || stop_;
  }

  const Clock* const clock_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Clients waiting for a worker, one entry per turn.
  std::deque<Client*> turns_ ABSL_GUARDED_BY(mu_);
  // Wake-ups: each client's, and the same ordered by time.
  std::map<Client*, absl::Time> wake_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, Client*>> wake_by_time_ ABSL_GUARDED_BY(mu_);
  bool timer_wakeup_ ABSL_GUARDED_BY(mu_) = false;  // the earliest wake-up changed
  // Calls in progress per client (RunTurn on a worker, Tick on the timer), for Detach; an entry
  // is erased when its count falls to 0.
  std::map<Client*, int> running_ ABSL_GUARDED_BY(mu_);
  // Clients that Detach is waiting for: no new turn or wake-up is taken for them.
  absl::flat_hash_set<Client*> detaching_ ABSL_GUARDED_BY(mu_);

  std::vector<std::thread> workers_;  // set by Create, joined by the destructor
  std::thread timer_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_WORKER_POOL_H_
