// Process-level tests of what shard_replicator replicates, against real stores: objects created,
// updated (spec, status, labels, annotations) and deleted in a shard reach the cache as equal
// copies; copies that someone else deletes or changes in the cache are restored; label
// selectors, and a selector that changes; CCR deletion (finalizer, phases Deleting and Deleted,
// copies purged); two shards in one cache; two CCRs for one resource; readiness; and the flags
// it refuses to start with.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/server_process.h"
#include "integration_tests/refuse_to_start.h"
#include "integration_tests/replicator_fixture.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

class ReplicationTest : public ReplicatorFixture {
 protected:
  // Shard "a"'s store, the cache, and one replica of "a" that leads.
  void StartAll(const std::vector<std::string>& extra = {}) {
    StartShardStore("a");
    if (HasFatalFailure()) return;
    StartCache();
    if (HasFatalFailure()) return;
    replica_ = StartReplicator("a", "replica-0", extra);
    ASSERT_TRUE(WaitForLeading(replica_, 1, absl::Seconds(15)));
  }

  // The copy of widget `name` of shard "a" in the cache.
  std::optional<v1::Object> CacheCopy(const std::string& name, const std::string& shard = "a") {
    return GetFrom(cache(), WidgetsGvr(), shard, kCluster, kNamespace, name);
  }

  ServerProcess* replica_ = nullptr;
};

// Status is computed on every reconcile and written only when it changes: with a resync every
// 100 ms the CCR is reconciled again and again, yet the shard store receives no UpdateStatus (a
// write of an unchanged status would not change the CCR's resourceVersion, so the store's own
// request count is what tells); a change of the counts is written.
TEST_F(ReplicationTest, StatusWrittenOnlyWhenItChanges) {
  ASSERT_NO_FATAL_FAILURE(StartAll({"--resync-period=100ms"}));
  ASSERT_NO_FATAL_FAILURE(ReplicateWidgets());
  const int shard_http = shards_.at("a").process->http_port();
  const char* kRequests = "shardcache_grpc_requests_total";
  const std::vector<std::string> kUpdateStatus = {"method=\"UpdateStatus\""};
  const char* kReconciles = "shardcache_replicator_reconcile_duration_seconds_count";
  const std::vector<std::string> kCcrs = {"controller=\"clustercachedresources\""};
  // Ready can be written while the cache has not yet acknowledged the last copy (Synced False,
  // Pending); the status changes once more when it has. Count from there.
  auto synced = [&] {
    return WaitForCcr(
        "widgets",
        [](const v1::Object& ccr) { return FindCondition(ccr, "Synced").status == "True"; },
        "Synced=True");
  };
  ASSERT_TRUE(synced());
  ASSERT_TRUE(WaitForCcrCopy("widgets"));
  double status_writes = Metric(shard_http, kRequests, kUpdateStatus);
  ASSERT_GT(status_writes, 0);
  // Five reconciles, each of which would have written an unchanged status (a reconcile is
  // counted once it has returned, after any write it made has been answered, and the store
  // counts a request before it answers it).
  auto five_more_reconciles = [&] {
    double reconciles = Metric(replica_->http_port(), kReconciles, kCcrs);
    return Eventually(
        [&] { return Metric(replica_->http_port(), kReconciles, kCcrs) >= reconciles + 5; },
        kConverge, "the resync reconciles the CCR five more times",
        [&] {
          return absl::StrCat(Metric(replica_->http_port(), kReconciles, kCcrs) - reconciles);
        });
  };
  EXPECT_TRUE(five_more_reconciles());
  EXPECT_EQ(Metric(shard_http, kRequests, kUpdateStatus), status_writes)
      << "an unchanged status was written again";

  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w4")).ok());
  EXPECT_TRUE(WaitForReady("widgets", 4));
  EXPECT_TRUE(synced());
  // The CCR's copy in the cache is written from the replicator's informer: once it equals the
  // CCR, that informer has seen the status just written, and a reconcile no longer compares
  // against (and writes over) the status before it.
  EXPECT_TRUE(WaitForCcrCopy("widgets"));
  double counted = Metric(shard_http, kRequests, kUpdateStatus);
  EXPECT_GT(counted, status_writes);
  EXPECT_TRUE(five_more_reconciles());
  EXPECT_EQ(Metric(shard_http, kRequests, kUpdateStatus), counted);
}

