// LeaseLock and LeaderElector against a real cache_server (shard role), in real time.
//
// Three electors with distinct identities compete for one lease with small timings (lease 2 s,
// renew deadline 1.5 s, retry 0.3 s). Every term is recorded from the callbacks on a monotonic
// clock; after each test all electors are stopped and the terms must not overlap, with epochs
// rising from term to term. Waits poll with deadlines; nothing sleeps to synchronize.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/client/leader_elector.h"
#include "common/client/lease_lock.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::StatusIs;
using Steady = std::chrono::steady_clock;

constexpr absl::Duration kLease = absl::Seconds(2);
constexpr absl::Duration kRenew = absl::Milliseconds(1500);
constexpr absl::Duration kRetry = absl::Milliseconds(300);
constexpr absl::Duration kCallTimeout = absl::Milliseconds(500);
// Allowance for scheduling and RPC latency (a Get and an Update with fsync) on a busy two-core
// machine. A release is still seen well within the lease (kRetry + kSlack < kLease).
constexpr absl::Duration kSlack = absl::Seconds(1);

absl::Duration Since(Steady::time_point from, Steady::time_point to) {
  return absl::FromChrono(to - from);
}

// A lock that can be cut off from the store: every call fails while broken, as if the replica
// were partitioned away. A broken leader stops renewing without releasing.
class SeverableLock : public ResourceLock {
 public:
  explicit SeverableLock(std::shared_ptr<ResourceLock> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<ObservedRecord> Get() override {
    if (severed_) return Severed();
    return inner_->Get();
  }
  absl::StatusOr<std::string> Create(const LeaderElectionRecord& r) override {
    if (severed_) return Severed();
    return inner_->Create(r);
  }
  absl::StatusOr<std::string> Update(const LeaderElectionRecord& r) override {
    if (severed_) return Severed();
    return inner_->Update(r);
  }
  std::string Describe() const override { return inner_->Describe(); }
  std::string Identity() const override { return inner_->Identity(); }
  void Sever(bool severed) { severed_ = severed; }

 private:
  static absl::Status Severed() { return absl::UnavailableError("severed by the test"); }
  const std::shared_ptr<ResourceLock> inner_;
  std::atomic<bool> severed_{false};
};

// Every term of every elector, from the callbacks, on the monotonic clock.
class TermLog {
 public:
  struct Term {
    std::string identity;
    int64_t epoch = 0;
    Steady::time_point start;
    std::optional<Steady::time_point> end;
  };

  void Started(const std::string& identity, int64_t epoch) {
    absl::MutexLock l(&mu_);
    terms_.push_back(Term{identity, epoch, Steady::now(), std::nullopt});
  }
  void Stopped(const std::string& identity) {
    absl::MutexLock l(&mu_);
    for (auto it = terms_.rbegin(); it != terms_.rend(); ++it) {
      if (it->identity == identity && !it->end.has_value()) {
        it->end = Steady::now();
        return;
      }
    }
    ADD_FAILURE() << identity << ": on_stopped_leading without a term";
  }
  std::vector<Term> Terms() const {
    absl::MutexLock l(&mu_);
    return terms_;
  }
  // The term that has not ended, if there is one.
  std::optional<Term> Open() const {
    absl::MutexLock l(&mu_);
    for (const Term& t : terms_) {
      if (!t.end.has_value()) return t;
    }
    return std::nullopt;
  }
  // The term started after the first `n`, if any.
  std::optional<Term> After(size_t n) const {
    absl::MutexLock l(&mu_);
    if (terms_.size() <= n) return std::nullopt;
    return terms_[n];
  }
  size_t Size() const {
    absl::MutexLock l(&mu_);
    return terms_.size();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Term> terms_ ABSL_GUARDED_BY(mu_);
};

class LeaderElectionProcessTest : public ::testing::Test {
 protected:
  struct Candidate {
    std::string identity;
    std::shared_ptr<SeverableLock> lock;
    std::unique_ptr<LeaderElector> elector;
  };

  void SetUp() override {
    server_ = std::make_unique<testing::ServerProcess>(
        testing::BinaryPath("cache_server/cache_server"), std::vector<std::string>{"--role=shard"});
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Store::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Signal(SIGCONT);
    for (auto& c : candidates_) c->elector.reset();  // Stop: ends terms, releases
    CheckTerms();
  }

  // Terms never overlap, and each has a higher epoch than the one before.
  void CheckTerms() {
    std::vector<TermLog::Term> terms = log_.Terms();
    for (size_t i = 0; i < terms.size(); ++i) {
      SCOPED_TRACE(
          absl::StrCat("term ", i, " (", terms[i].identity, ", epoch ", terms[i].epoch, ")"));
      ASSERT_TRUE(terms[i].end.has_value()) << "a term that never ended";
      if (i == 0) continue;
      EXPECT_LE(*terms[i - 1].end, terms[i].start)
          << "two leaders at once: " << terms[i - 1].identity << " until "
          << Since(terms[i].start, *terms[i - 1].end) << " after " << terms[i].identity
          << " started";
      EXPECT_GT(terms[i].epoch, terms[i - 1].epoch);
    }
  }

