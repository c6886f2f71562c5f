// Reflector liveness and store identity, against a scripted ListerWatcher on a FakeClock: a watch
// that receives nothing for watch_idle_timeout is cancelled and reopened from the last revision
// (without a relist); an event or bookmark restarts the timer; an event from another store is
// never applied and makes the reflector list again, and so do response headers that name another
// store.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/client/lister_watcher.h"
#include "common/client/reflector.h"
#include "common/clock.h"
#include "common/testing/scripted_lister_watcher.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::ScriptedListerWatcher;
using ::shardcache::testing::ScriptedStream;
using ::shardcache::testing::StatusIs;
using ::shardcache::testing::ThisThreadId;
using ::shardcache::testing::ThreadAsleep;
using ::shardcache::testing::WaitFor;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class NamesSink : public ReflectorSink {
 public:
  void Replace(std::vector<ObjectRef> objects, const std::string& rv) override {
    absl::MutexLock l(&mu_);
    names_.clear();
    for (const ObjectRef& o : objects) names_.push_back(o->metadata().name());
    log_.push_back(absl::StrCat("REPLACE ", objects.size(), "@", rv));
  }
  void Add(ObjectRef o) override {
    absl::MutexLock l(&mu_);
    names_.push_back(o->metadata().name());
    log_.push_back(absl::StrCat("ADD ", o->metadata().name()));
  }
  void Update(ObjectRef o) override {
    absl::MutexLock l(&mu_);
    log_.push_back(absl::StrCat("UPDATE ", o->metadata().name()));
  }
  void Delete(ObjectRef o) override {
    absl::MutexLock l(&mu_);
    log_.push_back(absl::StrCat("DELETE ", o->metadata().name()));
  }
  void Bookmark(const std::string& rv) override {
    absl::MutexLock l(&mu_);
    log_.push_back(absl::StrCat("BOOKMARK ", rv));
  }
  void Stopped(const absl::Status&) override {}
  std::vector<std::string> Log() const {
    absl::MutexLock l(&mu_);
    return log_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

v1::WatchEvent Event(v1::WatchEvent::Type type, const std::string& name, const std::string& rv,
                     const std::string& store_id) {
  v1::WatchEvent e;
  e.set_type(type);
  e.mutable_object()->mutable_metadata()->set_name(name);
  e.mutable_object()->mutable_metadata()->set_resource_version(rv);
  e.set_store_id(store_id);
  return e;
}

// Each test runs twice: on a thread of the reflector's own (which also waits out the idle timeout
// and the backoff on the clock), and as turns on a one-thread WorkerPool, with no thread of its own
// (then the pool's timer thread is the one waiting on the clock).
class ReflectorLivenessTest : public ::testing::TestWithParam<bool> {
 protected:
  // A reflector over a scripted ListerWatcher that feeds `sink` (null: sink_).
  void Make(absl::Duration idle_timeout, ReflectorSink* sink = nullptr) {
    auto lw = std::make_unique<ScriptedListerWatcher>(&clock_);
    lw_ = lw.get();
    lw_->SetList("store-1", "5", {"a"});
    Reflector::Options o;
    o.clock = &clock_;
    o.watch_idle_timeout = idle_timeout;
    o.backoff.initial = absl::Seconds(1);
    o.backoff.max = absl::Seconds(1);
    o.backoff.jitter = 0;
    o.registry = registry_;
    if (GetParam()) {
      auto pool = WorkerPool::Create({.threads = 1, .clock = &clock_});
      ASSERT_TRUE(pool.ok()) << pool.status();
      pool_ = *std::move(pool);
      o.pool = pool_.get();
    }
    auto r = Reflector::Create(std::move(lw), sink != nullptr ? sink : &sink_, o);
    ASSERT_TRUE(r.ok()) << r.status();
    reflector_ = *std::move(r);
  }

  std::string Metrics() const {
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }

  FakeClock clock_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  NamesSink sink_;
  ScriptedListerWatcher* lw_ = nullptr;
  std::unique_ptr<WorkerPool> pool_;  // outlives the reflector
  std::unique_ptr<Reflector> reflector_;
};

INSTANTIATE_TEST_SUITE_P(Driver, ReflectorLivenessTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "OnAPool" : "OwnThread";
                         });

TEST_P(ReflectorLivenessTest, SilentWatch_IsCancelledAfterTheIdleTimeout_AndResumed) {
  Make(absl::Seconds(15));
  reflector_->Start();
  ASSERT_TRUE(WaitFor([&] { return lw_->streams() == 1; }));
  std::shared_ptr<ScriptedStream> first = lw_->stream(0);
  EXPECT_EQ(first->from(), "5");
  const absl::Time opened = clock_.Now();
  // The reflector's thread (or the pool's timer), woken by the new stream, waits on the clock
  // again with the stream's deadline: until then it may still wait with an older one.
  ASSERT_TRUE(WaitFor([&] { return clock_.NextDeadline() == opened + absl::Seconds(15); }));

  // A bookmark 10 s in restarts the timer: the watch is alive until 15 s after it.
  clock_.Advance(absl::Seconds(10));
  first->Push(Event(v1::WatchEvent::BOOKMARK, "", "7", "store-1"));
  ASSERT_TRUE(WaitFor([&] { return first->delivered() == 1; }));
  ASSERT_TRUE(WaitFor([&] { return reflector_->LastResourceVersion() == "7"; }));
  const absl::Time bookmarked = clock_.Now();

  // Move the clock a second at a time; the watchdog must cancel the stream only once 15 s have
  // passed since the bookmark (25 s after it opened), not 15 s after it opened. One thread waits
  // on the clock while the watch is open (the reflector's, or the pool's timer): once it waits
  // again after an Advance, it has done what that moment asked of it.
  for (int i = 0; i < 20 && !first->cancelled(); ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(clock_.AwaitWaiters(1)) << "the reflector's timer waits on the clock again";
  }
  ASSERT_TRUE(first->cancelled()) << "the silent watch was never taken for dead";
  EXPECT_EQ(first->cancelled_at() - bookmarked, absl::Seconds(15));
  EXPECT_GT(first->cancelled_at() - opened, absl::Seconds(15));
  ASSERT_TRUE(WaitFor([&] { return reflector_->watch_idle_restarts() == 1; }));

  // After its backoff delay (1 s on the clock) it watches again from the bookmark's revision,
  // without listing again.
  ASSERT_TRUE(WaitFor([&] { return reflector_->backoff_waits() == 1; }));
  // The backoff waits on the clock once it has read the time.
  ASSERT_TRUE(WaitFor([&] { return clock_.NextDeadline() != absl::InfiniteFuture(); }));
  EXPECT_EQ(clock_.NextDeadline() - clock_.Now(), absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitFor([&] { return lw_->streams() == 2; }));
  EXPECT_EQ(lw_->stream(1)->from(), "7");
  EXPECT_EQ(reflector_->lists_started(), 1);
  EXPECT_FALSE(lw_->stream(1)->cancelled());
  EXPECT_THAT(Metrics(),
              HasSubstr("shardcache_reflector_watch_idle_restarts_total{name=\"scripted\"} 1"));

  // The new watch is live: an event reaches the sink.
  lw_->stream(1)->Push(Event(v1::WatchEvent::ADDED, "b", "8", "store-1"));
  ASSERT_TRUE(WaitFor([&] { return reflector_->LastResourceVersion() == "8"; }));
  EXPECT_THAT(sink_.Log(), ElementsAre("REPLACE 1@5", "BOOKMARK 7", "ADD b"));
  reflector_->Stop();
}

TEST_P(ReflectorLivenessTest, ZeroIdleTimeout_NeverCancels) {
  Make(absl::ZeroDuration());
  reflector_->Start();
  ASSERT_TRUE(WaitFor([&] { return lw_->streams() == 1; }));
  clock_.Advance(absl::Hours(1));
  // An event after the hour proves the stream was still being read, not replaced.
  lw_->stream(0)->Push(Event(v1::WatchEvent::ADDED, "b", "6", "store-1"));
  ASSERT_TRUE(WaitFor([&] { return reflector_->LastResourceVersion() == "6"; }));
  EXPECT_FALSE(lw_->stream(0)->cancelled());
  EXPECT_EQ(lw_->streams(), 1);
  EXPECT_EQ(reflector_->watch_idle_restarts(), 0);
  reflector_->Stop();
}

TEST_P(ReflectorLivenessTest, EventOfAnotherStore_IsNotApplied_AndTheReflectorListsAgain) {
  Make(absl::Seconds(15));
  reflector_->Start();
  ASSERT_TRUE(WaitFor([&] { return lw_->streams() == 1; }));
  lw_->stream(0)->Push(Event(v1::WatchEvent::ADDED, "b", "6", "store-1"));
  ASSERT_TRUE(WaitFor([&] { return reflector_->LastResourceVersion() == "6"; }));
  EXPECT_EQ(reflector_->StoreId(), "store-1");

  // The store was replaced: its stream resumed "from 6" and tells of a change at 9 that means
  // nothing to this reflector. The event is dropped and the reflector lists the new store.
  lw_->SetList("store-2", "12", {"x", "y"});
  lw_->stream(0)->Push(Event(v1::WatchEvent::ADDED, "ghost", "9", "store-2"));
  // The watch was the first after its list (the list and the watch disagree): the reflector
  // lists again after its backoff delay (1 s on the clock) rather than at once.
  ASSERT_TRUE(WaitFor([&] { return reflector_->backoff_waits() == 1; }));
  EXPECT_EQ(reflector_->lists_started(), 1);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitFor([&] { return reflector_->lists_started() == 2; }));
  ASSERT_TRUE(WaitFor([&] { return lw_->streams() == 2; }));
  EXPECT_TRUE(lw_->stream(0)->cancelled());
  EXPECT_EQ(lw_->stream(1)->from(), "12");
  EXPECT_EQ(reflector_->StoreId(), "store-2");
  EXPECT_EQ(reflector_->store_changes(), 1);
  EXPECT_THAT(sink_.Log(), ElementsAre("REPLACE 1@5", "ADD b", "REPLACE 2@12"));
  EXPECT_THAT(Metrics(),
              HasSubstr("shardcache_reflector_store_changes_total{name=\"scripted\"} 1"));

  // Events of the new store are applied.
  lw_->stream(1)->Push(Event(v1::WatchEvent::ADDED, "z", "13", "store-2"));
  ASSERT_TRUE(WaitFor([&] { return reflector_->LastResourceVersion() == "13"; }));
  EXPECT_EQ(reflector_->store_changes(), 1);
  reflector_->Stop();
}

