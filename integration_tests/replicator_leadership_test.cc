// Process-level tests of shard_replicator's leadership: the lease taken away by another holder and
// handed back (no writes to the cache in between, then convergence); two replicas, with the
// leader killed (-9) or terminated; a leader paused past its lease while another takes over,
// whose old epoch the cache then rejects; the same with the paused leader's own write held in
// flight (by a TCP relay) until after the takeover, then rejected; and a leader fenced by a higher
// epoch claimed at the cache.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/client/lease_lock.h"
#include "integration_tests/refuse_to_start.h"
#include "integration_tests/replicator_fixture.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/tcp_relay.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kEpoch[] = "shardcache_replicator_epoch";
constexpr char kTerms[] = "shardcache_leader_election_terms_total";
constexpr char kFenced[] = "shardcache_replicator_fenced_total";
constexpr char kWrites[] = "shardcache_replicator_writes_total";
// How long a standby may take to notice that a lease was released, or that its holder's term
// ended, beyond what the protocol allows: scheduling on a loaded two-core machine.
constexpr absl::Duration kSlack = absl::Seconds(2);

// A metric that may not be exported before its first increment: absent reads as 0.
double Counter(ServerProcess* p, const std::string& name) {
  double v = Metric(p->http_port(), name);
  return v < 0 ? 0 : v;
}

size_t Occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

class LeadershipTest : public ReplicatorFixture {
 protected:
  // Shard "a"'s store and the cache.
  void StartStores() {
    StartShardStore("a");
    if (HasFatalFailure()) return;
    StartCache();
  }

  // The stores and replica-0 of shard "a", leading (`leader`), and widgets replicated
  // (ReplicateWidgets).
  void StartLeader(ServerProcess** leader) {
    StartStores();
    if (HasFatalFailure()) return;
    *leader = StartReplicator("a", "replica-0");
    ASSERT_TRUE(WaitForLeading(*leader, 1, absl::Seconds(15)));
    ReplicateWidgets();
  }

  // The stores, replicas replica-0 and replica-1 of shard "a", one leading (`leader`) and the
  // other standing by (`standby`), and widgets replicated (ReplicateWidgets).
  void StartLeaderAndStandby(ServerProcess** leader, ServerProcess** standby) {
    StartStores();
    if (HasFatalFailure()) return;
    ServerProcess* r0 = StartReplicator("a", "replica-0");
    ServerProcess* r1 = StartReplicator("a", "replica-1");
    *leader = WaitForOneLeader({r0, r1});
    ASSERT_NE(*leader, nullptr);
    *standby = *leader == r0 ? r1 : r0;
    ReplicateWidgets();
  }

  // Waits until exactly one of `replicas` leads and returns it (nullptr on timeout).
  ServerProcess* WaitForOneLeader(const std::vector<ServerProcess*>& replicas,
                                  absl::Duration timeout = absl::Seconds(15)) {
    ServerProcess* leader = nullptr;
    EXPECT_TRUE(Eventually(
        [&] {
          int leading = 0;
          for (ServerProcess* r : replicas) {
            if (Leading(r) == 1) {
              leader = r;
              ++leading;
            }
          }
          return leading == 1;
        },
        timeout, "exactly one replica leads"));
    return leader;
  }

