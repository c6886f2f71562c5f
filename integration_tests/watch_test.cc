// Process-level tests of the Watch RPC against a real cache_server: where a watch starts (from a
// resourceVersion, or from now with the current state and the initial-events-end bookmark),
// filters and how updates that cross them are seen, the history window, periodic bookmarks (only
// for a watch that asks), slow watchers, resource definitions that go away, and many watchers at
// once.

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/testing/channels.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kInitialEventsEnd[] = "k8s.io/initial-events-end";

// An object with spec {"n": n}.
v1::Object Obj(const std::string& cluster, const std::string& ns, const std::string& name,
               const std::map<std::string, std::string>& labels = {}, int n = 0) {
  v1::Object o;
  o.mutable_metadata()->set_cluster(cluster);
  o.mutable_metadata()->set_namespace_(ns);
  o.mutable_metadata()->set_name(name);
  for (const auto& [k, v] : labels) (*o.mutable_metadata()->mutable_labels())[k] = v;
  (*o.mutable_spec()->mutable_fields())["n"].set_number_value(n);
  return o;
}

class WatchTest : public StoreFixture {
 protected:
  const v1::GroupVersionResource widgets_ = Gvr("example.com", "v1", "widgets");
  const v1::GroupVersionResource gadgets_ = Gvr("example.com", "v1", "gadgets");

  // Each writes, fails the test on error, and returns the resourceVersion written.
  int64_t MustCreate(const v1::GroupVersionResource& gvr, const v1::Object& o) {
    v1::Object out;
    grpc::Status s = Create(gvr, o, &out);
    EXPECT_TRUE(Ok(s)) << "create " << o.metadata().name();
    return s.ok() ? Rv(out) : -1;
  }
  int64_t MustUpdate(const v1::GroupVersionResource& gvr, const v1::Object& o) {
    v1::Object out;
    grpc::Status s = Update(gvr, o, &out);
    EXPECT_TRUE(Ok(s)) << "update " << o.metadata().name();
    return s.ok() ? Rv(out) : -1;
  }
  int64_t MustDelete(const v1::GroupVersionResource& gvr, const v1::Object& o) {
    v1::DeleteResponse out;
    grpc::Status s =
        Delete(gvr, o.metadata().cluster(), o.metadata().namespace_(), o.metadata().name(), &out);
    EXPECT_TRUE(Ok(s)) << "delete " << o.metadata().name();
    EXPECT_TRUE(out.deleted());
    return s.ok() ? Rv(out.object()) : -1;
  }
};

// ---- (a) from a resourceVersion ----

TEST_F(WatchTest, FromResourceVersion_DeliversExactlyTheLaterEventsInOrder) {
  StartServer({});
  v1::Object a1 = Obj("c1", "ns1", "a1"), a2 = Obj("c1", "ns1", "a2"), a3 = Obj("c1", "ns1", "a3");
  MustCreate(widgets_, a1);
  MustCreate(widgets_, a2);
  int64_t from = MustCreate(widgets_, a3);

  // After `from`: a mix of writes, interleaved with writes to another resource.
  std::vector<std::string> want;
  v1::Object b1 = Obj("c2", "ns1", "b1");
  want.push_back(Summary("ADDED", "b1", MustCreate(widgets_, b1)));
  a1 = Obj("c1", "ns1", "a1", {}, 1);
  want.push_back(Summary("MODIFIED", "a1", MustUpdate(widgets_, a1)));
  MustCreate(gadgets_, Obj("c1", "ns1", "g1"));
  want.push_back(Summary("DELETED", "a2", MustDelete(widgets_, a2)));
  b1 = Obj("c2", "ns1", "b1", {{"x", "y"}}, 2);
  want.push_back(Summary("MODIFIED", "b1", MustUpdate(widgets_, b1)));
  MustDelete(gadgets_, Obj("c1", "ns1", "g1"));
  want.push_back(Summary("ADDED", "a4", MustCreate(widgets_, Obj("c1", "ns2", "a4"))));
  int64_t last = MustCreate(gadgets_, Obj("c1", "ns1", "g2"));

  WatchReader w(stub_.get(), WatchReq(widgets_, from));
  WatchReader at_head(stub_.get(), WatchReq(widgets_, last));

  // Read them as events, to check the contents too.
  std::vector<v1::WatchEvent> got;
  for (size_t i = 0; i < want.size(); ++i) {
    auto e = w.NextObjectEvent();
    ASSERT_TRUE(e.has_value()) << "only " << i << " of " << want.size() << " events";
    got.push_back(*e);
  }
  std::vector<std::string> got_summaries;
  int64_t prev = from;
  for (const auto& e : got) {
    got_summaries.push_back(Summary(e));
    EXPECT_GT(Rv(e.object()), prev)
        << "resourceVersions must rise strictly, and start after " << from << ": " << Summary(e);
    prev = Rv(e.object());
  }
  EXPECT_EQ(got_summaries, want);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[1].object().spec().fields().at("n").number_value(), 1);  // a1 as updated
  EXPECT_EQ(got[3].object().metadata().labels().at("x"), "y");           // b1 as updated
  EXPECT_EQ(got[3].object().metadata().cluster(), "c2");

  // Nothing else came between: the next event of both watches is the next live write.
  int64_t live = MustCreate(widgets_, Obj("c1", "ns1", "a5"));
  EXPECT_EQ(w.Take(1), std::vector<std::string>{Summary("ADDED", "a5", live)});
  EXPECT_EQ(at_head.Take(1), std::vector<std::string>{Summary("ADDED", "a5", live)});
}

