#include "cache_server/watch_cache.h"

#include <gmock/gmock.h>
#include <grpcpp/alarm.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "cache_server/testing/fake_watcher.h"
#include "common/clock.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::testing::ElementsAre;

using ::shardcache::testing::FakeHistory;
using ::shardcache::testing::FakeWatcher;
using ::shardcache::testing::MakeEvent;
using ::shardcache::testing::Spec;
using ::shardcache::testing::WithBookmarks;

class WatchCacheTest : public ::testing::Test {
 protected:
  StoreMetrics metrics_{std::make_shared<prometheus::Registry>()};
};

TEST_F(WatchCacheTest, Dispatch_SkipsEventsAtOrBeforeStart) {
  WatchCache cache({absl::Seconds(60)}, &metrics_);
  FakeWatcher w(Spec(5));
  ASSERT_TRUE(cache.Register(&w).ok());
  cache.Publish({MakeEvent(5, v1::WatchEvent::ADDED, "old", "web"),
                 MakeEvent(6, v1::WatchEvent::ADDED, "new", "web")});
  EXPECT_THAT(w.WaitFor(1), ElementsAre("ADDED new web"));
  cache.Unregister(&w);
}

TEST_F(WatchCacheTest, Dispatch_FilterCrossingChangesType) {
  WatchCache cache({absl::Seconds(60)}, &metrics_);
  FakeWatcher w(Spec(0, "app=web"));
  ASSERT_TRUE(cache.Register(&w).ok());
  cache.Publish({MakeEvent(2, v1::WatchEvent::MODIFIED, "a", "web", "db"),
                 MakeEvent(3, v1::WatchEvent::MODIFIED, "a", "web", "web"),
                 MakeEvent(4, v1::WatchEvent::MODIFIED, "a", "db", "web"),
                 MakeEvent(5, v1::WatchEvent::MODIFIED, "a", "db", "db"),
                 MakeEvent(6, v1::WatchEvent::ADDED, "b", "web")});
  // The DELETED of an object that stopped matching carries its last matching state.
  EXPECT_THAT(w.WaitFor(4),
              ElementsAre("ADDED a web", "MODIFIED a web", "DELETED a web", "ADDED b web"));
  cache.Unregister(&w);
}

TEST_F(WatchCacheTest, ResourceGone_EndsAfterEarlierEvents) {
  WatchCache cache({absl::Seconds(60)}, &metrics_);
  FakeWatcher w1(Spec(0));
  WatchSpec other = Spec(0);
  other.group_resource = "example.com/gadgets";
  FakeWatcher w2(other);
  ASSERT_TRUE(cache.Register(&w1).ok());
  ASSERT_TRUE(cache.Register(&w2).ok());
  cache.Publish({MakeEvent(2, v1::WatchEvent::DELETED, "a", "web")});
  cache.PublishResourceGone("example.com/widgets", "", 2, absl::NotFoundError("gone"));
  EXPECT_THAT(w1.WaitFor(2), ElementsAre("DELETED a web", "END NOT_FOUND"));
  // The ended watcher left; the other resource's watcher stays, untouched.
  EXPECT_EQ(cache.watcher_count(), 1u);
  cache.Unregister(&w1);  // a second removal is harmless
  cache.Unregister(&w2);
  EXPECT_TRUE(w2.WaitFor(0).empty());
}

TEST_F(WatchCacheTest, Bookmarks_CarryDispatchedRevision) {
  WatchCache cache({absl::Milliseconds(20)}, &metrics_);
  FakeWatcher w(WithBookmarks(Spec(3)));
  ASSERT_TRUE(cache.Register(&w).ok());
  EXPECT_EQ(w.WaitFor(1).front(), "BOOKMARK 3");
  cache.Publish({MakeEvent(4, v1::WatchEvent::ADDED, "a", "web")});
  std::vector<std::string> seen;
  for (int i = 0; i < 100 && (seen.empty() || seen.back() != "BOOKMARK 4"); ++i) {
    seen = w.WaitFor(seen.size() + 1);
  }
  EXPECT_EQ(seen.back(), "BOOKMARK 4");
  cache.Unregister(&w);
}