// Every change to an object in the shard (create; spec, status, labels and annotations; delete)
// reaches its copy in the cache, which equals the origin plus metadata.shard and the two
// annotations. The CCR itself has a copy too; objects of another logical cluster are not
// replicated.
TEST_F(ReplicationTest, CreateUpdateAndDeleteReachTheCache) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  EXPECT_EQ(Metric(replica_->http_port(), "shardcache_build_info", {"version=\"", "commit=\""}), 1);
  ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("widgets")).ok());
  ASSERT_TRUE(WaitForReady("widgets", 0));
  // The replicator put its finalizer on the CCR.
  std::optional<v1::Object> ccr = GetCcr("widgets");
  ASSERT_TRUE(ccr.has_value());
  EXPECT_THAT(ccr->metadata().finalizers(), ::testing::Contains(kFinalizer));
  EXPECT_EQ(FindCondition(*ccr, "ResourceValid").status, "True") << DescribeStatus(*ccr);

  // An object in another logical cluster, which the CCR (of kCluster) does not select.
  v1::Object other = Widget("elsewhere");
  other.mutable_metadata()->set_cluster("root:other");
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), other).ok());

  // Create.
  v1::Object w = Widget("w1", R"({"app":"web","tier":"front"})", R"({"color":"blue","size":3})");
  (*w.mutable_metadata()->mutable_annotations())["note"] = "first";
  v1::Object origin;
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), w, &origin).ok());
  ASSERT_TRUE(WaitForCacheInSync());
  std::optional<v1::Object> copy = CacheCopy("w1");
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->metadata().shard(), "a");
  EXPECT_EQ(copy->metadata().uid(), origin.metadata().uid());
  EXPECT_EQ(copy->metadata().annotations().at(kOriginalRvAnnotation),
            origin.metadata().resource_version());
  EXPECT_EQ(copy->metadata().annotations().at(kOriginalUidAnnotation), origin.metadata().uid());
  EXPECT_TRUE(copy->metadata().finalizers().empty());

  // Spec: the generation rises, and the copy keeps the origin's.
  ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, "w1", [](v1::Object* o) {
                (*o->mutable_spec()->mutable_fields())["color"].set_string_value("green");
              }).ok());
  ASSERT_TRUE(WaitForCacheInSync());
  copy = CacheCopy("w1");
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->metadata().generation(), 2);
  EXPECT_EQ(copy->spec().fields().at("color").string_value(), "green");

  // Status (a subresource in the shard store; the cache keeps it in the copy).
  ASSERT_TRUE(Modify(
                  shard(), WidgetsGvr(), kCluster, kNamespace, "w1",
                  [](v1::Object* o) {
                    *o->mutable_status() =
                        FromJson<google::protobuf::Struct>(R"({"phase":"Running","replicas":3})");
                  },
                  /*status=*/true)
                  .ok());
  ASSERT_TRUE(WaitForCacheInSync());
  copy = CacheCopy("w1");
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->status().fields().at("phase").string_value(), "Running");

  // Labels.
  ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, "w1", [](v1::Object* o) {
                (*o->mutable_metadata()->mutable_labels())["tier"] = "back";
                (*o->mutable_metadata()->mutable_labels())["new"] = "label";
              }).ok());
  ASSERT_TRUE(WaitForCacheInSync());
  copy = CacheCopy("w1");
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->metadata().labels().at("tier"), "back");

  // Annotations.
  ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, "w1", [](v1::Object* o) {
                (*o->mutable_metadata()->mutable_annotations())["note"] = "second";
                (*o->mutable_metadata()->mutable_annotations())["extra"] = "x";
              }).ok());
  ASSERT_TRUE(WaitForCacheInSync());
  copy = CacheCopy("w1");
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->metadata().annotations().at("note"), "second");
  EXPECT_TRUE(WaitForReady("widgets", 1));

  // The CCR's own copy, with its status.
  EXPECT_TRUE(WaitForCcrCopy("widgets"));

  // Delete.
  ASSERT_TRUE(DeleteIn(shard(), WidgetsGvr(), "", kCluster, kNamespace, "w1").ok());
  ASSERT_TRUE(WaitForCacheInSync());
  EXPECT_TRUE(WaitForReady("widgets", 0));

  // Nothing of root:other reached the cache.
  auto elsewhere = ListFrom(cache(), WidgetsGvr(), "", "root:other");
  ASSERT_TRUE(elsewhere.has_value());
  EXPECT_TRUE(elsewhere->empty());
}