  std::shared_ptr<LeaseLock> NewLeaseLock(const std::string& identity) {
    return std::make_shared<LeaseLock>(
        stub_, LeaseLock::Options{"root", "kube-system", "shard-a", identity, kCallTimeout});
  }

  Candidate* AddCandidate(const std::string& identity, bool release_on_cancel = true) {
    auto c = std::make_unique<Candidate>();
    c->identity = identity;
    c->lock = std::make_shared<SeverableLock>(NewLeaseLock(identity));
    LeaderElector::Config config;
    config.lock = c->lock;
    config.lease_duration = kLease;
    config.renew_deadline = kRenew;
    config.retry_period = kRetry;
    config.release_on_cancel = release_on_cancel;
    config.callbacks.on_started_leading = [this, identity](LeadingContext ctx) {
      log_.Started(identity, ctx.epoch);
    };
    config.callbacks.on_stopped_leading = [this, identity] { log_.Stopped(identity); };
    absl::StatusOr<std::unique_ptr<LeaderElector>> e = LeaderElector::Create(std::move(config));
    EXPECT_THAT(e, IsOk());
    c->elector = *std::move(e);
    c->elector->Run();
    candidates_.push_back(std::move(c));
    return candidates_.back().get();
  }

  void AddThree() {
    for (const char* id : {"replica-0", "replica-1", "replica-2"}) AddCandidate(id);
  }

  Candidate* Find(const std::string& identity) {
    for (auto& c : candidates_) {
      if (c->identity == identity) return c.get();
    }
    return nullptr;
  }

  // Waits for a term to be open and returns it.
  std::optional<TermLog::Term> WaitForLeader(absl::Duration timeout) {
    std::optional<TermLog::Term> t;
    EXPECT_TRUE(Eventually([&] { return (t = log_.Open()).has_value(); }, timeout, "a leader"));
    return t;
  }

  std::unique_ptr<testing::ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::Store::StubInterface> stub_;
  TermLog log_;
  std::vector<std::unique_ptr<Candidate>> candidates_;
};

TEST_F(LeaderElectionProcessTest, LeaseLock_OptimisticConcurrencyAgainstTheStore) {
  std::shared_ptr<LeaseLock> a = NewLeaseLock("a");
  std::shared_ptr<LeaseLock> b = NewLeaseLock("b");
  EXPECT_THAT(a->Get(), StatusIs(absl::StatusCode::kNotFound));
  LeaderElectionRecord r;
  r.holder_identity = "a";
  r.lease_duration = absl::Seconds(15);
  r.acquire_time = absl::FromUnixMicros(absl::ToUnixMicros(absl::Now()));
  r.renew_time = r.acquire_time;
  r.leader_transitions = 1;
  EXPECT_THAT(a->Update(r), StatusIs(absl::StatusCode::kFailedPrecondition));
  absl::StatusOr<std::string> v1 = a->Create(r);
  ASSERT_THAT(v1, IsOk());
  EXPECT_THAT(b->Create(r), StatusIs(absl::StatusCode::kAlreadyExists));

  absl::StatusOr<ObservedRecord> got = b->Get();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->record, r);
  EXPECT_EQ(got->resource_version, *v1);

  // The stored object is plain JSON as a grpcurl user sees it.
  v1::GetRequest req;
  *req.mutable_resource() = LeaseLock::Resource();
  req.set_cluster("root");
  req.set_namespace_("kube-system");
  req.set_name("shard-a");
  v1::Object object;
  ASSERT_TRUE(stub_->Get(testing::Context().get(), req, &object).ok());
  EXPECT_EQ(object.spec().fields().at("holderIdentity").string_value(), "a");
  EXPECT_EQ(object.spec().fields().at("leaseDurationSeconds").number_value(), 15);
  EXPECT_EQ(object.spec().fields().at("renewTime").string_value(), FormatMicroTime(r.renew_time));
  EXPECT_EQ(object.spec().fields().at("leaseTransitions").number_value(), 1);

  r.renew_time += absl::Seconds(2);
  absl::StatusOr<std::string> v2 = a->Update(r);
  ASSERT_THAT(v2, IsOk());
  EXPECT_NE(*v2, *v1);
  r.holder_identity = "b";
  EXPECT_THAT(b->Update(r), StatusIs(absl::StatusCode::kAborted)) << "b read version " << *v1;
  ASSERT_THAT(b->Get(), IsOk());
  EXPECT_THAT(b->Update(r), IsOk());
}

TEST_F(LeaderElectionProcessTest, ThreeElectors_NeverTwoLeadersAtOnce_AcrossTakeovers) {
  AddThree();
  // Three takeovers: each time the leader is cut off from the store (no release).
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    std::optional<TermLog::Term> leader = WaitForLeader(absl::Seconds(10));
    ASSERT_TRUE(leader.has_value());
    int leaders = 0;
    for (auto& c : candidates_) leaders += c->elector->IsLeader() ? 1 : 0;
    EXPECT_EQ(leaders, 1);
    size_t before = log_.Size();
    Candidate* cut = Find(leader->identity);
    cut->lock->Sever(true);
    ASSERT_TRUE(Eventually([&] { return log_.After(before).has_value(); }, absl::Seconds(10),
                           "a new term"));
    cut->lock->Sever(false);
  }
  EXPECT_GE(log_.Size(), 4u);
}