size_t CountOf(const std::vector<std::string>& seen, absl::string_view prefix) {
  size_t n = 0;
  for (const std::string& s : seen) n += absl::StartsWith(s, prefix) ? 1 : 0;
  return n;
}

// One dispatcher on a FakeClock, with bookmarks every 10 s: one bookmark slot a second.
WatchCache::Options OnFakeClock(FakeClock* clock) {
  WatchCache::Options o;
  o.bookmark_interval = absl::Seconds(10);
  o.dispatchers = 1;
  o.clock = clock;
  return o;
}

// Moves the clock by one bookmark slot and waits until the dispatcher has done that slot's work
// and waits again.
void StepOneSlot(FakeClock* clock) {
  clock->Advance(absl::Seconds(1));
  ASSERT_TRUE(clock->AwaitWaiters(1)) << "the dispatcher did not wait again";
}

TEST_F(WatchCacheTest, Bookmarks_OnlyForWatchersThatWereSentNothing) {
  FakeClock clock;
  WatchCache cache(OnFakeClock(&clock), &metrics_);
  FakeWatcher busy(WithBookmarks(Spec(0, "app=web")));
  FakeWatcher idle(WithBookmarks(Spec(0, "app=db")));
  ASSERT_TRUE(cache.Register(&busy).ok());
  ASSERT_TRUE(cache.Register(&idle).ok());
  ASSERT_TRUE(clock.AwaitWaiters(1));
  // 40 s: every second an event that only `busy` sees.
  for (int second = 1; second <= 40; ++second) {
    cache.Publish({MakeEvent(second, v1::WatchEvent::ADDED, absl::StrCat("w", second), "web")});
    ASSERT_EQ(CountOf(busy.WaitFor(static_cast<size_t>(second)), "ADDED"),
              static_cast<size_t>(second));
    ASSERT_TRUE(clock.AwaitWaiters(1));
    ASSERT_NO_FATAL_FAILURE(StepOneSlot(&clock));
  }
  EXPECT_EQ(CountOf(busy.WaitFor(0), "BOOKMARK"), 0u) << "events told it how far it has seen";
  // Idle, it is looked at once every 10 s and gets a bookmark each time.
  size_t idle_bookmarks = CountOf(idle.WaitFor(0), "BOOKMARK");
  EXPECT_GE(idle_bookmarks, 3u);
  EXPECT_LE(idle_bookmarks, 4u);
  // At the revision dispatched when it was sent (the events it did not see count too).
  int64_t last = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripPrefix(idle.WaitFor(0).back(), "BOOKMARK "), &last));
  EXPECT_GT(last, 30);
  cache.Unregister(&busy);
  cache.Unregister(&idle);
}

TEST_F(WatchCacheTest, Bookmarks_OfIdleWatchers_AreSpreadOverTheInterval) {
  FakeClock clock;
  WatchCache cache(OnFakeClock(&clock), &metrics_);
  std::vector<std::unique_ptr<FakeWatcher>> watchers;
  for (int i = 0; i < 40; ++i) {
    watchers.push_back(std::make_unique<FakeWatcher>(WithBookmarks(Spec(0))));
    ASSERT_TRUE(cache.Register(watchers.back().get()).ok());
  }
  ASSERT_TRUE(clock.AwaitWaiters(1));
  auto total = [&] {
    size_t n = 0;
    for (auto& w : watchers) n += CountOf(w->WaitFor(0), "BOOKMARK");
    return n;
  };
  size_t before = 0;
  for (int second = 1; second <= 25; ++second) {
    ASSERT_NO_FATAL_FAILURE(StepOneSlot(&clock));
    size_t now = total();
    // 40 watchers in 10 slots: 4 a slot, never all at once.
    EXPECT_LE(now - before, 4u) << "at second " << second;
    before = now;
  }
  for (auto& w : watchers) {
    EXPECT_GE(CountOf(w->WaitFor(0), "BOOKMARK"), 2u) << "every idle watcher hears, every 10 s";
  }
  for (auto& w : watchers) cache.Unregister(w.get());
}