// A copy that another client deletes from the cache comes back; one it changes is reverted; the
// CCR's copy too.
TEST_F(ReplicationTest, CopiesChangedInTheCacheAreRestored) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("widgets")).ok());
  for (const char* name : {"w1", "w2", "w3"}) {
    ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget(name, R"({"app":"web"})")).ok());
  }
  ASSERT_TRUE(WaitForCacheInSync());
  ASSERT_TRUE(WaitForReady("widgets", 3));
  ASSERT_TRUE(WaitForCcrCopy("widgets"));

  // Deleted by someone else (no fence): restored.
  std::optional<v1::Object> before = CacheCopy("w1");
  ASSERT_TRUE(before.has_value());
  ASSERT_TRUE(DeleteIn(cache(), WidgetsGvr(), "a", kCluster, kNamespace, "w1").ok());
  ASSERT_TRUE(WaitForCacheInSync());
  std::optional<v1::Object> after = CacheCopy("w1");
  ASSERT_TRUE(after.has_value());
  EXPECT_NE(after->metadata().resource_version(), before->metadata().resource_version());

  // Changed by someone else: reverted.
  std::optional<v1::Object> w2 = CacheCopy("w2");
  ASSERT_TRUE(w2.has_value());
  (*w2->mutable_spec()->mutable_fields())["size"].set_number_value(99);
  (*w2->mutable_metadata()->mutable_labels())["app"] = "hijacked";
  v1::UpdateRequest update;
  *update.mutable_resource() = WidgetsGvr();
  *update.mutable_object() = *w2;
  v1::Object written;
  grpc::Status s = cache()->Update(Context().get(), update, &written);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(WaitForCacheInSync());
  std::optional<v1::Object> reverted = CacheCopy("w2");
  ASSERT_TRUE(reverted.has_value());
  EXPECT_EQ(reverted->spec().fields().at("size").number_value(), 1);

  // The CCR's copy, deleted: restored.
  ASSERT_TRUE(DeleteIn(cache(), CcrGvr(), "a", kCluster, "", "widgets").ok());
  EXPECT_TRUE(WaitForCcrCopy("widgets"));
  EXPECT_TRUE(WaitForReady("widgets", 3));
}

// Only objects that match the CCR's selector are copied, and resourceCounts count them; objects
// deleted locally or relabelled out of the selector leave the cache; a changed selector removes
// the copies that no longer match and adds those that now do.
TEST_F(ReplicationTest, LabelSelectorChoosesTheCopies) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  for (int i = 0; i < 7; ++i) {
    std::string labels = i == 2 || i == 3 ? R"({"app":"web","tier":"front"})" : R"({"app":"web"})";
    ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget(absl::StrCat("w", i), labels)).ok());
  }
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w7", R"({"app":"db"})")).ok());
  ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("web", R"({"matchLabels":{"app":"web"}})")).ok());

  ASSERT_TRUE(WaitForReady("web", 7));
  ASSERT_TRUE(WaitForCacheInSync("a", "app=web"));
  EXPECT_FALSE(CacheCopy("w7").has_value());

  // Two deleted locally: 5.
  ASSERT_TRUE(DeleteIn(shard(), WidgetsGvr(), "", kCluster, kNamespace, "w0").ok());
  ASSERT_TRUE(DeleteIn(shard(), WidgetsGvr(), "", kCluster, kNamespace, "w1").ok());
  ASSERT_TRUE(WaitForReady("web", 5));
  ASSERT_TRUE(WaitForCacheInSync("a", "app=web"));

  // One relabelled out of the selector: 4.
  ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, "w4", [](v1::Object* o) {
                (*o->mutable_metadata()->mutable_labels())["app"] = "db";
              }).ok());
  ASSERT_TRUE(WaitForReady("web", 4));
  ASSERT_TRUE(WaitForCacheInSync("a", "app=web"));

  // The selector narrowed (matchLabels plus a matchExpression): w2 and w3 remain.
  ASSERT_TRUE(
      Modify(shard(), CcrGvr(), kCluster, "", "web", [](v1::Object* o) {
        (*o->mutable_spec()->mutable_fields())["labelSelector"] = FromJson<google::protobuf::Value>(
            R"({"matchLabels":{"app":"web"},)"
            R"("matchExpressions":[{"key":"tier","operator":"In","values":["front"]}]})");
      }).ok());
  ASSERT_TRUE(WaitForReady("web", 2));
  ASSERT_TRUE(WaitForCacheInSync("a", "app=web,tier in (front)"));

  // A new object that matches the new selector is copied.
  ASSERT_TRUE(
      CreateIn(shard(), WidgetsGvr(), Widget("w8", R"({"app":"web","tier":"front"})")).ok());
  ASSERT_TRUE(WaitForReady("web", 3));
  EXPECT_TRUE(WaitForCacheInSync("a", "app=web,tier in (front)"));
  EXPECT_TRUE(WaitForCcrCopy("web"));
}