TEST_F(LeaderElectionProcessTest, Takeover_AfterLeaderStopsRenewing) {
  AddThree();
  std::optional<TermLog::Term> leader = WaitForLeader(absl::Seconds(10));
  ASSERT_TRUE(leader.has_value());
  size_t before = log_.Size();
  Steady::time_point severed = Steady::now();
  Find(leader->identity)->lock->Sever(true);

  std::optional<TermLog::Term> next;
  ASSERT_TRUE(Eventually([&] { return (next = log_.After(before)).has_value(); }, absl::Seconds(10),
                         "a new leader"));
  EXPECT_NE(next->identity, leader->identity);
  EXPECT_GT(next->epoch, leader->epoch);
  TermLog::Term old = log_.Terms()[before - 1];
  ASSERT_TRUE(old.end.has_value());
  // The old leader stopped by its renew deadline (its last renewal started before `severed`)...
  EXPECT_LE(Since(severed, *old.end), kRenew + kSlack);
  // ...before the lease expired for the others, who then took over within a retry period or so.
  EXPECT_LE(*old.end, next->start);
  absl::Duration takeover = Since(severed, next->start);
  EXPECT_LE(takeover, kLease + kRetry + kSlack) << takeover;
  std::cout << "leader stopped " << Since(severed, *old.end) << " and " << next->identity
            << " took over " << takeover << " after the leader was cut off\n";
}

TEST_F(LeaderElectionProcessTest, Takeover_WithinOneRetryPeriod_AfterGracefulRelease) {
  AddThree();
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    std::optional<TermLog::Term> leader = WaitForLeader(absl::Seconds(10));
    ASSERT_TRUE(leader.has_value());
    size_t before = log_.Size();
    Candidate* c = Find(leader->identity);
    c->elector->Stop();  // ends the term, then releases the lease
    Steady::time_point released = Steady::now();
    std::optional<TermLog::Term> next;
    ASSERT_TRUE(Eventually([&] { return (next = log_.After(before)).has_value(); },
                           absl::Seconds(5), "a new leader"));
    absl::Duration takeover = Since(released, next->start);
    // Without the release this would take at least the lease duration (2 s).
    EXPECT_LE(takeover, kRetry + kSlack) << takeover;
    std::cout << next->identity << " took over " << takeover << " after the release\n";
    EXPECT_NE(next->identity, leader->identity);
  }
}

TEST_F(LeaderElectionProcessTest, LeaderThatLosesTheStore_StopsByItsRenewDeadline) {
  AddThree();
  std::optional<TermLog::Term> leader = WaitForLeader(absl::Seconds(10));
  ASSERT_TRUE(leader.has_value());
  Candidate* c = Find(leader->identity);
  // Wait until it has renewed at least once.
  std::shared_ptr<LeaseLock> observer = NewLeaseLock("observer");
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<ObservedRecord> r = observer->Get();
        return r.ok() && r->record.renew_time > r->record.acquire_time;
      },
      absl::Seconds(5), "a renewal"));
  ASSERT_TRUE(c->elector->IsLeader());
  size_t before = log_.Size();

  Steady::time_point frozen = Steady::now();
  server_->Signal(SIGSTOP);  // the store stops answering; calls time out
  // IsLeader() turns false first, then on_stopped_leading records the term's end: wait for both.
  ASSERT_TRUE(Eventually(
      [&] { return !c->elector->IsLeader() && log_.Terms()[before - 1].end.has_value(); },
      absl::Seconds(5), "the leader to stop leading"));
  TermLog::Term old = log_.Terms()[before - 1];
  ASSERT_TRUE(old.end.has_value());
  absl::Duration stopped_after = Since(frozen, *old.end);
  // By its renew deadline, and before its lease (kLease) could have expired for the others.
  EXPECT_LE(stopped_after, kRenew + absl::Milliseconds(400)) << stopped_after;
  EXPECT_GE(stopped_after, kRenew - kRetry - kCallTimeout) << stopped_after;
  EXPECT_EQ(log_.Size(), before) << "nobody can acquire from a frozen store";
  std::cout << "the leader stopped leading " << stopped_after << " after the store froze\n";

  server_->Signal(SIGCONT);
  std::optional<TermLog::Term> next;
  ASSERT_TRUE(Eventually([&] { return (next = log_.After(before)).has_value(); }, absl::Seconds(10),
                         "a leader after the store is back"));
  EXPECT_GT(next->epoch, leader->epoch);
}

}  // namespace
}  // namespace shardcache