TEST_F(WatchCacheTest, Shutdown_EndsWatchersAndRefusesNew) {
  WatchCache cache({absl::Seconds(60)}, &metrics_);
  FakeWatcher w(Spec(0));
  ASSERT_TRUE(cache.Register(&w).ok());
  // The fake does not unregister itself, so Shutdown reports it as left over.
  EXPECT_EQ(cache.Shutdown(absl::Milliseconds(50)), 1u);
  EXPECT_THAT(w.WaitFor(1), ElementsAre("END UNAVAILABLE"));
  FakeWatcher late(Spec(0));
  EXPECT_EQ(cache.Register(&late).code(), absl::StatusCode::kUnavailable);
  cache.Unregister(&w);
}

TEST_F(WatchCacheTest, ResourceGone_SparesWatchersThatStartedAfterIt) {
  WatchCache cache({absl::Seconds(60)}, &metrics_);
  FakeWatcher old_watcher(Spec(1));
  FakeWatcher new_watcher(Spec(5));  // registered after the resource came back at revision 5
  ASSERT_TRUE(cache.Register(&old_watcher).ok());
  ASSERT_TRUE(cache.Register(&new_watcher).ok());
  cache.PublishResourceGone("example.com/widgets", "", 4, absl::NotFoundError("gone"));
  cache.Publish({MakeEvent(6, v1::WatchEvent::ADDED, "a", "web")});
  EXPECT_THAT(old_watcher.WaitFor(1), ElementsAre("END NOT_FOUND"));
  EXPECT_THAT(new_watcher.WaitFor(1), ElementsAre("ADDED a web"));
  cache.Unregister(&old_watcher);
  cache.Unregister(&new_watcher);
}

TEST_F(WatchCacheTest, Dispatchers_ShareTheWatchers_EachGetsEveryEventInOrder) {
  WatchCache::Options options{absl::Seconds(60)};
  options.dispatchers = 3;
  WatchCache cache(options, &metrics_);
  std::vector<std::unique_ptr<FakeWatcher>> watchers;
  for (int i = 0; i < 7; ++i) {
    watchers.push_back(std::make_unique<FakeWatcher>(Spec(0)));
    ASSERT_TRUE(cache.Register(watchers.back().get()).ok());
  }
  std::vector<std::string> want;
  for (int batch = 0; batch < 10; ++batch) {
    std::vector<EventPtr> events;
    for (int i = 0; i < 5; ++i) {
      std::string name = absl::StrCat("o", batch * 5 + i);
      events.push_back(MakeEvent(batch * 5 + i + 1, v1::WatchEvent::ADDED, name, "web"));
      want.push_back(absl::StrCat("ADDED ", name, " web"));
    }
    cache.Publish(std::move(events));
  }
  for (auto& w : watchers) EXPECT_EQ(w->WaitFor(want.size()), want);
  EXPECT_EQ(cache.watcher_count(), 7u);
  for (auto& w : watchers) cache.Unregister(w.get());
  EXPECT_EQ(cache.watcher_count(), 0u);
}

