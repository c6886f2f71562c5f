// Unit tests of CcrController, one (or more) per branch of its reconcile (ccr_controller.h), with
// no process: the shard store's and the cache's informers come from DynamicInformerFactories
// over scripted ListerWatchers (common/testing/scripted_source.h), the writes go to a fake cache
// writer and a fake shard-store writer, and the controller's time is a FakeClock (its queue's
// delayed retries happen only when the test advances it).
#include "shard_replicator/ccr_controller.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/client/dynamic_informer_factory.h"
#include "common/clock.h"
#include "common/error_info.h"
#include "common/resources.h"
#include "common/testing/objects.h"
#include "common/testing/scripted_source.h"
#include "common/testing/wait.h"
#include "shard_replicator/cluster_cached_resource.h"
#include "shard_replicator/testing/fake_cache_writer.h"
#include "shard_replicator/testing/fake_shard_store_writer.h"

namespace shardcache {
namespace {

using testing::Eventually;
using testing::FakeCacheWriter;
using testing::FakeShardStoreWriter;
using testing::PushWhenWatching;
using testing::ScriptedListerWatcher;
using testing::ScriptedSource;
using testing::WatchEventOf;

constexpr char kShard[] = "a";
constexpr char kCluster[] = "root";
constexpr int64_t kEpoch = 7;

v1::GroupVersionResource Widgets() { return testing::Gvr("example.com", "v1", "widgets"); }
v1::GroupVersionResource Gadgets() { return testing::Gvr("example.com", "v1", "gadgets"); }

v1::Object Json(const std::string& json) {
  v1::Object o;
  auto s = google::protobuf::util::JsonStringToMessage(json, &o);
  EXPECT_TRUE(s.ok()) << json;
  return o;
}

v1::Object WidgetsDefinition() {
  return Json(R"({"metadata": {"name": "widgets.example.com", "resourceVersion": "1"},
    "spec": {"group": "example.com", "names": {"plural": "widgets"}, "scope": "Namespaced",
             "versions": [{"name": "v1"}]}})");
}

v1::Object GadgetsDefinition() {
  return Json(R"({"metadata": {"name": "gadgets.example.com", "resourceVersion": "1"},
    "spec": {"group": "example.com", "names": {"plural": "gadgets"}, "scope": "Namespaced",
             "versions": [{"name": "v1"}]}})");
}

// A CCR of kCluster; `spec` is its spec's JSON; `finalizer`: it carries the replicator's.
v1::Object Ccr(const std::string& name, const std::string& spec, bool finalizer = true,
               int64_t created = 1'600'000'000) {
  v1::Object o = Json(absl::StrCat(R"({"metadata": {"cluster": ")", kCluster, R"(", "name": ")",
                                   name, R"(", "uid": "uid-)", name,
                                   R"(", "resourceVersion": "1", "generation": 1},
                                   "spec": )",
                                   spec, "}"));
  o.mutable_metadata()->mutable_creation_timestamp()->set_seconds(created);
  if (finalizer) o.mutable_metadata()->add_finalizers(kReplicatorFinalizer);
  return o;
}

constexpr char kWidgetsSpec[] =
    R"({"group": "example.com", "version": "v1", "resource": "widgets"})";
constexpr char kGadgetsSpec[] =
    R"({"group": "example.com", "version": "v1", "resource": "gadgets"})";

// The copy of `ccr` that an earlier term left in the cache (at the cache's revision 50).
v1::Object CopyOf(const v1::Object& ccr) {
  v1::Object copy = ProjectCopy(ccr, kShard);
  copy.mutable_metadata()->set_resource_version("50");
  return copy;
}

v1::Object Widget(const std::string& name, const std::string& tier = "gold") {
  v1::Object o = Json(absl::StrCat(
      R"({"metadata": {"cluster": ")", kCluster, R"(", "namespace": "default", "name": ")", name,
      R"(", "uid": "uid-)", name, R"(", "resourceVersion": "5", "labels": {"tier": ")", tier,
      R"("}}, "spec": {"size": 3}})"));
  return o;
}

const google::protobuf::Value* Field(const google::protobuf::Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}

std::string Phase(const google::protobuf::Struct& status) {
  const google::protobuf::Value* v = Field(status, "phase");
  return v == nullptr ? "" : v->string_value();
}

// "<status>/<reason>" of condition `type` ("" when absent).
std::string Condition(const google::protobuf::Struct& status, const std::string& type) {
  const google::protobuf::Value* conditions = Field(status, "conditions");
  if (conditions == nullptr) return "";
  for (const google::protobuf::Value& c : conditions->list_value().values()) {
    const google::protobuf::Struct& s = c.struct_value();
    if (Field(s, "type") != nullptr && Field(s, "type")->string_value() == type) {
      return absl::StrCat(Field(s, "status")->string_value(), "/",
                          Field(s, "reason")->string_value());
    }
  }
  return "";
}

class CcrControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    definitions()->SetListObjects("store-1", "1", {WidgetsDefinition()});
    shard_writer_.OnStored([this](const v1::Object& o) {
      // As the store's watch shows the write.
      PushWhenWatching(*ccr_lw(), WatchEventOf(v1::WatchEvent::MODIFIED, o));
    });
  }

  void TearDown() override {
    // As a term ends: the writer stops and runs or drops its callbacks before the controller
    // stops (ccr_controller.cc, SyncCopy); answers still due must not reach a freed controller.
    writer_.Stop();
    writer_.Drain();
    if (controller_ != nullptr) controller_->Stop();
    controller_.reset();
    ccrs_.reset();
    cache_ccrs_.reset();
    shard_informers_.reset();
    cache_informers_.reset();
  }

  std::shared_ptr<ScriptedListerWatcher> definitions() {
    return shard_source_.For(DynamicInformerFactory::DefinitionsResource());
  }
  std::shared_ptr<ScriptedListerWatcher> ccr_lw() { return shard_source_.For(CcrResource()); }
  static ListWatchFilters LocalFilters() {
    ListWatchFilters f;
    f.cluster = kCluster;
    return f;
  }
  static ListWatchFilters CopyFilters() {
    ListWatchFilters f;
    f.shard = kShard;
    f.cluster = kCluster;
    return f;
  }
  std::shared_ptr<ScriptedListerWatcher> local_widgets() {
    return shard_source_.For(Widgets(), LocalFilters());
  }
  std::shared_ptr<ScriptedListerWatcher> copied_widgets() {
    return cache_source_.For(Widgets(), CopyFilters());
  }
  std::shared_ptr<ScriptedListerWatcher> local_gadgets() {
    return shard_source_.For(Gadgets(), LocalFilters());
  }
  std::shared_ptr<ScriptedListerWatcher> copied_gadgets() {
    return cache_source_.For(Gadgets(), CopyFilters());
  }
  std::shared_ptr<ScriptedListerWatcher> copied_ccrs() {
    ListWatchFilters f;
    f.shard = kShard;
    return cache_source_.For(CcrResource(), f);
  }

  // Builds the factories and the CCR informers over the scripts set so far, and starts the
  // controller.
  void Start(int64_t epoch = kEpoch) {
    if (shard_informers_ == nullptr) {
      DynamicInformerFactory::Options shard;
      auto s = DynamicInformerFactory::Create(shard_source_.Source(), shard);
      ASSERT_TRUE(s.ok()) << s.status();
      shard_informers_ = *std::move(s);
      ASSERT_TRUE(shard_informers_->WaitForSync(absl::Seconds(20)));
      DynamicInformerFactory::Options cache;
      cache.follow_definitions = false;
      auto c = DynamicInformerFactory::Create(cache_source_.Source(), cache);
      ASSERT_TRUE(c.ok()) << c.status();
      cache_informers_ = *std::move(c);
      auto ccrs = shard_informers_->ForResource(CcrResource());
      ASSERT_TRUE(ccrs.ok()) << ccrs.status();
      ccrs_ = *ccrs;
      ListWatchFilters mine;
      mine.shard = kShard;
      auto copies = cache_informers_->ForResource(CcrResource(), mine);
      ASSERT_TRUE(copies.ok()) << copies.status();
      cache_ccrs_ = *copies;
      ASSERT_TRUE(ccrs_->WaitForSync(absl::Seconds(20)));
      ASSERT_TRUE(cache_ccrs_->WaitForSync(absl::Seconds(20)));
    }
    CcrController::Options o;
    o.shard = kShard;
    o.epoch = epoch;
    o.workers = 2;
    o.clock = &clock_;
    o.shard_writer = &shard_writer_;
    o.shard_informers = shard_informers_.get();
    o.cache_informers = cache_informers_.get();
    o.writer = &writer_;
    o.ccrs = ccrs_;
    o.cache_ccrs = cache_ccrs_;
    o.on_fenced = [this](const absl::Status& s) {
      absl::MutexLock l(&mu_);
      fenced_.push_back(s);
    };
    auto c = CcrController::Start(std::move(o));
    ASSERT_TRUE(c.ok()) << c.status();
    controller_ = *std::move(c);
  }

  // The status of the last status write of `name` (empty when none).
  google::protobuf::Struct LastStatus(const std::string& name) {
    google::protobuf::Struct status;
    for (const v1::UpdateRequest& r : shard_writer_.StatusRequests()) {
      if (r.object().metadata().name() == name) status = r.object().status();
    }
    return status;
  }
  int StatusWritesOf(const std::string& name) {
    int n = 0;
    for (const v1::UpdateRequest& r : shard_writer_.StatusRequests()) {
      n += r.object().metadata().name() == name ? 1 : 0;
    }
    return n;
  }
  std::string Describe(const std::string& name) {
    google::protobuf::Struct s = LastStatus(name);
    return absl::StrCat("phase ", Phase(s), ", ResourceValid ", Condition(s, "ResourceValid"),
                        ", ReplicationStarted ", Condition(s, "ReplicationStarted"), ", Synced ",
                        Condition(s, "Synced"), "; ", shard_writer_.StatusWrites(),
                        " status writes, ", writer_.WriteCount(), " cache writes");
  }

  // The positions in writer_.Writes() of the deletes of `name` and of the upserts of `name` (in
  // that order), for tests of what is written before what.
  std::pair<std::vector<int>, std::vector<int>> DeletesAndUpserts(const std::string& name) {
    std::vector<int> deletes;
    std::vector<int> upserts;
    std::vector<v1::WriteRequest> writes = writer_.Writes();
    for (int i = 0; i < static_cast<int>(writes.size()); ++i) {
      if (writes[i].has_delete_() && writes[i].delete_().name() == name) deletes.push_back(i);
      if (writes[i].has_upsert() && writes[i].upsert().object().metadata().name() == name) {
        upserts.push_back(i);
      }
    }
    return {deletes, upserts};
  }
  // The resource that the last upsert of CCR `name`'s copy names ("" when none).
  std::string LastCopyNames(const std::string& name) {
    std::string resource;
    for (const v1::WriteRequest& w : writer_.Writes()) {
      if (!w.has_upsert() || w.upsert().object().metadata().name() != name ||
          GvrKey(w.upsert().resource()) != GvrKey(CcrResource())) {
        continue;
      }
      const google::protobuf::Value* r = Field(w.upsert().object().spec(), "resource");
      resource = r == nullptr ? "" : r->string_value();
    }
    return resource;
  }

  // Waits for `cond`, advancing the controller's clock between polls, so that the queue's
  // delayed retries (and the replication controllers') come due.
  ::testing::AssertionResult Advancing(const std::function<bool()>& cond, const std::string& what,
                                       const std::string& name = "c1") {
    return Eventually(
        [&] {
          if (cond()) return true;
          clock_.Advance(absl::Seconds(1));
          return false;
        },
        absl::Seconds(30), what, [&] { return Describe(name); });
  }

  FakeClock clock_;
  ScriptedSource shard_source_{RealClock::Get()};
  ScriptedSource cache_source_{RealClock::Get()};
  FakeCacheWriter writer_{&clock_};
  FakeShardStoreWriter shard_writer_;
  std::unique_ptr<DynamicInformerFactory> shard_informers_;
  std::unique_ptr<DynamicInformerFactory> cache_informers_;
  std::shared_ptr<SharedInformer> ccrs_;
  std::shared_ptr<SharedInformer> cache_ccrs_;
  std::unique_ptr<CcrController> controller_;
  absl::Mutex mu_;
  std::vector<absl::Status> fenced_ ABSL_GUARDED_BY(mu_);
};