// Deleting a CCR: its finalizer holds it while the replicator purges its copies (phase Deleting,
// then Deleted), then the finalizer goes and so does the CCR, and its own copy in the cache.
TEST_F(ReplicationTest, DeletingACcrPurgesItsCopies) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  ASSERT_NO_FATAL_FAILURE(ReplicateWidgets());

  v1::WatchRequest req;
  *req.mutable_resource() = CcrGvr();
  req.set_cluster(kCluster);
  WatchReader watch(shard(), req);
  ASSERT_TRUE(watch.SkipInitial());

  v1::DeleteRequest del;
  *del.mutable_resource() = CcrGvr();
  del.set_cluster(kCluster);
  del.set_name("widgets");
  v1::DeleteResponse deleted;
  grpc::Status s = shard()->Delete(Context().get(), del, &deleted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(deleted.deleted()) << "the replicator's finalizer should hold the CCR";

  // The phases the CCR goes through, up to its DELETED event.
  std::vector<std::string> phases;
  bool gone = false;
  absl::Time deadline = absl::Now() + kConverge;
  while (!gone && absl::Now() < deadline) {
    std::optional<v1::WatchEvent> e = watch.NextObjectEvent(deadline - absl::Now());
    if (!e.has_value()) break;
    if (e->object().metadata().name() != "widgets") continue;
    std::string phase = Phase(e->object());
    if (phases.empty() || phases.back() != phase) phases.push_back(phase);
    gone = e->type() == v1::WatchEvent::DELETED;
  }
  std::cerr << "phases of the deleted CCR: " << absl::StrJoin(phases, " -> ") << "\n";
  EXPECT_TRUE(gone) << "no DELETED event for the CCR; phases seen: "
                    << absl::StrJoin(phases, " -> ");
  auto deleting = std::find(phases.begin(), phases.end(), "Deleting");
  auto deleted_phase = std::find(phases.begin(), phases.end(), "Deleted");
  EXPECT_TRUE(deleting != phases.end() && deleted_phase != phases.end() && deleting < deleted_phase)
      << "phases seen: " << absl::StrJoin(phases, " -> ");

  EXPECT_FALSE(GetCcr("widgets").has_value());
  // No copies of its widgets, nor of itself, in the cache; the widgets themselves stay.
  std::optional<std::map<std::string, v1::Object>> copies;
  EXPECT_TRUE(Eventually(
      [&] {
        copies = ListFrom(cache(), WidgetsGvr(), "a", kCluster);
        return copies.has_value() && copies->empty();
      },
      absl::Seconds(10), "no widget copies in the cache",
      [&] { return absl::StrCat(copies.has_value() ? copies->size() : 0, " copies"); }));
  EXPECT_TRUE(Eventually(
      [&] { return !GetFrom(cache(), CcrGvr(), "a", kCluster, "", "widgets").has_value(); },
      absl::Seconds(10), "no copy of the CCR in the cache"));
  auto local = ListFrom(shard(), WidgetsGvr(), "", kCluster);
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(local->size(), 3u);
}