// The store's identity in a resumed watch's response headers is enough: the reflector lists again
// before the stream says anything else.
TEST_P(ReflectorLivenessTest, HeadersOfAnotherStore_MakeTheReflectorListAgainAtOnce) {
  Make(absl::Seconds(15));
  reflector_->Start();
  ASSERT_TRUE(WaitFor([&] { return lw_->streams() == 1; }));
  lw_->stream(0)->Push(Event(v1::WatchEvent::BOOKMARK, "", "6", "store-1"));
  ASSERT_TRUE(WaitFor([&] { return reflector_->LastResourceVersion() == "6"; }));

  // The connection breaks; the store behind the address is replaced meanwhile.
  lw_->SetList("store-2", "12", {"x", "y"});
  lw_->SetHeader("store-2");
  lw_->stream(0)->Break();
  ASSERT_TRUE(WaitFor([&] { return reflector_->backoff_waits() == 1; }));
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitFor([&] { return lw_->streams() == 3; }));
  std::shared_ptr<ScriptedStream> resumed = lw_->stream(1);
  EXPECT_EQ(resumed->from(), "6");
  EXPECT_TRUE(resumed->cancelled());
  EXPECT_EQ(resumed->delivered(), 0);
  EXPECT_EQ(lw_->stream(2)->from(), "12");
  EXPECT_EQ(reflector_->lists_started(), 2);
  EXPECT_EQ(reflector_->store_changes(), 1);
  EXPECT_EQ(reflector_->backoff_waits(), 1);  // the relist did not wait
  EXPECT_THAT(sink_.Log(), ElementsAre("REPLACE 1@5", "BOOKMARK 6", "REPLACE 2@12"));
  reflector_->Stop();
}