TEST_F(CcrControllerTest, AddsTheFinalizerFencedWithTheEpoch) {
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec, /*finalizer=*/false)});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Eventually([&] { return shard_writer_.Updates() >= 1; }, "the finalizer is added"));
  v1::UpdateRequest added = shard_writer_.UpdateRequests().front();
  ASSERT_EQ(added.object().metadata().finalizers_size(), 1);
  EXPECT_EQ(added.object().metadata().finalizers(0), kReplicatorFinalizer);
  EXPECT_EQ(added.fence().shard(), kShard);
  EXPECT_EQ(added.fence().epoch(), kEpoch);
  // Once the finalizer is seen, the CCR is replicated.
  EXPECT_TRUE(Advancing([&] { return Phase(LastStatus("c1")) == "Ready"; }, "phase Ready"));
}

struct InvalidCase {
  std::string spec;
  std::string reason;
};

class CcrControllerInvalidTest : public CcrControllerTest,
                                 public ::testing::WithParamInterface<InvalidCase> {};

TEST_P(CcrControllerInvalidTest, InvalidSpecIsNotReplicated) {
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", GetParam().spec)});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing([&] { return StatusWritesOf("c1") >= 1; }, "the status is written"));
  google::protobuf::Struct status = LastStatus("c1");
  EXPECT_EQ(Phase(status), "Initializing");
  EXPECT_EQ(Condition(status, "ResourceValid"), "False/" + GetParam().reason);
  EXPECT_EQ(Condition(status, "ReplicationStarted"), "False/InvalidResource");
  EXPECT_EQ(Condition(status, "Synced"), "False/NotReplicating");
  // The CCR's copy shows the reconcile went through: still nothing of the resource.
  ASSERT_TRUE(Eventually([&] { return writer_.Upserts("c1") >= 1; }, "the CCR's copy"));
  EXPECT_EQ(writer_.Upserts("w1"), 0);
  EXPECT_EQ(shard_source_.Taken(Widgets(), LocalFilters()), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Specs, CcrControllerInvalidTest,
    ::testing::Values(InvalidCase{R"({"group": "example.com", "version": "v1"})", "InvalidSpec"},
                      InvalidCase{
                          R"({"group": "example.com", "version": "v1", "resource": "widgets",
                        "labelSelector": "a=b"})",
                          "InvalidLabelSelector"}));

