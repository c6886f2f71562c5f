// Process-level tests that replication converges after faults of the cache server, with real
// processes on loopback: a cache killed (SIGKILL) and restarted with its data while the shard
// changes leaves no copy missing, extra or stale, and the CCR's status right; after a long
// outage of the cache, the backlog reaches it within seconds of its return, and the replicator
// logs when replication stops and resumes; and a CCR's status lets a reader tell "replicated as
// of now" from "last known" (its epoch against the lease, and the Synced condition).

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <csignal>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/server_process.h"
#include "integration_tests/replicator_fixture.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// How long the backlog may take to reach the cache after its return. The replicator's own bound
// is 2 s (it reconnects at least every second); the rest is room for a busy machine.
constexpr absl::Duration kBacklogBound = absl::Seconds(4);

class ConvergenceTest : public ReplicatorFixture {
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

  // Until CCR "widgets" is Ready with `n` objects on both sides and Synced=True.
  ::testing::AssertionResult WaitForSynced(double n, absl::Duration timeout = kConverge) {
    return WaitForCcr(
        "widgets",
        [n](const v1::Object& ccr) {
          return Phase(ccr) == "Ready" && ResourceCount(ccr, "local") == n &&
                 ResourceCount(ccr, "cache") == n && FindCondition(ccr, "Synced").status == "True";
        },
        absl::StrCat("Ready, ", n, " local and cache, Synced=True"), timeout);
  }

  double WriteErrors(const std::string& code) {
    double n = Metric(replica_->http_port(), "shardcache_replicator_write_errors_total",
                      {absl::StrCat("code=\"", code, "\"")});
    return n < 0 ? 0 : n;
  }

  ServerProcess* replica_ = nullptr;
};

class CacheRestartTest : public ConvergenceTest, public ::testing::WithParamInterface<int> {};

// The cache is killed and restarted with its data directory on the same port while objects are
// created, updated and deleted in the shard. With several workers the writes that were waiting
// when the cache came back used to open a stream each, every one cancelling the one before,
// and the cancelled writes were dropped: copies stayed missing, extra or stale, and the CCR
// stayed Ready with wrong counts until the periodic resync (5 minutes). Now the writer has one
// stream at a time, no write is cancelled while the term lasts, and every failed write is
// retried: the cache converges, and so does the status.
TEST_P(CacheRestartTest, CacheRestartedWithItsDataWhileTheShardChanges) {
  const int workers = GetParam();
  ASSERT_NO_FATAL_FAILURE(StartAll({absl::StrCat("--workers=", workers)}));
  ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("widgets")).ok());
  constexpr int kObjects = 200;
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget(absl::StrCat("w", i))).ok());
  }
  ASSERT_TRUE(WaitForCacheInSync("a", "", absl::Seconds(60)));
  ASSERT_TRUE(WaitForReady("widgets", kObjects, absl::Seconds(60)));

  // One change: a create, an update of the spec, or a delete, each of another object.
  auto change = [&](int i) {
    switch (i % 3) {
      case 0:
        ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget(absl::StrCat("new", i))).ok());
        break;
      case 1:
        ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, absl::StrCat("w", i),
                           [i](v1::Object* o) {
                             (*o->mutable_spec()->mutable_fields())["size"].set_number_value(1000 +
                                                                                             i);
                           })
                        .ok());
        break;
      default:
        ASSERT_TRUE(
            DeleteIn(shard(), WidgetsGvr(), "", kCluster, kNamespace, absl::StrCat("w", i)).ok());
        break;
    }
  };

  ASSERT_NO_FATAL_FAILURE(KillStore(&cache_));
  // 75 changes over about 3 s while the cache is down, 15 more as it comes back.
  for (int i = 0; i < 75; ++i) {
    ASSERT_NO_FATAL_FAILURE(change(i));
    absl::SleepFor(absl::Milliseconds(40));  // pacing, not a wait for an effect
  }
  ASSERT_NO_FATAL_FAILURE(RestartStore(&cache_));
  for (int i = 75; i < 90; ++i) ASSERT_NO_FATAL_FAILURE(change(i));

  // 30 creates and 30 deletes: the count is unchanged.
  EXPECT_TRUE(WaitForCacheInSync("a", "", absl::Seconds(30)));
  EXPECT_TRUE(WaitForReady("widgets", kObjects, absl::Seconds(30)));
  EXPECT_TRUE(WaitForSynced(kObjects, absl::Seconds(10)));
  EXPECT_TRUE(WaitForCcrCopy("widgets"));
  EXPECT_EQ(WriteErrors("CANCELLED"), 0)
      << "a write was cancelled while the term lasted (a stream replaced another)";
}

