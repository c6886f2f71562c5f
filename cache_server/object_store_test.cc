#include "cache_server/object_store.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>
#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cache_server/rocksdb_storage.h"
#include "cache_server/testing/fake_watcher.h"
#include "cache_server/testing/in_process_server.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"

namespace shardcache {
namespace {

using ::shardcache::testing::IsOk;
using ::shardcache::testing::RecordingWatcher;
using ::shardcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Object Obj(const std::string& json) {
  v1::Object o;
  auto s = google::protobuf::util::JsonStringToMessage(json, &o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return o;
}

v1::GroupVersionResource Widgets(const std::string& version = "v1") {
  v1::GroupVersionResource g;
  g.set_group("example.com");
  g.set_version(version);
  g.set_resource("widgets");
  return g;
}

v1::GroupVersionResource Definitions() {
  v1::GroupVersionResource g;
  g.set_group("core.shardcache.io");
  g.set_version("v1");
  g.set_resource("resourcedefinitions");
  return g;
}

v1::Object WidgetDefinition(bool status_subresource = true,
                            const std::string& versions = R"([{"name":"v1"}])") {
  return Obj(
      absl::StrCat(R"({"metadata":{"name":"widgets.example.com"},"spec":{"group":"example.com",)",
                   R"("names":{"plural":"widgets"},"scope":"Namespaced","versions":)", versions,
                   status_subresource ? R"(,"subresources":{"status":{}})" : "", "}}"));
}

v1::Object Widget(const std::string& name, const std::string& labels = "{}",
                  const std::string& spec = R"({"size":1})") {
  return Obj(absl::StrCat(R"({"metadata":{"cluster":"root","namespace":"default","name":")", name,
                          R"(","labels":)", labels, R"(},"spec":)", spec, "}"));
}

class ObjectStoreTest : public ::testing::Test {
 protected:
  void Make(Role role, int64_t history = 1000) {
    ObjectStore::Options o;
    o.role = role;
    o.history_events = history;
    o.clock = &clock_;
    store_ = std::make_unique<ObjectStore>(o, &cache_, &metrics_);
  }
  void DefineWidgets(bool status_subresource = true) {
    v1::CreateRequest req;
    *req.mutable_resource() = Definitions();
    *req.mutable_object() = WidgetDefinition(status_subresource);
    ASSERT_THAT(store_->Create(req), IsOk());
  }
  absl::StatusOr<ObjectRef> Create(const v1::Object& o) {
    v1::CreateRequest req;
    *req.mutable_resource() = Widgets();
    *req.mutable_object() = o;
    return store_->Create(req);
  }
  absl::StatusOr<ObjectRef> Update(const v1::Object& o) {
    v1::UpdateRequest req;
    *req.mutable_resource() = Widgets();
    *req.mutable_object() = o;
    return store_->Update(req);
  }
  absl::StatusOr<ObjectStore::DeleteResult> Delete(const std::string& name) {
    v1::DeleteRequest req;
    *req.mutable_resource() = Widgets();
    req.set_cluster("root");
    req.set_namespace_("default");
    req.set_name(name);
    return store_->Delete(req);
  }
  absl::StatusOr<v1::ListResponse> List(int64_t limit, const std::string& token = "",
                                        const std::string& selector = "") {
    v1::ListRequest req;
    *req.mutable_resource() = Widgets();
    req.set_limit(limit);
    req.set_continue_token(token);
    req.set_label_selector(selector);
    return store_->List(req);
  }