TEST_F(CcrControllerTest, DuplicateForTheSameResourceIsInvalid) {
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  ccr_lw()->SetListObjects("store-1", "1",
                           {Ccr("first", kWidgetsSpec, true, 1'600'000'000),
                            Ccr("second", kWidgetsSpec, true, 1'600'000'100)});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(
      Advancing([&] { return Phase(LastStatus("first")) == "Ready"; }, "first Ready", "first"));
  ASSERT_TRUE(
      Advancing([&] { return StatusWritesOf("second") >= 1; }, "second's status", "second"));
  google::protobuf::Struct second = LastStatus("second");
  EXPECT_EQ(Condition(second, "ResourceValid"), "False/DuplicateResource");
  EXPECT_EQ(Condition(second, "ReplicationStarted"), "False/InvalidResource");
  EXPECT_EQ(Condition(LastStatus("first"), "ResourceValid"), "True/Valid");
}

TEST_F(CcrControllerTest, UnservedResourcePurgesCopiesAndIsRetried) {
  definitions()->SetListObjects("store-1", "1", {});
  v1::Object stale = ProjectCopy(Widget("w1"), kShard);
  stale.mutable_metadata()->set_resource_version("3");
  copied_widgets()->SetListObjects("store-1", "3", {stale});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec)});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing(
      [&] {
        return Condition(LastStatus("c1"), "ReplicationStarted") == "False/ResourceNotServed" &&
               writer_.Deletes("w1") >= 1;
      },
      "ResourceNotServed, the copy purged"));
  google::protobuf::Struct status = LastStatus("c1");
  EXPECT_EQ(Phase(status), "Initializing");
  EXPECT_EQ(Condition(status, "ResourceValid"), "True/Valid");
  EXPECT_EQ(Condition(status, "Synced"), "False/NotReplicating");
  // Retried: each retry purges again (the scripted cache still shows the copy).
  int deletes = writer_.Deletes("w1");
  EXPECT_TRUE(Advancing([&] { return writer_.Deletes("w1") > deletes; }, "a retry"));
}

TEST_F(CcrControllerTest, ServedResourceIsReplicated) {
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec)});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Eventually([&] { return writer_.Upserts("w1") >= 1; }, "w1 is copied"));
  ASSERT_TRUE(
      Advancing([&] { return Condition(LastStatus("c1"), "Synced") == "True/InSync"; }, "Synced"));
  google::protobuf::Struct status = LastStatus("c1");
  EXPECT_EQ(Phase(status), "Ready");
  EXPECT_EQ(Condition(status, "ResourceValid"), "True/Valid");
  EXPECT_EQ(Condition(status, "ReplicationStarted"), "True/Started");
  EXPECT_EQ(Field(status, "epoch")->number_value(), kEpoch);
  const google::protobuf::Value* counts = Field(status, "resourceCounts");
  ASSERT_NE(counts, nullptr);
  EXPECT_EQ(Field(counts->struct_value(), "local")->number_value(), 1);
  // Stamped with the controller's clock (which the test advanced from its start, 2023).
  absl::Time stamped;
  std::string error;
  ASSERT_TRUE(absl::ParseTime("%Y-%m-%d%ET%H:%M:%SZ",
                              Field(status, "lastUpdateTime")->string_value(), &stamped, &error))
      << error;
  EXPECT_GE(stamped, absl::FromUnixSeconds(1'700'000'000));
  EXPECT_LE(stamped, clock_.Now());
}

TEST_F(CcrControllerTest, SpecChangeReplacesTheController) {
  local_widgets()->SetListObjects("store-1", "5",
                                  {Widget("gold", "gold"), Widget("silver", "silver")});
  v1::Object ccr = Ccr("c1", R"({"group": "example.com", "version": "v1", "resource": "widgets",
                                 "labelSelector": {"matchLabels": {"tier": "gold"}}})");
  ccr_lw()->SetListObjects("store-1", "1", {ccr});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing([&] { return Phase(LastStatus("c1")) == "Ready"; }, "Ready"));
  // In sync: the replication controller has been through every key.
  ASSERT_TRUE(
      Advancing([&] { return Condition(LastStatus("c1"), "Synced") == "True/InSync"; }, "Synced"));
  ASSERT_GE(writer_.Upserts("gold"), 1);
  EXPECT_EQ(writer_.Upserts("silver"), 0);

  v1::Object changed = Ccr("c1", kWidgetsSpec);
  changed.mutable_metadata()->set_generation(2);
  changed.mutable_metadata()->set_resource_version("2");
  shard_writer_.Put(changed);  // a user's update: a status write from the old spec conflicts
  EXPECT_TRUE(Advancing([&] { return writer_.Upserts("silver") >= 1; },
                        "the new controller copies what the new spec selects"));
}