  // Rewrites the lease's record in the shard store (retrying on conflicts with the holder).
  void RewriteLease(const std::function<void(LeaderElectionRecord*)>& change) {
    grpc::Status s = Modify(
        shard(), LeaseGvr(), kLeaseCluster, kLeaseNamespace, kLeaseName, [&](v1::Object* lease) {
          absl::StatusOr<LeaderElectionRecord> record = RecordFromSpec(lease->spec());
          ASSERT_TRUE(record.ok()) << record.status();
          change(&*record);
          *lease->mutable_spec() = RecordToSpec(*record);
        });
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // The cache converges with shard "a": in sync, CCR "widgets" Ready with `n` widgets, and its
  // copy current.
  void ExpectConverged(double n) {
    EXPECT_TRUE(WaitForCacheInSync());
    EXPECT_TRUE(WaitForReady("widgets", n));
    EXPECT_TRUE(WaitForCcrCopy("widgets"));
  }

  // Reads of single objects in shard a's store. Only the lease is read that way by a replica:
  // each read is an attempt to take the lease by a replica that does not lead (a leader renews
  // without reading, unless its renewal conflicts). The tests' own Get and Modify calls count
  // too: none is made while AttemptsToTakeTheLease counts.
  double ShardReads() {
    return Metric(shards_.at("a").process->http_port(), "shardcache_grpc_requests_total",
                  {"method=\"Get\""});
  }

  // Waits until the replicas that do not lead have made `n` more attempts to take the lease:
  // `n` retry periods in which they ran, saw what the shard and the cache did, and could have
  // acted on it.
  ::testing::AssertionResult AttemptsToTakeTheLease(int n) {
    const double before = ShardReads();
    return Eventually([&] { return ShardReads() >= before + n; }, kConverge,
                      absl::StrCat(n, " more attempts to take the lease"),
                      [&] { return absl::StrCat(ShardReads() - before, " attempts"); });
  }

  // Writes an object to the cache outside everything the tests watch, and returns its revision:
  // a point in the cache's history that a watch's bookmark passes once the watch has been sent
  // every event before it (WatchReader::NothingMoreUpTo).
  int64_t MarkCache(const std::string& name) {
    v1::CreateRequest req;
    *req.mutable_resource() = Gvr("example.com", "v1", "markers");
    req.mutable_object()->mutable_metadata()->set_name(name);
    v1::Object out;
    EXPECT_TRUE(Ok(cache()->Create(Context().get(), req, &out)));
    return Rv(out);
  }

  // A local change: w1's spec.color.
  void ChangeLocally(const std::string& color) {
    ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, "w1", [&](v1::Object* o) {
                  (*o->mutable_spec()->mutable_fields())["color"].set_string_value(color);
                }).ok());
  }
};

