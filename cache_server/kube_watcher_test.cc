#include "cache_server/kube_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace shardcache {
namespace {

ObjectRef Obj(const std::string& name, int64_t rv) {
  auto o = std::make_shared<v1::Object>();
  o->mutable_metadata()->set_name(name);
  o->mutable_metadata()->set_resource_version(absl::StrCat(rv));
  return o;
}

// An event of `bytes` bytes as the fan-out hands it over.
Delivery Event(const std::string& name, int64_t rv, size_t bytes = 100) {
  return Delivery{v1::WatchEvent::ADDED, Obj(name, rv), grpc::Slice(std::string(bytes, 'x')),
                  grpc::Slice()};
}

std::vector<std::string> Names(const KubeWatcher::Taken& t) {
  std::vector<std::string> names;
  for (const auto& [type, object] : t.events) names.push_back(object->metadata().name());
  return names;
}

class KubeWatcherTest : public ::testing::Test {
 protected:
  KubeWatcher::Options Options(size_t queue_bytes = 1000) {
    KubeWatcher::Options o;
    o.max_queue_bytes = queue_bytes;
    o.stall_timeout = absl::Seconds(20);
    o.clock = &clock_;
    return o;
  }
  // A deadline that has passed: Take returns what waits, without waiting.
  static absl::Time Now() { return absl::Now(); }

  FakeClock clock_;
};

TEST_F(KubeWatcherTest, InitialEventsComeFirstThenLiveOnesInOrder) {
  KubeWatcher w(Options());
  w.Init(WatchSpec(), {{v1::WatchEvent::ADDED, Obj("a", 1)}, {v1::WatchEvent::ADDED, Obj("b", 2)}});
  ASSERT_TRUE(w.Deliver(Event("c", 3)));
  ASSERT_TRUE(w.Deliver(Event("d", 4)));
  w.Flush();
  KubeWatcher::Taken t = w.Take(Now());
  EXPECT_THAT(Names(t), ::testing::ElementsAre("a", "b", "c", "d"));
  EXPECT_FALSE(t.ended.has_value());
}

TEST_F(KubeWatcherTest, TakesAtMostMaxTakeAtATime) {
  KubeWatcher::Options o = Options();
  o.max_take = 2;
  KubeWatcher w(o);
  w.Init(WatchSpec(), {{v1::WatchEvent::ADDED, Obj("a", 1)},
                       {v1::WatchEvent::ADDED, Obj("b", 2)},
                       {v1::WatchEvent::ADDED, Obj("c", 3)}});
  w.End(absl::OutOfRangeError("too old"));
  KubeWatcher::Taken first = w.Take(Now());
  EXPECT_THAT(Names(first), ::testing::ElementsAre("a", "b"));
  EXPECT_FALSE(first.ended.has_value());  // the end comes after every event before it
  KubeWatcher::Taken second = w.Take(Now());
  EXPECT_THAT(Names(second), ::testing::ElementsAre("c"));
  ASSERT_TRUE(second.ended.has_value());
  EXPECT_EQ(second.ended->code(), absl::StatusCode::kOutOfRange);
}

TEST_F(KubeWatcherTest, AFullQueueRefusesAndHasRoomAtHalf) {
  KubeWatcher::Options o = Options(/*queue_bytes=*/400);
  o.max_take = 1;
  KubeWatcher w(o);
  w.Init(WatchSpec(), {});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(w.Deliver(Event(absl::StrCat(i), i + 1)));
  EXPECT_FALSE(w.Deliver(Event("refused", 5)));  // parked: nothing kept
  EXPECT_FALSE(w.HasRoom());
  w.Take(Now());  // 300 bytes left
  w.Take(Now());  // 200: still half full
  EXPECT_FALSE(w.HasRoom());
  EXPECT_THAT(Names(w.Take(Now())), ::testing::ElementsAre("2"));  // 100: less than half
  EXPECT_TRUE(w.HasRoom());
}

TEST_F(KubeWatcherTest, AFullWatcherThatTakesNothingIsEndedAsTooSlow) {
  KubeWatcher w(Options(/*queue_bytes=*/200));
  w.Init(WatchSpec(), {});
  ASSERT_TRUE(w.Deliver(Event("a", 1)));
  ASSERT_TRUE(w.Deliver(Event("b", 2)));
  clock_.Advance(absl::Seconds(19));
  w.Sweep(clock_.Now());
  EXPECT_FALSE(w.Deliver(Event("c", 3)));  // full, not yet stalled
  clock_.Advance(absl::Seconds(2));
  w.Sweep(clock_.Now());
  KubeWatcher::Taken t = w.Take(Now());
  EXPECT_TRUE(t.events.empty());  // dropped: the client reads nothing
  ASSERT_TRUE(t.ended.has_value());
  EXPECT_EQ(t.ended->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(w.Deliver(Event("d", 4)));  // ending: taken and dropped
}

TEST_F(KubeWatcherTest, AWatcherThatKeepsTakingIsNotStalled) {
  KubeWatcher w(Options(/*queue_bytes=*/200));
  w.Init(WatchSpec(), {});
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(w.Deliver(Event("a", 2 * i + 1)));
    ASSERT_TRUE(w.Deliver(Event("b", 2 * i + 2)));
    clock_.Advance(absl::Seconds(15));
    w.Sweep(clock_.Now());
    size_t taken = 0;
    for (KubeWatcher::Taken t = w.Take(Now()); !t.events.empty(); t = w.Take(Now())) {
      EXPECT_FALSE(t.ended.has_value());
      taken += t.events.size();
    }
    EXPECT_EQ(taken, 2u);
  }
}

TEST_F(KubeWatcherTest, TakesAtMostHalfTheQueuesBoundOfLiveEvents) {
  KubeWatcher w(Options(/*queue_bytes=*/1000));
  w.Init(WatchSpec(), {});
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(w.Deliver(Event(absl::StrCat(i), i + 1, 200)));
  EXPECT_THAT(Names(w.Take(Now())), ::testing::ElementsAre("0", "1"));
  EXPECT_THAT(Names(w.Take(Now())), ::testing::ElementsAre("2", "3"));
  ASSERT_TRUE(w.Deliver(Event("big", 6, 5000)));  // larger than the bound: still taken, alone
  EXPECT_THAT(Names(w.Take(Now())), ::testing::ElementsAre("4"));
  EXPECT_THAT(Names(w.Take(Now())), ::testing::ElementsAre("big"));
}

TEST_F(KubeWatcherTest, ShutdownDropsWhatWaitsButAnOutOfRangeEndKeepsIt) {
  KubeWatcher w(Options());
  w.Init(WatchSpec(), {});
  ASSERT_TRUE(w.Deliver(Event("a", 1)));
  w.End(absl::UnavailableError("server shutting down"));
  KubeWatcher::Taken t = w.Take(Now());
  EXPECT_TRUE(t.events.empty());
  ASSERT_TRUE(t.ended.has_value());
  EXPECT_EQ(t.ended->code(), absl::StatusCode::kUnavailable);
}

TEST_F(KubeWatcherTest, BookmarksOnlyWhenNothingElseWaits) {
  KubeWatcher w(Options());
  w.Init(WatchSpec(), {});
  ASSERT_TRUE(w.Deliver(Event("a", 1)));
  w.Bookmark(1);  // the event says as much
  KubeWatcher::Taken t = w.Take(Now());
  ASSERT_EQ(t.events.size(), 1u);
  w.Bookmark(7);
  t = w.Take(Now());
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].first, v1::WatchEvent::BOOKMARK);
  EXPECT_EQ(t.events[0].second->metadata().resource_version(), "7");
}

