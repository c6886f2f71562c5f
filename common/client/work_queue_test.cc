#include "common/client/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::StatusIs;

// Long enough never to be reached by a correct queue; bounds every wait of a broken one.
constexpr absl::Duration kTimeout = absl::Seconds(20);

// A thread whose join is bounded: JoinWithin waits for it to finish, and if it does not, detaches
// it and reports false. The thread's function must own (share) everything it uses, so that a
// detached thread never touches freed memory.
class BoundedThread {
 public:
  explicit BoundedThread(std::function<void()> fn)
      : done_(std::make_shared<absl::Notification>()), thread_([fn = std::move(fn), done = done_] {
          fn();
          done->Notify();
        }) {}
  ~BoundedThread() {
    if (thread_.joinable()) {
      EXPECT_TRUE(JoinWithin(kTimeout)) << "thread did not finish";
    }
  }
  bool Finished() const { return done_->HasBeenNotified(); }
  bool JoinWithin(absl::Duration timeout) {
    if (!done_->WaitForNotificationWithTimeout(timeout)) {
      thread_.detach();
      return false;
    }
    thread_.join();
    return true;
  }

 private:
  std::shared_ptr<absl::Notification> done_;
  std::thread thread_;
};

// Get() for a test's own thread, which must never block: what Get() returns if a key is waiting
// or the queue is shut down, else kNothingWaiting (where Get() would block).
constexpr char kShutDown[] = "<nullopt: shut down>";
constexpr char kNothingWaiting[] = "<nothing waiting: Get() would block>";
std::string GetNow(WorkQueue& q) {
  if (q.Len() == 0 && !q.ShuttingDown()) return kNothingWaiting;
  std::optional<std::string> key = q.Get();
  return key.has_value() ? *key : kShutDown;
}

// The value of a queue's series in the registry: a counter's or gauge's value, a histogram's
// sample count. -1 when absent.
double MetricValue(prometheus::Registry& registry, const std::string& family,
                   const std::string& queue) {
  for (const auto& f : registry.Collect()) {
    if (f.name != family) continue;
    for (const auto& m : f.metric) {
      for (const auto& label : m.label) {
        if (label.name != "name" || label.value != queue) continue;
        switch (f.type) {
          case prometheus::MetricType::Counter:
            return m.counter.value;
          case prometheus::MetricType::Gauge:
            return m.gauge.value;
          case prometheus::MetricType::Histogram:
            return static_cast<double>(m.histogram.sample_count);
          default:
            return -1;
        }
      }
    }
  }
  return -1;
}

double HistogramSum(prometheus::Registry& registry, const std::string& family,
                    const std::string& queue) {
  for (const auto& f : registry.Collect()) {
    if (f.name != family) continue;
    for (const auto& m : f.metric) {
      for (const auto& label : m.label) {
        if (label.name == "name" && label.value == queue) return m.histogram.sample_sum;
      }
    }
  }
  return -1;
}

class WorkQueueTest : public ::testing::Test {
 protected:
  // A queue on the fake clock: its delayed keys come due when the test advances the clock.
  std::shared_ptr<WorkQueue> NewQueue(std::unique_ptr<RateLimiter> limiter = nullptr,
                                      absl::Duration tick_period = absl::Milliseconds(500)) {
    WorkQueue::Options options;
    options.tick_period = tick_period;
    options.name = "test";
    options.clock = &clock_;
    options.rate_limiter = std::move(limiter);
    options.registry = registry_;
    auto queue = WorkQueue::Create(std::move(options));
    EXPECT_THAT(queue, IsOk());
    return std::shared_ptr<WorkQueue>(*std::move(queue));
  }

  double Metric(const std::string& family) { return MetricValue(*registry_, family, "test"); }

  FakeClock clock_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
};

TEST_F(WorkQueueTest, Add_KeyWaitsOnceAndKeysComeInOrder) {
  auto q = NewQueue();
  q->Add("a");
  q->Add("b");
  q->Add("a");
  q->Add("c");
  EXPECT_EQ(q->Len(), 3u);
  EXPECT_EQ(GetNow(*q), "a");
  EXPECT_EQ(GetNow(*q), "b");
  EXPECT_EQ(GetNow(*q), "c");
  EXPECT_EQ(q->Len(), 0u);
}