INSTANTIATE_TEST_SUITE_P(Workers, CacheRestartTest, ::testing::Values(4, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Workers");
                         });

// A long outage of the cache must not push the retries far into the future: gRPC's reconnect
// backoff and the per-key backoff used to double through the outage (a new object took 22 s to
// arrive after a 32 s outage). Writes that failed because the cache could not be reached are
// retried as soon as the writer's stream is back; the replicator logs when replication stops
// and when it resumes.
TEST_F(ConvergenceTest, BacklogFlowsWithinSecondsOfTheCachesReturnAfterALongOutage) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  ASSERT_NO_FATAL_FAILURE(ReplicateWidgets());
  ASSERT_NO_FATAL_FAILURE(KillStore(&cache_));
  absl::Time down = absl::Now();

  // A change at once (its retries would back off the longest), and more through the outage.
  constexpr absl::Duration kOutage = absl::Seconds(30);
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("first")).ok());
  int n = 0;
  while (absl::Now() < down + kOutage) {
    ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget(absl::StrCat("during", n++))).ok());
    ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, "w1", [n](v1::Object* o) {
                  (*o->mutable_spec()->mutable_fields())["size"].set_number_value(n);
                }).ok());
    absl::SleepFor(absl::Seconds(3));  // pacing through the outage
  }
  EXPECT_THAT(replica_->Log(), HasSubstr("replication to the cache stops"));
  EXPECT_GT(WriteErrors("UNAVAILABLE"), 0);
  // Readiness tells a leader that cannot write from one that replicates.
  EXPECT_THAT(HttpGet(replica_->http_port(), "/readyz"),
              AllOf(StartsWith("503"), HasSubstr("leading (epoch "),
                    HasSubstr("but unable to write to the cache since")));

  ASSERT_NO_FATAL_FAILURE(RestartStore(&cache_));
  absl::Time back = absl::Now();
  ::testing::AssertionResult synced = WaitForCacheInSync("a", "", absl::Seconds(60));
  absl::Duration took = absl::Now() - back;
  ASSERT_TRUE(synced);
  std::cout << "backlog of " << n + 1 << " creates and " << n
            << " updates in the cache after an outage of " << back - down << ": " << took
            << " after the cache's return" << std::endl;
  EXPECT_LE(took, kBacklogBound);
  EXPECT_TRUE(Eventually(
      [&] { return replica_->Log().find("replication to the cache resumes") != std::string::npos; },
      absl::Seconds(5), "the replicator logs that replication resumes"));
  EXPECT_TRUE(
      Eventually([&] { return absl::StartsWith(HttpGet(replica_->http_port(), "/readyz"), "200"); },
                 absl::Seconds(5), "the replicator is ready again"));
  EXPECT_TRUE(WaitForSynced(3 + n + 1));
}