// Two shards replicate into one cache: each copy names its own shard, equal names in both shards
// do not collide, and one watch of the cache without a shard filter sees both.
TEST_F(ReplicationTest, TwoShardsIntoOneCache) {
  StartShardStore("a");
  StartShardStore("b");
  StartCache();
  ASSERT_FALSE(HasFatalFailure());

  v1::WatchRequest req;
  *req.mutable_resource() = WidgetsGvr();
  WatchReader watch(cache(), req);
  ASSERT_TRUE(watch.SkipInitial());

  for (const std::string s : {"a", "b"}) {
    ASSERT_TRUE(CreateIn(shard(s), CcrGvr(), Ccr("widgets")).ok());
    ASSERT_TRUE(CreateIn(shard(s), WidgetsGvr(),
                         Widget("common", "{}", absl::StrCat(R"({"from":")", s, R"("})")))
                    .ok());
    ASSERT_TRUE(CreateIn(shard(s), WidgetsGvr(), Widget("only-" + s)).ok());
  }
  ServerProcess* ra = StartReplicator("a", "a-0");
  ServerProcess* rb = StartReplicator("b", "b-0");
  ASSERT_TRUE(WaitForLeading(ra, 1, absl::Seconds(15)));
  ASSERT_TRUE(WaitForLeading(rb, 1, absl::Seconds(15)));

  for (const std::string s : {"a", "b"}) {
    SCOPED_TRACE("shard " + s);
    EXPECT_TRUE(WaitForCacheInSync(s));
    EXPECT_TRUE(WaitForReady("widgets", 2, kConverge, s));
    std::optional<v1::Object> common =
        GetFrom(cache(), WidgetsGvr(), s, kCluster, kNamespace, "common");
    ASSERT_TRUE(common.has_value());
    EXPECT_EQ(common->metadata().shard(), s);
    EXPECT_EQ(common->spec().fields().at("from").string_value(), s);
    // The CCR's copy is written after its status, so the status can read Ready before it.
    EXPECT_TRUE(WaitForCcrCopy("widgets", s));
  }
  auto all = ListFrom(cache(), WidgetsGvr(), "", kCluster);
  ASSERT_TRUE(all.has_value());
  v1::ListRequest list;
  *list.mutable_resource() = WidgetsGvr();
  v1::ListResponse listed;
  ASSERT_TRUE(cache()->List(Context().get(), list, &listed).ok());
  EXPECT_EQ(listed.items_size(), 4);

  // The unfiltered watch saw copies from both shards.
  std::set<std::string> seen;
  const std::set<std::string> want = {"a/common", "a/only-a", "b/common", "b/only-b"};
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!std::includes(seen.begin(), seen.end(), want.begin(), want.end()) &&
         absl::Now() < deadline) {
    std::optional<v1::WatchEvent> e = watch.NextObjectEvent(deadline - absl::Now());
    if (!e.has_value()) break;
    if (e->type() == v1::WatchEvent::DELETED) continue;
    seen.insert(absl::StrCat(e->object().metadata().shard(), "/", e->object().metadata().name()));
  }
  EXPECT_TRUE(std::includes(seen.begin(), seen.end(), want.begin(), want.end()))
      << "seen: " << absl::StrJoin(seen, ", ");

  // A change in shard a changes a's copy only.
  std::optional<v1::Object> b_before =
      GetFrom(cache(), WidgetsGvr(), "b", kCluster, kNamespace, "common");
  ASSERT_TRUE(b_before.has_value());
  ASSERT_TRUE(Modify(shard("a"), WidgetsGvr(), kCluster, kNamespace, "common", [](v1::Object* o) {
                (*o->mutable_spec()->mutable_fields())["from"].set_string_value("a, changed");
              }).ok());
  EXPECT_TRUE(WaitForCacheInSync("a"));
  std::optional<v1::Object> b_after =
      GetFrom(cache(), WidgetsGvr(), "b", kCluster, kNamespace, "common");
  ASSERT_TRUE(b_after.has_value());
  EXPECT_EQ(b_after->metadata().resource_version(), b_before->metadata().resource_version());
  EXPECT_TRUE(WaitForCacheInSync("b"));
}