// Another holder takes the lease (as if it had won an election): the replica stops leading and
// writes nothing to the cache while local changes happen; when the lease is handed back, its next
// term converges the cache, changes made in between included.
TEST_F(LeadershipTest, LeaseTakenAwayAndHandedBack) {
  ServerProcess* r = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartLeader(&r));
  double epoch = Metric(r->http_port(), kEpoch);
  EXPECT_GT(epoch, 0);
  double terms = Metric(r->http_port(), kTerms);
  EXPECT_EQ(terms, 1);

  RewriteLease([](LeaderElectionRecord* rec) {
    rec->holder_identity = "intruder";
    rec->leader_transitions += 1;
    rec->acquire_time = absl::Now();
    rec->renew_time = absl::Now();
    rec->lease_duration = absl::Hours(1);
  });
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(WaitForLeading(r, 0, kRenewDeadline + kRetryPeriod + kSlack));
  EXPECT_EQ(Metric(r->http_port(), kEpoch), 0);
  EXPECT_EQ(Metric(r->http_port(), "shardcache_replicator_replication_controllers"), 0);

  // Watch the cache's copies of shard a (widgets and CCRs) from now on.
  v1::WatchRequest req;
  *req.mutable_resource() = WidgetsGvr();
  req.set_shard("a");
  req.set_allow_bookmarks(true);  // NothingMoreUpTo waits for one
  WatchReader widget_watch(cache(), req);
  *req.mutable_resource() = CcrGvr();
  WatchReader ccr_watch(cache(), req);
  ASSERT_TRUE(widget_watch.SkipInitial());
  ASSERT_TRUE(ccr_watch.SkipInitial());
  double writes = Counter(r, kWrites);
  std::optional<v1::Object> ccr_before = GetCcr("widgets");
  ASSERT_TRUE(ccr_before.has_value());

  // Local changes while nobody (that replicates) leads.
  ChangeLocally("while-not-leading");
  ASSERT_TRUE(DeleteIn(shard(), WidgetsGvr(), "", kCluster, kNamespace, "w2").ok());
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w4")).ok());
  // Nothing reaches the cache, and nobody writes the CCR's status, for several retry periods
  // (the replica's attempts to take the lease back), up to a later write to the cache.
  EXPECT_TRUE(AttemptsToTakeTheLease(3));
  const int64_t mark = MarkCache("while-not-leading");
  EXPECT_TRUE(widget_watch.NothingMoreUpTo(mark, kConverge))
      << "the cache changed while the replica did not lead";
  EXPECT_TRUE(ccr_watch.NothingMoreUpTo(mark, kConverge))
      << "the CCR's copy changed while the replica did not lead";
  EXPECT_EQ(Counter(r, kWrites), writes);
  std::optional<v1::Object> ccr_after = GetCcr("widgets");
  ASSERT_TRUE(ccr_after.has_value());
  EXPECT_EQ(ccr_after->metadata().resource_version(), ccr_before->metadata().resource_version())
      << "the CCR was written while the replica did not lead: " << DescribeStatus(*ccr_after);
  EXPECT_EQ(Leading(r), 0);

  // Handed back (released, as a holder that stops does).
  RewriteLease([](LeaderElectionRecord* rec) {
    rec->holder_identity = "";
    rec->lease_duration = absl::Seconds(1);
  });
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(WaitForLeading(r, 1, kRetryPeriod * 2.2 + kSlack));
  EXPECT_GE(Metric(r->http_port(), kEpoch), epoch + 2) << "the intruder's term counts too";
  EXPECT_EQ(Metric(r->http_port(), kTerms), 2);
  ExpectConverged(3);
}

// Two replicas: one leads, the other stands by. Killed with SIGKILL, the leader cannot release its
// lease: the standby takes over once it expires. Stopped with SIGTERM, the leader releases it: the
// standby takes over within a retry period. Either way the new leader converges.
TEST_F(LeadershipTest, StandbyTakesOverFromAKilledOrStoppedLeader) {
  ServerProcess* leader = nullptr;
  ServerProcess* standby = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartLeaderAndStandby(&leader, &standby));
  EXPECT_EQ(Leading(standby), 0);

  // kill -9.
  leader->Signal(SIGKILL);
  absl::Time killed = absl::Now();
  EXPECT_NE(leader->Wait(absl::Seconds(5)), -1);
  ::testing::AssertionResult took_over =
      WaitForLeading(standby, 1, kLeaseDuration + kRetryPeriod * 2.2 + kSlack);
  ASSERT_TRUE(took_over) << "(lease " << kLeaseDuration << ", retry period " << kRetryPeriod << ")";
  std::cerr << "after SIGKILL of the leader, the standby led within " << absl::Now() - killed
            << "\n";
  ChangeLocally("after-kill");
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w4")).ok());
  EXPECT_TRUE(WaitForCacheInSync());
  EXPECT_TRUE(WaitForReady("widgets", 4));

  // A new standby; then SIGTERM to the leader.
  leader = standby;
  standby = StartReplicator("a", "replica-2");
  EXPECT_TRUE(
      Eventually([&] { return absl::StartsWith(HttpGet(standby->http_port(), "/readyz"), "200"); },
                 kConverge, "the new standby is ready"));
  EXPECT_EQ(Leading(standby), 0);
  // The lease's changes from now on: SIGTERM must hand it over by releasing it, not by letting
  // it expire.
  std::optional<v1::Object> lease = GetLease();
  ASSERT_TRUE(lease.has_value());
  v1::WatchRequest lease_req = WatchReq(LeaseGvr(), lease->metadata().resource_version());
  lease_req.set_cluster(kLeaseCluster);
  lease_req.set_namespace_(kLeaseNamespace);
  WatchReader lease_watch(shard(), lease_req);
  leader->Signal(SIGTERM);
  absl::Time terminated = absl::Now();
  ASSERT_TRUE(WaitForLeading(standby, 1, kLeaseDuration + kRetryPeriod * 2.2 + kSlack));
  std::cerr << "after SIGTERM of the leader, the standby led within " << absl::Now() - terminated
            << "\n";
  // The old leader's renewals, then its release (no holder), then the standby's term; a lease
  // that expired would have gone from the old holder straight to the standby.
  bool released = false;
  bool acquired_after_release = false;
  while (std::optional<v1::WatchEvent> e = lease_watch.NextObjectEvent()) {
    auto it = e->object().spec().fields().find("holderIdentity");
    std::string holder = it == e->object().spec().fields().end() ? "" : it->second.string_value();
    if (holder.empty()) released = true;
    if (holder == "replica-2") {
      acquired_after_release = released;
      break;
    }
  }
  EXPECT_TRUE(acquired_after_release)
      << "the standby's term did not follow a release of the lease by the stopped leader";
  int status = leader->Wait(absl::Seconds(15));
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << DescribeWaitStatus(status);
  // A term given up on purpose is logged as news, not as a warning; a lease without spaces in
  // its name is a usable Prometheus label.
  EXPECT_THAT(leader->Log(),
              ContainsRegex(" info shard_replicator: root/[^ ]+: [^ ]+ stopped leading "
                            "\\(epoch [0-9]+\\): the elector is stopping"));
  EXPECT_THAT(leader->Log(), Not(HasSubstr("warning shard_replicator: root/")));
  ChangeLocally("after-term");
  ASSERT_TRUE(DeleteIn(shard(), WidgetsGvr(), "", kCluster, kNamespace, "w2").ok());
  ExpectConverged(3);
}