TEST_F(CcrControllerTest, DeletionPurgesCopiesThenRemovesTheFinalizer) {
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  v1::Object copy = ProjectCopy(Widget("w1"), kShard);
  copy.mutable_metadata()->set_resource_version("3");
  copied_widgets()->SetListObjects("store-1", "3", {copy});
  v1::Object ccr = Ccr("c1", kWidgetsSpec);
  ccr.mutable_metadata()->mutable_deletion_timestamp()->set_seconds(1'600'001'000);
  ccr_lw()->SetListObjects("store-1", "1", {ccr});
  ASSERT_NO_FATAL_FAILURE(Start());
  // Deleting is shown first, then the copies are purged.
  // Purged twice: the second pass shows that the first one ended without removing the finalizer.
  ASSERT_TRUE(Advancing([&] { return writer_.Deletes("w1") >= 2; }, "the copy is purged again"));
  EXPECT_EQ(Phase(shard_writer_.StatusRequests().front().object().status()), "Deleting");
  EXPECT_EQ(Condition(LastStatus("c1"), "ReplicationStarted"), "False/Deleting");
  EXPECT_EQ(Condition(LastStatus("c1"), "Synced"), "False/Deleting");
  EXPECT_EQ(shard_writer_.Updates(), 0) << "the finalizer stays while copies are left";

  // The cache shows the copy gone: Deleted, and the finalizer goes.
  ASSERT_TRUE(PushWhenWatching(*copied_widgets(), WatchEventOf(v1::WatchEvent::DELETED, copy)));
  ASSERT_TRUE(Advancing([&] { return shard_writer_.Updates() >= 1; }, "the finalizer is removed"));
  EXPECT_EQ(Phase(LastStatus("c1")), "Deleted");
  EXPECT_EQ(shard_writer_.UpdateRequests().back().object().metadata().finalizers_size(), 0);
  EXPECT_EQ(shard_writer_.UpdateRequests().back().fence().epoch(), kEpoch);
}

TEST_F(CcrControllerTest, TheCcrsCopyIsWrittenAndRemoved) {
  local_widgets()->SetListObjects("store-1", "5", {});
  v1::Object ccr = Ccr("c1", kWidgetsSpec);
  ccr_lw()->SetListObjects("store-1", "1", {ccr});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Eventually([&] { return writer_.Upserts("c1") >= 1; }, "the CCR's copy"));
  v1::WriteRequest written;
  for (const v1::WriteRequest& w : writer_.Writes()) {
    if (w.has_upsert() && w.upsert().object().metadata().name() == "c1") written = w;
  }
  EXPECT_EQ(GvrKey(written.upsert().resource()), GvrKey(CcrResource()));
  EXPECT_EQ(written.upsert().object().metadata().shard(), kShard);
  EXPECT_EQ(writer_.Deletes("c1"), 0);

  // The cache holds the copy; the CCR goes from the shard store: its copy is removed.
  v1::Object held = written.upsert().object();
  held.mutable_metadata()->set_resource_version("200");
  ASSERT_TRUE(PushWhenWatching(*copied_ccrs(), WatchEventOf(v1::WatchEvent::ADDED, held)));
  shard_writer_.Remove(ccr);
  ASSERT_TRUE(PushWhenWatching(*ccr_lw(), WatchEventOf(v1::WatchEvent::DELETED, ccr)));
  EXPECT_TRUE(Advancing([&] { return writer_.Deletes("c1") >= 1; }, "the copy is removed"));
}

TEST_F(CcrControllerTest, SyncedIsPendingWhileWritesAreInFlight) {
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec)});
  // Replicated by an earlier term: replication starts without waiting for a write to the cache.
  copied_ccrs()->SetListObjects("store-1", "50", {CopyOf(Ccr("c1", kWidgetsSpec))});
  writer_.Hold();
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing([&] { return Condition(LastStatus("c1"), "Synced") == "False/Pending"; },
                        "Pending"));
  EXPECT_EQ(Phase(LastStatus("c1")), "Ready");
  writer_.Release();
  EXPECT_TRUE(
      Advancing([&] { return Condition(LastStatus("c1"), "Synced") == "True/InSync"; }, "InSync"));
}