// Status semantics. While a replica leads, the status it writes carries its term's epoch (the
// lease's leaseTransitions) and Synced says whether the cache holds the projection (False with
// CacheUnavailable and the number of objects waiting while the cache is down). Once nobody leads
// (the leader is killed and its lease expires; another identity takes the lease), the status is
// not rewritten, and a reader tells from the lease that it is the last known one. A new leader
// rewrites it with its own epoch.
TEST_F(ConvergenceTest, StatusTellsReplicatedAsOfNowFromLastKnown) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  ASSERT_NO_FATAL_FAILURE(ReplicateWidgets());
  ASSERT_TRUE(WaitForSynced(3));
  std::optional<v1::Object> lease = GetLease();
  ASSERT_TRUE(lease.has_value());
  std::optional<v1::Object> ccr = GetCcr("widgets");
  ASSERT_TRUE(ccr.has_value());
  const double epoch = StatusEpoch(*ccr);
  EXPECT_GE(epoch, 1) << DescribeStatus(*ccr);
  EXPECT_EQ(WhyLastKnown(*ccr, *lease, absl::Now()), "") << ToJson(*lease);
  EXPECT_EQ(FindCondition(*ccr, "Synced").reason, "InSync");
  EXPECT_TRUE(ccr->status().fields().count("lastUpdateTime") > 0) << ToJson(*ccr);

  // The cache goes away; two objects cannot be written: "as of now", not synced, 2 waiting.
  ASSERT_NO_FATAL_FAILURE(KillStore(&cache_));
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w4")).ok());
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w5")).ok());
  ASSERT_TRUE(WaitForCcr(
      "widgets",
      [](const v1::Object& c) {
        ConditionView synced = FindCondition(c, "Synced");
        return synced.status == "False" && synced.reason == "CacheUnavailable" &&
               synced.message.find("2 objects wait") != std::string::npos &&
               ResourceCount(c, "local") == 5;
      },
      "Synced=False, CacheUnavailable, 2 objects waiting"));
  ccr = GetCcr("widgets");
  lease = GetLease();
  ASSERT_TRUE(ccr.has_value() && lease.has_value());
  EXPECT_EQ(WhyLastKnown(*ccr, *lease, absl::Now()), "") << "the leader still writes it";
  EXPECT_EQ(Phase(*ccr), "Ready");

  ASSERT_NO_FATAL_FAILURE(RestartStore(&cache_));
  ASSERT_TRUE(WaitForSynced(5));
  ASSERT_TRUE(WaitForCacheInSync());

  // The leader dies: nobody renews the lease. The status stays as it was, and once the lease has
  // expired a reader knows it is the last known one.
  replica_->Signal(SIGKILL);
  ASSERT_NE(replica_->Wait(absl::Seconds(10)), -1);
  ccr = GetCcr("widgets");
  ASSERT_TRUE(ccr.has_value());
  std::string why;
  ASSERT_TRUE(Eventually(
      [&] {
        lease = GetLease();
        why = lease.has_value() ? WhyLastKnown(*ccr, *lease, absl::Now()) : "";
        return !why.empty();
      },
      kLeaseDuration + absl::Seconds(5), "the reader sees the status as the last known one"));
  EXPECT_THAT(why, HasSubstr("expired"));
  std::optional<v1::Object> now = GetCcr("widgets");
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->metadata().resource_version(), ccr->metadata().resource_version())
      << "nobody leads, yet the status changed";
  EXPECT_EQ(FindCondition(*now, "Synced").status, "True") << "what was true when it was written";

  // Another identity takes the lease (a new term): the status's epoch is now an old term's.
  ASSERT_TRUE(
      Modify(shard(), LeaseGvr(), kLeaseCluster, kLeaseNamespace, kLeaseName, [](v1::Object* l) {
        auto& f = *l->mutable_spec()->mutable_fields();
        std::string t =
            absl::FormatTime("%Y-%m-%d%ET%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone());
        f["holderIdentity"].set_string_value("someone-else");
        f["leaseTransitions"].set_number_value(f["leaseTransitions"].number_value() + 1);
        f["acquireTime"].set_string_value(t);
        f["renewTime"].set_string_value(t);
        f["leaseDurationSeconds"].set_number_value(1);
      }).ok());
  lease = GetLease();
  ASSERT_TRUE(lease.has_value());
  why = WhyLastKnown(*now, *lease, absl::Now());
  EXPECT_THAT(why, HasSubstr(absl::StrCat("written in term ", epoch))) << ToJson(*lease);

  // A new replica leads once that lease expires, and rewrites the status with its epoch.
  ServerProcess* next = StartReplicator("a", "replica-1");
  ASSERT_TRUE(WaitForLeading(next, 1, absl::Seconds(20)));
  ASSERT_TRUE(WaitForCcr(
      "widgets",
      [&](const v1::Object& c) {
        std::optional<v1::Object> l = GetLease();
        return l.has_value() && StatusEpoch(c) > epoch + 1 &&
               WhyLastKnown(c, *l, absl::Now()).empty() &&
               FindCondition(c, "Synced").status == "True";
      },
      "the new leader's epoch, current, Synced=True"));
}

}  // namespace
}  // namespace shardcache::testing
