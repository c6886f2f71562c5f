// Tests of the clocks' waits: FakeClock wakes a waiter when Advance/Set reaches its deadline and
// not before, a condition that turns true wakes it without the clock, a deadline already reached
// returns at once, many waiters wake in deadline order, a waiter may destroy its mutex as soon as
// its wait returns, and a waiter that reads Now() under its own mutex never deadlocks with
// Advance. RealClock waits in real time. Run under ThreadSanitizer by scripts/check.sh.
#include "common/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/cancellation.h"

namespace shardcache {
namespace {

// Long enough never to be reached by a correct clock; bounds every wait of a broken one.
constexpr absl::Duration kTimeout = absl::Seconds(20);

// What one waiting thread shares with the test: its mutex and flag, and what its wait returned.
struct Sleeper {
  absl::Mutex mu;
  bool flag ABSL_GUARDED_BY(mu) = false;
  absl::Notification returned;
  // Written before `returned` is notified.
  bool result = false;
  absl::Time returned_at = absl::InfinitePast();
};

// Starts a thread that waits on `clock` until sleeper->flag or `deadline`.
std::thread StartSleeper(const Clock* clock, std::shared_ptr<Sleeper> sleeper,
                         absl::Time deadline) {
  return std::thread([clock, sleeper = std::move(sleeper), deadline] {
    bool result;
    {
      absl::MutexLock l(&sleeper->mu);
      result = clock->AwaitWithDeadline(&sleeper->mu, absl::Condition(&sleeper->flag), deadline);
    }
    sleeper->result = result;
    sleeper->returned_at = clock->Now();
    sleeper->returned.Notify();
  });
}

TEST(FakeClockTest, Advance_WakesAWaiterOnlyOnceItsDeadlineIsReached) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  auto s = std::make_shared<Sleeper>();
  std::thread t = StartSleeper(&clock, s, start + absl::Seconds(10));
  ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
  EXPECT_EQ(clock.NextDeadline(), start + absl::Seconds(10));

  clock.Advance(absl::Seconds(9));
  // Advance wakes the due waiters before it returns: one still counted was not woken.
  EXPECT_EQ(clock.Waiters(), 1u);
  EXPECT_FALSE(s->returned.HasBeenNotified());

  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(clock.Waiters(), 0u);
  ASSERT_TRUE(s->returned.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_FALSE(s->result) << "the deadline passed; the condition never held";
  EXPECT_EQ(s->returned_at, start + absl::Seconds(10));
  t.join();
}

TEST(FakeClockTest, Set_WakesAWaiterAndBackwardsWakesNobody) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  auto s = std::make_shared<Sleeper>();
  std::thread t = StartSleeper(&clock, s, start + absl::Seconds(5));
  ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
  clock.Set(start - absl::Hours(1));
  EXPECT_EQ(clock.Waiters(), 1u);
  clock.Set(start + absl::Hours(1));
  ASSERT_TRUE(s->returned.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_FALSE(s->result);
  t.join();
}

TEST(FakeClockTest, DeadlineAlreadyReached_ReturnsAtOnceWithTheCondition) {
  FakeClock clock;
  absl::Mutex mu;
  bool flag = false;
  absl::MutexLock l(&mu);
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&flag), clock.Now()));
  EXPECT_FALSE(
      clock.AwaitWithDeadline(&mu, absl::Condition(&flag), clock.Now() - absl::Seconds(1)));
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&flag), absl::InfinitePast()));
  flag = true;
  EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&flag), clock.Now()));
  EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&flag), absl::InfiniteFuture()));
  EXPECT_EQ(clock.Waiters(), 0u);
}

TEST(FakeClockTest, ConditionTurningTrue_WakesTheWaiterWithoutAdvance) {
  FakeClock clock;
  auto s = std::make_shared<Sleeper>();
  std::thread t = StartSleeper(&clock, s, absl::InfiniteFuture());
  ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
  EXPECT_EQ(clock.NextDeadline(), absl::InfiniteFuture());
  {
    absl::MutexLock l(&s->mu);
    s->flag = true;
  }
  ASSERT_TRUE(s->returned.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_TRUE(s->result);
  EXPECT_EQ(clock.Waiters(), 0u) << "a waiter that returned is no longer counted";
  t.join();
}

TEST(FakeClockTest, ManyWaiters_EachWakesWhenTheClockReachesItsOwnDeadline) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  constexpr int kWaiters = 8;
  std::vector<std::shared_ptr<Sleeper>> sleepers;
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    sleepers.push_back(std::make_shared<Sleeper>());
    // Deadlines 1..8 s, started out of order.
    int second = (i * 3) % kWaiters + 1;
    threads.push_back(StartSleeper(&clock, sleepers.back(), start + absl::Seconds(second)));
  }
  ASSERT_TRUE(clock.AwaitWaiters(kWaiters, kTimeout));
  for (int now = 1; now <= kWaiters; ++now) {
    clock.Advance(absl::Seconds(1));
    EXPECT_EQ(clock.Waiters(), static_cast<size_t>(kWaiters - now));
    for (int i = 0; i < kWaiters; ++i) {
      int second = (i * 3) % kWaiters + 1;
      if (second <= now) {
        ASSERT_TRUE(sleepers[i]->returned.WaitForNotificationWithTimeout(kTimeout)) << i;
        EXPECT_EQ(sleepers[i]->returned_at - start, absl::Seconds(second)) << i;
      } else {
        EXPECT_FALSE(sleepers[i]->returned.HasBeenNotified()) << i;
      }
    }
  }
  for (std::thread& t : threads) t.join();
}