TEST_F(CcrControllerTest, SyncedSaysCacheUnavailable) {
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec)});
  // Replicated by an earlier term: replication starts without waiting for a write to the cache.
  copied_ccrs()->SetListObjects("store-1", "50", {CopyOf(Ccr("c1", kWidgetsSpec))});
  writer_.AnswerAll(absl::UnavailableError("the stream broke"));
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(
      Advancing([&] { return Condition(LastStatus("c1"), "Synced") == "False/CacheUnavailable"; },
                "CacheUnavailable"));
  writer_.AnswerAll(absl::OkStatus());
  writer_.SetAvailable();
  EXPECT_TRUE(
      Advancing([&] { return Condition(LastStatus("c1"), "Synced") == "True/InSync"; }, "InSync"));
}

TEST_F(CcrControllerTest, SyncedWaitsForTheInformersInitialLists) {
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec)});
  // The local informer's list never completes.
  shard_source_.FailLists(Widgets(), LocalFilters(), absl::UnavailableError("no list"));
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing([&] { return StatusWritesOf("c1") >= 1; }, "the status"));
  google::protobuf::Struct status = LastStatus("c1");
  EXPECT_EQ(Condition(status, "ReplicationStarted"), "False/WaitingForSync");
  EXPECT_EQ(Condition(status, "Synced"), "False/WaitingForSync");
  EXPECT_EQ(Phase(status), "Initializing");
  shard_source_.FailLists(Widgets(), LocalFilters(), absl::OkStatus());
  EXPECT_TRUE(Advancing([&] { return Phase(LastStatus("c1")) == "Ready"; }, "Ready"));
}

TEST_F(CcrControllerTest, StatusIsWrittenOnlyWhenItDiffers) {
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec)});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(
      Advancing([&] { return Condition(LastStatus("c1"), "Synced") == "True/InSync"; }, "InSync"));
  // Settled: let every pending retry run.
  ASSERT_TRUE(Advancing(
      [&, last = -1]() mutable {
        int now = shard_writer_.StatusWrites();
        bool same = now == last;
        last = now;
        return same;
      },
      "the status settles"));
  int writes = shard_writer_.StatusWrites();
  // A reconcile with nothing new (the CCR shown again): the CCR's copy is written again (the
  // scripted cache never shows it), the status is not.
  int copies = writer_.Upserts("c1");
  google::protobuf::Struct status = LastStatus("c1");
  shard_writer_.Put(shard_writer_.StatusRequests().back().object());
  ASSERT_TRUE(Eventually([&] { return writer_.Upserts("c1") > copies; }, "reconciled again"));
  EXPECT_EQ(shard_writer_.StatusWrites(), writes);

  // A new term with the same state rewrites the status once, with its epoch.
  controller_->Stop();
  controller_.reset();
  ASSERT_NO_FATAL_FAILURE(Start(kEpoch + 1));
  ASSERT_TRUE(Eventually([&] { return shard_writer_.StatusWrites() > writes; }, "rewritten"));
  EXPECT_EQ(Field(LastStatus("c1"), "epoch")->number_value(), kEpoch + 1);
  EXPECT_EQ(shard_writer_.StatusRequests().back().fence().epoch(), kEpoch + 1);
}

TEST_F(CcrControllerTest, FencedStatusWriteCallsOnFenced) {
  local_widgets()->SetListObjects("store-1", "5", {});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec)});
  shard_writer_.Answer([](const FakeShardStoreWriter::Call& call) {
    return call.status ? FencedError("a newer leader", kShard, kEpoch + 1, kEpoch)
                       : absl::OkStatus();
  });
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Eventually(
      [&] {
        absl::MutexLock l(&mu_);
        return !fenced_.empty();
      },
      "on_fenced is called"));
  absl::MutexLock l(&mu_);
  EXPECT_TRUE(IsFenced(fenced_.front())) << fenced_.front();
}