// A second CCR for the same resource in the same cluster is invalid (DuplicateResource); the
// first keeps working. The second's name sorts first, so that only creation order can decide.
TEST_F(ReplicationTest, SecondCcrForTheSameResourceIsInvalid) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w1")).ok());
  ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("z-first")).ok());
  ASSERT_TRUE(WaitForReady("z-first", 1));
  ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("a-second", R"({"matchLabels":{"x":"y"}})")).ok());

  EXPECT_TRUE(WaitForCcr(
      "a-second",
      [](const v1::Object& ccr) {
        ConditionView valid = FindCondition(ccr, "ResourceValid");
        return valid.status == "False" && valid.reason == "DuplicateResource" &&
               Phase(ccr) == "Initializing" &&
               FindCondition(ccr, "ReplicationStarted").status == "False";
      },
      "ResourceValid=False DuplicateResource, phase Initializing, ReplicationStarted=False"));

  // The first still works, and the second's selector (which matches nothing) did not change it.
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w2")).ok());
  EXPECT_TRUE(WaitForReady("z-first", 2));
  EXPECT_TRUE(WaitForCacheInSync());
  std::optional<v1::Object> first = GetCcr("z-first");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(FindCondition(*first, "ResourceValid").status, "True") << DescribeStatus(*first);
  std::optional<v1::Object> second = GetCcr("a-second");
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(FindCondition(*second, "ResourceValid").reason, "DuplicateResource")
      << DescribeStatus(*second);
}

// /healthz answers while running; /readyz is 503 until the informers have synced (here: until
// the shard store it cannot reach comes up), then 200.
TEST_F(ReplicationTest, ReadyOnceSynced) {
  StartShardStore("a");
  StartCache();
  ASSERT_FALSE(HasFatalFailure());
  // The shard store goes away (its port is kept for the restart).
  ASSERT_EQ(shards_["a"].process->Stop(), 0);
  ServerProcess* r = StartReplicator("a", "replica-0");
  ASSERT_TRUE(r->Running());

  EXPECT_TRUE(
      Eventually([&] { return absl::StartsWith(HttpGet(r->http_port(), "/healthz"), "200"); },
                 absl::Seconds(10), "/healthz answers 200"));
  std::string readyz = HttpGet(r->http_port(), "/readyz");
  EXPECT_TRUE(absl::StartsWith(readyz, "503")) << readyz;
  // Not ready once it has listed the cache and failed to list the shard store (both of its
  // informers there): the point where a readiness that ignored the shard store would say 200.
  const int cache_http = cache_.process->http_port();
  EXPECT_TRUE(Eventually(
      [&] {
        return Metric(cache_http, "shardcache_grpc_requests_total",
                      {"method=\"List\"", "code=\"OK\""}) >= 1 &&
               absl::StrContains(
                   r->Log(), "reflector resourcedefinitions.core.shardcache.io/v1: list failed") &&
               absl::StrContains(
                   r->Log(),
                   "reflector clustercachedresources.cache.shardcache.io/v1alpha1: list failed");
      },
      kConverge, "the cache was listed and both lists of the shard store failed",
      [&] { return r->Log(); }));
  readyz = HttpGet(r->http_port(), "/readyz");
  EXPECT_TRUE(absl::StartsWith(readyz, "503")) << "ready with no shard store: " << readyz;

  RestartStore(&shards_["a"]);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_TRUE(Eventually(
      [&] { return absl::StartsWith(HttpGet(r->http_port(), "/readyz"), "200"); }, kConverge,
      "/readyz answers 200", [&] { return HttpGet(r->http_port(), "/readyz"); }));
  // And it works.
  EXPECT_TRUE(WaitForLeading(r, 1, absl::Seconds(15)));
  ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("widgets")).ok());
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w1")).ok());
  EXPECT_TRUE(WaitForReady("widgets", 1));
  EXPECT_TRUE(WaitForCacheInSync());
}

// A standby replica (not leading) is ready too.
TEST_F(ReplicationTest, StandbyIsReady) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  ServerProcess* standby = StartReplicator("a", "replica-1");
  EXPECT_TRUE(
      Eventually([&] { return absl::StartsWith(HttpGet(standby->http_port(), "/readyz"), "200"); },
                 kConverge, "the standby's /readyz answers 200"));
  EXPECT_EQ(Leading(standby), 0);
  EXPECT_EQ(Leading(replica_), 1);
}

// The threads of a process (its /proc/<pid>/task entries); -1 when they cannot be read.
int ThreadCount(pid_t pid) {
  std::error_code error;
  std::filesystem::directory_iterator it(absl::StrCat("/proc/", pid, "/task"), error);
  if (error) return -1;
  int n = 0;
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (error) return -1;
    ++n;
  }
  return n;
}