TEST(FakeClockTest, ManyWaitersOnOneMutex_OneAdvanceWakesThemAll) {
  FakeClock clock;
  auto mu = std::make_shared<absl::Mutex>();
  std::atomic<int> returned{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&clock, mu, &returned] {
      absl::MutexLock l(mu.get());
      bool never = false;
      clock.AwaitWithDeadline(mu.get(), absl::Condition(&never), clock.Now() + absl::Seconds(1));
      ++returned;
    });
  }
  ASSERT_TRUE(clock.AwaitWaiters(6, kTimeout));
  clock.Advance(absl::Seconds(1));
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(returned.load(), 6);
}

// A waiter owns its mutex and destroys it as soon as its wait returns, which Advance ended: the
// waiter can hold the mutex again while Advance is still inside its Unlock. The clock must not
// touch the mutex after the wait returned (absl's checks, ThreadSanitizer and AddressSanitizer
// see it if it does).
TEST(FakeClockTest, WaiterDestroysItsMutexRightAfterWaking) {
  FakeClock clock;
  for (int round = 0; round < 300; ++round) {
    struct Owned {
      absl::Mutex mu;
      bool flag ABSL_GUARDED_BY(mu) = false;
    };
    auto owned = std::make_unique<Owned>();
    const absl::Time deadline = clock.Now() + absl::Seconds(1);
    absl::Notification done;
    std::thread waiter([&clock, owned = std::move(owned), deadline, &done]() mutable {
      {
        absl::MutexLock l(&owned->mu);
        clock.AwaitWithDeadline(&owned->mu, absl::Condition(&owned->flag), deadline);
      }
      owned.reset();  // at once: the mutex is gone
      done.Notify();
    });
    ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
    clock.Advance(absl::Seconds(1));
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(kTimeout));
    waiter.join();
  }
}

// Lock order: a waiter evaluates a condition that reads Now() with its own mutex held, and other
// threads read Now() under that mutex, while Advance runs over and over. Nothing deadlocks.
TEST(FakeClockTest, WaitersReadingNowUnderTheirMutex_NeverDeadlockWithAdvance) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  const absl::Time until = start + absl::Seconds(200);
  absl::Mutex mu;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      absl::MutexLock l(&mu);
      // True once the clock is past `until`: reads the clock under mu.
      auto past = [&clock, until] { return clock.Now() >= until; };
      while (!past()) {
        clock.AwaitWithDeadline(&mu, absl::Condition(&past), clock.Now() + absl::Seconds(3));
      }
    });
  }
  std::thread reader([&] {
    while (!stop.load()) {
      {
        absl::MutexLock l(&mu);
        (void)clock.Now();
      }
      std::this_thread::yield();
    }
  });
  absl::Time real_deadline = absl::Now() + kTimeout;
  while (clock.Now() < until + absl::Seconds(3) && absl::Now() < real_deadline) {
    clock.Advance(absl::Seconds(1));
  }
  for (std::thread& t : threads) t.join();
  stop = true;
  reader.join();
  EXPECT_GE(clock.Now(), until);
}

TEST(FakeClockTest, AwaitWaiters_TimesOutWhenNobodyWaits) {
  FakeClock clock;
  EXPECT_FALSE(clock.AwaitWaiters(1, absl::Milliseconds(10)));
  EXPECT_TRUE(clock.AwaitWaiters(0, absl::Milliseconds(10)));
  EXPECT_EQ(clock.NextDeadline(), absl::InfiniteFuture());
}

TEST(FakeClockTest, SleepUntil_ReturnsTrueAtTheDeadlineAndFalseWhenCancelled) {
  FakeClock clock;
  CancellationSource source;
  std::atomic<int> result{-1};
  std::thread sleeper(
      [&] { result = clock.SleepUntil(clock.Now() + absl::Seconds(2), source.Token()) ? 1 : 0; });
  ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
  clock.Advance(absl::Seconds(2));
  sleeper.join();
  EXPECT_EQ(result.load(), 1);

  std::thread cancelled(
      [&] { result = clock.SleepUntil(absl::InfiniteFuture(), source.Token()) ? 1 : 0; });
  ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
  source.Cancel();
  cancelled.join();
  EXPECT_EQ(result.load(), 0);

  // Cancelled already: at once.
  EXPECT_FALSE(clock.SleepUntil(absl::InfiniteFuture(), source.Token()));
}

TEST(RealClockTest, AwaitWithDeadline_WaitsInRealTimeOrUntilTheCondition) {
  const Clock* clock = RealClock::Get();
  absl::Mutex mu;
  bool flag = false;
  absl::MutexLock l(&mu);
  absl::Time start = absl::Now();
  EXPECT_FALSE(
      clock->AwaitWithDeadline(&mu, absl::Condition(&flag), start + absl::Milliseconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  flag = true;
  EXPECT_TRUE(clock->AwaitWithDeadline(&mu, absl::Condition(&flag), absl::InfiniteFuture()));

  CancellationSource source;
  source.Cancel();
  EXPECT_FALSE(clock->SleepUntil(absl::InfiniteFuture(), source.Token()));
  CancellationSource never;
  EXPECT_TRUE(clock->SleepUntil(absl::Now() + absl::Milliseconds(5), never.Token()));
}

}  // namespace
}  // namespace shardcache