  FakeClock clock_;
  StoreMetrics metrics_{std::make_shared<prometheus::Registry>()};
  WatchCache cache_{WatchCache::Options{absl::Seconds(60)}, &metrics_};
  std::unique_ptr<ObjectStore> store_;
};

// The identity comes from the loaded state; a store without storage makes one per process.
TEST_F(ObjectStoreTest, StoreId_FromTheStateOrMadeForTheProcess_OnEveryList) {
  Make(Role::kCache);
  const std::string made = store_->store_id();
  EXPECT_EQ(made.size(), 36u);
  auto listed = List(0);
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ(listed->store_id(), made);

  ObjectStore::Options o;
  o.clock = &clock_;
  PersistedState state;
  state.store_id = "0b8a4c1e-loaded";
  ObjectStore loaded(o, &cache_, &metrics_, state);
  EXPECT_EQ(loaded.store_id(), "0b8a4c1e-loaded");
  v1::ListRequest req;
  *req.mutable_resource() = Widgets();
  auto from_loaded = loaded.List(req);
  ASSERT_THAT(from_loaded, IsOk());
  EXPECT_EQ(from_loaded->store_id(), "0b8a4c1e-loaded");
  EXPECT_NE(ObjectStore(o, &cache_, &metrics_).store_id(), made);
}

TEST_F(ObjectStoreTest, Create_SetsServerOwnedMetadata) {
  Make(Role::kShard);
  DefineWidgets();
  v1::Object in = Widget("a");
  in.mutable_metadata()->set_uid("client-chosen");
  in.mutable_metadata()->set_generation(7);
  auto out = Create(in);
  ASSERT_THAT(out, IsOk());
  const v1::ObjectMeta& m = (*out)->metadata();
  EXPECT_EQ(m.resource_version(), "3");  // 1 initial, 2 the definition
  EXPECT_NE(m.uid(), "client-chosen");
  EXPECT_EQ(m.uid().size(), 36u);
  EXPECT_EQ(m.generation(), 1);
  EXPECT_EQ(google::protobuf::util::TimeUtil::TimestampToNanoseconds(m.creation_timestamp()),
            absl::ToUnixNanos(clock_.Now()));
  EXPECT_EQ(store_->revision(), 3);
}

TEST_F(ObjectStoreTest, Create_CacheRoleKeepsWriterIdentity) {
  Make(Role::kCache);
  v1::Object in = Widget("a");
  in.mutable_metadata()->set_uid("origin-uid");
  in.mutable_metadata()->set_generation(7);
  in.mutable_metadata()->mutable_creation_timestamp()->set_seconds(1000);
  auto out = Create(in);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ((*out)->metadata().uid(), "origin-uid");
  EXPECT_EQ((*out)->metadata().generation(), 7);
  EXPECT_EQ((*out)->metadata().creation_timestamp().seconds(), 1000);
  EXPECT_EQ((*out)->metadata().resource_version(), "2");
}

TEST_F(ObjectStoreTest, Update_GenerationRisesOnlyOnSpecChange) {
  Make(Role::kShard);
  DefineWidgets();
  ASSERT_THAT(Create(Widget("a")), IsOk());
  auto labels_only = Update(Widget("a", R"({"x":"y"})"));
  ASSERT_THAT(labels_only, IsOk());
  EXPECT_EQ((*labels_only)->metadata().generation(), 1);
  auto spec = Update(Widget("a", R"({"x":"y"})", R"({"size":2})"));
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ((*spec)->metadata().generation(), 2);
}

TEST_F(ObjectStoreTest, Update_NoChange_KeepsRevision) {
  Make(Role::kShard);
  DefineWidgets();
  auto created = Create(Widget("a"));
  ASSERT_THAT(created, IsOk());
  auto same = Update(Widget("a"));
  ASSERT_THAT(same, IsOk());
  EXPECT_EQ((*same)->metadata().resource_version(), (*created)->metadata().resource_version());
  EXPECT_EQ(store_->revision(), 3);
}

TEST_F(ObjectStoreTest, Update_StaleResourceVersion_IsConflict) {
  Make(Role::kShard);
  DefineWidgets();
  ASSERT_THAT(Create(Widget("a")), IsOk());
  v1::Object stale = Widget("a", "{}", R"({"size":5})");
  stale.mutable_metadata()->set_resource_version("2");
  EXPECT_THAT(Update(stale), StatusIs(absl::StatusCode::kAborted, HasSubstr("modified")));
  stale.mutable_metadata()->set_resource_version("3");
  EXPECT_THAT(Update(stale), IsOk());
}

TEST_F(ObjectStoreTest, Update_StatusSubresource_IgnoresStatus) {
  Make(Role::kShard);
  DefineWidgets(/*status_subresource=*/true);
  ASSERT_THAT(Create(Widget("a")), IsOk());
  v1::Object with_status = Widget("a");
  (*with_status.mutable_status()->mutable_fields())["ready"].set_bool_value(true);
  auto updated = Update(with_status);
  ASSERT_THAT(updated, IsOk());
  EXPECT_EQ((*updated)->status().fields_size(), 0);

  v1::UpdateRequest req;
  *req.mutable_resource() = Widgets();
  *req.mutable_object() = with_status;
  (*req.mutable_object()->mutable_spec()->mutable_fields())["size"].set_number_value(99);
  auto status = store_->UpdateStatus(req);
  ASSERT_THAT(status, IsOk());
  EXPECT_TRUE((*status)->status().fields().at("ready").bool_value());
  EXPECT_EQ((*status)->spec().fields().at("size").number_value(), 1);  // spec untouched
}

TEST_F(ObjectStoreTest, UpdateStatus_WithoutSubresource_IsNotFound) {
  Make(Role::kShard);
  DefineWidgets(/*status_subresource=*/false);
  ASSERT_THAT(Create(Widget("a")), IsOk());
  v1::UpdateRequest req;
  *req.mutable_resource() = Widgets();
  *req.mutable_object() = Widget("a");
  EXPECT_THAT(store_->UpdateStatus(req),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no status subresource")));
}

TEST_F(ObjectStoreTest, Delete_WithFinalizers_HoldsObjectUntilRemoved) {
  Make(Role::kShard);
  DefineWidgets();
  v1::Object w = Widget("a");
  w.mutable_metadata()->add_finalizers("example.com/cleanup");
  ASSERT_THAT(Create(w), IsOk());
  auto first = Delete("a");
  ASSERT_THAT(first, IsOk());
  EXPECT_FALSE(first->deleted);
  EXPECT_TRUE(first->object->metadata().has_deletion_timestamp());
  auto second = Delete("a");
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->object->metadata().resource_version(),
            first->object->metadata().resource_version());

  v1::Object more = w;
  more.mutable_metadata()->add_finalizers("example.com/other");
  EXPECT_THAT(Update(more),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("metadata.finalizers[1]")));
  w.mutable_metadata()->clear_finalizers();
  ASSERT_THAT(Update(w), IsOk());
  v1::GetRequest get;
  *get.mutable_resource() = Widgets();
  get.set_cluster("root");
  get.set_namespace_("default");
  get.set_name("a");
  EXPECT_THAT(store_->Get(get), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ObjectStoreTest, Fence_LowerEpochIsRejected) {
  Make(Role::kCache);
  v1::CreateRequest req;
  *req.mutable_resource() = Widgets();
  *req.mutable_object() = Widget("a");
  req.mutable_fence()->set_shard("s1");
  req.mutable_fence()->set_epoch(5);
  ASSERT_THAT(store_->Create(req), IsOk());
  *req.mutable_object() = Widget("b");
  req.mutable_fence()->set_epoch(4);
  EXPECT_THAT(store_->Create(req),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("epoch 5")));
  EXPECT_EQ(store_->revision(), 2);
}