TEST_F(WorkQueueTest, Add_WhileProcessing_IsHandedOutOnceAfterDone) {
  auto q = NewQueue();
  q->Add("a");
  ASSERT_EQ(GetNow(*q), "a");
  q->Add("a");
  q->Add("a");
  EXPECT_EQ(q->Len(), 0u);  // not available while a worker holds it
  q->Add("b");
  EXPECT_EQ(GetNow(*q), "b");  // other keys are not held up
  q->Done("a");
  EXPECT_EQ(q->Len(), 1u);
  EXPECT_EQ(GetNow(*q), "a");
  q->Done("a");
  q->Done("b");
  EXPECT_EQ(q->Len(), 0u);
}

TEST_F(WorkQueueTest, Done_ForKeyNotProcessing_DoesNothing) {
  auto q = NewQueue();
  q->Add("a");
  q->Done("a");  // never handed out
  q->Done("zzz");
  EXPECT_EQ(q->Len(), 1u);
  EXPECT_EQ(GetNow(*q), "a");
  q->Done("a");
  q->Done("a");
  EXPECT_EQ(q->Len(), 0u);
}

TEST_F(WorkQueueTest, AddAfter_DeliversOnlyOnceTheClockPasses) {
  auto q = NewQueue();
  q->AddAfter("a", absl::Seconds(1));
  EXPECT_EQ(q->Len(), 0u);
  clock_.Advance(absl::Milliseconds(999));
  EXPECT_EQ(q->Len(), 0u);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(q->Len(), 1u);
  EXPECT_EQ(GetNow(*q), "a");
}

// A worker blocked in Get() is handed a delayed key when the clock reaches its time: the ticker
// waits on the clock, and FakeClock::Advance wakes it.
TEST_F(WorkQueueTest, AddAfter_WakesABlockedGetWhenTheClockPasses) {
  auto q = NewQueue(nullptr, absl::Hours(1));  // only the key's time wakes the ticker
  const absl::Time start = clock_.Now();
  auto got = std::make_shared<std::optional<std::string>>();
  BoundedThread getter([q, got] { *got = q->Get(); });
  q->AddAfter("a", absl::Seconds(1));
  // The ticker has seen the key once it waits on the clock for the key's time.
  ASSERT_TRUE(Eventually([&] { return clock_.NextDeadline() == start + absl::Seconds(1); },
                         kTimeout, "the ticker waits for the key's time"));
  clock_.Advance(absl::Milliseconds(999));
  // Advance wakes the waiters it reaches before it returns: the ticker still waiting was not
  // woken, so nothing could have handed the key out.
  EXPECT_EQ(clock_.Waiters(), 1u);
  EXPECT_FALSE(getter.Finished());
  clock_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(getter.JoinWithin(kTimeout));
  EXPECT_EQ(*got, "a");
}

TEST_F(WorkQueueTest, AddAfter_EarlierTimeWinsAndLaterDoesNotPostpone) {
  auto q = NewQueue();
  q->AddAfter("a", absl::Seconds(10));
  q->AddAfter("a", absl::Seconds(2));  // brings it forward
  q->AddAfter("b", absl::Seconds(1));
  q->AddAfter("b", absl::Seconds(5));  // does not postpone
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(q->Len(), 1u);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(q->Len(), 2u);
  EXPECT_EQ(GetNow(*q), "b");
  EXPECT_EQ(GetNow(*q), "a");
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(q->Len(), 0u);  // each was delivered once
}

TEST_F(WorkQueueTest, AddAfter_ZeroOrNegativeDelayAddsAtOnce) {
  auto q = NewQueue();
  q->AddAfter("a", absl::ZeroDuration());
  q->AddAfter("b", -absl::Seconds(1));
  EXPECT_EQ(q->Len(), 2u);
}