// A leader paused (SIGSTOP) past its lease: the standby takes over and writes. Resumed, the old
// leader stops leading, the cache keeps the new leader's view, and a write with the old leader's
// epoch is fenced.
TEST_F(LeadershipTest, PausedLeaderIsFencedAfterTakeover) {
  ServerProcess* old_leader = nullptr;
  ServerProcess* new_leader = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartLeaderAndStandby(&old_leader, &new_leader));
  double old_epoch = Metric(old_leader->http_port(), kEpoch);
  ASSERT_GT(old_epoch, 0);

  ASSERT_TRUE(old_leader->Pause());
  ASSERT_TRUE(WaitForLeading(new_leader, 1, kLeaseDuration + kRetryPeriod * 2.2 + kSlack));
  double new_epoch = Metric(new_leader->http_port(), kEpoch);
  EXPECT_GT(new_epoch, old_epoch);
  // The new leader writes.
  ChangeLocally("new-leader");
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w4")).ok());
  ASSERT_TRUE(WaitForCacheInSync());
  ASSERT_TRUE(WaitForReady("widgets", 4));
  // And a change the old leader will see when it resumes.
  ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, "w3", [](v1::Object* o) {
                (*o->mutable_spec()->mutable_fields())["size"].set_number_value(33);
              }).ok());

  old_leader->Signal(SIGCONT);
  EXPECT_TRUE(WaitForLeading(old_leader, 0, kRenewDeadline + kRetryPeriod * 2.2 + kSlack));
  EXPECT_EQ(Leading(new_leader), 1);
  EXPECT_TRUE(WaitForCacheInSync());
  // For a few retry periods (the old leader's attempts to take the lease back), the cache keeps
  // the new leader's view, and the leadership stays.
  EXPECT_TRUE(AttemptsToTakeTheLease(3));
  std::string diff = CacheDiff("a", "", WidgetsGvr(), kCluster);
  ASSERT_EQ(diff, "") << "the cache left the new leader's view";
  ASSERT_EQ(Leading(old_leader), 0);
  ASSERT_EQ(Leading(new_leader), 1);
  EXPECT_TRUE(WaitForReady("widgets", 4));
  EXPECT_TRUE(WaitForCcrCopy("widgets"));

  // A write carrying the old leader's epoch is fenced: an upsert of a copy, and a delete.
  v1::Fence fence;
  fence.set_shard("a");
  fence.set_epoch(static_cast<int64_t>(old_epoch));
  std::optional<v1::Object> copy = GetFrom(cache(), WidgetsGvr(), "a", kCluster, kNamespace, "w1");
  ASSERT_TRUE(copy.has_value());
  v1::UpdateRequest update;
  *update.mutable_resource() = WidgetsGvr();
  *update.mutable_object() = *copy;
  (*update.mutable_object()->mutable_spec()->mutable_fields())["color"].set_string_value("stale");
  *update.mutable_fence() = fence;
  v1::Object out;
  grpc::Status s = cache()->Update(Context().get(), update, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), StartsWith("fenced:"));
  v1::DeleteRequest del;
  *del.mutable_resource() = WidgetsGvr();
  del.set_shard("a");
  del.set_cluster(kCluster);
  del.set_namespace_(kNamespace);
  del.set_name("w1");
  *del.mutable_fence() = fence;
  v1::DeleteResponse deleted;
  s = cache()->Delete(Context().get(), del, &deleted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), StartsWith("fenced:"));
  // The new leader's epoch is still good (claiming it again is allowed).
  v1::ClaimEpochRequest claim;
  claim.mutable_fence()->set_shard("a");
  claim.mutable_fence()->set_epoch(static_cast<int64_t>(new_epoch));
  v1::ClaimEpochResponse claimed;
  s = cache()->ClaimEpoch(Context().get(), claim, &claimed);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(claimed.epoch(), static_cast<int64_t>(new_epoch));
  EXPECT_TRUE(WaitForCacheInSync());
}

