#include "common/client/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/client/work_queue.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::StatusIs;
using ::shardcache::testing::ThreadsOfThisProcess;

constexpr absl::Duration kTimeout = absl::Seconds(20);

std::unique_ptr<WorkerPool> MakePool(int threads, const Clock* clock = RealClock::Get()) {
  WorkerPool::Options o;
  o.threads = threads;
  o.clock = clock;
  absl::StatusOr<std::unique_ptr<WorkerPool>> pool = WorkerPool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

std::unique_ptr<WorkQueue> MakeQueue(WorkerPool* pool, const Clock* clock = RealClock::Get()) {
  WorkQueue::Options o;
  o.pool = pool;
  o.clock = clock;
  absl::StatusOr<std::unique_ptr<WorkQueue>> queue = WorkQueue::Create(std::move(o));
  EXPECT_TRUE(queue.ok()) << queue.status();
  return *std::move(queue);
}

TEST(WorkerPoolTest, RefusesBadOptions) {
  WorkerPool::Options o;
  o.threads = 0;
  EXPECT_THAT(WorkerPool::Create(o), StatusIs(absl::StatusCode::kInvalidArgument));
  o.threads = 1;
  o.clock = nullptr;
  EXPECT_THAT(WorkerPool::Create(o), StatusIs(absl::StatusCode::kInvalidArgument));

  FakeClock fake;
  std::unique_ptr<WorkerPool> pool = MakePool(1, &fake);
  WorkQueue::Options q;
  q.pool = pool.get();  // on the fake clock, the queue on the real one
  EXPECT_THAT(WorkQueue::Create(std::move(q)), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Every key of every queue is processed once, never more than the pool's threads at once
// overall, nor more than a queue's max_parallel of that queue's.
TEST(WorkerPoolTest, BoundsConcurrencyOverallAndPerQueue) {
  constexpr int kThreads = 3;
  constexpr int kQueues = 20;
  constexpr int kKeys = 200;
  constexpr int kMaxParallel = 2;
  std::unique_ptr<WorkerPool> pool = MakePool(kThreads);
  std::atomic<int> running{0}, peak{0}, processed{0};
  struct PerQueue {
    std::atomic<int> running{0}, peak{0};
  };
  std::vector<PerQueue> per(kQueues);
  std::vector<std::unique_ptr<WorkQueue>> queues;
  for (int q = 0; q < kQueues; ++q) {
    queues.push_back(MakeQueue(pool.get()));
    queues.back()->Process(kMaxParallel, [&, q](const std::string&) {
      int now = ++running;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {
      }
      int mine = ++per[q].running;
      int pp = per[q].peak.load();
      while (mine > pp && !per[q].peak.compare_exchange_weak(pp, mine)) {
      }
      absl::SleepFor(absl::Microseconds(50));
      --per[q].running;
      --running;
      ++processed;
    });
  }
  for (int k = 0; k < kKeys; ++k) {
    for (auto& queue : queues) queue->Add(absl::StrCat("key-", k));
  }
  ASSERT_TRUE(Eventually([&] { return processed.load() == kQueues * kKeys; }, kTimeout,
                         "every key of every queue processed"))
      << processed.load();
  EXPECT_LE(peak.load(), kThreads);
  EXPECT_GE(peak.load(), 2);  // the pool does run keys side by side
  for (int q = 0; q < kQueues; ++q) EXPECT_LE(per[q].peak.load(), kMaxParallel) << q;
  for (auto& queue : queues) queue->ShutDownAndWait();
}

// One thread: a queue with a long backlog does not hold back another queue's key for longer
// than one key of its own.
TEST(WorkerPoolTest, AQueueWithABacklogDoesNotStarveAnother) {
  std::unique_ptr<WorkerPool> pool = MakePool(1);
  std::unique_ptr<WorkQueue> busy = MakeQueue(pool.get());
  std::unique_ptr<WorkQueue> other = MakeQueue(pool.get());
  absl::Mutex mu;
  std::vector<std::string> order;
  absl::Notification first_started, release;
  busy->Process(1, [&](const std::string& key) {
    if (key == "b0") {
      first_started.Notify();
      release.WaitForNotificationWithTimeout(kTimeout);
    }
    absl::MutexLock l(&mu);
    order.push_back(key);
  });
  other->Process(1, [&](const std::string& key) {
    absl::MutexLock l(&mu);
    order.push_back(key);
  });
  for (int i = 0; i < 1000; ++i) busy->Add(absl::StrCat("b", i));
  ASSERT_TRUE(first_started.WaitForNotificationWithTimeout(kTimeout));
  other->Add("o");
  release.Notify();
  ASSERT_TRUE(Eventually(
      [&] {
        absl::MutexLock l(&mu);
        return order.size() == 1001;
      },
      kTimeout, "all 1001 keys processed"));
  absl::MutexLock l(&mu);
  size_t at = std::find(order.begin(), order.end(), "o") - order.begin();
  EXPECT_LE(at, 2u) << "the other queue's key waited behind " << at << " keys";
}

// A key added while it is processed is processed again after, once.
TEST(WorkerPoolTest, AKeyAddedWhileProcessingIsProcessedAgainOnce) {
  std::unique_ptr<WorkerPool> pool = MakePool(4);
  std::unique_ptr<WorkQueue> queue = MakeQueue(pool.get());
  std::atomic<int> calls{0};
  absl::Notification started, release;
  queue->Process(4, [&](const std::string&) {
    if (++calls == 1) {
      started.Notify();
      release.WaitForNotificationWithTimeout(kTimeout);
    }
  });
  queue->Add("k");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(kTimeout));
  queue->Add("k");
  queue->Add("k");
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(calls.load(), 1);  // never twice at once, though 4 may run
  release.Notify();
  ASSERT_TRUE(Eventually([&] { return calls.load() == 2; }, kTimeout, "two calls"));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(calls.load(), 2);
}

// Delayed keys wait for the pool's clock, which a test moves.
TEST(WorkerPoolTest, DelayedKeysWaitForTheClock) {
  FakeClock clock;
  std::unique_ptr<WorkerPool> pool = MakePool(2, &clock);
  std::unique_ptr<WorkQueue> queue = MakeQueue(pool.get(), &clock);
  absl::Mutex mu;
  std::vector<std::string> done;
  queue->Process(1, [&](const std::string& key) {
    absl::MutexLock l(&mu);
    done.push_back(key);
  });
  auto processed = [&] {
    absl::MutexLock l(&mu);
    return done;
  };
  queue->AddAfter("late", absl::Seconds(10));
  queue->AddAfter("early", absl::Seconds(5));
  queue->AddRateLimited("backoff");  // the default limiter: 5 ms
  ASSERT_TRUE(clock.AwaitWaiters(1));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(processed().empty());
  clock.Advance(absl::Milliseconds(5));
  ASSERT_TRUE(Eventually([&] { return processed().size() == 1; }, kTimeout, "1 keys processed"));
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE(Eventually([&] { return processed().size() == 2; }, kTimeout, "2 keys processed"));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(processed().size(), 2u);
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE(Eventually([&] { return processed().size() == 3; }, kTimeout, "3 keys processed"));
  EXPECT_EQ(processed(), (std::vector<std::string>{"backoff", "early", "late"}));
  queue.reset();  // detaches from the timer before the clock goes
}

// ShutDownAndWait waits for the key in progress, drops the waiting ones, and nothing is
// processed after it returns; the pool goes on serving the other queues.
TEST(WorkerPoolTest, ShutDownAndWaitProcessesNothingAfterItReturns) {
  std::unique_ptr<WorkerPool> pool = MakePool(2);
  std::unique_ptr<WorkQueue> queue = MakeQueue(pool.get());
  std::unique_ptr<WorkQueue> other = MakeQueue(pool.get());
  std::atomic<int> calls{0};
  std::atomic<bool> returned{false};
  std::atomic<bool> after{false};
  absl::Notification started, release;
  queue->Process(1, [&](const std::string&) {
    if (returned) after = true;
    if (++calls == 1) {
      started.Notify();
      release.WaitForNotificationWithTimeout(kTimeout);
    }
  });
  for (int i = 0; i < 100; ++i) queue->Add(absl::StrCat(i));
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(kTimeout));
  queue->Add("0");  // the key in progress again: dropped too
  std::thread stopper([&] {
    queue->ShutDownAndWait();
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(returned.load()) << "returned while a key was in progress";
  release.Notify();
  stopper.join();
  EXPECT_EQ(calls.load(), 1);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(after.load());
  EXPECT_EQ(calls.load(), 1);
  std::atomic<int> other_calls{0};
  other->Process(1, [&](const std::string&) { ++other_calls; });
  other->Add("x");
  EXPECT_TRUE(
      Eventually([&] { return other_calls.load() == 1; }, kTimeout, "the other queue's key"));
}

// Queues created and destroyed with keys waiting and delayed, while the pool runs them: no
// call reaches a destroyed queue (run under ThreadSanitizer and AddressSanitizer too).
TEST(WorkerPoolTest, QueuesComeAndGoWhileThePoolRuns) {
  std::unique_ptr<WorkerPool> pool = MakePool(3);
  std::atomic<int64_t> calls{0};
  for (int round = 0; round < 50; ++round) {
    std::vector<std::unique_ptr<WorkQueue>> queues;
    for (int q = 0; q < 5; ++q) {
      queues.push_back(MakeQueue(pool.get()));
      queues.back()->Process(2, [&](const std::string&) { ++calls; });
      for (int k = 0; k < 50; ++k) queues.back()->Add(absl::StrCat(k));
      queues.back()->AddAfter("later", absl::Milliseconds(round % 3));
    }
    absl::SleepFor(absl::Microseconds(200 * (round % 4)));
    queues.clear();
  }
  EXPECT_GT(calls.load(), 0);
}

// The threads are the pool's, whatever the number of queues.
TEST(WorkerPoolTest, QueuesAddNoThreads) {
  std::unique_ptr<WorkerPool> pool = MakePool(4);
  int before = ThreadsOfThisProcess();
  ASSERT_GT(before, 0);
  std::atomic<int> calls{0};
  std::vector<std::unique_ptr<WorkQueue>> queues;
  for (int q = 0; q < 200; ++q) {
    queues.push_back(MakeQueue(pool.get()));
    queues.back()->Process(4, [&](const std::string&) { ++calls; });
    queues.back()->Add("k");
    queues.back()->AddAfter("d", absl::Milliseconds(1));
  }
  ASSERT_TRUE(Eventually([&] { return calls.load() == 400; }, kTimeout, "400 calls"));
  EXPECT_EQ(ThreadsOfThisProcess(), before);
}

// A Client that detaches itself from inside its own turn (as an informer's handler that removes
// itself does): Detach returns at once, and the pool never calls it again.
TEST(WorkerPoolTest, DetachFromInsideItsOwnTurnReturnsAtOnce) {
  // One worker, busy with the client's turn: the turn it queues cannot start before the Detach.
  FakeClock clock;
  std::unique_ptr<WorkerPool> pool = MakePool(1, &clock);
  struct SelfDetaching final : WorkerPool::Client {
    WorkerPool* pool = nullptr;
    const Clock* clock = nullptr;
    std::atomic<int> turns{0};
    std::atomic<int> ticks{0};
    absl::Notification detached;
    void RunTurn() override {
      if (++turns > 1) return;
      pool->Schedule(this);                                 // queued, then dropped by Detach
      pool->WakeAt(this, clock->Now() + absl::Seconds(1));  // likewise
      pool->Detach(this);
      detached.Notify();
    }
    void Tick(absl::Time) override { ++ticks; }
  };
  SelfDetaching client;
  client.pool = pool.get();
  client.clock = &clock;
  pool->Schedule(&client);
  ASSERT_TRUE(client.detached.WaitForNotificationWithTimeout(kTimeout));
  // Another client's turns and wake-ups still run, after the dropped ones' time: the pool is not
  // stuck, and the detached client is not called.
  std::unique_ptr<WorkQueue> queue = MakeQueue(pool.get(), &clock);
  std::atomic<int> calls{0};
  queue->Process(1, [&](const std::string&) { ++calls; });
  queue->AddAfter("k", absl::Seconds(2));
  clock.Advance(absl::Seconds(2));
  ASSERT_TRUE(Eventually([&] { return calls.load() == 1; }, kTimeout, "the other queue's key"));
  queue->Add("k2");
  ASSERT_TRUE(Eventually([&] { return calls.load() == 2; }, kTimeout, "the other queue's key 2"));
  EXPECT_EQ(client.turns.load(), 1);
  EXPECT_EQ(client.ticks.load(), 0);
  pool->Detach(&client);  // from outside, after: nothing to wait for
  queue.reset();
}

}  // namespace
}  // namespace shardcache