// A watcher that takes nothing holds nobody up: Publish returns at once, the other watcher gets
// every event, and the parked one is caught up from the history once it reads.
TEST_F(WatchCacheTest, Publish_NeverWaitsForAWatcher_AFullOneIsCaughtUpFromTheHistory) {
  WatchCache cache({absl::Seconds(60)}, &metrics_);
  FakeHistory history;
  cache.SetHistory(&history);
  FakeWatcher full(Spec(0), /*capacity=*/100);
  FakeWatcher reader(Spec(0));
  ASSERT_TRUE(cache.Register(&full).ok());
  ASSERT_TRUE(cache.Register(&reader).ok());
  std::vector<std::string> want;
  for (int i = 1; i <= 2000; ++i) {
    std::string name = absl::StrCat("o", i);
    EventPtr e = MakeEvent(i, v1::WatchEvent::ADDED, name, "web");
    history.Add(e);
    cache.Publish({e});  // returns at once: nothing here waits
    want.push_back(absl::StrCat("ADDED ", name, " web"));
  }
  EXPECT_EQ(reader.WaitFor(want.size()), want);
  EXPECT_TRUE(testing::Eventually([&] { return metrics_.watchers_parked.Value() == 1; },
                                  "the full watcher is parked"));
  EXPECT_EQ(full.seen().size(), 100u);
  // It reads, and is caught up by its dispatcher, a little at a time.
  EXPECT_TRUE(testing::Eventually(
      [&] {
        full.Read();
        return full.seen().size() == want.size();
      },
      "the parked watcher catches up"));
  EXPECT_EQ(full.seen(), want);
  EXPECT_TRUE(testing::Eventually([&] { return metrics_.watchers_parked.Value() == 0; },
                                  "it is synced again"));
  cache.Unregister(&full);
  cache.Unregister(&reader);
  cache.SetHistory(nullptr);
}

// Without the history it would need (it has moved on), a parked watcher ends OUT_OF_RANGE and
// leaves; the count follows at once.
TEST_F(WatchCacheTest, ParkedWatcher_HistoryMovedOn_EndsOutOfRange) {
  WatchCache cache({absl::Seconds(60)}, &metrics_);
  FakeHistory history;
  cache.SetHistory(&history);
  FakeWatcher full(Spec(0), /*capacity=*/1);
  ASSERT_TRUE(cache.Register(&full).ok());
  for (int i = 1; i <= 10; ++i) {
    EventPtr e = MakeEvent(i, v1::WatchEvent::ADDED, absl::StrCat("o", i), "web");
    history.Add(e);
    cache.Publish({e});
  }
  ASSERT_TRUE(testing::Eventually([&] { return metrics_.watchers_parked.Value() == 1; },
                                  "the full watcher is parked"));
  history.Compact(8);
  full.Read();
  EXPECT_THAT(full.WaitFor(2), ElementsAre("ADDED o1 web", "END OUT_OF_RANGE"));
  EXPECT_TRUE(testing::Eventually([&] { return cache.watcher_count() == 0; }, "counted out"));
  cache.Unregister(&full);
  cache.SetHistory(nullptr);
}

// A dispatcher whose inbox holds more than max_queued_events skips the rest: its watchers are
// caught up from the history, and miss nothing.
TEST_F(WatchCacheTest, ADispatcherFarBehind_SkipsItsInbox_ItsWatchersMissNothing) {
  WatchCache::Options options = {absl::Seconds(60)};
  options.dispatchers = 1;
  options.max_queued_events = 4;
  WatchCache cache(options, &metrics_);
  FakeHistory history;
  cache.SetHistory(&history);
  FakeWatcher w(Spec(0));
  ASSERT_TRUE(cache.Register(&w).ok());
  std::vector<EventPtr> burst;
  std::vector<std::string> want;
  for (int i = 1; i <= 50; ++i) {
    std::string name = absl::StrCat("o", i);
    burst.push_back(MakeEvent(i, v1::WatchEvent::ADDED, name, "web"));
    history.Add(burst.back());
    want.push_back(absl::StrCat("ADDED ", name, " web"));
  }
  cache.Publish(burst);  // one call: the inbox takes 4 and skips 46
  EXPECT_EQ(w.WaitFor(want.size()), want);
  cache.Unregister(&w);
  cache.SetHistory(nullptr);
}

// Notes the thread its events are delivered on.
class ThreadNotingWatcher : public FakeWatcher {
 public:
  using FakeWatcher::FakeWatcher;
  bool Deliver(const Delivery& d) override {
    thread = std::this_thread::get_id();
    return FakeWatcher::Deliver(d);
  }
  std::atomic<std::thread::id> thread;
};