// The informers a CCR needs (its resource in its cluster, in the shard store; its copies, in the
// cache) run while it exists, on the leader and on the standby alike, and are released once it is
// deleted (after the factories' grace period): the informer gauges go back to what an idle
// replicator runs (its CCR informers). The standby's threads do not grow with its informers
// meanwhile: their reflectors run on the replicator's worker pool.
TEST_F(ReplicationTest, InformersOfDeletedCcrsAreReleased) {
  constexpr char kInformers[] = "shardcache_informer_factory_informers";
  constexpr char kShardFactory[] = "factory=\"shard_store\"";
  constexpr char kCacheFactory[] = "factory=\"cache\"";
  constexpr int kCcrs = 6;
  ASSERT_NO_FATAL_FAILURE(StartAll());
  ServerProcess* standby = StartReplicator("a", "replica-1");
  ASSERT_TRUE(
      Eventually([&] { return absl::StartsWith(HttpGet(standby->http_port(), "/readyz"), "200"); },
                 kConverge, "the standby's /readyz answers 200"));
  auto informers = [&](ServerProcess* replica) {
    return absl::StrCat(Metric(replica->http_port(), kInformers, {kShardFactory}), "/",
                        Metric(replica->http_port(), kInformers, {kCacheFactory}));
  };
  // Idle: the shard's CCRs, and their copies in the cache.
  for (ServerProcess* replica : {replica_, standby}) {
    ASSERT_TRUE(Eventually([&] { return informers(replica) == "1/1"; }, kConverge,
                           "an idle replicator runs its CCR informers only",
                           [&] { return informers(replica); }));
  }
  const int idle_threads = ThreadCount(standby->pid());
  ASSERT_GT(idle_threads, 0);

  auto cluster = [](int i) { return absl::StrCat("root:org-", i); };
  for (int i = 0; i < kCcrs; ++i) {
    ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("widgets", "", cluster(i))).ok());
  }
  for (int i = 0; i < kCcrs; ++i) {
    ASSERT_TRUE(WaitForCcr(
        "widgets", [](const v1::Object& ccr) { return Phase(ccr) == "Ready"; }, "Ready", kConverge,
        "a", cluster(i)));
  }
  const std::string needed = absl::StrCat(1 + kCcrs, "/", 1 + kCcrs);
  for (ServerProcess* replica : {replica_, standby}) {
    ASSERT_TRUE(Eventually([&] { return informers(replica) == needed; }, kConverge,
                           "two informers per CCR, on the leader and on the standby",
                           [&] { return informers(replica); }));
  }
  // No thread per informer (a few threads of gRPC's come and go).
  int running_threads = ThreadCount(standby->pid());
  EXPECT_GT(running_threads, 0);
  EXPECT_LE(running_threads, idle_threads + 4)
      << "the informers of " << kCcrs << " CCRs added threads to the " << idle_threads
      << " of an idle replicator";

  for (int i = 0; i < kCcrs; ++i) {
    ASSERT_TRUE(DeleteIn(shard(), CcrGvr(), "", cluster(i), "", "widgets").ok());
  }
  for (int i = 0; i < kCcrs; ++i) {
    ASSERT_TRUE(Eventually([&] { return !GetCcr("widgets", "a", cluster(i)).has_value(); },
                           kConverge, "the deleted CCR is gone (its copies purged)"));
  }
  // The factories' grace period (10 s) and then some.
  for (ServerProcess* replica : {replica_, standby}) {
    EXPECT_TRUE(Eventually([&] { return informers(replica) == "1/1"; }, absl::Seconds(40),
                           "the deleted CCRs' informers are released",
                           [&] { return informers(replica); }));
  }
  // Back to about the idle count (a few threads of gRPC's come and go).
  int threads = -1;
  EXPECT_TRUE(Eventually(
      [&] {
        threads = ThreadCount(standby->pid());
        return threads > 0 && threads <= idle_threads + 4;
      },
      absl::Seconds(20), "the standby's threads are back to the idle count",
      [&] { return absl::StrCat(threads, " threads, ", idle_threads, " when idle"); }));
  EXPECT_EQ(Leading(replica_), 1);
}

// shard_replicator refuses bad flags with exit code 2, naming the flag.
void ExpectBadFlagRefused(const RunResult& r, const std::string& mention) {
  ExpectRefused(r, mention, /*exit_code=*/2);
}