v1::ClaimEpochRequest Claim(const std::string& shard, int64_t epoch) {
  v1::ClaimEpochRequest req;
  req.mutable_fence()->set_shard(shard);
  req.mutable_fence()->set_epoch(epoch);
  return req;
}

v1::CreateRequest FencedCreate(const v1::Object& o, const std::string& shard, int64_t epoch) {
  v1::CreateRequest req;
  *req.mutable_resource() = Widgets();
  *req.mutable_object() = o;
  req.mutable_fence()->set_shard(shard);
  req.mutable_fence()->set_epoch(epoch);
  return req;
}

MATCHER_P(HoldsEpoch, epoch, absl::StrCat("is OK and holds epoch ", epoch)) {
  if (!arg.ok()) {
    *result_listener << "status " << arg.status();
    return false;
  }
  *result_listener << "epoch " << *arg;
  return *arg == epoch;
}

TEST_F(ObjectStoreTest, ClaimEpoch_HigherOrEqualIsRecorded_LowerIsFenced) {
  Make(Role::kCache);
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", 5)), HoldsEpoch(5));
  // Claiming the same epoch again (a retry) succeeds.
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", 5)), HoldsEpoch(5));
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", 4)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("fenced: shard \"s1\" is at epoch 5 and this claim carries "
                                 "epoch 4 (a newer leader holds the shard)")));
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", 9)), HoldsEpoch(9));
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", 5)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("at epoch 9")));
  // Shards are independent.
  EXPECT_THAT(store_->ClaimEpoch(Claim("s2", 1)), HoldsEpoch(1));
  // A claim writes no object.
  EXPECT_EQ(store_->revision(), 1);
}