TEST_F(KubeWatcherTest, TakeWaitsForAFlushOrTheDeadline) {
  KubeWatcher w(Options());
  w.Init(WatchSpec(), {});
  absl::Time start = absl::Now();
  KubeWatcher::Taken idle = w.Take(start + absl::Milliseconds(50));
  EXPECT_TRUE(idle.events.empty());
  EXPECT_FALSE(idle.ended.has_value());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));

  std::thread fan_out([&w] {
    absl::SleepFor(absl::Milliseconds(20));
    w.Deliver(Event("a", 1));
    w.Flush();
  });
  KubeWatcher::Taken t = w.Take(absl::Now() + absl::Seconds(30));
  fan_out.join();
  EXPECT_THAT(Names(t), ::testing::ElementsAre("a"));
}

TEST_F(KubeWatcherTest, CancelWakesATakeAndEndsTheWatch) {
  KubeWatcher w(Options());
  w.Init(WatchSpec(), {});
  std::thread view([&w] {
    absl::SleepFor(absl::Milliseconds(20));
    w.Cancel(absl::CancelledError("the client went away"));
  });
  KubeWatcher::Taken t = w.Take(absl::Now() + absl::Seconds(30));
  view.join();
  ASSERT_TRUE(t.ended.has_value());
  EXPECT_EQ(t.ended->code(), absl::StatusCode::kCancelled);
  // Cancelled before it was registered: its initial events are not kept.
  KubeWatcher early(Options());
  early.Cancel(absl::CancelledError("stopping"));
  early.Init(WatchSpec(), {{v1::WatchEvent::ADDED, Obj("a", 1)}});
  EXPECT_TRUE(early.Take(Now()).events.empty());
}

}  // namespace
}  // namespace shardcache