// The same takeover, with a real stale write: the leader's write to the cache is held in flight
// (a relay in front of the cache holds what it sends) while the leader is paused and the standby
// takes over and writes the same object. The held write then reaches the cache carrying the old
// epoch: the cache answers it "fenced" and does not apply it; resumed, the old leader stops
// leading and the cache keeps the new leader's view.
TEST_F(LeadershipTest, StaleWriteOfAPausedLeaderIsFenced) {
  // The relay recognizes the held write by its bytes, which TLS hides; the other fencing tests
  // run with TLS too.
  if (security_) GTEST_SKIP() << "finds the held write in plaintext bytes";
  ASSERT_NO_FATAL_FAILURE(StartStores());
  absl::StatusOr<std::unique_ptr<TcpRelay>> relay =
      TcpRelay::Start("127.0.0.1", cache_.process->grpc_port());
  ASSERT_TRUE(relay.ok()) << relay.status();
  TcpRelay& r = **relay;
  // replica-0 (A) reaches the cache through the relay, and leads; replica-1 (B) reaches it
  // directly, and stands by.
  ServerProcess* a = StartReplicator("a", "replica-0", {}, r.address());
  ASSERT_TRUE(WaitForLeading(a, 1, absl::Seconds(15)));
  ServerProcess* b = StartReplicator("a", "replica-1");
  ASSERT_TRUE(
      Eventually([&] { return absl::StartsWith(HttpGet(b->http_port(), "/readyz"), "200"); },
                 kConverge, "the standby is ready"));
  ASSERT_NO_FATAL_FAILURE(ReplicateWidgets());
  EXPECT_GT(r.connections_accepted(), 0);
  ASSERT_EQ(Leading(b), 0);
  double old_epoch = Metric(a->http_port(), kEpoch);
  ASSERT_GT(old_epoch, 0);

  // Markers that appear verbatim in the writes' bytes (a Struct's string values are not encoded).
  const std::string era_a = "A-stale-write";
  const std::string era_b = "B-after-takeover";
  auto era_of = [](const v1::Object& o) {
    auto it = o.spec().fields().find("era");
    return it == o.spec().fields().end() ? std::string() : it->second.string_value();
  };
  auto set_era = [&](const std::string& era) {
    ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, "w1", [&](v1::Object* o) {
                  (*o->mutable_spec()->mutable_fields())["era"].set_string_value(era);
                }).ok());
  };
  auto cache_w1 = [&] { return GetFrom(cache(), WidgetsGvr(), "a", kCluster, kNamespace, "w1"); };

  // A's upsert of w1 is sent, and held in the relay; then A is paused with it in flight.
  r.Hold();
  ASSERT_NO_FATAL_FAILURE(set_era(era_a));
  ASSERT_TRUE(Eventually([&] { return r.HeldContains(era_a); }, absl::Seconds(10),
                         "the leader's upsert of w1 is held in the relay",
                         [&] { return absl::StrCat(r.held_bytes(), " bytes held"); }));
  ASSERT_TRUE(a->Pause());
  std::optional<v1::Object> copy = cache_w1();
  ASSERT_TRUE(copy.has_value());
  ASSERT_EQ(era_of(*copy), "") << "the held write reached the cache: " << ToJson(*copy);

  // B takes over (claiming a higher epoch at the cache before it writes) and writes w1.
  ASSERT_TRUE(WaitForLeading(b, 1, kLeaseDuration + kRetryPeriod * 2.2 + kSlack));
  double new_epoch = Metric(b->http_port(), kEpoch);
  EXPECT_GT(new_epoch, old_epoch);
  ASSERT_NO_FATAL_FAILURE(set_era(era_b));
  ASSERT_TRUE(Eventually(
      [&] {
        copy = cache_w1();
        return copy.has_value() && era_of(*copy) == era_b;
      },
      kConverge, "the new leader's write of w1 reaches the cache",
      [&] { return copy.has_value() ? ToJson(*copy) : std::string("no copy"); }));
  const std::string b_rv = copy->metadata().resource_version();

  // Every change to the cache's widgets of shard a after B's write.
  v1::WatchRequest watch_req = WatchReq(WidgetsGvr(), b_rv);
  watch_req.set_shard("a");
  watch_req.set_cluster(kCluster);
  WatchReader watch(cache(), watch_req);

  // The held write reaches the cache now, with A's old epoch (A is still paused: nothing it does
  // once resumed can cancel it). What the cache answers is recorded on its way back to A.
  r.RecordServerToClient();
  r.Release();
  EXPECT_TRUE(Eventually([&] { return r.held_bytes() == 0; }, absl::Seconds(2),
                         "the held bytes are flushed to the cache",
                         [&] { return absl::StrCat(r.held_bytes(), " bytes held"); }));
  // The cache rejected it: its answer is a fenced error naming A's epoch. (A's own
  // shardcache_replicator_fenced_total may or may not count it: once resumed, A's watchdog may end
  // its term, cancelling the stream, before A reads the answer. So that is not required.)
  const std::string carries = absl::StrCat("carries epoch ", static_cast<int64_t>(old_epoch));
  EXPECT_TRUE(Eventually(
      [&] { return r.RecordedContains("fenced: shard \"a\"") && r.RecordedContains(carries); },
      absl::Seconds(5), "the cache answers the held write: fenced, " + carries));
  // And did not apply it: no change to the widgets after B's write up to a later write to the
  // cache, and w1 is B's.
  EXPECT_TRUE(watch.NothingMoreUpTo(MarkCache("after-the-stale-write"), kConverge))
      << "the stale write changed the cache";
  copy = cache_w1();
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(era_of(*copy), era_b) << ToJson(*copy);
  EXPECT_EQ(copy->metadata().resource_version(), b_rv) << ToJson(*copy);

  // A resumes: it stops leading, B keeps the lead, and the cache keeps B's view.
  a->Signal(SIGCONT);
  EXPECT_TRUE(WaitForLeading(a, 0, kRenewDeadline + kRetryPeriod * 2.2 + kSlack));
  std::cerr << "the old leader: fenced_total " << Counter(a, kFenced)
            << ", write_errors_total{FAILED_PRECONDITION} "
            << Metric(a->http_port(), "shardcache_replicator_write_errors_total",
                      {"code=\"FAILED_PRECONDITION\""})
            << "\n";
  // For a few retry periods (A's attempts to take the lease back), and up to a later write to
  // the cache.
  EXPECT_TRUE(AttemptsToTakeTheLease(3));
  ASSERT_EQ(Leading(a), 0);
  ASSERT_EQ(Leading(b), 1);
  EXPECT_TRUE(watch.NothingMoreUpTo(MarkCache("after-the-takeover"), kConverge))
      << "the cache changed after the takeover";
  copy = cache_w1();
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->metadata().resource_version(), b_rv) << ToJson(*copy);
  EXPECT_TRUE(WaitForCacheInSync());
  EXPECT_TRUE(WaitForReady("widgets", 3));

  // A stops (exit 0 on SIGTERM) while the relay it reaches the cache through still runs.
  int status = a->Stop();
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << DescribeWaitStatus(status);
}