// Sets an alarm on `cq` that fires at once and waits for its completion to run. Returns the
// thread that ran it, or nothing if it did not run in time.
std::optional<std::thread::id> RunAlarmOn(grpc::CompletionQueue* cq) {
  struct NotingCompletion : WatchCache::Completion {
    void Complete(bool ok) override {
      absl::MutexLock l(&mu);
      if (ok) thread = std::this_thread::get_id();
    }
    absl::Mutex mu;
    std::optional<std::thread::id> thread ABSL_GUARDED_BY(mu);
  } completion;
  grpc::Alarm alarm;
  alarm.Set(cq, gpr_time_0(GPR_CLOCK_REALTIME), completion.AsTag());
  testing::Eventually(
      [&] {
        absl::MutexLock l(&completion.mu);
        return completion.thread.has_value();
      },
      "the alarm's completion runs");
  absl::MutexLock l(&completion.mu);
  return completion.thread;
}

TEST_F(WatchCacheTest, CompletionQueues_PublishWakesTheDispatcher_CompletionsRunOnItsThread) {
  // The clock never moves and a dispatcher waiting on its queue would look at it only after an
  // hour: every event below reaches the watcher only if Publish wakes the dispatcher.
  FakeClock clock;
  WatchCache::Options options{absl::Seconds(60)};
  options.dispatchers = 1;
  options.clock = &clock;
  options.other_clock_poll_interval = absl::Hours(1);
  WatchCache cache(options, &metrics_);
  cache.StartCompletionQueues();
  ThreadNotingWatcher w(Spec(0));
  ASSERT_TRUE(cache.Register(&w).ok());
  // One at a time, each after the last arrived: the dispatcher has gone back to its queue.
  std::vector<std::string> want;
  for (int i = 1; i <= 20; ++i) {
    std::string name = absl::StrCat("w", i);
    cache.Publish({MakeEvent(i, v1::WatchEvent::ADDED, name, "web")});
    want.push_back(absl::StrCat("ADDED ", name, " web"));
    ASSERT_EQ(w.WaitFor(want.size()), want);
  }
  std::thread::id dispatcher = w.thread;
  EXPECT_NE(dispatcher, std::this_thread::get_id());

  // An operation completing on the dispatcher's queue is run by the dispatcher itself.
  std::optional<std::thread::id> ran = RunAlarmOn(cache.completion_queue(0));
  ASSERT_TRUE(ran.has_value()) << "the alarm's completion did not run";
  EXPECT_EQ(*ran, dispatcher);

  // Once the queues are shut down, the dispatcher waits on its condition again.
  cache.ShutdownCompletionQueues();
  cache.ShutdownCompletionQueues();  // idempotent
  cache.Publish({MakeEvent(21, v1::WatchEvent::ADDED, "w21", "web")});
  want.push_back("ADDED w21 web");
  EXPECT_EQ(w.WaitFor(want.size()), want);
  cache.Unregister(&w);
}

TEST_F(WatchCacheTest, CompletionQueues_ShutDownOnlyOnceNoStreamHoldsThem) {
  WatchCache cache({absl::Seconds(60)}, &metrics_);
  cache.StartCompletionQueues();
  auto hold = std::make_unique<WatchCache::CompletionQueueHold>(&cache);

  std::atomic<bool> returned{false};
  std::atomic<pid_t> tid{0};
  std::thread stopper([&] {
    tid = testing::ThisThreadId();
    cache.ShutdownCompletionQueues();
    returned = true;
  });
  ASSERT_TRUE(
      testing::Eventually([&] { return returned || (tid != 0 && testing::ThreadAsleep(tid)); },
                          "ShutdownCompletionQueues returns or waits"));
  EXPECT_FALSE(returned) << "the queues were shut down while a stream held them";
  // A stream that holds them may still start operations there.
  ASSERT_TRUE(RunAlarmOn(cache.completion_queue(0)).has_value())
      << "the alarm's completion did not run";

  hold.reset();
  stopper.join();
  EXPECT_TRUE(returned);
}

}  // namespace
}  // namespace shardcache