TEST_F(WorkQueueTest, AddAfter_KeyAlreadyWaiting_IsNotDuplicated) {
  auto q = NewQueue();
  q->Add("a");
  q->AddAfter("a", absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(q->Len(), 1u);
}

TEST_F(WorkQueueTest, AddRateLimited_DelayGrowsPerFailureAndForgetResetsIt) {
  auto q = NewQueue();  // the default limiter: 5 ms doubling, bucket 10/s burst 100
  // Each failure's delay: not there 1 ms before it, there at it.
  for (absl::Duration delay : {absl::Milliseconds(5), absl::Milliseconds(10),
                               absl::Milliseconds(20), absl::Milliseconds(40)}) {
    q->AddRateLimited("a");
    clock_.Advance(delay - absl::Milliseconds(1));
    ASSERT_EQ(q->Len(), 0u) << delay;
    clock_.Advance(absl::Milliseconds(1));
    ASSERT_EQ(q->Len(), 1u) << delay;
    ASSERT_EQ(GetNow(*q), "a");
    q->Done("a");
  }
  EXPECT_EQ(q->NumRequeues("a"), 4);
  q->Forget("a");
  EXPECT_EQ(q->NumRequeues("a"), 0);
  q->AddRateLimited("a");
  clock_.Advance(absl::Milliseconds(5));
  EXPECT_EQ(q->Len(), 1u);
}

TEST_F(WorkQueueTest, AddRateLimited_UsesTheGivenLimiter) {
  auto limiter = ItemExponentialFailureRateLimiter::Create({absl::Seconds(1), absl::Seconds(2)});
  ASSERT_THAT(limiter, IsOk());
  auto q = NewQueue(*std::move(limiter));
  q->AddRateLimited("a");
  q->AddRateLimited("b");
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(q->Len(), 2u);
  EXPECT_EQ(q->NumRequeues("a"), 1);
}

TEST_F(WorkQueueTest, ShutDown_HandsOutWaitingKeysThenNullopt) {
  auto q = NewQueue();
  q->Add("a");
  q->Add("b");
  q->AddAfter("delayed", absl::Seconds(1));
  q->ShutDown();
  EXPECT_TRUE(q->ShuttingDown());
  q->Add("c");  // ignored
  q->AddRateLimited("d");
  clock_.Advance(absl::Seconds(1));
  // the delayed key was dropped
  EXPECT_EQ(GetNow(*q), "a");
  EXPECT_EQ(GetNow(*q), "b");
  EXPECT_EQ(GetNow(*q), kShutDown);
  EXPECT_EQ(GetNow(*q), kShutDown);
  EXPECT_EQ(q->NumRequeues("d"), 0);
}

TEST_F(WorkQueueTest, ShutDown_KeyAddedBeforeWhileProcessing_IsStillHandedOut) {
  auto q = NewQueue();
  q->Add("a");
  ASSERT_EQ(GetNow(*q), "a");
  q->Add("a");
  q->ShutDown();
  q->Done("a");
  EXPECT_EQ(GetNow(*q), "a");
  q->Done("a");
  EXPECT_EQ(GetNow(*q), kShutDown);
}

TEST_F(WorkQueueTest, ShutDown_WakesEveryBlockedGet) {
  auto q = NewQueue();
  auto nullopts = std::make_shared<std::atomic<int>>(0);
  std::vector<std::unique_ptr<BoundedThread>> getters;
  for (int i = 0; i < 3; ++i) {
    getters.push_back(std::make_unique<BoundedThread>([q, nullopts] {
      if (q->Get() == std::nullopt) ++*nullopts;
    }));
  }
  q->ShutDown();
  for (auto& g : getters) ASSERT_TRUE(g->JoinWithin(kTimeout));
  EXPECT_EQ(nullopts->load(), 3);
}

TEST_F(WorkQueueTest, Get_BlocksUntilAKeyIsAdded) {
  auto q = NewQueue();
  auto got = std::make_shared<std::optional<std::string>>();
  BoundedThread getter([q, got] { *got = q->Get(); });
  EXPECT_FALSE(getter.Finished());
  q->Add("a");
  ASSERT_TRUE(getter.JoinWithin(kTimeout));
  EXPECT_EQ(*got, "a");
}

TEST_F(WorkQueueTest, ShutDownWithDrain_WaitsUntilKeysInFlightAreDone) {
  auto q = NewQueue();
  q->Add("a");
  q->Add("b");
  ASSERT_EQ(GetNow(*q), "a");
  auto tid = std::make_shared<std::atomic<pid_t>>(0);
  BoundedThread drainer([q, tid] {
    *tid = testing::ThisThreadId();
    q->ShutDownWithDrain();
  });
  ASSERT_TRUE(Eventually([&] { return q->ShuttingDown(); }, kTimeout, "the queue shuts down"));
  // "a" is in flight: the drain cannot be over, however long we give it. Once the draining
  // thread sleeps it waits (or it has returned, wrongly).
  ASSERT_TRUE(
      Eventually([&] { return drainer.Finished() || (*tid != 0 && testing::ThreadAsleep(*tid)); },
                 kTimeout, "the drain waits or returns"));
  EXPECT_FALSE(drainer.Finished());
  q->Add("c");                 // ignored
  EXPECT_EQ(GetNow(*q), "b");  // waiting keys are still handed out
  q->Done("a");
  EXPECT_FALSE(drainer.Finished());  // "b" is in flight now
  q->Done("b");
  ASSERT_TRUE(drainer.JoinWithin(kTimeout));
  EXPECT_EQ(GetNow(*q), kShutDown);
}

TEST_F(WorkQueueTest, ShutDown_EndsAWaitingDrain) {
  auto q = NewQueue();
  q->Add("a");
  ASSERT_EQ(GetNow(*q), "a");
  BoundedThread drainer([q] { q->ShutDownWithDrain(); });
  ASSERT_TRUE(Eventually([&] { return q->ShuttingDown(); }, kTimeout, "the queue shuts down"));
  q->ShutDown();
  ASSERT_TRUE(drainer.JoinWithin(kTimeout));
  q->Done("a");
}

TEST_F(WorkQueueTest, ManyWorkers_Process1000KeysEachExactlyOnce) {
  auto q = NewQueue();
  auto counts = std::make_shared<std::map<std::string, int>>();
  auto mu = std::make_shared<absl::Mutex>();
  std::vector<std::unique_ptr<BoundedThread>> workers;
  for (int w = 0; w < 4; ++w) {
    workers.push_back(std::make_unique<BoundedThread>([q, counts, mu] {
      while (std::optional<std::string> key = q->Get()) {
        {
          absl::MutexLock l(mu.get());
          ++(*counts)[*key];
        }
        q->Done(*key);
      }
    }));
  }
  for (int i = 0; i < 1000; ++i) q->Add(absl::StrCat("key-", i));
  ASSERT_TRUE(Eventually(
      [&] {
        absl::MutexLock l(mu.get());
        return counts->size() == 1000;
      },
      kTimeout, "every key is processed"));
  q->ShutDown();
  for (auto& w : workers) ASSERT_TRUE(w->JoinWithin(kTimeout));
  absl::MutexLock l(mu.get());
  for (int i = 0; i < 1000; ++i) EXPECT_EQ((*counts)[absl::StrCat("key-", i)], 1) << i;
}

TEST_F(WorkQueueTest, ManyWorkers_NeverProcessOneKeyConcurrently) {
  auto q = NewQueue();
  struct Shared {
    absl::Mutex mu;
    std::set<std::string> in_flight ABSL_GUARDED_BY(mu);
    std::map<std::string, int> processed ABSL_GUARDED_BY(mu);
    int overlaps ABSL_GUARDED_BY(mu) = 0;
  };
  auto shared = std::make_shared<Shared>();
  std::vector<std::unique_ptr<BoundedThread>> workers;
  for (int w = 0; w < 4; ++w) {
    workers.push_back(std::make_unique<BoundedThread>([q, shared] {
      while (std::optional<std::string> key = q->Get()) {
        {
          absl::MutexLock l(&shared->mu);
          if (!shared->in_flight.insert(*key).second) ++shared->overlaps;
          ++shared->processed[*key];
        }
        std::this_thread::yield();  // widen the window for a second worker
        {
          absl::MutexLock l(&shared->mu);
          shared->in_flight.erase(*key);
        }
        q->Done(*key);
      }
    }));
  }
  constexpr int kAdds = 20000;
  for (int i = 0; i < kAdds; ++i) q->Add(absl::StrCat("key-", i % 20));
  q->ShutDownWithDrain();  // the keys still waiting are handed out before Get says nullopt
  for (auto& w : workers) ASSERT_TRUE(w->JoinWithin(kTimeout));
  EXPECT_EQ(q->Len(), 0u);
  absl::MutexLock l(&shared->mu);
  EXPECT_EQ(shared->overlaps, 0);
  EXPECT_EQ(shared->processed.size(), 20u);
  int total = 0;
  for (const auto& [key, n] : shared->processed) total += n;
  EXPECT_LE(total, kAdds);
}

TEST_F(WorkQueueTest, Metrics_DepthAddsRetriesAndDurations) {
  auto q = NewQueue();
  q->Add("a");
  q->Add("a");
  q->Add("b");
  EXPECT_EQ(Metric("shardcache_workqueue_adds_total"), 2);
  EXPECT_EQ(Metric("shardcache_workqueue_depth"), 2);

  clock_.Advance(absl::Seconds(1));
  ASSERT_EQ(GetNow(*q), "a");
  EXPECT_EQ(Metric("shardcache_workqueue_depth"), 1);
  EXPECT_EQ(Metric("shardcache_workqueue_queue_duration_seconds"), 1);
  EXPECT_DOUBLE_EQ(HistogramSum(*registry_, "shardcache_workqueue_queue_duration_seconds", "test"),
                   1.0);

  // The ticker refreshes the gauges when the clock passes its tick period.
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(
      Eventually([&] { return Metric("shardcache_workqueue_unfinished_work_seconds") == 3.0; },
                 kTimeout, "unfinished work is 3 s"));
  EXPECT_DOUBLE_EQ(Metric("shardcache_workqueue_longest_running_processor_seconds"), 3.0);
  q->Done("a");
  EXPECT_EQ(Metric("shardcache_workqueue_work_duration_seconds"), 1);
  EXPECT_DOUBLE_EQ(HistogramSum(*registry_, "shardcache_workqueue_work_duration_seconds", "test"),
                   3.0);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(
      Eventually([&] { return Metric("shardcache_workqueue_unfinished_work_seconds") == 0; },
                 kTimeout, "no unfinished work"));

  q->AddAfter("c", absl::Seconds(1));
  q->AddRateLimited("d");
  EXPECT_EQ(Metric("shardcache_workqueue_retries_total"), 2);
  EXPECT_EQ(Metric("shardcache_workqueue_adds_total"), 2);  // not added yet
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(q->Len(), 3u);  // c and d are due: waiting for whoever looks
  EXPECT_EQ(Metric("shardcache_workqueue_adds_total"), 4);
  EXPECT_EQ(Metric("shardcache_workqueue_depth"), 3);  // b, c, d
}

TEST_F(WorkQueueTest, Metrics_AQueueCreatedAgainUnderItsNameContinuesTheSeries) {
  {
    auto q = NewQueue();
    q->Add("a");
    q->Add("b");
    EXPECT_EQ(Metric("shardcache_workqueue_depth"), 2);
  }
  EXPECT_EQ(Metric("shardcache_workqueue_depth"), 0);  // the keys left went with the queue
  auto q = NewQueue();
  q->Add("a");
  EXPECT_EQ(Metric("shardcache_workqueue_depth"), 1);
  EXPECT_EQ(Metric("shardcache_workqueue_adds_total"), 3);
}

TEST_F(WorkQueueTest, Metrics_NullRegistryDisablesThem) {
  WorkQueue::Options options;
  options.clock = &clock_;
  auto q = WorkQueue::Create(std::move(options));
  ASSERT_THAT(q, IsOk());
  (*q)->Add("a");
  ASSERT_EQ(GetNow(**q), "a");
  (*q)->Done("a");
  clock_.Advance(absl::Seconds(1));  // a tick period: the ticker would refresh the gauges
  ASSERT_TRUE(clock_.AwaitWaiters(1, kTimeout));
  EXPECT_TRUE(registry_->Collect().empty());
}

TEST_F(WorkQueueTest, Create_RejectsBadOptions) {
  WorkQueue::Options no_name;
  no_name.registry = registry_;
  EXPECT_THAT(WorkQueue::Create(std::move(no_name)), StatusIs(absl::StatusCode::kInvalidArgument));
  WorkQueue::Options no_clock;
  no_clock.clock = nullptr;
  EXPECT_THAT(WorkQueue::Create(std::move(no_clock)), StatusIs(absl::StatusCode::kInvalidArgument));
  WorkQueue::Options no_period;
  no_period.tick_period = absl::ZeroDuration();
  EXPECT_THAT(WorkQueue::Create(std::move(no_period)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A name taken by a metric of another type.
  prometheus::BuildCounter().Name("shardcache_workqueue_depth").Register(*registry_);
  WorkQueue::Options clash;
  clash.name = "x";
  clash.registry = registry_;
  EXPECT_THAT(WorkQueue::Create(std::move(clash)), StatusIs(absl::StatusCode::kInvalidArgument));
}

// The production path: the ticker thread, on the real clock, wakes a blocked Get() when a delayed
// key is due.
TEST(WorkQueueTickerTest, RealClock_DeliversDelayedKeyWhenDue) {
  WorkQueue::Options options;
  options.tick_period = absl::Seconds(30);  // so only the due time can wake the ticker in time
  auto created = WorkQueue::Create(std::move(options));
  ASSERT_THAT(created, IsOk());
  std::shared_ptr<WorkQueue> q(*std::move(created));
  absl::Time start = absl::Now();
  q->AddAfter("a", absl::Milliseconds(20));
  auto got = std::make_shared<std::optional<std::string>>();
  BoundedThread getter([q, got] { *got = q->Get(); });
  bool finished = getter.JoinWithin(absl::Seconds(10));
  if (!finished) q->ShutDown();  // unblocks the detached getter, which shares the queue
  ASSERT_TRUE(finished);
  EXPECT_EQ(*got, "a");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
}

}  // namespace
}  // namespace shardcache
