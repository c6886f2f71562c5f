#include "common/clock.h"

#include <atomic>
#include <memory>
#include <vector>

namespace shardcache {

bool Clock::SleepUntil(absl::Time deadline, const CancellationToken& token) const {
  // Shared with the cancellation callback, which may run on another thread until RemoveCallback
  // has returned.
  struct State {
    absl::Mutex mu;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
  };
  auto state = std::make_shared<State>();
  CancellationToken::CallbackId id = token.OnCancelled([state] {
    absl::MutexLock l(&state->mu);
    state->cancelled = true;
  });
  bool cancelled;
  {
    absl::MutexLock l(&state->mu);
    cancelled = AwaitWithDeadline(&state->mu, absl::Condition(&state->cancelled), deadline);
  }
  token.RemoveCallback(id);
  return !cancelled;
}

bool RealClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                  absl::Time deadline) const {
  return mu->AwaitWithDeadline(cond, deadline);
}

// One thread waiting on a FakeClock; on its stack.
struct FakeClock::Waiter {
  Waiter(const absl::Condition* cond, absl::Mutex* mu) : cond(cond), mu(mu) {}

  // The waiter's condition, or the clock has woken it. Evaluated with the waiter's mutex held.
  static bool Ready(Waiter* w) {
    return w->woken.load(std::memory_order_acquire) || w->cond->Eval();
  }

  const absl::Condition* const cond;
  absl::Mutex* const mu;
  // Set by Advance/Set (with the clock's mu_ held), read by Ready.
  std::atomic<bool> woken{false};
  // Advances that picked this waiter and have not finished waking it (guarded by the clock's
  // mu_): the waiter does not leave while it is above zero.
  int pins = 0;
};

FakeClock::~FakeClock() = default;

absl::Time FakeClock::Now() const {
  absl::MutexLock l(&mu_);
  return now_;
}

bool FakeClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                  absl::Time deadline) const {
  mu->AssertHeld();
  if (cond.Eval()) return true;
  Waiter w(&cond, mu);
  {
    absl::MutexLock l(&mu_);
    // Registered under mu_, so an Advance either came before (and is seen here) or sees us.
    if (now_ >= deadline) return false;
    waiters_.emplace(deadline, &w);
  }
  mu->Await(absl::Condition(&Waiter::Ready, &w));
  // Leave: unregister (when not woken by the clock), then wait for the Advances that picked this
  // waiter to be done with it, without holding *mu, which they take.
  bool release;
  {
    absl::MutexLock l(&mu_);
    waiters_.erase({deadline, &w});
    release = w.pins > 0;
  }
  if (release) {
    mu->Unlock();
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](int* pins) { return *pins == 0; }, &w.pins));
    }
    mu->Lock();
  }
  return cond.Eval();
}

void FakeClock::Advance(absl::Duration d) {
  std::vector<Waiter*> due;
  {
    absl::MutexLock l(&mu_);
    now_ += d;
    due = TakeDueLocked();
  }
  Wake(due);
}

void FakeClock::Set(absl::Time t) {
  std::vector<Waiter*> due;
  {
    absl::MutexLock l(&mu_);
    now_ = t;
    due = TakeDueLocked();
  }
  Wake(due);
}

std::vector<FakeClock::Waiter*> FakeClock::TakeDueLocked() {
  std::vector<Waiter*> due;
  while (!waiters_.empty() && waiters_.begin()->first <= now_) {
    Waiter* w = waiters_.begin()->second;
    waiters_.erase(waiters_.begin());
    w->woken.store(true, std::memory_order_release);
    ++w->pins;
    due.push_back(w);
  }
  return due;
}

void FakeClock::Wake(const std::vector<Waiter*>& due) {
  for (Waiter* w : due) {
    // Releasing the waiter's mutex makes absl evaluate its condition, which is now true.
    w->mu->Lock();
    w->mu->Unlock();
    absl::MutexLock l(&mu_);
    --w->pins;  // the last touch: once mu_ is released the waiter may leave
  }
}

size_t FakeClock::Waiters() const {
  absl::MutexLock l(&mu_);
  return waiters_.size();
}

bool FakeClock::AwaitWaiters(size_t n, absl::Duration timeout) const {
  absl::MutexLock l(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiters_.size() >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

absl::Time FakeClock::NextDeadline() const {
  absl::MutexLock l(&mu_);
  return waiters_.empty() ? absl::InfiniteFuture() : waiters_.begin()->first;
}

}  // namespace shardcache