TEST_F(WatchTest, FromResourceVersion_NotANumberOrInTheFuture_IsRejected) {
  StartServer({});
  int64_t rv = MustCreate(widgets_, Obj("c1", "ns1", "a1"));
  WatchReader bad(stub_.get(), WatchReq(widgets_, "abc"));
  auto s = bad.WaitForEnd();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s->error_message();
  EXPECT_THAT(s->error_message(), HasSubstr("resource_version"));

  WatchReader future(stub_.get(), WatchReq(widgets_, rv + 100));
  s = future.WaitForEnd();
  ASSERT_TRUE(s.has_value());
  EXPECT_NE(s->error_code(), grpc::StatusCode::OK);
  EXPECT_FALSE(future.Next(absl::ZeroDuration()).has_value());
}

// ---- (b) from now ----

TEST_F(WatchTest, FromNow_SendsCurrentStateThenInitialEventsEndBookmarkThenLiveEvents) {
  StartServer({});
  std::map<std::string, int64_t> want_initial;  // name -> resourceVersion
  for (const char* name : {"w1", "w2", "w3", "w4", "w5"}) {
    want_initial[name] = MustCreate(widgets_, Obj("c1", "ns1", name));
  }
  want_initial["w2"] = MustUpdate(widgets_, Obj("c1", "ns1", "w2", {}, 7));
  MustDelete(widgets_, Obj("c1", "ns1", "w4"));
  want_initial.erase("w4");
  // The last write is to another resource: the bookmark carries the store's revision, not the
  // last widget's.
  int64_t current = MustCreate(gadgets_, Obj("c1", "ns1", "g1"));

  WatchReader w(stub_.get(), WatchReq(widgets_));
  v1::WatchEvent bookmark;
  std::vector<v1::WatchEvent> initial = w.TakeInitial(&bookmark);
  std::map<std::string, int64_t> got_initial;
  for (const auto& e : initial) {
    EXPECT_EQ(e.type(), v1::WatchEvent::ADDED) << Summary(e);
    EXPECT_TRUE(got_initial.emplace(e.object().metadata().name(), Rv(e.object())).second)
        << "twice: " << Summary(e);
    if (e.object().metadata().name() == "w2") {
      EXPECT_EQ(e.object().spec().fields().at("n").number_value(), 7);
    }
  }
  EXPECT_EQ(got_initial, want_initial);
  EXPECT_EQ(bookmark.type(), v1::WatchEvent::BOOKMARK);
  EXPECT_EQ(bookmark.object().metadata().resource_version(), absl::StrCat(current));
  auto annotations = bookmark.object().metadata().annotations();
  EXPECT_EQ(annotations[kInitialEventsEnd], "true");

  // Then live events, each exactly once.
  std::vector<std::string> want;
  want.push_back(Summary("ADDED", "w6", MustCreate(widgets_, Obj("c1", "ns1", "w6"))));
  want.push_back(Summary("MODIFIED", "w1", MustUpdate(widgets_, Obj("c1", "ns1", "w1", {}, 1))));
  want.push_back(Summary("DELETED", "w3", MustDelete(widgets_, Obj("c1", "ns1", "w3"))));
  EXPECT_EQ(w.Take(3), want);
}

TEST_F(WatchTest, FromNow_EmptyResource_SendsOnlyTheBookmark) {
  StartServer({});
  int64_t current = MustCreate(gadgets_, Obj("c1", "ns1", "g1"));
  WatchReader w(stub_.get(), WatchReq(widgets_));
  auto e = w.Next();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type(), v1::WatchEvent::BOOKMARK);
  EXPECT_EQ(e->object().metadata().resource_version(), absl::StrCat(current));
  EXPECT_EQ(e->object().metadata().annotations().count(kInitialEventsEnd), 1u);
  int64_t rv = MustCreate(widgets_, Obj("c1", "ns1", "w1"));
  EXPECT_EQ(w.Take(1), std::vector<std::string>{Summary("ADDED", "w1", rv)});
}

// ---- (c) filters ----