// A burst far larger than a turn's share (kEventsPerTurn) reaches the sink whole and in order,
// over several turns on a pool.
TEST_P(ReflectorLivenessTest, Burst_IsDeliveredWholeAndInOrder) {
  Make(absl::Seconds(15));
  reflector_->Start();
  ASSERT_TRUE(WaitFor([&] { return lw_->streams() == 1; }));
  constexpr int kEvents = 3 * Reflector::kEventsPerTurn + 5;
  std::vector<std::string> want = {"REPLACE 1@5"};
  for (int i = 0; i < kEvents; ++i) {
    const std::string name = absl::StrCat("o", i);
    lw_->stream(0)->Push(Event(v1::WatchEvent::ADDED, name, absl::StrCat(6 + i), "store-1"));
    want.push_back(absl::StrCat("ADD ", name));
  }
  const std::string last = absl::StrCat(6 + kEvents - 1);
  ASSERT_TRUE(WaitFor([&] { return reflector_->LastResourceVersion() == last; }));
  EXPECT_EQ(sink_.Log(), want);
  EXPECT_EQ(lw_->streams(), 1);
  reflector_->Stop();
}

// Two Stop() calls at once: the one that does not end the loop itself still returns only once
// the sink's Stopped has returned.
TEST_P(ReflectorLivenessTest, ConcurrentStops_NeitherReturnsBeforeStopped) {
  class BlockingSink : public NamesSink {
   public:
    void Stopped(const absl::Status&) override {
      entered.Notify();
      release.WaitForNotification();
    }
    absl::Notification entered;
    absl::Notification release;
  };
  BlockingSink sink;
  Make(absl::Seconds(15), &sink);
  reflector_->Start();
  ASSERT_TRUE(WaitFor([&] { return lw_->streams() == 1; }));
  std::atomic<int> returned{0};
  std::thread first([&] {
    reflector_->Stop();
    returned.fetch_add(1);
  });
  absl::Cleanup join_first = [&] {
    if (!sink.release.HasBeenNotified()) sink.release.Notify();
    first.join();
  };
  ASSERT_TRUE(sink.entered.WaitForNotificationWithTimeout(absl::Seconds(20)));
  std::atomic<pid_t> second_tid{0};
  std::thread second([&] {
    second_tid = ThisThreadId();
    reflector_->Stop();
    returned.fetch_add(1);
  });
  absl::Cleanup join_second = [&] {
    if (!sink.release.HasBeenNotified()) sink.release.Notify();
    second.join();
  };
  ASSERT_TRUE(Eventually(
      [&] { return returned.load() > 0 || (second_tid != 0 && ThreadAsleep(second_tid)); },
      "the second Stop() returns or waits"));
  EXPECT_EQ(returned.load(), 0) << "a Stop() returned while Stopped was still running";
  sink.release.Notify();
  ASSERT_TRUE(WaitFor([&] { return returned.load() == 2; }));
  reflector_.reset();
}

TEST_P(ReflectorLivenessTest, Create_RejectsANegativeIdleTimeout) {
  FakeClock clock;
  Reflector::Options o;
  o.watch_idle_timeout = absl::Seconds(-1);
  EXPECT_THAT(Reflector::Create(std::make_unique<ScriptedListerWatcher>(&clock), &sink_, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("watch_idle_timeout")));
}

}  // namespace
}  // namespace shardcache