TEST(ReplicatorFlagsTest, RefusesToStartWithBadFlags) {
  const std::vector<std::string> good = {"--shard=a", "--shard-store=127.0.0.1:1",
                                         "--cache=127.0.0.1:2"};
  auto with = [&](std::vector<std::string> changes, const std::string& drop = "") {
    std::vector<std::string> args;
    for (const std::string& a : good) {
      if (drop.empty() || !absl::StartsWith(a, drop)) args.push_back(a);
    }
    args.insert(args.end(), changes.begin(), changes.end());
    return args;
  };
  {
    SCOPED_TRACE("no --shard");
    ExpectBadFlagRefused(RunReplicatorToExit(with({}, "--shard=")), "--shard:");
  }
  {
    SCOPED_TRACE("--shard not a DNS label");
    ExpectBadFlagRefused(RunReplicatorToExit(with({"--shard=Not_A_Label"}, "--shard=")),
                         "--shard:");
  }
  {
    SCOPED_TRACE("no --cache");
    ExpectBadFlagRefused(RunReplicatorToExit(with({}, "--cache=")), "--cache:");
  }
  {
    SCOPED_TRACE("no --shard-store");
    ExpectBadFlagRefused(RunReplicatorToExit(with({}, "--shard-store=")), "--shard-store:");
  }
  {
    SCOPED_TRACE("renew deadline not below the lease duration");
    ExpectBadFlagRefused(RunReplicatorToExit(with({"--lease-duration=3s", "--renew-deadline=5s"})),
                         "--renew-deadline");
  }
  {
    SCOPED_TRACE("no workers");
    ExpectBadFlagRefused(RunReplicatorToExit(with({"--workers=0"})), "--workers:");
  }
  {
    SCOPED_TRACE("an unknown flag");
    ExpectBadFlagRefused(RunReplicatorToExit(with({"--bogus-flag"})), "--bogus-flag: unknown flag");
  }
  {
    SCOPED_TRACE("a value that does not parse");
    ExpectBadFlagRefused(RunReplicatorToExit(with({"--lease-duration=long"})),
                         "--lease-duration: invalid value");
  }
}

// A bad timing is refused before anything starts: no informer has tried its list (the stores
// named do not exist, so one that had would have logged "list failed").
TEST(ReplicatorFlagsTest, LeaseNotAboveRenewDeadline_RefusedBeforeInformersStart) {
  for (std::vector<std::string> timing :
       {std::vector<std::string>{"--lease-duration=3s", "--renew-deadline=5s"},
        std::vector<std::string>{"--renew-deadline=2s", "--retry-period=2s"},
        std::vector<std::string>{"--retry-period=0s"}}) {
    SCOPED_TRACE(absl::StrJoin(timing, " "));
    std::vector<std::string> args = {"--shard=a", "--shard-store=127.0.0.1:1",
                                     "--cache=127.0.0.1:2"};
    args.insert(args.end(), timing.begin(), timing.end());
    RunResult r = RunReplicatorToExit(args);
    ExpectBadFlagRefused(r, "--");
    EXPECT_THAT(r.stderr_text, ::testing::Not(::testing::HasSubstr("list"))) << r.stderr_text;
    EXPECT_THAT(r.stderr_text.substr(0, r.stderr_text.find('\n')),
                ::testing::StartsWith("shard_replicator: refusing to start:"))
        << "something was logged before the refusal:\n"
        << r.stderr_text;
  }
}

TEST(ReplicatorFlagsTest, Version_PrintsVersionAndCommit) {
  RunResult r = RunReplicatorToExit({"--version"});
  EXPECT_EQ(ExitCode(r), 0) << r.stderr_text;
  EXPECT_THAT(r.stdout_text, ::testing::MatchesRegex("shard_replicator [0-9]+\\.[0-9]+\\.[0-9]+ "
                                                     "\\(commit ([0-9a-f]+|unknown)\\)\n"));
  RunResult help = RunReplicatorToExit({"--help"});
  EXPECT_THAT(help.stdout_text,
              ::testing::HasSubstr("Flags from shard_replicator/shard_replicator_main.cc:\n"));
}

}  // namespace
}  // namespace shardcache::testing