TEST_F(WatchTest, Filters_UpdateThatCrossesTheFilter_ArrivesAsDeletedOrAdded) {
  StartServer({});
  int64_t before = MustCreate(gadgets_, Obj("c1", "ns1", "g0"));

  struct Case {
    std::string label;
    std::string cluster, ns, selector;
  };
  const std::vector<Case> cases = {
      {"cluster", "c1", "", ""},
      {"namespace", "", "ns1", ""},
      {"selector", "", "", "app=web"},
      {"all three", "c1", "ns1", "app in (web)"},
  };
  auto request = [&](const Case& c, const std::string& rv) {
    v1::WatchRequest req = WatchReq(widgets_, rv);
    req.set_cluster(c.cluster);
    req.set_namespace_(c.ns);
    req.set_label_selector(c.selector);
    return req;
  };
  // Live watches, started before the writes.
  std::vector<std::unique_ptr<WatchReader>> live;
  for (const Case& c : cases) {
    live.push_back(std::make_unique<WatchReader>(stub_.get(), request(c, "")));
    v1::WatchEvent bookmark;
    EXPECT_TRUE(live.back()->TakeInitial(&bookmark).empty());
  }

  const std::map<std::string, std::string> web = {{"app", "web"}}, db = {{"app", "db"}};
  int64_t r1 = MustCreate(widgets_, Obj("c1", "ns1", "w1", web));
  int64_t r2 = MustCreate(widgets_, Obj("c1", "ns1", "w2", db));
  int64_t r3 = MustCreate(widgets_, Obj("c2", "ns1", "w3", web));
  int64_t r4 = MustCreate(widgets_, Obj("c1", "ns2", "w4", web));
  int64_t r5 = MustUpdate(widgets_, Obj("c1", "ns1", "w1", db));      // w1 stops matching app=web
  int64_t r6 = MustUpdate(widgets_, Obj("c1", "ns1", "w2", web));     // w2 starts matching
  int64_t r7 = MustUpdate(widgets_, Obj("c1", "ns1", "w2", web, 1));  // w2 still matches
  int64_t r8 = MustUpdate(widgets_, Obj("c2", "ns1", "w3", web, 1));
  int64_t r9 = MustDelete(widgets_, Obj("c1", "ns1", "w2"));
  int64_t r10 = MustDelete(widgets_, Obj("c1", "ns1", "w1"));  // no longer app=web
  int64_t r11 = MustUpdate(widgets_, Obj("c1", "ns2", "w4", web, 1));

  const std::vector<std::vector<std::string>> want = {
      // cluster c1
      {Summary("ADDED", "w1", r1), Summary("ADDED", "w2", r2), Summary("ADDED", "w4", r4),
       Summary("MODIFIED", "w1", r5), Summary("MODIFIED", "w2", r6), Summary("MODIFIED", "w2", r7),
       Summary("DELETED", "w2", r9), Summary("DELETED", "w1", r10), Summary("MODIFIED", "w4", r11)},
      // namespace ns1
      {Summary("ADDED", "w1", r1), Summary("ADDED", "w2", r2), Summary("ADDED", "w3", r3),
       Summary("MODIFIED", "w1", r5), Summary("MODIFIED", "w2", r6), Summary("MODIFIED", "w2", r7),
       Summary("MODIFIED", "w3", r8), Summary("DELETED", "w2", r9), Summary("DELETED", "w1", r10)},
      // app=web
      {Summary("ADDED", "w1", r1), Summary("ADDED", "w3", r3), Summary("ADDED", "w4", r4),
       Summary("DELETED", "w1", r5), Summary("ADDED", "w2", r6), Summary("MODIFIED", "w2", r7),
       Summary("MODIFIED", "w3", r8), Summary("DELETED", "w2", r9), Summary("MODIFIED", "w4", r11)},
      // c1, ns1, app in (web)
      {Summary("ADDED", "w1", r1), Summary("DELETED", "w1", r5), Summary("ADDED", "w2", r6),
       Summary("MODIFIED", "w2", r7), Summary("DELETED", "w2", r9)},
  };
  // The same from history: watches from before the writes, started after them.
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].label);
    EXPECT_EQ(live[i]->Take(want[i].size()), want[i]) << "live";
    WatchReader history(stub_.get(), request(cases[i], absl::StrCat(before)));
    EXPECT_EQ(history.Take(want[i].size()), want[i]) << "from resourceVersion " << before;
  }

  // A watch from now with filters starts with exactly the matching objects.
  WatchReader now(stub_.get(), request({"", "", "", "app=web"}, ""));
  v1::WatchEvent bookmark;
  std::set<std::string> names;
  for (const auto& e : now.TakeInitial(&bookmark)) names.insert(e.object().metadata().name());
  EXPECT_EQ(names, (std::set<std::string>{"w3", "w4"}));

  // And nothing more arrived on the live watches: the next event is the next matching write.
  int64_t r12 = MustCreate(widgets_, Obj("c1", "ns1", "w5", web));
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(live[i]->Take(1), std::vector<std::string>{Summary("ADDED", "w5", r12)})
        << cases[i].label;
  }
}