TEST_F(CcrControllerTest, ResourceServedAgainReenqueuesAtOnce) {
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec)});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing([&] { return Phase(LastStatus("c1")) == "Ready"; }, "Ready"));
  ASSERT_EQ(shard_source_.Taken(Widgets(), LocalFilters()), 1);

  // The definition goes: the controller stops, the status says so.
  ASSERT_TRUE(
      PushWhenWatching(*definitions(), WatchEventOf(v1::WatchEvent::DELETED, WidgetsDefinition())));
  ASSERT_TRUE(Eventually(
      [&] {
        return Condition(LastStatus("c1"), "ReplicationStarted") == "False/ResourceNotServed";
      },
      "ResourceNotServed", [&] { return Describe("c1"); }));
  int writes = shard_writer_.StatusWrites();
  // It comes back: the CCR is reconciled at once, without waiting for its backoff (the clock
  // does not move), and replication starts on new informers.
  v1::Object back = WidgetsDefinition();
  back.mutable_metadata()->set_resource_version("9");
  ASSERT_TRUE(PushWhenWatching(*definitions(), WatchEventOf(v1::WatchEvent::ADDED, back)));
  EXPECT_TRUE(Eventually(
      [&] {
        return shard_writer_.StatusWrites() > writes &&
               Condition(LastStatus("c1"), "ReplicationStarted") != "False/ResourceNotServed";
      },
      "reconciled when served again", [&] { return Describe("c1"); }));
  EXPECT_EQ(shard_source_.Taken(Widgets(), LocalFilters()), 2);
}

// The CCR's copy is the record of the resource its copies belong to (ccr_controller.h).

// A new term finds the CCR's copy naming widgets while the CCR now names gadgets (changed while
// nobody led): the widgets' copies are purged, and until the cache shows none left, neither the
// copy nor the status changes and no gadgets are replicated. Then the copy names gadgets.
TEST_F(CcrControllerTest, CopyNamingAFormerResource_PurgedBeforeTheCopyChanges) {
  definitions()->SetListObjects("store-1", "1", {WidgetsDefinition(), GadgetsDefinition()});
  local_gadgets()->SetListObjects("store-1", "5", {Widget("g1")});
  v1::Object stale = ProjectCopy(Widget("w1"), kShard);
  stale.mutable_metadata()->set_resource_version("3");
  copied_widgets()->SetListObjects("store-1", "3", {stale});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kGadgetsSpec)});
  copied_ccrs()->SetListObjects("store-1", "50", {CopyOf(Ccr("c1", kWidgetsSpec))});
  ASSERT_NO_FATAL_FAILURE(Start());
  // Purged again and again while the cache still shows the copy.
  ASSERT_TRUE(Advancing([&] { return writer_.Deletes("w1") >= 3; }, "the copy is purged"));
  v1::WriteRequest purge;
  for (const v1::WriteRequest& w : writer_.Writes()) {
    if (w.has_delete_() && w.delete_().name() == "w1") purge = w;
  }
  EXPECT_EQ(GvrKey(purge.delete_().resource()), GvrKey(Widgets()));
  EXPECT_EQ(purge.delete_().shard(), kShard);
  EXPECT_EQ(purge.delete_().cluster(), kCluster);
  EXPECT_EQ(writer_.Upserts("c1"), 0) << "the copy changed while the former copies remain";
  EXPECT_EQ(writer_.Upserts("g1"), 0);
  EXPECT_EQ(StatusWritesOf("c1"), 0);

  ASSERT_TRUE(PushWhenWatching(*copied_widgets(), WatchEventOf(v1::WatchEvent::DELETED, stale)));
  ASSERT_TRUE(Advancing(
      [&] { return LastCopyNames("c1") == "gadgets" && Phase(LastStatus("c1")) == "Ready"; },
      "the copy names gadgets, Ready"));
  EXPECT_TRUE(Eventually([&] { return writer_.Upserts("g1") >= 1; }, "g1 is copied"));
  auto [deletes, upserts] = DeletesAndUpserts("c1");
  auto [purged, unused] = DeletesAndUpserts("w1");
  ASSERT_FALSE(upserts.empty());
  EXPECT_GT(upserts.front(), purged.back());
  EXPECT_TRUE(deletes.empty());
}

// A new term finds a CCR copy whose CCR is gone from the shard store (its finalizer was removed
// while nobody led): the resource it names is purged, then the copy is removed.
TEST_F(CcrControllerTest, CopyOfAGoneCcr_ResourcePurgedThenCopyRemoved) {
  v1::Object stale = ProjectCopy(Widget("w1"), kShard);
  stale.mutable_metadata()->set_resource_version("3");
  copied_widgets()->SetListObjects("store-1", "3", {stale});
  ccr_lw()->SetListObjects("store-1", "1", {});
  copied_ccrs()->SetListObjects("store-1", "50", {CopyOf(Ccr("c1", kWidgetsSpec))});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing([&] { return writer_.Deletes("w1") >= 2; }, "the copy is purged"));
  EXPECT_EQ(writer_.Deletes("c1"), 0) << "the CCR's copy went while the copies remain";

  ASSERT_TRUE(PushWhenWatching(*copied_widgets(), WatchEventOf(v1::WatchEvent::DELETED, stale)));
  ASSERT_TRUE(Advancing([&] { return writer_.Deletes("c1") >= 1; }, "the CCR's copy is removed"));
  auto [removed, unused] = DeletesAndUpserts("c1");
  auto [purged, none] = DeletesAndUpserts("w1");
  EXPECT_GT(removed.front(), purged.back());
}