// A higher epoch claimed at the cache for the shard while a replica leads: its next write is
// fenced, it counts it, and its term ends; the change it could not write never reaches the cache.
TEST_F(LeadershipTest, HigherEpochClaimedAtTheCacheFencesTheLeader) {
  ServerProcess* r = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartLeader(&r));
  double epoch = Metric(r->http_port(), kEpoch);
  ASSERT_GT(epoch, 0);
  double fenced = Counter(r, kFenced);
  EXPECT_EQ(fenced, 0);
  std::optional<v1::Object> w1_copy =
      GetFrom(cache(), WidgetsGvr(), "a", kCluster, kNamespace, "w1");
  ASSERT_TRUE(w1_copy.has_value());
  size_t stopped = Occurrences(r->Log(), "stopped leading");

  v1::ClaimEpochRequest claim;
  claim.mutable_fence()->set_shard("a");
  claim.mutable_fence()->set_epoch(static_cast<int64_t>(epoch) + 100);
  v1::ClaimEpochResponse claimed;
  grpc::Status s = cache()->ClaimEpoch(Context().get(), claim, &claimed);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(claimed.epoch(), static_cast<int64_t>(epoch) + 100);

  ChangeLocally("fenced-out");
  EXPECT_TRUE(Eventually([&] { return Counter(r, kFenced) > fenced; }, absl::Seconds(10),
                         "shardcache_replicator_fenced_total rises",
                         [&] { return absl::StrCat(Counter(r, kFenced)); }));
  EXPECT_TRUE(Eventually([&] { return Occurrences(r->Log(), "stopped leading") > stopped; },
                         absl::Seconds(10), "the log says the term ended"));
  EXPECT_THAT(r->Log(), HasSubstr("fenced"));

  // The change never reached the cache (a new term, if any, is fenced as well: its epoch is far
  // below the claimed one), after several attempts of the replica to lead again.
  EXPECT_TRUE(AttemptsToTakeTheLease(3));
  std::optional<v1::Object> now = GetFrom(cache(), WidgetsGvr(), "a", kCluster, kNamespace, "w1");
  ASSERT_TRUE(now.has_value());
  ASSERT_EQ(now->metadata().resource_version(), w1_copy->metadata().resource_version())
      << "a fenced replica changed the cache: " << ToJson(*now);
  EXPECT_TRUE(r->Running());
  EXPECT_TRUE(absl::StartsWith(HttpGet(r->http_port(), "/healthz"), "200"));
}

}  // namespace
}  // namespace shardcache::testing