TEST_F(WatchTest, Filters_ShardInCacheRole) {
  StartServer({"--role=cache"});
  v1::WatchRequest req = WatchReq(widgets_);
  req.set_shard("a");
  WatchReader w(stub_.get(), req);
  v1::WatchEvent bookmark;
  EXPECT_TRUE(w.TakeInitial(&bookmark).empty());
  v1::Object in_b = Obj("root", "ns1", "x");
  in_b.mutable_metadata()->set_shard("b");
  v1::Object in_a = in_b;
  in_a.mutable_metadata()->set_shard("a");
  MustCreate(widgets_, in_b);
  int64_t rv = MustCreate(widgets_, in_a);
  EXPECT_EQ(w.Take(1), std::vector<std::string>{Summary("ADDED", "x", rv)});
}

TEST_F(WatchTest, Filters_BadSelector_IsInvalidArgument) {
  StartServer({});
  v1::WatchRequest req = WatchReq(widgets_);
  req.set_label_selector("app in (web");
  WatchReader w(stub_.get(), req);
  auto s = w.WaitForEnd();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s->error_message();
  EXPECT_THAT(s->error_message(), HasSubstr("label_selector"));
}

// ---- (d) the history window ----

TEST_F(WatchTest, TooOldResourceVersion_IsOutOfRange) {
  StartServer({"--history-events=10"});
  std::vector<int64_t> rvs;
  for (int i = 0; i < 30; ++i) {
    rvs.push_back(MustCreate(widgets_, Obj("c1", "ns1", absl::StrCat("w", i))));
  }
  WatchReader old(stub_.get(), WatchReq(widgets_, rvs[2]));
  auto s = old.WaitForEnd();
  ASSERT_TRUE(s.has_value()) << "a watch from a compacted revision did not end";
  EXPECT_THAT(FromGrpcStatus(*s),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("too old resource version")));
  EXPECT_FALSE(old.Next(absl::ZeroDuration()).has_value()) << "events before the error";

  // The window holds the last 10 events: a watch from 11 revisions back needs one that is gone;
  // from 10 back it gets exactly the 10 that are kept.
  WatchReader just_too_old(stub_.get(), WatchReq(widgets_, rvs[29] - 11));
  s = just_too_old.WaitForEnd();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->error_code(), grpc::StatusCode::OUT_OF_RANGE) << s->error_message();

  WatchReader oldest_kept(stub_.get(), WatchReq(widgets_, rvs[29] - 10));
  std::vector<std::string> want;
  for (int i = 20; i < 30; ++i) want.push_back(Summary("ADDED", absl::StrCat("w", i), rvs[i]));
  EXPECT_EQ(oldest_kept.Take(10), want);
  EXPECT_FALSE(oldest_kept.WaitForEnd(absl::ZeroDuration()).has_value());
}

// ---- (e) periodic bookmarks ----

TEST_F(WatchTest, PeriodicBookmarks_ReachAnIdleWatch) {
  StartServer({"--bookmark-interval=200ms"});
  int64_t rv = MustCreate(widgets_, Obj("c1", "ns1", "w1"));
  WatchReader from_now(stub_.get(), WatchReq(widgets_));
  WatchReader from_rv(stub_.get(), WatchReq(widgets_, rv));
  v1::WatchEvent initial_end;
  EXPECT_EQ(from_now.TakeInitial(&initial_end).size(), 1u);

  for (WatchReader* w : {&from_now, &from_rv}) {
    for (int i = 0; i < 3; ++i) {
      auto e = w->Next(absl::Seconds(5));
      ASSERT_TRUE(e.has_value()) << "no periodic bookmark " << i;
      EXPECT_EQ(e->type(), v1::WatchEvent::BOOKMARK) << Summary(*e);
      EXPECT_EQ(e->object().metadata().resource_version(), absl::StrCat(rv));
      EXPECT_EQ(e->object().metadata().annotations().count(kInitialEventsEnd), 0u)
          << "only the end of the initial events is annotated";
      EXPECT_EQ(e->object().metadata().name(), "") << "a bookmark carries no object";
    }
  }

  // After a write, the next bookmark covers it. (Bookmarks from before the write may still be
  // queued in front of its event: they keep coming while the test reads the other watch.)
  int64_t rv2 = MustCreate(widgets_, Obj("c1", "ns1", "w2"));
  for (WatchReader* w : {&from_now, &from_rv}) {
    auto e = w->NextObjectEvent();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(Summary(*e), Summary("ADDED", "w2", rv2));
    e = w->Next(absl::Seconds(5));
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->type(), v1::WatchEvent::BOOKMARK);
    EXPECT_EQ(e->object().metadata().resource_version(), absl::StrCat(rv2));
  }
}

