// Tests of InvariantChecker against real stores with no replicator: the test writes by hand a
// shard's state and a cache that holds exactly its projection, sees the checker report nothing,
// then breaks one thing at a time (a missing copy, an extra one, a stale one, a wrong one, a
// wrong status, a stale CCR copy, a definition deleted under a Ready CCR, a status of an earlier
// leadership term or not Synced) and sees each reported
// precisely: its kind, shard, CCR and key. A checker that cannot fail would prove nothing.
#include "integration_tests/invariant_checker.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/client/lease_lock.h"
#include "integration_tests/replicator_fixture.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

using Kind = Difference::Kind;

// The copy a replicator of `shard` writes for `origin`, as the brief describes it.
v1::Object HandCopy(const v1::Object& origin, const std::string& shard) {
  v1::Object copy = origin;
  v1::ObjectMeta& m = *copy.mutable_metadata();
  m.set_shard(shard);
  m.clear_resource_version();
  m.clear_finalizers();
  m.clear_deletion_timestamp();
  (*m.mutable_annotations())[kOriginalRvAnnotation] = origin.metadata().resource_version();
  (*m.mutable_annotations())[kOriginalUidAnnotation] = origin.metadata().uid();
  return copy;
}

// "kind key" of each difference, to compare with what a test expects.
std::vector<std::string> Kinds(const std::vector<Difference>& diffs) {
  std::vector<std::string> out;
  for (const Difference& d : diffs)
    out.push_back(absl::StrCat(Difference::KindName(d.kind), " ", d.key));
  return out;
}

constexpr char kWidgets[] = "example.com/v1/widgets";
constexpr char kCcrs[] = "cache.shardcache.io/v1alpha1/clustercachedresources";

std::string WidgetKey(const std::string& name) {
  return absl::StrCat(kWidgets, " ", kCluster, "/", kNamespace, "/", name);
}

