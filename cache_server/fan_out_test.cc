// Unit tests of FanOut: the watch policy alone, on fake watchers, a fake history and a fake
// clock; no thread, no network.
#include "cache_server/fan_out.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache_server/testing/fake_watcher.h"
#include "common/clock.h"

namespace shardcache {
namespace {

using ::shardcache::testing::FakeHistory;
using ::shardcache::testing::FakeWatcher;
using ::shardcache::testing::MakeEvent;
using ::shardcache::testing::Spec;
using ::shardcache::testing::WithBookmarks;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The history and the published events' forms, as the WatchCache keeps them.
class FakeSource : public FanOut::Source {
 public:
  absl::Status ReadHistory(const std::string& group_resource, int64_t after, int64_t up_to,
                           size_t max_events, std::vector<EventPtr>* out) override {
    return history.ReadHistory(group_resource, after, up_to, max_events, out);
  }
  EventFormsPtr Forms(const EventPtr& event) override {
    auto it = kept.find(event->revision);
    if (it != kept.end()) return it->second;
    return std::make_shared<EventForms>(event, &chunks);
  }
  // Commits an event: into the history, with forms kept for it.
  EventFormsPtr Commit(EventPtr e) {
    history.Add(e);
    auto forms = std::make_shared<EventForms>(e, &chunks);
    kept[e->revision] = forms;
    return forms;
  }

  FakeHistory history;
  EventChunks chunks;
  std::map<int64_t, EventFormsPtr> kept;
};

class FanOutTest : public ::testing::Test {
 protected:
  FanOutTest() {
    FanOut::Options options;
    options.bookmark_interval = absl::Seconds(10);
    options.clock = &clock_;
    options.count_changed = [this](int delta) { count_changes_ += delta; };
    fan_out_ = std::make_unique<FanOut>(options, &metrics_);
  }

  // Commits and dispatches the ADDED of `name` at revision `rev`.
  void Add(int64_t rev, const std::string& name, const std::string& app = "web") {
    fan_out_->Dispatch(*source_.Commit(MakeEvent(rev, v1::WatchEvent::ADDED, name, app)));
    fan_out_->Flush(clock_.Now());
  }
  // One catch-up step, as a dispatcher runs it.
  void CatchUp() {
    std::vector<FanOut::CatchUpRead> reads = fan_out_->PlanCatchUp();
    FanOut::ReadCatchUp(&source_, &reads);
    fan_out_->ApplyCatchUp(std::move(reads));
    fan_out_->Flush(clock_.Now());
  }
  static std::vector<std::string> Added(int from, int to) {
    std::vector<std::string> out;
    for (int i = from; i <= to; ++i) out.push_back(absl::StrCat("ADDED o", i, " web"));
    return out;
  }