TEST_F(WatchTest, PeriodicBookmarks_OnlyForAWatchThatAsked) {
  StartServer({"--bookmark-interval=200ms"});
  int64_t rv = MustCreate(widgets_, Obj("c1", "ns1", "w1"));
  // Two watches as grpcurl sends them (allow_bookmarks unset), from now and from a revision,
  // and one that asks.
  v1::WatchRequest from_now = WatchReq(widgets_);
  from_now.clear_allow_bookmarks();
  v1::WatchRequest from_rv = WatchReq(widgets_, rv);
  from_rv.clear_allow_bookmarks();
  WatchReader plain_now(stub_.get(), from_now);
  WatchReader plain_rv(stub_.get(), from_rv);
  WatchReader asked(stub_.get(), WatchReq(widgets_));
  v1::WatchEvent initial_end;
  EXPECT_EQ(plain_now.TakeInitial(&initial_end).size(), 1u)
      << "the bookmark that ends the initial events comes all the same";
  EXPECT_EQ(initial_end.object().metadata().annotations().count(kInitialEventsEnd), 1u);
  EXPECT_EQ(asked.TakeInitial().size(), 1u);

  // Five bookmarks to the one that asked: a second (five intervals) at least, in which the others
  // were sent nothing, and are sent nothing for five more intervals.
  for (int i = 0; i < 5; ++i) {
    auto e = asked.Next(absl::Seconds(5));
    ASSERT_TRUE(e.has_value()) << "no periodic bookmark " << i;
    EXPECT_EQ(e->type(), v1::WatchEvent::BOOKMARK) << Summary(*e);
    EXPECT_EQ(e->object().metadata().resource_version(), absl::StrCat(rv));
  }
  for (WatchReader* w : {&plain_now, &plain_rv}) {
    auto e = w->Next(absl::Seconds(1));
    EXPECT_FALSE(e.has_value()) << "a watch that did not ask got " << Summary(*e);
    EXPECT_FALSE(w->WaitForEnd(absl::ZeroDuration()).has_value()) << "the watch ended";
  }

  // Events reach them as ever, with nothing in front.
  int64_t rv2 = MustCreate(widgets_, Obj("c1", "ns1", "w2"));
  for (WatchReader* w : {&plain_now, &plain_rv}) {
    auto e = w->Next();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(Summary(*e), Summary("ADDED", "w2", rv2));
  }
}

// ---- json_objects ----

// The object of an event of a json_objects watch, parsed from its JSON. Fails the test if the
// event carries an Object message instead, or JSON that does not parse.
v1::Object FromJson(const v1::WatchEvent& e) {
  EXPECT_FALSE(e.has_object()) << "a json_objects watch got an Object: " << e.ShortDebugString();
  v1::Object o;
  auto status = google::protobuf::util::JsonStringToMessage(e.object_json(), &o);
  EXPECT_TRUE(status.ok()) << status.ToString() << ": " << e.object_json();
  return o;
}

MATCHER_P(SameObject, want, "") {
  return google::protobuf::util::MessageDifferencer::Equals(arg, want);
}

TEST_F(WatchTest, JsonObjects_InitialLiveHistoryAndBookmarkEventsCarryTheObjectAsJson) {
  StartServer({"--bookmark-interval=200ms"});
  v1::Object created;
  ASSERT_TRUE(Ok(Create(widgets_, Obj("c1", "ns1", "w1", {{"app", "a"}}, 1), &created)));
  std::vector<v1::Object> updates;
  for (bool batch : {false, true}) {
    SCOPED_TRACE(batch ? "batch_events" : "one event a message");
    v1::WatchRequest req = WatchReq(widgets_);
    req.set_json_objects(true);
    req.set_batch_events(batch);
    WatchReader w(stub_.get(), req);
    auto initial = w.Next();
    ASSERT_TRUE(initial.has_value());
    EXPECT_EQ(initial->type(), v1::WatchEvent::ADDED);
    v1::Object want = updates.empty() ? created : updates.back();
    EXPECT_THAT(FromJson(*initial), SameObject(want));
    auto end = w.Next();
    ASSERT_TRUE(end.has_value());
    EXPECT_EQ(end->type(), v1::WatchEvent::BOOKMARK);
    EXPECT_EQ(FromJson(*end).metadata().annotations().at(kInitialEventsEnd), "true");

    v1::Object updated;
    ASSERT_TRUE(
        Ok(Update(widgets_, Obj("c1", "ns1", "w1", {{"app", "a"}}, 2 + updates.size()), &updated)));
    updates.push_back(updated);
    auto live = w.NextObjectEvent();
    ASSERT_TRUE(live.has_value());
    EXPECT_EQ(live->type(), v1::WatchEvent::MODIFIED);
    EXPECT_THAT(FromJson(*live), SameObject(updated));
    auto bookmark = w.Next(absl::Seconds(5));
    ASSERT_TRUE(bookmark.has_value());
    EXPECT_EQ(bookmark->type(), v1::WatchEvent::BOOKMARK);
    EXPECT_EQ(FromJson(*bookmark).metadata().resource_version(), absl::StrCat(Rv(updated)));
  }

  // From a resourceVersion: the history, then a deletion, in the same form.
  v1::WatchRequest req = WatchReq(widgets_, Rv(created));
  req.set_json_objects(true);
  WatchReader w(stub_.get(), req);
  for (const v1::Object& want : updates) {
    auto e = w.NextObjectEvent();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->type(), v1::WatchEvent::MODIFIED);
    EXPECT_THAT(FromJson(*e), SameObject(want));
  }
  MustDelete(widgets_, Obj("c1", "ns1", "w1"));
  auto deleted = w.NextObjectEvent();
  ASSERT_TRUE(deleted.has_value());
  EXPECT_EQ(deleted->type(), v1::WatchEvent::DELETED);
  EXPECT_EQ(FromJson(*deleted).metadata().name(), "w1");

  // A watch without the flag is unchanged: Objects, no JSON.
  WatchReader plain(stub_.get(), WatchReq(widgets_, Rv(created)));
  auto e = plain.NextObjectEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->object_json().empty());
  EXPECT_THAT(e->object(), SameObject(updates.front()));
}

