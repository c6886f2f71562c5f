// Process-level tests of shard_replicator when a CCR's resource stops being served: its definition
// deleted (briefly, long enough to push the CCR's backoff high, and for 45 s) and recreated, and
// its version switched to served: false and back with no edit to the CCR. Each time the CCR says
// why nothing is replicated, the cache holds no copies, and replication resumes, promptly, once
// the resource is served again.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "integration_tests/replicator_fixture.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

constexpr char kReconcileCount[] = "shardcache_replicator_reconcile_duration_seconds_count";
constexpr char kCcrController[] = "controller=\"clustercachedresources\"";

class DefinitionsTest : public ReplicatorFixture {
 protected:
  // Shard "a"'s store, the cache, one leading replica, CCR "widgets" and widgets w1..w3 in sync.
  void StartReplicating() {
    StartShardStore("a");
    if (HasFatalFailure()) return;
    StartCache();
    if (HasFatalFailure()) return;
    replica_ = StartReplicator("a", "replica-0");
    ASSERT_TRUE(WaitForLeading(replica_, 1, absl::Seconds(15)));
    ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("widgets")).ok());
    CreateWidgets();
    ASSERT_TRUE(WaitForReady("widgets", 3));
    ASSERT_TRUE(WaitForCacheInSync());
  }

  void CreateWidgets() {
    for (const char* name : {"w1", "w2", "w3"}) {
      ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget(name)).ok());
    }
  }

  // The CCR says the resource is not served, and the cache holds no copies.
  void ExpectNotServed() {
    EXPECT_TRUE(WaitForCcrState("widgets", "Initializing", "False", "ResourceNotServed"));
    std::optional<std::map<std::string, v1::Object>> copies;
    EXPECT_TRUE(Eventually(
        [&] {
          copies = ListFrom(cache(), WidgetsGvr(), "a", kCluster);
          return copies.has_value() && copies->empty();
        },
        kConverge, "no widget copies in the cache",
        [&] { return absl::StrCat(copies.has_value() ? copies->size() : 0, " copies"); }));
  }

  // For `duration`: the CCR stays Initializing/ResourceNotServed and the cache holds no copies.
  ::testing::AssertionResult StaysNotServed(absl::Duration duration) {
    absl::Time end = absl::Now() + duration;
    while (absl::Now() < end) {
      std::optional<v1::Object> ccr = GetCcr("widgets");
      if (!ccr.has_value()) return ::testing::AssertionFailure() << "the CCR went away";
      ConditionView started = FindCondition(*ccr, "ReplicationStarted");
      if (Phase(*ccr) != "Initializing" || started.reason != "ResourceNotServed") {
        return ::testing::AssertionFailure() << "the CCR changed: " << DescribeStatus(*ccr);
      }
      auto copies = ListFrom(cache(), WidgetsGvr(), "a", kCluster);
      if (!copies.has_value() || !copies->empty()) {
        return ::testing::AssertionFailure() << "copies in the cache while not served";
      }
      absl::SleepFor(absl::Milliseconds(500));
    }
    return ::testing::AssertionSuccess();
  }

  // Waits until the cache holds the copies of w1..w3 again; returns how long that took.
  absl::Duration TimeToResume(absl::Time since, absl::Duration timeout) {
    std::string last = "not checked";
    bool ok = Eventually(
        [&] {
          auto copies = ListFrom(cache(), WidgetsGvr(), "a", kCluster);
          if (!copies.has_value() || copies->size() != 3) {
            last = absl::StrCat(copies.has_value() ? copies->size() : 0, " copies");
            return false;
          }
          last = CacheDiff("a", "", WidgetsGvr(), kCluster);
          return last.empty();
        },
        timeout, "the copies of w1..w3 are back", [&] { return last; });
    EXPECT_TRUE(ok) << last;
    return absl::Now() - since;
  }

  ServerProcess* replica_ = nullptr;
};

