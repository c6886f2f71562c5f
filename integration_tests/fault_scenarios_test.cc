// Process tests of replication under network and process faults: real shard store, cache and
// shard_replicator replicas on loopback, faults put between them with FaultProxy, and the
// InvariantChecker as the judge of convergence (the cache equals the shard's projection, every
// CCR's status tells the truth). Each test reports how long convergence took after the fault.
//
// - the cache restarted (with its data, or wiped) while the shard changes;
// - the leader partitioned from its shard store: it stops leading by its renew deadline, writes
//   nothing after, and a standby takes over;
// - the leader partitioned from the cache (black hole or reset connections): writes wait and are
//   retried, nothing is lost;
// - connections that flap while the shard changes.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/client/lease_lock.h"
#include "integration_tests/fault_proxy.h"
#include "integration_tests/invariant_checker.h"
#include "integration_tests/replicator_fixture.h"

namespace shardcache::testing {
namespace {

constexpr char kWrites[] = "shardcache_replicator_writes_total";
constexpr char kWriteErrors[] = "shardcache_replicator_write_errors_total";
// Slack for a loaded machine on top of the leader-election timings.
constexpr absl::Duration kSlack = absl::Seconds(3);
// How many widgets the CCR replicates at the start.
constexpr int kWidgets = 60;

class FaultScenariosTest : public ReplicatorFixture {
 protected:
  // Shard "a" and the cache, kWidgets widgets, CCR "widgets" selecting them all.
  void StartWithWidgets() {
    ASSERT_NO_FATAL_FAILURE(StartShardStore("a"));
    ASSERT_NO_FATAL_FAILURE(StartCache());
    for (int i = 0; i < kWidgets; ++i) {
      ASSERT_TRUE(Ok(CreateIn(shard(), WidgetsGvr(), Widget(absl::StrCat("w", i)))));
    }
    ASSERT_TRUE(Ok(CreateIn(shard(), CcrGvr(), Ccr("widgets"))));
    InvariantChecker::Options options;
    options.shards["a"] = shards_.at("a").address();
    options.cache = cache_.address();
    options.resources = {WidgetsGvr()};
    absl::StatusOr<std::unique_ptr<InvariantChecker>> checker = InvariantChecker::Create(options);
    ASSERT_TRUE(checker.ok()) << checker.status();
    checker_ = *std::move(checker);
  }

  // A proxy in front of shard "a"'s store or the cache (owned by the test).
  FaultProxy* ProxyTo(const Store& store) {
    absl::StatusOr<std::unique_ptr<FaultProxy>> proxy =
        FaultProxy::Start("127.0.0.1", store.process->grpc_port());
    EXPECT_TRUE(proxy.ok()) << proxy.status();
    if (!proxy.ok()) return nullptr;
    proxies_.push_back(*std::move(proxy));
    return proxies_.back().get();
  }

  // A replica of shard "a" that reaches its store and the cache at the given addresses.
  ServerProcess* StartReplicaVia(const std::string& identity, const std::string& store_address,
                                 const std::string& cache_address) {
    std::vector<std::string> args = ReplicatorArgs("a", identity, {}, cache_address);
    for (std::string& a : args) {
      if (a.rfind("--shard-store=", 0) == 0) a = "--shard-store=" + store_address;
    }
    auto p = std::make_unique<ServerProcess>(BinaryPath("shard_replicator/shard_replicator"), args);
    absl::Status started = p->Start();
    EXPECT_TRUE(started.ok()) << started;
    replicators_.push_back(std::move(p));
    return replicators_.back().get();
  }