// ---- (f) slow watchers ----

TEST_F(WatchTest, SlowWatcher_IsEndedWithResourceExhausted_AndTheServerStaysHealthy) {
  StartServer({"--watch-queue-events=50", "--watch-stall-timeout=2s"});
  double too_slow_before = Metric(server_->http_port(), "shardcache_store_watchers_too_slow_total");
  ASSERT_GE(too_slow_before, 0) << HttpGet(server_->http_port(), "/metrics");

  // A watcher on its own connection that does not read: once HTTP/2 flow control stops the
  // server's writes, its live events pile up on the server.
  auto slow_channel = testing::NonGrowingWindowChannel(server_->grpc_address());
  auto slow_stub = v1::Store::NewStub(slow_channel);
  grpc::ClientContext slow_ctx;
  slow_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(90)));
  int64_t from = MustCreate(gadgets_, Obj("c1", "ns1", "g0"));
  auto slow = slow_stub->Watch(&slow_ctx, WatchReq(widgets_, from));
  // Its events must be live ones (history is not bounded): wait until it is registered.
  ASSERT_TRUE(
      Eventually([&] { return Metric(server_->http_port(), "shardcache_store_watchers") >= 1; },
                 "the watch is registered"));

  // A well-behaved watcher alongside it.
  WatchReader healthy(stub_.get(), WatchReq(widgets_, from));

  const int kObjects = 120;
  std::string big(100 * 1024, 'x');
  for (int i = 0; i < kObjects; ++i) {
    v1::Object o = Obj("c1", "ns1", absl::StrCat("big", i));
    (*o.mutable_spec()->mutable_fields())["data"].set_string_value(big);
    ASSERT_GT(MustCreate(widgets_, o), 0);
  }
  EXPECT_TRUE(Eventually(
      [&] {
        return Metric(server_->http_port(), "shardcache_store_watchers_too_slow_total") >
               too_slow_before;
      },
      "shardcache_store_watchers_too_slow_total rises"));

  // Now read: what was sent before the end, then RESOURCE_EXHAUSTED.
  v1::WatchEvent e;
  int read = 0;
  while (read <= kObjects && slow->Read(&e)) ++read;
  grpc::Status s = slow->Finish();
  EXPECT_LT(read, kObjects) << "the slow watcher got every event";
  EXPECT_THAT(FromGrpcStatus(s),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("too slow")));

  // The well-behaved watcher got everything, and new watches and writes work.
  EXPECT_EQ(healthy.Take(kObjects, absl::Seconds(30)).size(), static_cast<size_t>(kObjects));
  EXPECT_FALSE(healthy.WaitForEnd(absl::ZeroDuration()).has_value());
  v1::WatchRequest small = WatchReq(widgets_);
  small.set_label_selector("app=small");
  WatchReader fresh(stub_.get(), small);
  v1::WatchEvent bookmark;
  EXPECT_TRUE(fresh.TakeInitial(&bookmark).empty());
  int64_t rv = MustCreate(widgets_, Obj("c1", "ns1", "small", {{"app", "small"}}));
  EXPECT_EQ(fresh.Take(1), std::vector<std::string>{Summary("ADDED", "small", rv)});
  EXPECT_EQ(healthy.Take(1), std::vector<std::string>{Summary("ADDED", "small", rv)});
}

// ---- (g) definitions that go away (shard role) ----