// The definition deleted: the CCR waits (ResourceNotServed), failing and backing off meanwhile.
// Recreated: the CCR is reconciled at once, not after its backoff. To make a missed backoff reset
// show, the definition is recreated right after a failed reconcile of the CCR, when its next
// retry is furthest away (after about 20 s of failures, seconds away).
TEST_F(DefinitionsTest, DefinitionRecreatedAfterBackoffResumesAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartReplicating());
  UndefineWidgets();
  ASSERT_FALSE(HasFatalFailure());
  ExpectNotServed();

  // Let failed retries push the backoff up, checking that nothing changes meanwhile.
  EXPECT_TRUE(StaysNotServed(absl::Seconds(20)));
  // Then wait (a little) for a reconcile of the CCR to have just happened.
  double reconciles = Metric(replica_->http_port(), kReconcileCount, {kCcrController});
  ::testing::AssertionResult reconciled = Eventually(
      [&] {
        return Metric(replica_->http_port(), kReconcileCount, {kCcrController}) != reconciles;
      },
      absl::Seconds(15), "another reconcile of the CCR");
  std::cerr << "recreating the definition; waited for a retry of the CCR: " << reconciled.message()
            << " (" << reconciles << " reconciles before)\n";

  absl::Time recreated = absl::Now();
  DefineWidgets();
  ASSERT_FALSE(HasFatalFailure());
  CreateWidgets();
  ASSERT_FALSE(HasFatalFailure());
  absl::Duration took = TimeToResume(recreated, absl::Seconds(20));
  std::cerr << "replication resumed " << took << " after the definition was recreated\n";
  // 2 s, and slack for a loaded machine; a long backoff is many seconds.
  EXPECT_LE(took, absl::Seconds(4)) << "replication resumed only after a backoff";
  EXPECT_TRUE(WaitForReady("widgets", 3));
  EXPECT_TRUE(WaitForCcrCopy("widgets"));
}

// The definition absent for 45 s, then recreated: replication resumes.
TEST_F(DefinitionsTest, DefinitionAbsentFor45SecondsThenRecreated) {
  ASSERT_NO_FATAL_FAILURE(StartReplicating());
  UndefineWidgets();
  ASSERT_FALSE(HasFatalFailure());
  ExpectNotServed();
  EXPECT_TRUE(StaysNotServed(absl::Seconds(45)));

  absl::Time recreated = absl::Now();
  DefineWidgets();
  ASSERT_FALSE(HasFatalFailure());
  CreateWidgets();
  ASSERT_FALSE(HasFatalFailure());
  absl::Duration took = TimeToResume(recreated, kConverge);
  std::cerr << "replication resumed " << took << " after the definition was recreated\n";
  EXPECT_LE(took, absl::Seconds(4)) << "replication resumed only after a backoff";
  EXPECT_TRUE(WaitForReady("widgets", 3));
}

// The version switched to served: false (the objects stay in the store, its informers stop):
// the CCR turns ReplicationStarted=False by itself, with no edit to it, and the copies leave the
// cache; served again: Ready, and the copies are back.
TEST_F(DefinitionsTest, VersionUnservedAndServedAgain) {
  ASSERT_NO_FATAL_FAILURE(StartReplicating());
  std::optional<v1::Object> before = GetCcr("widgets");
  ASSERT_TRUE(before.has_value());

  SetWidgetsServed(false);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_TRUE(WaitForCcr(
      "widgets",
      [](const v1::Object& ccr) {
        return FindCondition(ccr, "ReplicationStarted").status == "False" && Phase(ccr) != "Ready";
      },
      "ReplicationStarted=False, not Ready"));
  ExpectNotServed();

  SetWidgetsServed(true);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_TRUE(WaitForReady("widgets", 3));
  EXPECT_TRUE(WaitForCacheInSync());

  // Nobody edited the CCR's spec: only its status changed.
  std::optional<v1::Object> after = GetCcr("widgets");
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->metadata().generation(), before->metadata().generation());
}

}  // namespace
}  // namespace shardcache::testing