  FakeClock clock_;
  StoreMetrics metrics_{std::make_shared<prometheus::Registry>()};
  FakeSource source_;
  int count_changes_ = 0;
  std::unique_ptr<FanOut> fan_out_;
};

TEST_F(FanOutTest, Dispatch_AWatcherThatRefusesIsParked_TheOthersGetEveryEvent) {
  FakeWatcher slow(Spec(0), /*capacity=*/3);
  FakeWatcher fast(Spec(0));
  fan_out_->Add(&slow);
  fan_out_->Add(&fast);
  for (int i = 1; i <= 10; ++i) Add(i, absl::StrCat("o", i));
  EXPECT_EQ(slow.seen(), Added(1, 3));
  EXPECT_EQ(slow.refused(), 1u) << "once parked, it is not offered live events";
  EXPECT_EQ(fast.seen(), Added(1, 10));
  EXPECT_EQ(fan_out_->parked(), 1u);
  EXPECT_EQ(metrics_.watchers_parked.Value(), 1);
}

TEST_F(FanOutTest, CatchUp_FromTheHistory_InOrder_NoGapNoDuplicate_ThenSyncedAgain) {
  FakeWatcher slow(Spec(0), /*capacity=*/4);
  fan_out_->Add(&slow);
  for (int i = 1; i <= 20; ++i) Add(i, absl::StrCat("o", i));
  ASSERT_EQ(fan_out_->parked(), 1u);
  // It reads, a little at a time; each step gives it what it has room for, from the history.
  for (int step = 0; step < 20 && fan_out_->parked() > 0; ++step) {
    slow.Read();
    CatchUp();
  }
  EXPECT_EQ(fan_out_->parked(), 0u) << "caught up, it is synced again";
  EXPECT_EQ(slow.seen(), Added(1, 20));
  // Live events reach it directly again.
  slow.Read();
  Add(21, "o21");
  EXPECT_EQ(slow.seen(), Added(1, 21));
  EXPECT_EQ(metrics_.watchers_parked.Value(), 0);
  EXPECT_EQ(metrics_.watch_catch_up_events.Value(), 16);
}

TEST_F(FanOutTest, CatchUp_OnlyOnceTheWatcherHasDrainedHalfItsQueue) {
  FakeWatcher slow(Spec(0), /*capacity=*/4);
  fan_out_->Add(&slow);
  for (int i = 1; i <= 8; ++i) Add(i, absl::StrCat("o", i));
  size_t reads = source_.history.reads();
  CatchUp();
  EXPECT_EQ(source_.history.reads(), reads) << "read the history for a watcher with no room";
  slow.Read(1);  // 3 of 4 still unread
  CatchUp();
  EXPECT_EQ(source_.history.reads(), reads);
  slow.Read(1);  // half
  CatchUp();
  EXPECT_EQ(source_.history.reads(), reads + 1);
  EXPECT_EQ(slow.seen(), Added(1, 6));
}

TEST_F(FanOutTest, CatchUp_AppliesTheFilter_ACrossingBecomesAddedOrDeleted) {
  FakeWatcher slow(Spec(0, "app=web"), /*capacity=*/1);
  fan_out_->Add(&slow);
  Add(1, "a");
  // Parked from here on.
  auto dispatch = [&](EventPtr e) {
    fan_out_->Dispatch(*source_.Commit(std::move(e)));
    fan_out_->Flush(clock_.Now());
  };
  dispatch(MakeEvent(2, v1::WatchEvent::ADDED, "b", "web"));
  dispatch(MakeEvent(3, v1::WatchEvent::MODIFIED, "a", "db", "web"));
  dispatch(MakeEvent(4, v1::WatchEvent::ADDED, "c", "db"));
  dispatch(MakeEvent(5, v1::WatchEvent::MODIFIED, "c", "web", "db"));
  for (int i = 0; i < 10 && fan_out_->parked() > 0; ++i) {
    slow.Read();
    CatchUp();
  }
  EXPECT_THAT(slow.seen(),
              ElementsAre("ADDED a web", "ADDED b web", "DELETED a web", "ADDED c web"));
}

TEST_F(FanOutTest, CatchUp_SendsTheEncodingsTheSyncedWatchersSent) {
  FakeWatcher slow(Spec(0), /*capacity=*/1);
  FakeWatcher fast(Spec(0));
  fan_out_->Add(&slow);
  fan_out_->Add(&fast);
  for (int i = 1; i <= 3; ++i) Add(i, absl::StrCat("o", i));
  for (int i = 0; i < 5 && fan_out_->parked() > 0; ++i) {
    slow.Read();
    CatchUp();
  }
  ASSERT_EQ(slow.slices().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(slow.slices()[i].begin(), fast.slices()[i].begin()) << "event " << i;
  }
}

TEST_F(FanOutTest, JsonWatchers_GetTheObjectAsJson_LiveAndCaughtUp_SharingOneEncoding) {
  WatchSpec json = Spec(0);
  json.encoding = ObjectEncoding::kJson;
  FakeWatcher slow(json, /*capacity=*/1);
  FakeWatcher fast(json);
  FakeWatcher proto(Spec(0));
  fan_out_->Add(&slow);
  fan_out_->Add(&fast);
  fan_out_->Add(&proto);
  for (int i = 1; i <= 3; ++i) Add(i, absl::StrCat("o", i));
  ASSERT_EQ(fan_out_->parked(), 1u);
  for (int i = 0; i < 5 && fan_out_->parked() > 0; ++i) {
    slow.Read();
    CatchUp();
  }
  EXPECT_EQ(slow.seen(), Added(1, 3));
  EXPECT_EQ(proto.seen(), Added(1, 3));
  ASSERT_EQ(slow.slices().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(absl::StrCat("event ", i));
    EXPECT_EQ(slow.slices()[i].begin(), fast.slices()[i].begin()) << "encoded once per encoding";
    v1::WatchEvent e;
    ASSERT_TRUE(e.ParseFromArray(slow.slices()[i].begin(), slow.slices()[i].size()));
    EXPECT_FALSE(e.has_object());
    EXPECT_THAT(e.object_json(), HasSubstr(absl::StrCat(R"("name":"o)", i + 1, R"(")")));
    v1::WatchEvent p;
    ASSERT_TRUE(p.ParseFromArray(proto.slices()[i].begin(), proto.slices()[i].size()));
    EXPECT_TRUE(p.object_json().empty());
    EXPECT_EQ(p.object().metadata().name(), absl::StrCat("o", i + 1));
  }
}

TEST_F(FanOutTest, CatchUp_HistoryMovedOn_EndsOutOfRange_AndCountsItOut) {
  FakeWatcher slow(Spec(0), /*capacity=*/2);
  FakeWatcher fast(Spec(0));
  fan_out_->Add(&slow);
  fan_out_->Add(&fast);
  for (int i = 1; i <= 10; ++i) Add(i, absl::StrCat("o", i));
  source_.history.Compact(5);  // it has everything up to 2; 3 and later are needed
  slow.Read();
  CatchUp();
  EXPECT_THAT(slow.seen(), ElementsAre("ADDED o1 web", "ADDED o2 web", "END OUT_OF_RANGE"));
  EXPECT_THAT(slow.end_message(), HasSubstr("too old resource version"));
  EXPECT_EQ(count_changes_, -1);
  EXPECT_EQ(fan_out_->size(), 1u);
  EXPECT_FALSE(fan_out_->Remove(&slow)) << "it left by itself";
  EXPECT_EQ(metrics_.watchers_too_old.Value(), 1);
  EXPECT_EQ(fast.seen(), Added(1, 10));
}

TEST_F(FanOutTest, CatchUp_WithinTheWindow_AfterCompactionOfWhatItHas_StillCatchesUp) {
  FakeWatcher slow(Spec(0), /*capacity=*/2);
  fan_out_->Add(&slow);
  for (int i = 1; i <= 10; ++i) Add(i, absl::StrCat("o", i));
  source_.history.Compact(2);  // it has everything up to 2: the rest is still there
  for (int i = 0; i < 20 && fan_out_->parked() > 0; ++i) {
    slow.Read();
    CatchUp();
  }
  EXPECT_EQ(slow.seen(), Added(1, 10));
}

TEST_F(FanOutTest, ResourceGone_EndsSyncedAtOnce_AndParkedOnceCaughtUpToIt) {
  FakeWatcher slow(Spec(0), /*capacity=*/1);
  FakeWatcher fast(Spec(0));
  fan_out_->Add(&slow);
  fan_out_->Add(&fast);
  Add(1, "o1");
  Add(2, "o2");
  fan_out_->Dispatch(*source_.Commit(MakeEvent(3, v1::WatchEvent::DELETED, "o1", "web")));
  fan_out_->ResourceGone("example.com/widgets", "", 3, absl::NotFoundError("gone"));
  EXPECT_THAT(fast.seen(),
              ElementsAre("ADDED o1 web", "ADDED o2 web", "DELETED o1 web", "END NOT_FOUND"));
  EXPECT_EQ(count_changes_, -1);
  // The resource is served again: a later event is not for the old watcher.
  Add(4, "o4");
  for (int i = 0; i < 10 && fan_out_->size() > 0; ++i) {
    slow.Read();
    CatchUp();
  }
  EXPECT_THAT(slow.seen(),
              ElementsAre("ADDED o1 web", "ADDED o2 web", "DELETED o1 web", "END NOT_FOUND"));
  EXPECT_EQ(count_changes_, -2);
  EXPECT_EQ(fan_out_->size(), 0u);
}

TEST_F(FanOutTest, Skip_ParksEverySyncedWatcher_WhichCatchesUpFromTheHistory) {
  FakeWatcher a(Spec(0));
  FakeWatcher b(Spec(0));
  fan_out_->Add(&a);
  fan_out_->Add(&b);
  Add(1, "o1");
  // 2..5 never reached the dispatcher.
  for (int i = 2; i <= 5; ++i)
    source_.Commit(MakeEvent(i, v1::WatchEvent::ADDED, absl::StrCat("o", i), "web"));
  fan_out_->Skip(5);
  EXPECT_EQ(fan_out_->parked(), 2u);
  EXPECT_EQ(fan_out_->dispatched_revision(), 5);
  CatchUp();
  EXPECT_EQ(fan_out_->parked(), 0u);
  Add(6, "o6");
  EXPECT_EQ(a.seen(), Added(1, 6));
  EXPECT_EQ(b.seen(), Added(1, 6));
}

TEST_F(FanOutTest, Dispatch_SkipsEventsAtOrBeforeTheStart_AlsoWhenCaughtUp) {
  FakeWatcher late(Spec(5), /*capacity=*/1);
  fan_out_->Add(&late);
  for (int i = 1; i <= 8; ++i) Add(i, absl::StrCat("o", i));
  for (int i = 0; i < 10 && fan_out_->parked() > 0; ++i) {
    late.Read();
    CatchUp();
  }
  EXPECT_EQ(late.seen(), Added(6, 8));
}

TEST_F(FanOutTest, Bookmarks_OnlyForWatchersThatAskedForThem) {
  FakeWatcher asked(WithBookmarks(Spec(0, "app=none")));
  FakeWatcher not_asked(Spec(0, "app=none"));
  fan_out_->Add(&asked);
  fan_out_->Add(&not_asked);
  Add(1, "o1");
  // Idle for two and a half intervals (10 s): one bookmark an interval for the one that asked.
  for (int second = 0; second < 25; ++second) {
    clock_.Advance(absl::Seconds(1));
    fan_out_->Tick(clock_.Now());
  }
  EXPECT_THAT(asked.seen(), ElementsAre("BOOKMARK 1", "BOOKMARK 1"));
  EXPECT_THAT(not_asked.seen(), ::testing::IsEmpty()) << "no periodic bookmark unasked";
  // Events still reach both.
  Add(2, "o2", "none");
  EXPECT_THAT(asked.seen(), ElementsAre("BOOKMARK 1", "BOOKMARK 1", "ADDED o2 none"));
  EXPECT_THAT(not_asked.seen(), ElementsAre("ADDED o2 none"));
}

TEST_F(FanOutTest, Bookmarks_SlotsAreDealtAmongTheWatchersThatAsked) {
  // Every other watcher asks: the ten that ask still get their bookmarks one a slot, spread
  // over the interval, not two in one slot and none in the next.
  std::vector<std::unique_ptr<FakeWatcher>> watchers;
  for (int i = 0; i < 20; ++i) {
    WatchSpec spec = Spec(0, "app=none");
    watchers.push_back(std::make_unique<FakeWatcher>(i % 2 == 0 ? WithBookmarks(spec) : spec));
    fan_out_->Add(watchers.back().get());
  }
  // Once every watcher has been idle for half an interval, each slot (1 s) bookmarks one.
  clock_.Advance(absl::Seconds(5));
  fan_out_->Tick(clock_.Now());
  auto bookmarked = [&] {
    size_t n = 0;
    for (const auto& w : watchers) n += w->seen().size();
    return n;
  };
  size_t before = bookmarked();
  for (int slot = 0; slot < FanOut::kBookmarkSlots; ++slot) {
    clock_.Advance(absl::Seconds(1));
    fan_out_->Tick(clock_.Now());
    EXPECT_EQ(bookmarked(), before + slot + 1) << "slot " << slot;
  }
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(watchers[i]->seen().empty(), i % 2 != 0) << "watcher " << i;
  }
}

TEST_F(FanOutTest, Bookmarks_NoneForAWatcherRemoved) {
  FakeWatcher removed(WithBookmarks(Spec(0)));
  FakeWatcher kept(WithBookmarks(Spec(0)));
  fan_out_->Add(&removed);
  fan_out_->Add(&kept);
  EXPECT_TRUE(fan_out_->Remove(&removed));
  for (int second = 0; second < 25; ++second) {
    clock_.Advance(absl::Seconds(1));
    fan_out_->Tick(clock_.Now());
  }
  EXPECT_THAT(removed.seen(), ::testing::IsEmpty());
  EXPECT_THAT(kept.seen(), ElementsAre("BOOKMARK 0", "BOOKMARK 0"));
}

TEST_F(FanOutTest, Bookmarks_NotForAParkedWatcher_WhichHasNotGotEverything) {
  FakeWatcher parked(WithBookmarks(Spec(0)), /*capacity=*/1);
  FakeWatcher idle(WithBookmarks(Spec(0, "app=none")));
  fan_out_->Add(&parked);
  fan_out_->Add(&idle);
  Add(1, "o1");
  Add(2, "o2");
  ASSERT_EQ(fan_out_->parked(), 1u);
  for (int second = 0; second < 25; ++second) {
    clock_.Advance(absl::Seconds(1));
    fan_out_->Tick(clock_.Now());
  }
  EXPECT_THAT(parked.seen(), ElementsAre("ADDED o1 web"));
  EXPECT_THAT(idle.seen(), ElementsAre("BOOKMARK 2", "BOOKMARK 2"));
}

TEST_F(FanOutTest, Sweeps_ReachParkedWatchersToo) {
  FakeWatcher parked(Spec(0), /*capacity=*/1);
  fan_out_->Add(&parked);
  Add(1, "o1");
  Add(2, "o2");
  ASSERT_EQ(fan_out_->parked(), 1u);
  clock_.Advance(FanOut::kSweepInterval);
  fan_out_->Tick(clock_.Now());
  EXPECT_EQ(parked.last_sweep(), clock_.Now());
}

TEST_F(FanOutTest, Remove_OfAParkedWatcher_LeavesNothingBehind) {
  FakeWatcher parked(Spec(0), /*capacity=*/1);
  fan_out_->Add(&parked);
  Add(1, "o1");
  Add(2, "o2");
  ASSERT_EQ(fan_out_->parked(), 1u);
  EXPECT_TRUE(fan_out_->Remove(&parked));
  EXPECT_EQ(fan_out_->parked(), 0u);
  EXPECT_EQ(fan_out_->size(), 0u);
  EXPECT_EQ(metrics_.watchers_parked.Value(), 0);
  parked.Read();
  CatchUp();
  Add(3, "o3");
  EXPECT_THAT(parked.seen(), ElementsAre("ADDED o1 web"));
}

TEST_F(FanOutTest, EndAll_EndsSyncedAndParked) {
  FakeWatcher parked(Spec(0), /*capacity=*/1);
  FakeWatcher synced(Spec(0));
  fan_out_->Add(&parked);
  fan_out_->Add(&synced);
  Add(1, "o1");
  Add(2, "o2");
  fan_out_->EndAll(absl::UnavailableError("server shutting down"));
  EXPECT_EQ(parked.seen().back(), "END UNAVAILABLE");
  EXPECT_EQ(synced.seen().back(), "END UNAVAILABLE");
}

}  // namespace
}  // namespace shardcache