TEST_F(WatchTest, DefinitionDeleted_WatchersGetDeletedPerObjectThenNotFound) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  Define("example.com", "gadgets", "Namespaced");
  std::set<std::string> all, web;
  for (int i = 0; i < 5; ++i) {
    std::string name = absl::StrCat("w", i);
    std::map<std::string, std::string> labels;
    if (i % 2 == 0) {
      labels["app"] = "web";
      web.insert(name);
    }
    MustCreate(widgets_, Obj("root", "ns1", name, labels));
    all.insert(name);
  }
  MustCreate(gadgets_, Obj("root", "ns1", "g1"));
  int64_t before = MustCreate(gadgets_, Obj("root", "ns1", "g2"));

  WatchReader everything(stub_.get(), WatchReq(widgets_));
  v1::WatchRequest web_req = WatchReq(widgets_);
  web_req.set_label_selector("app=web");
  WatchReader only_web(stub_.get(), web_req);
  WatchReader from_rv(stub_.get(), WatchReq(widgets_, before));
  WatchReader other(stub_.get(), WatchReq(gadgets_));
  v1::WatchEvent bookmark;
  EXPECT_EQ(everything.TakeInitial(&bookmark).size(), 5u);
  EXPECT_EQ(only_web.TakeInitial(&bookmark).size(), 3u);
  EXPECT_EQ(other.TakeInitial(&bookmark).size(), 2u);
  // A watch from a revision has no initial bookmark to wait for: wait until all four are
  // registered, so that none is started after the definition is gone.
  ASSERT_TRUE(
      Eventually([&] { return Metric(server_->http_port(), "shardcache_store_watchers") >= 4; },
                 "the four watches are registered"));

  ASSERT_TRUE(Ok(Delete(DefinitionGvr(), "", "", "widgets.example.com")));

  // On etcd the objects go in the definition's own transaction, and the watchers end without a
  // DELETED per object (docs/design.md, "Replicas on etcd").
  const bool per_object = StorageUnderTest() != "etcd";
  auto expect_deleted_then_not_found = [per_object](WatchReader& w, std::set<std::string> names) {
    if (!per_object) names.clear();
    std::set<std::string> deleted;
    int64_t prev = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      auto e = w.NextObjectEvent();
      ASSERT_TRUE(e.has_value()) << "only " << i << " DELETED events of " << names.size();
      EXPECT_EQ(e->type(), v1::WatchEvent::DELETED) << Summary(*e);
      EXPECT_TRUE(deleted.insert(e->object().metadata().name()).second) << "twice: " << Summary(*e);
      EXPECT_GT(Rv(e->object()), prev);
      prev = Rv(e->object());
    }
    EXPECT_EQ(deleted, names);
    auto extra = w.NextObjectEvent();
    EXPECT_FALSE(extra.has_value()) << "after the DELETED events: " << Summary(*extra);
    auto s = w.WaitForEnd();
    ASSERT_TRUE(s.has_value()) << "the watch did not end";
    EXPECT_EQ(s->error_code(), grpc::StatusCode::NOT_FOUND) << s->error_message();
  };
  {
    SCOPED_TRACE("everything");
    expect_deleted_then_not_found(everything, all);
  }
  {
    SCOPED_TRACE("app=web");
    expect_deleted_then_not_found(only_web, web);
  }
  {
    SCOPED_TRACE("from a resourceVersion");
    expect_deleted_then_not_found(from_rv, all);
  }

  // The resource is not served; the other one is, and its watch is untouched.
  v1::Object got;
  EXPECT_EQ(Get(widgets_, "root", "ns1", "w0", &got).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::ListRequest list;
  *list.mutable_resource() = widgets_;
  v1::ListResponse listed;
  EXPECT_EQ(List(list, &listed).error_code(), grpc::StatusCode::NOT_FOUND);
  WatchReader refused(stub_.get(), WatchReq(widgets_));
  auto s = refused.WaitForEnd();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->error_code(), grpc::StatusCode::NOT_FOUND) << s->error_message();
  int64_t g3 = MustCreate(gadgets_, Obj("root", "ns1", "g3"));
  EXPECT_EQ(other.Take(1), std::vector<std::string>{Summary("ADDED", "g3", g3)});

  // Recreated: served again, empty, and watchable.
  Define("example.com", "widgets", "Namespaced");
  ASSERT_TRUE(Ok(List(list, &listed)));
  EXPECT_EQ(listed.items_size(), 0);
  WatchReader again(stub_.get(), WatchReq(widgets_));
  EXPECT_TRUE(again.TakeInitial(&bookmark).empty());
  int64_t w9 = MustCreate(widgets_, Obj("root", "ns1", "w9"));
  EXPECT_EQ(again.Take(1), std::vector<std::string>{Summary("ADDED", "w9", w9)});
  int64_t g4 = MustCreate(gadgets_, Obj("root", "ns1", "g4"));
  EXPECT_EQ(other.Take(1), std::vector<std::string>{Summary("ADDED", "g4", g4)});
  EXPECT_FALSE(other.WaitForEnd(absl::ZeroDuration()).has_value());
}