  // Until the checker finds nothing; the message says how long it took, or what still differs.
  ::testing::AssertionResult Converges(absl::Duration bound, absl::Duration* took = nullptr) {
    absl::Time start = absl::Now();
    std::string last;
    while (true) {
      absl::StatusOr<std::vector<Difference>> diffs = checker_->Check();
      if (diffs.ok() && diffs->empty()) {
        if (took != nullptr) *took = absl::Now() - start;
        std::cerr << "converged in " << absl::Now() - start << "\n";
        return ::testing::AssertionSuccess() << "converged in " << absl::Now() - start;
      }
      last = diffs.ok() ? absl::StrCat(diffs->size(), " differences:\n", Describe(*diffs))
                        : diffs.status().ToString();
      if (absl::Now() - start > bound) {
        return ::testing::AssertionFailure()
               << "not converged within " << bound << "; last check: " << last;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  // `n` changes in shard "a": creates of new widgets, spec updates, label changes and deletes of
  // existing ones (round-robin), tagged with `round` so that every round changes something.
  void ChangeShard(int n, int round) {
    for (int i = 0; i < n; ++i) {
      std::string name = absl::StrCat("w", (i * 7 + round) % kWidgets);
      switch (i % 4) {
        case 0:
          (void)CreateIn(shard(), WidgetsGvr(), Widget(absl::StrCat("new-", round, "-", i)));
          break;
        case 1:
          TryModify(name, [&](v1::Object* o) {
            (*o->mutable_spec()->mutable_fields())["round"].set_number_value(round * 1000 + i);
          });
          break;
        case 2:
          TryModify(name, [&](v1::Object* o) {
            (*o->mutable_metadata()->mutable_labels())["round"] = absl::StrCat("r", round, "-", i);
          });
          break;
        default: {
          v1::DeleteRequest req;
          *req.mutable_resource() = WidgetsGvr();
          req.set_cluster(kCluster);
          req.set_namespace_(kNamespace);
          req.set_name(name);
          v1::DeleteResponse out;
          (void)shard()->Delete(Context().get(), req, &out);  // may be gone already
        }
      }
    }
  }

  // Read-modify-write of a widget of shard "a" that may have been deleted (then nothing).
  void TryModify(const std::string& name, const std::function<void(v1::Object*)>& mutate) {
    v1::GetRequest get;
    *get.mutable_resource() = WidgetsGvr();
    get.set_cluster(kCluster);
    get.set_namespace_(kNamespace);
    get.set_name(name);
    v1::Object obj;
    if (!shard()->Get(Context().get(), get, &obj).ok()) return;
    mutate(&obj);
    v1::UpdateRequest req;
    *req.mutable_resource() = WidgetsGvr();
    *req.mutable_object() = obj;
    v1::Object out;
    grpc::Status s = shard()->Update(Context().get(), req, &out);
    EXPECT_TRUE(s.ok()) << "update " << name << ": " << s.error_message();
  }

  // Until the CCR "widgets" says that the leader's writes wait (Synced=False): the leader has seen
  // changes that it cannot write to the cache.
  ::testing::AssertionResult WaitForWritesWaiting() {
    return WaitForCcr(
        "widgets",
        [](const v1::Object& ccr) { return FindCondition(ccr, "Synced").status == "False"; },
        "Synced=False (writes wait for the cache)");
  }

  // Until `holder` has renewed shard "a"'s lease at `after` or later, in the term it held at the
  // call (the same leaseTransitions): proof that it kept leading until then.
  ::testing::AssertionResult WaitForRenewalAfter(const std::string& holder, absl::Time after,
                                                 absl::Duration timeout) {
    std::optional<LeaderElectionRecord> first;
    std::string last = "no lease";
    auto renewed = [&] {
      std::optional<v1::Object> lease = GetLease("a");
      if (!lease.has_value()) return false;
      absl::StatusOr<LeaderElectionRecord> record = RecordFromSpec(lease->spec());
      if (!record.ok()) return false;
      if (!first.has_value()) first = *record;
      last = absl::StrCat("holder ", record->holder_identity, ", leaseTransitions ",
                          record->leader_transitions, ", renewTime ",
                          absl::FormatTime(record->renew_time));
      return record->holder_identity == holder &&
             record->leader_transitions == first->leader_transitions && record->renew_time >= after;
    };
    return Eventually(renewed, timeout,
                      absl::StrCat(holder, " renewing the lease at ", absl::FormatTime(after),
                                   " or later, in the same term"),
                      [&] { return last; });
  }

  static double Counter(ServerProcess* p, const char* name) {
    double v = Metric(p->http_port(), name);
    return v < 0 ? 0 : v;
  }

  std::unique_ptr<InvariantChecker> checker_;
  std::vector<std::unique_ptr<FaultProxy>> proxies_;
};

// The cache is killed (-9) while the shard changes, and restarted on the same port with its
// data: the cache converges to the shard's projection within seconds, and the CCR's counts tell
// the truth.
TEST_F(FaultScenariosTest, CacheRestartedWithItsDataWhileTheShardChanges) {
  ASSERT_NO_FATAL_FAILURE(StartWithWidgets());
  StartReplicator("a", "replica-0");
  ASSERT_TRUE(Converges(kConverge));
  cache_.process->Signal(SIGKILL);
  ASSERT_NE(cache_.process->Wait(absl::Seconds(10)), -1);
  ChangeShard(60, 1);
  ASSERT_NO_FATAL_FAILURE(RestartStore(&cache_));
  ChangeShard(12, 2);
  EXPECT_TRUE(Converges(kConverge));
}

// The same with the cache's data directory wiped: the replicator writes everything again.
TEST_F(FaultScenariosTest, CacheRestartedWithoutItsDataWhileTheShardChanges) {
  ASSERT_NO_FATAL_FAILURE(StartWithWidgets());
  StartReplicator("a", "replica-0");
  ASSERT_TRUE(Converges(kConverge));
  cache_.process->Signal(SIGKILL);
  ASSERT_NE(cache_.process->Wait(absl::Seconds(10)), -1);
  std::filesystem::remove_all(cache_.process->data_dir());
  ChangeShard(60, 1);
  ASSERT_NO_FATAL_FAILURE(RestartStore(&cache_));
  ChangeShard(12, 2);
  EXPECT_TRUE(Converges(kConverge));
}

// The leader loses its shard store (a black hole: no reset, nothing answers). It cannot renew:
// it stops leading by its renew deadline, and from then on writes nothing to the cache, although
// the cache needs a repair that it would make while leading (a copy deleted by hand). The
// standby takes over, makes the repair and replicates what changed meanwhile.
TEST_F(FaultScenariosTest, LeaderPartitionedFromItsShardStoreStopsAndStandbyTakesOver) {
  ASSERT_NO_FATAL_FAILURE(StartWithWidgets());
  FaultProxy* a_store = ProxyTo(shards_.at("a"));
  ASSERT_NE(a_store, nullptr);
  ServerProcess* a = StartReplicaVia("replica-0", a_store->address(), cache_.address());
  ASSERT_TRUE(WaitForLeading(a, 1, absl::Seconds(15)));
  ServerProcess* b = StartReplicator("a", "replica-1");
  ASSERT_TRUE(Converges(kConverge));
  ASSERT_EQ(Leading(b), 0);

  absl::Time partitioned = absl::Now();
  a_store->BlackHole();
  ASSERT_TRUE(WaitForLeading(a, 0, kRenewDeadline + kRetryPeriod + kSlack));
  absl::Duration stopped_after = absl::Now() - partitioned;
  std::cerr << "the partitioned leader stopped leading " << stopped_after << " after the partition"
            << " (renew deadline " << kRenewDeadline << ")\n";
  EXPECT_LE(stopped_after, kRenewDeadline + kRetryPeriod + kSlack);
  const double writes = Counter(a, kWrites) + Counter(a, kWriteErrors);

  // A repair that a leader would make, and local changes.
  ASSERT_TRUE(Ok(DeleteIn(cache(), WidgetsGvr(), "a", kCluster, kNamespace, "w1")));
  ChangeShard(8, 1);
  ASSERT_TRUE(WaitForLeading(b, 1, kLeaseDuration + kRetryPeriod * 2 + kSlack));
  ASSERT_TRUE(Converges(kConverge));  // b restored w1: a would have had the time to as well
  EXPECT_EQ(Counter(a, kWrites) + Counter(a, kWriteErrors), writes)
      << "the replica that lost its lease kept writing to the cache";
  EXPECT_EQ(Leading(a), 0);
  a_store->Heal();
}

// The leader loses the cache: a black hole, then reset connections. It keeps leading (it renews
// its lease after its renew deadline has passed in the partition, while its writes wait); its
// writes are retried; once the cache is reachable again nothing is lost.
TEST_F(FaultScenariosTest, LeaderPartitionedFromTheCacheLosesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartWithWidgets());
  FaultProxy* to_cache = ProxyTo(cache_);
  ASSERT_NE(to_cache, nullptr);
  ServerProcess* a = StartReplicator("a", "replica-0", {}, to_cache->address());
  ASSERT_TRUE(WaitForLeading(a, 1, absl::Seconds(15)));
  ASSERT_TRUE(Converges(kConverge));

  absl::Time partitioned = absl::Now();
  to_cache->BlackHole();
  ChangeShard(30, 1);
  // Deleted by hand meanwhile: must be restored too.
  ASSERT_TRUE(Ok(DeleteIn(cache(), WidgetsGvr(), "a", kCluster, kNamespace, "w2")));
  ASSERT_TRUE(WaitForWritesWaiting());
  // Had the partition made it give up, it would have by its renew deadline.
  EXPECT_TRUE(WaitForRenewalAfter("replica-0", partitioned + kRenewDeadline + kRetryPeriod,
                                  kRenewDeadline + kRetryPeriod * 2 + kSlack))
      << "a partition from the cache made the leader give up its lease";
  EXPECT_EQ(Leading(a), 1) << "a partition from the cache made the leader give up its lease";
  to_cache->Heal();
  absl::Duration took;
  EXPECT_TRUE(Converges(kConverge, &took));
  std::cerr << "after a black hole of the cache: converged " << took << " after the heal\n";

  partitioned = absl::Now();
  to_cache->Cut();
  ChangeShard(30, 2);
  ASSERT_TRUE(WaitForWritesWaiting());
  EXPECT_TRUE(WaitForRenewalAfter("replica-0", partitioned + kRenewDeadline + kRetryPeriod,
                                  kRenewDeadline + kRetryPeriod * 2 + kSlack))
      << "reset connections to the cache made the leader give up its lease";
  EXPECT_EQ(Leading(a), 1) << "reset connections to the cache made the leader give up its lease";
  to_cache->Heal();
  EXPECT_TRUE(Converges(kConverge, &took));
  std::cerr << "after reset connections to the cache: converged " << took << " after the heal\n";
}

// Both of the leader's connections are reset every 250 ms for 8 s while the shard changes.
TEST_F(FaultScenariosTest, FlappingConnectionsLoseNothing) {
  ASSERT_NO_FATAL_FAILURE(StartWithWidgets());
  FaultProxy* to_store = ProxyTo(shards_.at("a"));
  FaultProxy* to_cache = ProxyTo(cache_);
  ASSERT_TRUE(to_store != nullptr && to_cache != nullptr);
  ServerProcess* a = StartReplicaVia("replica-0", to_store->address(), to_cache->address());
  ASSERT_TRUE(WaitForLeading(a, 1, absl::Seconds(15)));
  ASSERT_TRUE(Converges(kConverge));
  absl::Time end = absl::Now() + absl::Seconds(8);
  for (int round = 1; absl::Now() < end; ++round) {
    to_store->ResetAll();
    to_cache->ResetAll();
    ChangeShard(3, round);
    absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_GT(to_cache->connections_reset(), 5);
  EXPECT_TRUE(Converges(kConverge));
}

}  // namespace
}  // namespace shardcache::testing