class InvariantCheckerTest : public ReplicatorFixture {
 protected:
  // Shard "a": widgets w1, w2 (app=web) and w3 (app=db); CCR "widgets" selecting app=web, with
  // the finalizer and a true status (Ready, Synced, 2 and 2, epoch kEpoch); the lease held by
  // replica-0 in term kEpoch. The cache: copies of w1, w2 and the CCR.
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartShardStore("a"));
    ASSERT_NO_FATAL_FAILURE(StartCache());
    for (const auto& [name, app] : std::vector<std::pair<std::string, std::string>>{
             {"w1", "web"}, {"w2", "web"}, {"w3", "db"}}) {
      ASSERT_TRUE(Ok(CreateIn(shard(), WidgetsGvr(), Widget(name, R"({"app":")" + app + R"("})"))));
    }
    ASSERT_TRUE(
        Ok(CreateIn(shard(), CcrGvr(), Ccr("widgets", R"({"matchLabels":{"app":"web"}})"))));
    ASSERT_TRUE(Ok(Modify(shard(), CcrGvr(), kCluster, "", "widgets", [](v1::Object* o) {
      o->mutable_metadata()->add_finalizers(kFinalizer);
    })));
    ASSERT_NO_FATAL_FAILURE(SetLease("replica-0", kEpoch));
    ASSERT_NO_FATAL_FAILURE(SetCcrStatus("Ready", "True", 2, 2));
    for (const char* name : {"w1", "w2"})
      ASSERT_NO_FATAL_FAILURE(CopyToCache(WidgetsGvr(), "", name));
    ASSERT_NO_FATAL_FAILURE(CopyToCache(CcrGvr(), "", "widgets"));

    InvariantChecker::Options options;
    options.shards["a"] = shards_.at("a").address();
    options.cache = cache_.address();
    options.resources = {WidgetsGvr()};
    absl::StatusOr<std::unique_ptr<InvariantChecker>> checker = InvariantChecker::Create(options);
    ASSERT_TRUE(checker.ok()) << checker.status();
    checker_ = *std::move(checker);
  }

  void TearDown() override {
    checker_.reset();  // its channels, before the stores stop
    ReplicatorFixture::TearDown();
  }

  static constexpr int kEpoch = 3;

  // The replicators' lease: held by `holder` ("" : released) in term `transitions`.
  void SetLease(const std::string& holder, int transitions) {
    LeaderElectionRecord record;
    record.holder_identity = holder;
    record.lease_duration = kLeaseDuration;
    record.acquire_time = absl::Now();
    record.renew_time = absl::Now();
    record.leader_transitions = transitions;
    if (!GetLease("a").has_value()) {
      v1::Object lease;
      lease.mutable_metadata()->set_cluster(kLeaseCluster);
      lease.mutable_metadata()->set_namespace_(kLeaseNamespace);
      lease.mutable_metadata()->set_name(kLeaseName);
      *lease.mutable_spec() = RecordToSpec(record);
      ASSERT_TRUE(Ok(CreateIn(shard(), LeaseGvr(), lease)));
      return;
    }
    ASSERT_TRUE(Ok(Modify(shard(), LeaseGvr(), kLeaseCluster, kLeaseNamespace, kLeaseName,
                          [&](v1::Object* o) { *o->mutable_spec() = RecordToSpec(record); })));
  }

  void SetCcrStatus(const std::string& phase, const std::string& started, int local, int cache,
                    int epoch = kEpoch, const std::string& synced = "True",
                    const std::string& synced_reason = "InSync") {
    std::string json = absl::StrCat(
        R"({"phase":")", phase, R"(","observedGeneration":1,"epoch":)", epoch, R"(,"conditions":[)",
        R"({"type":"ResourceValid","status":"True","reason":"Valid"},)",
        R"({"type":"ReplicationStarted","status":")", started, R"(","reason":"Started"},)",
        R"({"type":"Synced","status":")", synced, R"(","reason":")", synced_reason, R"("}],)",
        R"("resourceCounts":{"local":)", local, R"(,"cache":)", cache, "}}");
    ASSERT_TRUE(Ok(Modify(
        shard(), CcrGvr(), kCluster, "", "widgets",
        [&](v1::Object* o) { *o->mutable_status() = FromJson<google::protobuf::Struct>(json); },
        /*status=*/true)));
  }

  // Writes into the cache the copy of shard a's object as it is now (upsert, as a replicator).
  void CopyToCache(const v1::GroupVersionResource& gvr, const std::string& ns,
                   const std::string& name,
                   const std::function<void(v1::Object*)>& spoil = nullptr) {
    std::optional<v1::Object> origin =
        GetFrom(shard(), gvr, "", kCluster, gvr.resource() == "widgets" ? kNamespace : ns, name);
    ASSERT_TRUE(origin.has_value()) << name;
    v1::Object copy = HandCopy(*origin, "a");
    if (spoil) spoil(&copy);
    Upsert(gvr, copy);
  }

  void Upsert(const v1::GroupVersionResource& gvr, const v1::Object& copy) {
    auto ctx = Context();
    auto stream = cache()->Write(ctx.get());
    v1::WriteRequest req;
    req.set_id(1);
    *req.mutable_upsert()->mutable_resource() = gvr;
    *req.mutable_upsert()->mutable_object() = copy;
    ASSERT_TRUE(stream->Write(req));
    v1::WriteResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    ASSERT_EQ(resp.code(), 0) << resp.message();
    stream->WritesDone();
    ASSERT_TRUE(Ok(stream->Finish()));
  }

  std::vector<Difference> Check() {
    absl::StatusOr<std::vector<Difference>> diffs = checker_->Check();
    EXPECT_TRUE(diffs.ok()) << diffs.status();
    return diffs.ok() ? *diffs : std::vector<Difference>{};
  }

  std::unique_ptr<InvariantChecker> checker_;
};

TEST_F(InvariantCheckerTest, ExactProjectionHasNoDifference) {
  std::vector<Difference> diffs = Check();
  EXPECT_TRUE(diffs.empty()) << Describe(diffs);
}

TEST_F(InvariantCheckerTest, ReportsMissingCopy) {
  ASSERT_TRUE(Ok(DeleteIn(cache(), WidgetsGvr(), "a", kCluster, kNamespace, "w2")));
  std::vector<Difference> diffs = Check();
  EXPECT_EQ(Kinds(diffs), std::vector<std::string>{"missing-copy " + WidgetKey("w2")})
      << Describe(diffs);
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_EQ(diffs[0].shard, "a");
  EXPECT_EQ(diffs[0].ccr, absl::StrCat(kCluster, "|widgets"));
}