// The end of the old resource's watches must not reach a watch started on the recreated
// resource, however soon after the deletion it starts. Many watchers and objects keep the
// server's dispatcher busy with the deletion's events while the new watch starts.
TEST_F(WatchTest, DefinitionRecreated_NewWatchIsNotEndedByTheOldDeletion) {
  StartServer({"--role=shard"});
  const int kRounds = 5, kObjects = 300, kWatchers = 40;
  v1::Object definition = Definition("example.com", "widgets", "Namespaced", {"v1"}, false);
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    ASSERT_TRUE(Ok(Create(DefinitionGvr(), definition)));
    for (int i = 0; i < kObjects; ++i) {
      ASSERT_GT(MustCreate(widgets_, Obj("root", "ns1", absl::StrCat("w", i))), 0);
    }
    std::vector<std::unique_ptr<WatchReader>> old;
    int64_t rv = MustCreate(widgets_, Obj("root", "ns1", "last"));
    for (int i = 0; i < kWatchers; ++i) {
      old.push_back(std::make_unique<WatchReader>(stub_.get(), WatchReq(widgets_, rv)));
    }
    ASSERT_TRUE(Eventually(
        [&] { return Metric(server_->http_port(), "shardcache_store_watchers") >= kWatchers; },
        "the watches are registered"));

    ASSERT_TRUE(Ok(Delete(DefinitionGvr(), "", "", "widgets.example.com")));
    ASSERT_TRUE(Ok(Create(DefinitionGvr(), definition)));
    WatchReader fresh(stub_.get(), WatchReq(widgets_));
    auto first = fresh.Next();
    ASSERT_TRUE(first.has_value())
        << "the new watch ended: " << fresh.WaitForEnd()->error_message();
    EXPECT_EQ(first->type(), v1::WatchEvent::BOOKMARK) << Summary(*first);
    int64_t added = MustCreate(widgets_, Obj("root", "ns1", "new"));
    auto next = fresh.NextObjectEvent();
    ASSERT_TRUE(next.has_value()) << "the new watch ended: " << fresh.WaitForEnd()->error_message();
    EXPECT_EQ(Summary(*next), Summary("ADDED", "new", added));

    for (auto& w : old) {
      auto s = w->WaitForEnd(absl::Seconds(30));
      ASSERT_TRUE(s.has_value());
      EXPECT_EQ(s->error_code(), grpc::StatusCode::NOT_FOUND) << s->error_message();
    }
    old.clear();
    ASSERT_TRUE(Ok(Delete(DefinitionGvr(), "", "", "widgets.example.com")));
  }
}

// ---- (h) many watchers ----

TEST_F(WatchTest, ManyWatchers_AllReceiveTheSameEventsInTheSameOrder) {
  StartServer({});
  const int kChannels = 4, kPerChannel = 50;
  int64_t from = MustCreate(gadgets_, Obj("c1", "ns1", "g0"));
  std::vector<std::unique_ptr<v1::Store::Stub>> stubs;
  for (int c = 0; c < kChannels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stubs.push_back(v1::Store::NewStub(grpc::CreateCustomChannel(
        server_->grpc_address(), grpc::InsecureChannelCredentials(), args)));
  }
  std::vector<std::unique_ptr<WatchReader>> watchers;
  for (int c = 0; c < kChannels; ++c) {
    for (int i = 0; i < kPerChannel; ++i) {
      watchers.push_back(std::make_unique<WatchReader>(stubs[c].get(), WatchReq(widgets_, from)));
    }
  }
  // All registered before the writes, so that the events reach them live.
  ASSERT_TRUE(Eventually(
      [&] {
        return Metric(server_->http_port(), "shardcache_store_watchers") >= kChannels * kPerChannel;
      },
      absl::Seconds(30), "every watch is registered",
      [&] { return absl::StrCat(Metric(server_->http_port(), "shardcache_store_watchers")); }));

  std::vector<std::string> want;
  for (int i = 0; i < 60; ++i) {
    std::string name = absl::StrCat("w", i);
    want.push_back(Summary("ADDED", name, MustCreate(widgets_, Obj("c1", "ns1", name))));
  }
  for (int i = 0; i < 60; i += 2) {
    std::string name = absl::StrCat("w", i);
    want.push_back(Summary("MODIFIED", name, MustUpdate(widgets_, Obj("c1", "ns1", name, {}, 1))));
  }
  for (int i = 0; i < 60; i += 3) {
    std::string name = absl::StrCat("w", i);
    want.push_back(Summary("DELETED", name, MustDelete(widgets_, Obj("c1", "ns1", name))));
  }
  for (size_t i = 0; i < watchers.size(); ++i) {
    std::vector<std::string> got = watchers[i]->Take(want.size(), absl::Seconds(30));
    ASSERT_EQ(got, want) << "watcher " << i;
  }
}

}  // namespace
}  // namespace shardcache::testing