TEST_F(ObjectStoreTest, ClaimEpoch_FencesLaterWritesOfLowerEpochs) {
  Make(Role::kCache);
  ASSERT_THAT(store_->ClaimEpoch(Claim("s1", 5)), IsOk());
  EXPECT_THAT(store_->Create(FencedCreate(Widget("a"), "s1", 4)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is at epoch 5 and this write carries epoch 4")));
  EXPECT_EQ(store_->revision(), 1);
  ASSERT_THAT(store_->Create(FencedCreate(Widget("a"), "s1", 5)), IsOk());
  v1::UpdateRequest update;
  *update.mutable_resource() = Widgets();
  *update.mutable_object() = Widget("a", "{}", R"({"size":2})");
  update.mutable_fence()->set_shard("s1");
  update.mutable_fence()->set_epoch(3);
  EXPECT_THAT(store_->Update(update), StatusIs(absl::StatusCode::kFailedPrecondition));
  v1::DeleteRequest del;
  *del.mutable_resource() = Widgets();
  del.set_cluster("root");
  del.set_namespace_("default");
  del.set_name("a");
  del.mutable_fence()->set_shard("s1");
  del.mutable_fence()->set_epoch(4);
  EXPECT_THAT(store_->Delete(del), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(store_->revision(), 2);
  // A write under a higher epoch raises it past the claim.
  ASSERT_THAT(store_->Create(FencedCreate(Widget("b"), "s1", 6)), IsOk());
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", 5)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("at epoch 6")));
}

TEST_F(ObjectStoreTest, ClaimEpoch_InvalidFence_NamesTheFieldAndClaimsNothing) {
  Make(Role::kShard);
  EXPECT_THAT(store_->ClaimEpoch(v1::ClaimEpochRequest()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fence.shard: Required")));
  EXPECT_THAT(store_->ClaimEpoch(Claim("", 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fence.shard: Required")));
  EXPECT_THAT(
      store_->ClaimEpoch(Claim("Shard_1", 3)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fence.shard: Invalid value")));
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fence.epoch: Required")));
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", -3)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fence.epoch: Invalid value: must be positive")));
  // Nothing was recorded: any positive epoch may still be claimed.
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", 1)), HoldsEpoch(1));
}

TEST_F(ObjectStoreTest, List_PagesStayAtFirstRevision) {
  Make(Role::kShard);
  DefineWidgets();
  for (int i = 0; i < 10; ++i) ASSERT_THAT(Create(Widget(absl::StrCat("w", i))), IsOk());
  auto page1 = List(4);
  ASSERT_THAT(page1, IsOk());
  ASSERT_EQ(page1->items_size(), 4);
  ASSERT_FALSE(page1->continue_token().empty());
  // Change the rest: delete w5, add w99, modify w9.
  ASSERT_THAT(Delete("w5"), IsOk());
  ASSERT_THAT(Create(Widget("w99")), IsOk());
  ASSERT_THAT(Update(Widget("w9", "{}", R"({"size":42})")), IsOk());
  std::vector<std::string> names;
  for (const auto& o : page1->items()) names.push_back(o.metadata().name());
  std::string token = page1->continue_token();
  while (!token.empty()) {
    auto page = List(4, token);
    ASSERT_THAT(page, IsOk());
    EXPECT_EQ(page->resource_version(), page1->resource_version());
    for (const auto& o : page->items()) {
      names.push_back(o.metadata().name());
      if (o.metadata().name() == "w9") {
        EXPECT_EQ(o.spec().fields().at("size").number_value(), 1);
      }
    }
    token = page->continue_token();
  }
  EXPECT_THAT(names, ElementsAre("w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9"));
}

TEST_F(ObjectStoreTest, List_ContinueAfterCompaction_IsOutOfRange) {
  Make(Role::kShard, /*history=*/5);
  DefineWidgets();
  for (int i = 0; i < 6; ++i) ASSERT_THAT(Create(Widget(absl::StrCat("w", i))), IsOk());
  auto page1 = List(2);
  ASSERT_THAT(page1, IsOk());
  for (int i = 0; i < 6; ++i)
    ASSERT_THAT(Update(Widget("w0", "{}", absl::StrCat("{\"n\":", i, "}"))), IsOk());
  EXPECT_THAT(List(2, page1->continue_token()),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("too old resource version")));
}

TEST_F(ObjectStoreTest, List_LabelSelectorFilters) {
  Make(Role::kShard);
  DefineWidgets();
  ASSERT_THAT(Create(Widget("a", R"({"app":"web","tier":"front"})")), IsOk());
  ASSERT_THAT(Create(Widget("b", R"({"app":"web","tier":"back"})")), IsOk());
  ASSERT_THAT(Create(Widget("c", R"({"app":"db"})")), IsOk());
  auto l = List(0, "", "app=web,tier notin (back)");
  ASSERT_THAT(l, IsOk());
  ASSERT_EQ(l->items_size(), 1);
  EXPECT_EQ(l->items(0).metadata().name(), "a");
  EXPECT_THAT(List(0, "", "app in (web"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("label_selector")));
}

TEST_F(ObjectStoreTest, Watch_FromRevision_ReplaysHistoryThenLive) {
  Make(Role::kShard);
  DefineWidgets();
  ASSERT_THAT(Create(Widget("a")), IsOk());                         // rv 3
  ASSERT_THAT(Update(Widget("a", "{}", R"({"size":2})")), IsOk());  // rv 4
  RecordingWatcher w;
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  req.set_resource_version("3");
  ASSERT_THAT(store_->StartWatch(req, &w), IsOk());
  ASSERT_THAT(Delete("a"), IsOk());  // rv 5
  EXPECT_THAT(w.WaitFor(2), ElementsAre("MODIFIED a 4", "DELETED a 5"));
  cache_.Unregister(&w);
}

TEST_F(ObjectStoreTest, Watch_FromNow_SendsStateThenBookmark) {
  Make(Role::kShard);
  DefineWidgets();
  ASSERT_THAT(Create(Widget("a")), IsOk());
  ASSERT_THAT(Create(Widget("b")), IsOk());
  RecordingWatcher w;
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  ASSERT_THAT(store_->StartWatch(req, &w), IsOk());
  ASSERT_THAT(Create(Widget("c")), IsOk());
  EXPECT_THAT(w.WaitFor(4), ElementsAre("ADDED a 3", "ADDED b 4", "BOOKMARK  4", "ADDED c 5"));
  cache_.Unregister(&w);
}

TEST_F(ObjectStoreTest, Watch_SelectorCrossing_BecomesAddedOrDeleted) {
  Make(Role::kShard);
  DefineWidgets();
  RecordingWatcher w;
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  req.set_resource_version("2");
  req.set_label_selector("app=web");
  ASSERT_THAT(store_->StartWatch(req, &w), IsOk());
  ASSERT_THAT(Create(Widget("a", R"({"app":"db"})")), IsOk());   // 3: not seen
  ASSERT_THAT(Update(Widget("a", R"({"app":"web"})")), IsOk());  // 4: ADDED
  ASSERT_THAT(Update(Widget("a", R"({"app":"db"})")), IsOk());   // 5: DELETED
  ASSERT_THAT(Create(Widget("b", R"({"app":"web"})")), IsOk());  // 6: ADDED
  EXPECT_THAT(w.WaitFor(3), ElementsAre("ADDED a 4", "DELETED a 5", "ADDED b 6"));
  cache_.Unregister(&w);
}

TEST_F(ObjectStoreTest, Watch_TooOldRevision_IsOutOfRange) {
  Make(Role::kShard, /*history=*/3);
  DefineWidgets();
  for (int i = 0; i < 5; ++i) ASSERT_THAT(Create(Widget(absl::StrCat("w", i))), IsOk());
  RecordingWatcher w;
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  req.set_resource_version("2");
  EXPECT_THAT(store_->StartWatch(req, &w),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("too old resource version")));
  req.set_resource_version("4");  // compacted up to 4: events 5.. remain
  EXPECT_THAT(store_->StartWatch(req, &w), IsOk());
  cache_.Unregister(&w);
}

// The history the watch fan-out catches parked watchers up from: one resource's events in a
// revision range, at most as many as asked, and OUT_OF_RANGE once what follows `after` has left
// the window.
TEST_F(ObjectStoreTest, ReadHistory_OneResourcesEventsInRange_OutOfRangeOnceCompacted) {
  Make(Role::kShard, /*history=*/5);
  DefineWidgets();  // revision 2
  for (int i = 0; i < 4; ++i) ASSERT_THAT(Create(Widget(absl::StrCat("w", i))), IsOk());  // 3..6
  auto revisions = [](const std::vector<EventPtr>& events) {
    std::vector<int64_t> out;
    for (const EventPtr& e : events) out.push_back(e->revision);
    return out;
  };
  std::vector<EventPtr> events;
  ASSERT_THAT(store_->ReadHistory("example.com/widgets", 2, 6, 100, &events), IsOk());
  EXPECT_THAT(revisions(events), ElementsAre(3, 4, 5, 6));
  events.clear();
  ASSERT_THAT(store_->ReadHistory("example.com/widgets", 3, 5, 100, &events), IsOk());
  EXPECT_THAT(revisions(events), ElementsAre(4, 5));
  events.clear();
  ASSERT_THAT(store_->ReadHistory("example.com/widgets", 2, 6, 2, &events), IsOk());
  EXPECT_THAT(revisions(events), ElementsAre(3, 4));
  events.clear();
  // The definition's own event is another resource's.
  ASSERT_THAT(store_->ReadHistory("example.com/gadgets", 1, 6, 100, &events), IsOk());
  EXPECT_THAT(events, ::testing::IsEmpty());
  // Two more writes: the window (5 events) starts after revision 3.
  for (int i = 4; i < 6; ++i) ASSERT_THAT(Create(Widget(absl::StrCat("w", i))), IsOk());
  EXPECT_THAT(store_->ReadHistory("example.com/widgets", 2, 8, 100, &events),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(events, ::testing::IsEmpty());
  ASSERT_THAT(store_->ReadHistory("example.com/widgets", 3, 8, 100, &events), IsOk());
  EXPECT_THAT(revisions(events), ElementsAre(4, 5, 6, 7, 8));
}

TEST_F(ObjectStoreTest, DefinitionDeleted_DeletesObjectsThenEndsWatches) {
  Make(Role::kShard);
  DefineWidgets();
  ASSERT_THAT(Create(Widget("a")), IsOk());
  ASSERT_THAT(Create(Widget("b")), IsOk());
  RecordingWatcher w;
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  req.set_resource_version("4");
  ASSERT_THAT(store_->StartWatch(req, &w), IsOk());
  v1::DeleteRequest del;
  *del.mutable_resource() = Definitions();
  del.set_name("widgets.example.com");
  ASSERT_THAT(store_->Delete(del), IsOk());
  EXPECT_THAT(w.WaitFor(3), ElementsAre("DELETED a 6", "DELETED b 7", "END NOT_FOUND"));
  EXPECT_THAT(List(0), StatusIs(absl::StatusCode::kNotFound));
  cache_.Unregister(&w);

  // Recreated: served again, and empty.
  DefineWidgets();
  auto l = List(0);
  ASSERT_THAT(l, IsOk());
  EXPECT_EQ(l->items_size(), 0);
}

TEST_F(ObjectStoreTest, DefinitionVersionRemoved_EndsOnlyThatVersionsWatches) {
  Make(Role::kShard);
  v1::CreateRequest def;
  *def.mutable_resource() = Definitions();
  *def.mutable_object() = WidgetDefinition(true, R"([{"name":"v1"},{"name":"v2"}])");
  ASSERT_THAT(store_->Create(def), IsOk());
  RecordingWatcher w1, w2;
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets("v1");
  req.set_resource_version("2");
  ASSERT_THAT(store_->StartWatch(req, &w1), IsOk());
  *req.mutable_resource() = Widgets("v2");
  ASSERT_THAT(store_->StartWatch(req, &w2), IsOk());
  v1::UpdateRequest upd;
  *upd.mutable_resource() = Definitions();
  *upd.mutable_object() = WidgetDefinition(true, R"([{"name":"v1"},{"name":"v2","served":false}])");
  ASSERT_THAT(store_->Update(upd), IsOk());
  EXPECT_THAT(w2.WaitFor(1), ElementsAre("END NOT_FOUND"));
  ASSERT_THAT(Create(Widget("a")), IsOk());
  EXPECT_THAT(w1.WaitFor(1), ElementsAre("ADDED a 4"));
  cache_.Unregister(&w1);
  cache_.Unregister(&w2);
}

TEST_F(ObjectStoreTest, ShardRole_UnknownResource_IsNotFound) {
  Make(Role::kShard);
  EXPECT_THAT(Create(Widget("a")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("widgets.example.com/v1")));
  EXPECT_EQ(store_->revision(), 1);
}

TEST_F(ObjectStoreTest, Compaction_DropsOldVersions_KeepsCurrent) {
  Make(Role::kCache, /*history=*/2);
  ASSERT_THAT(Create(Widget("a")), IsOk());
  for (int i = 0; i < 20; ++i) {
    ASSERT_THAT(Update(Widget("a", "{}", absl::StrCat("{\"n\":", i, "}"))), IsOk());
  }
  ASSERT_THAT(Delete("a"), IsOk());
  ASSERT_THAT(Create(Widget("b")), IsOk());
  ASSERT_THAT(Create(Widget("c")), IsOk());
  auto l = List(0);
  ASSERT_THAT(l, IsOk());
  ASSERT_EQ(l->items_size(), 2);
  EXPECT_EQ(l->items(0).metadata().name(), "b");
}

// Records what the store commits.
class RecordingStorage : public Storage {
 public:
  absl::StatusOr<PersistedState> Load() override { return PersistedState(); }
  absl::Status Commit(const CommitBatch& batch) override {
    absl::MutexLock l(&mu_);
    batches_.push_back(batch);
    return absl::OkStatus();
  }
  std::vector<CommitBatch> batches() {
    absl::MutexLock l(&mu_);
    return batches_;
  }

 private:
  absl::Mutex mu_;
  std::vector<CommitBatch> batches_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ObjectStoreTest, Durability_AckedWritesAndEpochsAreInACommittedBatch) {
  RecordingStorage storage;
  ObjectStore::Options o;
  o.role = Role::kCache;
  o.clock = &clock_;
  o.storage = &storage;
  store_ = std::make_unique<ObjectStore>(o, &cache_, &metrics_);
  auto created = Create(Widget("a"));
  ASSERT_THAT(created, IsOk());
  // A no-op update that raises the shard's epoch is acknowledged only once the epoch is durable.
  v1::UpdateRequest req;
  *req.mutable_resource() = Widgets();
  *req.mutable_object() = Widget("a");
  req.mutable_fence()->set_shard("s1");
  req.mutable_fence()->set_epoch(7);
  auto same = store_->Update(req);
  ASSERT_THAT(same, IsOk());
  EXPECT_EQ((*same)->metadata().resource_version(), (*created)->metadata().resource_version());
  std::vector<CommitBatch> batches = storage.batches();
  int64_t rev = 0;
  std::map<std::string, int64_t> epochs;
  for (const CommitBatch& b : batches) {
    for (const EventPtr& e : b.events) EXPECT_GT(e->revision, rev);
    if (!b.events.empty()) rev = b.events.back()->revision;
    for (const auto& [shard, epoch] : b.epochs) epochs[shard] = epoch;
  }
  EXPECT_EQ(rev, 2);
  EXPECT_EQ(epochs["s1"], 7);
}

TEST_F(ObjectStoreTest, Durability_ClaimAloneIsCommittedBeforeItIsAnswered) {
  testing::GatedStorage storage;
  storage.Close();
  ObjectStore::Options o;
  o.role = Role::kCache;
  o.clock = &clock_;
  o.storage = &storage;
  store_ = std::make_unique<ObjectStore>(o, &cache_, &metrics_);
  absl::Notification answered;
  absl::StatusOr<int64_t> result;
  size_t committed_when_answered = 0;
  store_->ClaimEpochAsync(Claim("s1", 3), [&](absl::StatusOr<int64_t> r) {
    result = std::move(r);
    committed_when_answered = storage.committed();
    answered.Notify();
  });
  // The committer writes a batch holding only the epoch (nothing else is pending)...
  ASSERT_TRUE(storage.WaitForEpochCommit("s1")) << "the claim was never committed";
  // ...and the claim is not answered while that commit is in progress: not yet, and when it is,
  // the commit has returned.
  EXPECT_FALSE(answered.HasBeenNotified()) << "the claim was answered before it was durable";
  storage.Open();
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(committed_when_answered, 1u) << "the claim was answered before it was durable";
  EXPECT_THAT(result, HoldsEpoch(3));
  std::vector<CommitBatch> batches = storage.batches();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_TRUE(batches[0].events.empty());
  EXPECT_EQ(batches[0].revision, 1);
  EXPECT_EQ(batches[0].epochs, (std::map<std::string, int64_t>{{"s1", 3}}));
  // An equal claim is durable already: it is answered without another commit.
  EXPECT_THAT(store_->ClaimEpoch(Claim("s1", 3)), HoldsEpoch(3));
  EXPECT_EQ(storage.batches().size(), 1u);
}

TEST_F(ObjectStoreTest, Durability_ClaimsSurviveReopeningTheDataDirectory) {
  const std::string dir = testing::MakeTempDir("claims") + "/data";
  ObjectStore::Options o;
  o.role = Role::kShard;
  o.clock = &clock_;
  {
    auto storage = RocksDbStorage::Open({dir, true});
    ASSERT_THAT(storage, IsOk());
    auto state = (*storage)->Load();
    ASSERT_THAT(state, IsOk());
    o.storage = storage->get();
    store_ = std::make_unique<ObjectStore>(o, &cache_, &metrics_, *std::move(state));
    ASSERT_THAT(store_->ClaimEpoch(Claim("a", 5)), IsOk());
    ASSERT_THAT(store_->ClaimEpoch(Claim("b", 2)), IsOk());
    store_.reset();
  }
  auto storage = RocksDbStorage::Open({dir, true});
  ASSERT_THAT(storage, IsOk());
  auto state = (*storage)->Load();
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->epochs, (std::map<std::string, int64_t>{{"a", 5}, {"b", 2}}));
  EXPECT_EQ(state->revision, 1);
  o.storage = storage->get();
  store_ = std::make_unique<ObjectStore>(o, &cache_, &metrics_, *std::move(state));
  EXPECT_THAT(store_->ClaimEpoch(Claim("a", 4)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is at epoch 5 and this claim carries epoch 4")));
  DefineWidgets();
  EXPECT_THAT(store_->Create(FencedCreate(Widget("w"), "a", 4)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("at epoch 5")));
  EXPECT_THAT(store_->Create(FencedCreate(Widget("w"), "b", 2)), IsOk());
  EXPECT_THAT(store_->ClaimEpoch(Claim("a", 5)), HoldsEpoch(5));
  store_.reset();
}

}  // namespace
}  // namespace shardcache
