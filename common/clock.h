// Clock: the source of "now", and of every timed wait, for everything timing-sensitive (leases,
// backoff, resync, liveness, delayed work), so that tests can control time.
//
//   absl::MutexLock l(&mu_);
//   // Sleeps until stop_ is set or the clock reaches `deadline`, whichever comes first.
//   bool stopped = clock->AwaitWithDeadline(&mu_, absl::Condition(&stop_), deadline);
//
// RealClock reads the system clock and waits in real time. FakeClock only moves when a test calls
// Advance or Set, and those wake the waiters whose deadline the new time has reached. Code that
// waits for time to pass does it through its Clock, never with absl's own timed waits, so that one
// scheme serves production and tests.
//
// Thread-safe: every method of every clock may be called from any thread.
//
// How FakeClock wakes a waiter, and why it cannot deadlock or touch freed memory:
// - A waiter holds its own mutex `mu` and calls AwaitWithDeadline, which registers it (under the
//   clock's internal mutex) and waits in mu->Await on "cond, or woken by the clock". A waiter that
//   reads Now() while holding `mu` takes the clock's mutex after `mu`: the order is always
//   waiter's mutex, then the clock's.
// - Advance/Set move the time and pick the due waiters under the clock's mutex, mark each woken
//   (an atomic flag the waiter's condition reads) and pin it; then, with the clock's mutex
//   RELEASED, lock and unlock each due waiter's `mu`, which makes absl re-evaluate the waiter's
//   condition and wake it. So Advance never holds the clock's mutex while taking a waiter's.
// - A waiter leaves only when no Advance pins it: if one does, it releases `mu` (the pinning
//   Advance may need it), waits on the clock's mutex for the pin to go, and takes `mu` again. So
//   Advance never touches a waiter's mutex (or its registration) after AwaitWithDeadline returned,
//   and an owner may destroy `mu` as soon as the wait returns.
// - The clock must outlive every wait on it.
#ifndef SHARDCACHE_COMMON_CLOCK_H_
#define SHARDCACHE_COMMON_CLOCK_H_

#include <cstddef>
#include <set>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cancellation.h"

namespace shardcache {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // Waits until `cond` holds or this clock reaches `deadline` (absl::InfiniteFuture(): no
  // deadline), and returns whether `cond` holds. Returns at once when `cond` holds or the
  // deadline has been reached already. As absl::Mutex::Await, it releases *mu while it waits and
  // holds it again when it returns; `cond` is evaluated with *mu held, and is re-evaluated when
  // *mu is released by another thread (so whatever makes it true must change under *mu).
  // REQUIRES: *mu is held by the caller, and is not held by a thread that moves a FakeClock.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                 absl::Time deadline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // Sleeps until this clock reaches `deadline` or `token` is cancelled. Returns true when the
  // deadline was reached, false when cancelled (also when cancelled already).
  bool SleepUntil(absl::Time deadline, const CancellationToken& token) const;
};

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override;
  // A process-wide instance; never destroyed.
  static RealClock* Get() {
    static RealClock* clock = new RealClock();
    return clock;
  }
};

// A clock for tests: time stands still until Advance or Set, which wake the waiters that the new
// time has reached before they return (each is then runnable; it has not necessarily run yet).
// Set may move time backwards; that wakes nobody. Tests learn that code has gone back to waiting
// with Waiters() / AwaitWaiters (as clockwork's BlockUntil): a waiter woken by Advance stops
// counting at once, and counts again when it waits again.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  // REQUIRES: nobody waits on this clock.
  ~FakeClock() override;

  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_);
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_LOCKS_EXCLUDED(mu_) override;

  // Moves time forward by `d` (Set(Now() + d)).
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves time to `t` and wakes every waiter whose deadline is at or before `t`.
  // REQUIRES: the caller holds no mutex that a waiter of this clock waits with.
  void Set(absl::Time t) ABSL_LOCKS_EXCLUDED(mu_);

  // Threads waiting on this clock now (neither woken by Advance/Set nor returned).
  size_t Waiters() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until at least `n` threads wait on this clock, for at most `timeout` of real time.
  // Returns whether they do.
  bool AwaitWaiters(size_t n, absl::Duration timeout = absl::Seconds(30)) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The earliest deadline of the threads waiting now (absl::InfiniteFuture() when none has one).
  absl::Time NextDeadline() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiter;

  // Unregisters the waiters whose deadline now_ has reached, marks them woken and pins them.
  std::vector<Waiter*> TakeDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the waiters TakeDueLocked returned, and unpins them. Takes each waiter's mutex.
  void Wake(const std::vector<Waiter*>& due) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  // The registered waiters (each lives on its waiting thread's stack), by deadline.
  mutable std::set<std::pair<absl::Time, Waiter*>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLOCK_H_