// The resource that the copy names is still replicated by another valid CCR whose own copy names
// it: its copies stay, and the copy changes at once.
TEST_F(CcrControllerTest, FormerResourceStillNamedByAnotherCcr_IsNotPurged) {
  definitions()->SetListObjects("store-1", "1", {WidgetsDefinition(), GadgetsDefinition()});
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  local_gadgets()->SetListObjects("store-1", "5", {});
  v1::Object copy = ProjectCopy(Widget("w1"), kShard);
  copy.mutable_metadata()->set_resource_version("3");
  copied_widgets()->SetListObjects("store-1", "3", {copy});
  ccr_lw()->SetListObjects(
      "store-1", "1",
      {Ccr("c1", kGadgetsSpec, true, 1'600'000'000), Ccr("c2", kWidgetsSpec, true, 1'600'000'100)});
  copied_ccrs()->SetListObjects("store-1", "50",
                                {CopyOf(Ccr("c1", kWidgetsSpec)), CopyOf(Ccr("c2", kWidgetsSpec))});
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing(
      [&] { return LastCopyNames("c1") == "gadgets" && Phase(LastStatus("c1")) == "Ready"; },
      "c1's copy names gadgets, Ready"));
  ASSERT_TRUE(Advancing([&] { return Phase(LastStatus("c2")) == "Ready"; }, "c2 Ready", "c2"));
  EXPECT_EQ(writer_.Deletes("w1"), 0);
}

// The purge fails (the cache refuses the deletes, then cannot be reached): the copy keeps naming
// the former resource. Once the deletes go through and the cache shows none left, it changes.
TEST_F(CcrControllerTest, FailedPurgeKeepsTheCopy) {
  definitions()->SetListObjects("store-1", "1", {WidgetsDefinition(), GadgetsDefinition()});
  local_gadgets()->SetListObjects("store-1", "5", {});
  v1::Object stale = ProjectCopy(Widget("w1"), kShard);
  stale.mutable_metadata()->set_resource_version("3");
  copied_widgets()->SetListObjects("store-1", "3", {stale});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kGadgetsSpec)});
  copied_ccrs()->SetListObjects("store-1", "50", {CopyOf(Ccr("c1", kWidgetsSpec))});
  writer_.Answer([](const v1::WriteRequest& w) {
    return w.has_delete_() ? absl::PermissionDeniedError("no deletes") : absl::OkStatus();
  });
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing([&] { return writer_.Deletes("w1") >= 3; }, "the purge is retried"));
  EXPECT_EQ(writer_.Upserts("c1"), 0);

  // Unreachable: the key waits for the cache instead of spinning.
  writer_.SetUnavailable();
  ASSERT_TRUE(Advancing([&] { return writer_.WhenAvailableWaiting() >= 1; }, "waits"));
  int deletes = writer_.Deletes("w1");
  for (int i = 0; i < 5; ++i) clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(writer_.Deletes("w1"), deletes);
  EXPECT_EQ(writer_.Upserts("c1"), 0);

  writer_.AnswerAll(absl::OkStatus());
  writer_.SetAvailable();
  ASSERT_TRUE(Eventually([&] { return writer_.Deletes("w1") > deletes; }, "purged again"));
  EXPECT_EQ(writer_.Upserts("c1"), 0);
  ASSERT_TRUE(PushWhenWatching(*copied_widgets(), WatchEventOf(v1::WatchEvent::DELETED, stale)));
  EXPECT_TRUE(Advancing([&] { return LastCopyNames("c1") == "gadgets"; }, "the copy changes"));
}

// A new CCR: its copy, naming its resource, is acknowledged by the cache before anything of the
// resource is written, so that a leader that stops at any point leaves the record.
TEST_F(CcrControllerTest, ReplicationStartsOnceTheCopyNamesTheResource) {
  local_widgets()->SetListObjects("store-1", "5", {Widget("w1")});
  ccr_lw()->SetListObjects("store-1", "1", {Ccr("c1", kWidgetsSpec)});
  writer_.Hold();
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_TRUE(Advancing(
      [&] {
        return writer_.Upserts("c1") >= 1 &&
               Condition(LastStatus("c1"), "ReplicationStarted") == "False/WaitingForSync";
      },
      "the copy is written, replication waits"));
  EXPECT_EQ(LastCopyNames("c1"), "widgets");
  EXPECT_EQ(writer_.Upserts("w1"), 0);
  EXPECT_EQ(shard_source_.Taken(Widgets(), LocalFilters()), 0);
  writer_.Release();
  EXPECT_TRUE(Eventually([&] { return writer_.Upserts("w1") >= 1; }, "w1 is copied"));
}

}  // namespace
}  // namespace shardcache