TEST_F(InvariantCheckerTest, ReportsExtraCopies) {
  // w3 is not selected; "ghost" does not exist at all.
  ASSERT_NO_FATAL_FAILURE(CopyToCache(WidgetsGvr(), "", "w3"));
  v1::Object ghost = HandCopy(Widget("ghost"), "a");
  ghost.mutable_metadata()->set_uid("ghost-uid");
  ASSERT_NO_FATAL_FAILURE(Upsert(WidgetsGvr(), ghost));
  std::vector<Difference> diffs = Check();
  EXPECT_EQ(Kinds(diffs), (std::vector<std::string>{"extra-copy " + WidgetKey("ghost"),
                                                    "extra-copy " + WidgetKey("w3")}))
      << Describe(diffs);
}

// The origin changed and its copy did not: stale, with both resourceVersions in the message.
TEST_F(InvariantCheckerTest, ReportsStaleCopy) {
  v1::Object updated;
  ASSERT_TRUE(Ok(Modify(
      shard(), WidgetsGvr(), kCluster, kNamespace, "w1",
      [](v1::Object* o) { (*o->mutable_spec()->mutable_fields())["size"].set_number_value(9); },
      false, &updated)));
  std::vector<Difference> diffs = Check();
  EXPECT_EQ(Kinds(diffs), std::vector<std::string>{"stale-copy " + WidgetKey("w1")})
      << Describe(diffs);
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_NE(diffs[0].detail.find("want " + updated.metadata().resource_version()),
            std::string::npos)
      << diffs[0].detail;
}

// A copy at the right version that differs otherwise (someone edited it in the cache).
TEST_F(InvariantCheckerTest, ReportsWrongCopy) {
  ASSERT_NO_FATAL_FAILURE(CopyToCache(WidgetsGvr(), "", "w2", [](v1::Object* copy) {
    (*copy->mutable_metadata()->mutable_labels())["edited"] = "by-hand";
  }));
  std::vector<Difference> diffs = Check();
  EXPECT_EQ(Kinds(diffs), std::vector<std::string>{"wrong-copy " + WidgetKey("w2")})
      << Describe(diffs);
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_NE(diffs[0].detail.find("edited"), std::string::npos) << diffs[0].detail;
}

// Counts that do not match the truth, and a copy of the CCR that shows its older status.
TEST_F(InvariantCheckerTest, ReportsWrongStatusAndStaleCcrCopy) {
  ASSERT_NO_FATAL_FAILURE(SetCcrStatus("Ready", "True", 3, 2));
  std::vector<Difference> diffs = Check();
  std::string ccr_key = absl::StrCat(kCcrs, " ", kCluster, "//widgets");
  EXPECT_EQ(Kinds(diffs),
            (std::vector<std::string>{"stale-ccr-copy " + ccr_key, "wrong-status " + ccr_key}))
      << Describe(diffs);
  for (const Difference& d : diffs) {
    if (d.kind == Kind::kWrongStatus) {
      EXPECT_NE(d.detail.find("resourceCounts.local 3, want 2"), std::string::npos) << d.detail;
    }
  }
}

// A status that an earlier term wrote (another term leads now), and one that says the cache does
// not hold the whole projection yet: both are last known, not converged.
TEST_F(InvariantCheckerTest, ReportsStatusOfAnEarlierTermAndNotSynced) {
  ASSERT_NO_FATAL_FAILURE(SetCcrStatus("Ready", "True", 2, 2, kEpoch - 1, "False", "Pending"));
  ASSERT_NO_FATAL_FAILURE(CopyToCache(CcrGvr(), "", "widgets"));
  std::vector<Difference> diffs = Check();
  std::string ccr_key = absl::StrCat(kCcrs, " ", kCluster, "//widgets");
  EXPECT_EQ(Kinds(diffs), std::vector<std::string>{"wrong-status " + ccr_key}) << Describe(diffs);
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_NE(diffs[0].detail.find(
                absl::StrCat("epoch ", kEpoch - 1, ", want the lease's leaseTransitions ", kEpoch)),
            std::string::npos)
      << diffs[0].detail;
  EXPECT_NE(diffs[0].detail.find("Synced False (Pending), want True (InSync)"), std::string::npos)
      << diffs[0].detail;
}

// The status's term ended with the lease released: nobody leads, so it is only the last known.
TEST_F(InvariantCheckerTest, ReportsStatusWhileNobodyLeads) {
  ASSERT_NO_FATAL_FAILURE(SetLease("", kEpoch));
  std::vector<Difference> diffs = Check();
  std::string ccr_key = absl::StrCat(kCcrs, " ", kCluster, "//widgets");
  EXPECT_EQ(Kinds(diffs), std::vector<std::string>{"wrong-status " + ccr_key}) << Describe(diffs);
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_NE(diffs[0].detail.find("the lease names no holder"), std::string::npos)
      << diffs[0].detail;
}

// The definition goes (the shard store deletes every widget): the CCR must say Initializing and
// ReplicationStarted=False, and the cache must hold no copies; here it still says Ready and the
// copies are there.
TEST_F(InvariantCheckerTest, ReportsReadyCcrAndCopiesOfAnUnservedResource) {
  ASSERT_NO_FATAL_FAILURE(UndefineWidgets("a"));
  std::vector<Difference> diffs = Check();
  std::string ccr_key = absl::StrCat(kCcrs, " ", kCluster, "//widgets");
  EXPECT_EQ(Kinds(diffs),
            (std::vector<std::string>{"extra-copy " + WidgetKey("w1"),
                                      "extra-copy " + WidgetKey("w2"), "wrong-status " + ccr_key}))
      << Describe(diffs);
  for (const Difference& d : diffs) {
    if (d.kind == Kind::kWrongStatus) {
      EXPECT_NE(d.detail.find("phase Ready, want Initializing"), std::string::npos) << d.detail;
      EXPECT_NE(d.detail.find("ReplicationStarted True, want False"), std::string::npos)
          << d.detail;
    }
  }
}

// A CCR whose deletion never finished, and a second CCR for the same resource that claims to
// replicate it (only the first one may).
TEST_F(InvariantCheckerTest, ReportsStuckDeletionAndDuplicateThatClaimsToReplicate) {
  ASSERT_TRUE(Ok(CreateIn(shard(), CcrGvr(), Ccr("widgets-again"))));
  ASSERT_TRUE(Ok(Modify(shard(), CcrGvr(), kCluster, "", "widgets-again",
                        [](v1::Object* o) { o->mutable_metadata()->add_finalizers(kFinalizer); })));
  ASSERT_TRUE(Ok(Modify(
      shard(), CcrGvr(), kCluster, "", "widgets-again",
      [](v1::Object* o) {
        *o->mutable_status() = FromJson<google::protobuf::Struct>(
            R"({"phase":"Ready","observedGeneration":1,"conditions":[)"
            R"({"type":"ResourceValid","status":"True"},)"
            R"({"type":"ReplicationStarted","status":"True"}],)"
            R"("resourceCounts":{"local":3,"cache":3}})");
      },
      /*status=*/true)));
  ASSERT_NO_FATAL_FAILURE(CopyToCache(CcrGvr(), "", "widgets-again"));
  ASSERT_TRUE(Ok(DeleteIn(shard(), CcrGvr(), "", kCluster, "", "widgets")));  // held: finalizer
  ASSERT_NO_FATAL_FAILURE(CopyToCache(CcrGvr(), "", "widgets"));
  std::vector<Difference> diffs = Check();
  std::string first = absl::StrCat(kCcrs, " ", kCluster, "//widgets");
  std::string second = absl::StrCat(kCcrs, " ", kCluster, "//widgets-again");
  // "widgets" came first: while it is being deleted, "widgets-again" is still the later CCR
  // for the same resource and must say ResourceValid=False.
  bool stuck = false, duplicate = false;
  for (const Difference& d : diffs) {
    if (d.kind == Kind::kStuckDeleting && d.key == first) stuck = true;
    if (d.kind == Kind::kWrongStatus && d.key == second &&
        d.detail.find("ResourceValid True, want False") != std::string::npos) {
      duplicate = true;
    }
  }
  EXPECT_TRUE(stuck) << Describe(diffs);
  EXPECT_TRUE(duplicate) << Describe(diffs);
}

}  // namespace
}  // namespace shardcache::testing
