// Unit tests of LeaderElector (running, over an in-memory lock, on a FakeClock per replica that the
// test advances), of the lease record's JSON form, and of CancellationToken.
// leader_election_process_test.cc runs electors against a real cache_server.
#include "common/client/leader_elector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/client/lease_lock.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"
#include "prometheus/registry.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---- A fake lock: one in-memory lease object shared by several FakeLocks ----

// The "store": one lease object with a resourceVersion that every write raises.
struct FakeLeaseStore {
  absl::Mutex mu;
  bool exists ABSL_GUARDED_BY(mu) = false;
  LeaderElectionRecord record ABSL_GUARDED_BY(mu);
  int64_t version ABSL_GUARDED_BY(mu) = 0;
  int64_t revision ABSL_GUARDED_BY(mu) = 0;  // raised by every write, never reused

  // Writes the record as someone else would (another process, a person).
  void Put(const LeaderElectionRecord& r) {
    absl::MutexLock l(&mu);
    exists = true;
    record = r;
    version = ++revision;
  }
  void Delete() {
    absl::MutexLock l(&mu);
    exists = false;
  }
  std::optional<LeaderElectionRecord> Read() {
    absl::MutexLock l(&mu);
    if (!exists) return std::nullopt;
    return record;
  }
};

// Semantics as LeaseLock's: Update is conditional on the version last read or written. Can be
// made to fail (UNAVAILABLE) or to hang until released.
class FakeLock : public ResourceLock {
 public:
  FakeLock(std::shared_ptr<FakeLeaseStore> store, std::string identity)
      : store_(std::move(store)), identity_(std::move(identity)) {}
  ~FakeLock() override { Unhang(); }

  absl::StatusOr<ObservedRecord> Get() override {
    RETURN_IF_ERROR(Enter());
    absl::MutexLock l(&store_->mu);
    if (!store_->exists) return absl::NotFoundError("lease not found");
    last_version_ = store_->version;
    return ObservedRecord{store_->record, absl::StrCat(store_->version)};
  }
  absl::StatusOr<std::string> Create(const LeaderElectionRecord& r) override {
    RETURN_IF_ERROR(Enter());
    if (failing_writes_) return absl::UnavailableError("injected write failure");
    absl::MutexLock l(&store_->mu);
    if (store_->exists) return absl::AlreadyExistsError("lease exists");
    store_->exists = true;
    store_->record = r;
    store_->version = last_version_ = ++store_->revision;
    return absl::StrCat(store_->version);
  }
  absl::StatusOr<std::string> Update(const LeaderElectionRecord& r) override {
    RETURN_IF_ERROR(Enter());
    if (failing_writes_) return absl::UnavailableError("injected write failure");
    absl::MutexLock l(&store_->mu);
    if (last_version_ == 0) return absl::FailedPreconditionError("not read yet");
    if (!store_->exists) return absl::NotFoundError("lease not found");
    if (store_->version != last_version_) return absl::AbortedError("conflict");
    store_->record = r;
    store_->version = last_version_ = ++store_->revision;
    return absl::StrCat(store_->version);
  }
  std::string Describe() const override { return "leases fake"; }
  std::string Identity() const override { return identity_; }

  // All calls fail.
  void SetFailing(bool failing) { failing_ = failing; }
  // Create and Update fail.
  void SetFailingWrites(bool failing) { failing_writes_ = failing; }
  // Calls block from now until Unhang (at most 10 s).
  void Hang() {
    absl::MutexLock l(&mu_);
    hanging_ = true;
  }
  void Unhang() {
    absl::MutexLock l(&mu_);
    hanging_ = false;
  }
  int calls() const { return calls_; }

 private:
  absl::Status Enter() {
    ++calls_;
    {
      absl::MutexLock l(&mu_);
      // Bounded, so that a failing test cannot hang in the elector's Stop.
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](bool* h) { return !*h; }, &hanging_),
                           absl::Seconds(10));
    }
    if (failing_) return absl::UnavailableError("injected failure");
    return absl::OkStatus();
  }

  const std::shared_ptr<FakeLeaseStore> store_;
  const std::string identity_;
  std::atomic<bool> failing_{false};
  std::atomic<bool> failing_writes_{false};
  std::atomic<int> calls_{0};
  absl::Mutex mu_;
  bool hanging_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_version_ = 0;  // used by one elector thread at a time
};

LeaderElectionRecord Held(const std::string& holder, int64_t transitions, absl::Time renewed) {
  LeaderElectionRecord r;
  r.holder_identity = holder;
  r.lease_duration = absl::Seconds(15);
  r.acquire_time = renewed;
  r.renew_time = renewed;
  r.leader_transitions = transitions;
  return r;
}

// ---- Fixture: replicas on one FakeClock, stepped by hand ----

// The start of every replica's clock.
const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

// One elector, its own clock (no replica trusts another's), and what its callbacks saw. The
// callbacks run on the elector's threads (or on the thread that calls Stop) and write under `mu`;
// the test reads once the elector waits on its clock again (StepAt), or under `mu`.
struct Replica {
  std::shared_ptr<FakeLock> lock;
  FakeClock clock{kStart};
  mutable absl::Mutex mu;
  std::vector<int64_t> started;  // epochs, in order
  std::vector<absl::Time> start_times;
  std::vector<absl::Time> stop_times;
  std::vector<std::string> new_leaders;
  std::optional<CancellationToken> token;  // the latest term's
  bool token_cancelled_at_stop = false;
  std::optional<LeaderElectionRecord> record_at_stop;  // the store's record when stopping
  bool running = false;                                // Run() was called
  // Last: destroyed first, while what its callbacks write to still exists.
  std::unique_ptr<LeaderElector> elector;

  int stopped() const {
    absl::MutexLock l(&mu);
    return static_cast<int>(stop_times.size());
  }
};

class LeaderElectorTest : public ::testing::Test {
 protected:
  static absl::Time At(double seconds) { return kStart + absl::Seconds(seconds); }

  // A retry period of 1 ms: each time the test moves a replica's clock (by 1 ms or more), the
  // replica makes exactly one attempt, at that time, as the test's timeline says.
  LeaderElector::Config BaseConfig(Replica* r) {
    LeaderElector::Config c;
    c.lock = r->lock;
    c.clock = &r->clock;
    c.retry_period = absl::Milliseconds(1);
    c.callbacks.on_started_leading = [r](LeadingContext ctx) {
      absl::MutexLock l(&r->mu);
      r->started.push_back(ctx.epoch);
      r->start_times.push_back(r->clock.Now());
      r->token = ctx.cancellation;
    };
    c.callbacks.on_stopped_leading = [this, r] {
      absl::MutexLock l(&r->mu);
      r->stop_times.push_back(r->clock.Now());
      r->token_cancelled_at_stop = r->token.has_value() && r->token->Cancelled();
      r->record_at_stop = store_->Read();
    };
    c.callbacks.on_new_leader = [r](const std::string& id) {
      absl::MutexLock l(&r->mu);
      r->new_leaders.push_back(id);
    };
    return c;
  }

  // A replica with client-go's lease duration and renew deadline (15 s / 10 s), unless `tweak`
  // changes them. Not running until its first StepAt.
  std::unique_ptr<Replica> MakeReplica(
      const std::string& identity,
      const std::function<void(LeaderElector::Config*)>& tweak = nullptr) {
    auto r = std::make_unique<Replica>();
    r->lock = std::make_shared<FakeLock>(store_, identity);
    LeaderElector::Config c = BaseConfig(r.get());
    if (tweak) tweak(&c);
    absl::StatusOr<std::unique_ptr<LeaderElector>> e = LeaderElector::Create(std::move(c));
    EXPECT_THAT(e, IsOk());
    if (e.ok()) r->elector = *std::move(e);
    return r;
  }

  // Moves `r`'s clock to `t` (at least 1 ms after its last attempt), or starts it there, and
  // returns once its loop has made its attempt and its two threads wait on the clock again
  // (the watchdog too, if the renew deadline was reached).
  static void StepAt(Replica* r, double t) {
    r->clock.Set(At(t));
    if (!r->running) {
      r->running = true;
      r->elector->Run();
    }
    ASSERT_TRUE(r->clock.AwaitWaiters(2)) << "the elector waits on its clock again";
  }

  // Steps each of `rs`, in order, at every multiple of `period` after `from` up to and including
  // `to`.
  static void StepEvery(const std::vector<Replica*>& rs, double from, double to, double period) {
    for (double t = from; t <= to + 1e-9; t += period) {
      for (Replica* r : rs) StepAt(r, t);
    }
  }

  std::shared_ptr<FakeLeaseStore> store_ = std::make_shared<FakeLeaseStore>();
};

// ---- Config ----

TEST_F(LeaderElectorTest, Config_DefaultsAreClientGos) {
  LeaderElector::Config c;
  EXPECT_EQ(c.lease_duration, absl::Seconds(15));
  EXPECT_EQ(c.renew_deadline, absl::Seconds(10));
  EXPECT_EQ(c.retry_period, absl::Seconds(2));
  EXPECT_TRUE(c.release_on_cancel);
}

TEST_F(LeaderElectorTest, Create_ValidatesConfigAsClientGo) {
  struct Case {
    std::string name;
    std::function<void(LeaderElector::Config*)> mutate;
    std::string error;  // empty: valid
  };
  const std::vector<Case> cases = {
      {"Defaults", [](LeaderElector::Config*) {}, ""},
      {"SmallButValid",
       [](LeaderElector::Config* c) {
         c->lease_duration = absl::Seconds(2);
         c->renew_deadline = absl::Milliseconds(1500);
         c->retry_period = absl::Milliseconds(300);
       },
       ""},
      {"LeaseEqualsRenew", [](LeaderElector::Config* c) { c->lease_duration = absl::Seconds(10); },
       "lease_duration must be greater than renew_deadline"},
      {"LeaseBelowRenew", [](LeaderElector::Config* c) { c->lease_duration = absl::Seconds(5); },
       "lease_duration must be greater than renew_deadline"},
      {"RenewAtJitteredRetry",
       [](LeaderElector::Config* c) { c->retry_period = absl::Milliseconds(10000 / 1.2); },
       "renew_deadline must be greater than retry_period*1.2"},
      {"RenewBelowRetry", [](LeaderElector::Config* c) { c->retry_period = absl::Seconds(11); },
       "renew_deadline must be greater than retry_period*1.2"},
      {"ZeroLease", [](LeaderElector::Config* c) { c->lease_duration = absl::ZeroDuration(); },
       "lease_duration must be greater than zero"},
      {"NegativeRenew", [](LeaderElector::Config* c) { c->renew_deadline = -absl::Seconds(1); },
       "renew_deadline must be greater than zero"},
      {"ZeroRetry", [](LeaderElector::Config* c) { c->retry_period = absl::ZeroDuration(); },
       "retry_period must be greater than zero"},
      {"NullLock", [](LeaderElector::Config* c) { c->lock = nullptr; }, "lock must not be null"},
      {"EmptyIdentity",
       [this](LeaderElector::Config* c) { c->lock = std::make_shared<FakeLock>(store_, ""); },
       "identity must not be empty"},
      {"NoOnStartedLeading",
       [](LeaderElector::Config* c) { c->callbacks.on_started_leading = nullptr; },
       "on_started_leading must be set"},
      {"NoOnStoppedLeading",
       [](LeaderElector::Config* c) { c->callbacks.on_stopped_leading = nullptr; },
       "on_stopped_leading must be set"},
      {"NoOnNewLeaderIsFine",
       [](LeaderElector::Config* c) { c->callbacks.on_new_leader = nullptr; }, ""},
  };
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.name);
    Replica r;
    r.lock = std::make_shared<FakeLock>(store_, "a");
    LeaderElector::Config c = BaseConfig(&r);
    tc.mutate(&c);
    absl::StatusOr<std::unique_ptr<LeaderElector>> e = LeaderElector::Create(std::move(c));
    if (tc.error.empty()) {
      EXPECT_THAT(e, IsOk());
    } else {
      EXPECT_THAT(e, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(tc.error)));
    }
  }
}

// ---- Acquiring ----

TEST_F(LeaderElectorTest, Acquire_NoLeaseObject_CreatesItWithEpochOne) {
  auto a = MakeReplica("a");
  StepAt(a.get(), 0);
  EXPECT_TRUE(a->elector->IsLeader());
  EXPECT_EQ(a->elector->Epoch(), 1);
  EXPECT_THAT(a->started, ElementsAre(1));
  EXPECT_EQ(a->elector->GetLeader(), "a");
  EXPECT_THAT(a->new_leaders, ElementsAre("a"));
  ASSERT_TRUE(store_->Read().has_value());
  EXPECT_EQ(*store_->Read(), Held("a", 1, At(0)));
}

TEST_F(LeaderElectorTest, Acquire_ReleasedLease_AtOnceWithNextEpoch) {
  LeaderElectionRecord released = Held("", 5, At(-1));
  released.lease_duration = absl::Seconds(1);
  store_->Put(released);
  auto a = MakeReplica("a");
  StepAt(a.get(), 0);
  EXPECT_TRUE(a->elector->IsLeader());
  EXPECT_THAT(a->started, ElementsAre(6));
  EXPECT_EQ(store_->Read()->leader_transitions, 6);
}

TEST_F(LeaderElectorTest, Acquire_OthersLease_WaitsLeaseDurationFromObservationNotRenewTime) {
  // The holder's renewTime is an hour old on the writer's clock: clocks are not compared. The
  // lease counts as expired 15 s after this replica first saw this version of the record.
  store_->Put(Held("x", 3, At(-3600)));
  auto b = MakeReplica("b");
  StepAt(b.get(), 0);
  EXPECT_FALSE(b->elector->IsLeader());
  EXPECT_EQ(b->elector->GetLeader(), "x");
  EXPECT_THAT(b->new_leaders, ElementsAre("x"));

  StepAt(b.get(), 14.999);
  EXPECT_FALSE(b->elector->IsLeader());

  StepAt(b.get(), 15);
  EXPECT_TRUE(b->elector->IsLeader());
  EXPECT_THAT(b->started, ElementsAre(4));
  EXPECT_THAT(b->start_times, ElementsAre(At(15)));
  EXPECT_THAT(b->new_leaders, ElementsAre("x", "b"));
}

TEST_F(LeaderElectorTest, Acquire_HoldersRenewal_RestartsTheExpiry) {
  store_->Put(Held("x", 3, At(0)));
  auto b = MakeReplica("b");
  StepEvery({b.get()}, 0, 8, 2);
  store_->Put(Held("x", 3, At(9)));  // x renews; b sees it at its next step, t=10
  StepEvery({b.get()}, 10, 24, 2);
  StepAt(b.get(), 24.999);
  EXPECT_FALSE(b->elector->IsLeader());
  StepAt(b.get(), 25);
  EXPECT_TRUE(b->elector->IsLeader());
  EXPECT_THAT(b->started, ElementsAre(4));
}

TEST_F(LeaderElectorTest, Acquire_LeaseWithEmptySpec_IsFree) {
  store_->Put(LeaderElectionRecord{});
  auto a = MakeReplica("a");
  StepAt(a.get(), 0);
  EXPECT_THAT(a->started, ElementsAre(1));
}

// ---- Renewing ----

TEST_F(LeaderElectorTest, Renew_KeepsLeadershipAndEpoch_StandbyNeverAcquires) {
  auto a = MakeReplica("a");
  auto b = MakeReplica("b");
  StepEvery({a.get(), b.get()}, 0, 60, 2);
  EXPECT_TRUE(a->elector->IsLeader());
  EXPECT_EQ(a->elector->Epoch(), 1);
  EXPECT_THAT(a->started, ElementsAre(1));
  EXPECT_EQ(a->stopped(), 0);
  EXPECT_FALSE(b->elector->IsLeader());
  EXPECT_TRUE(b->started.empty());
  LeaderElectionRecord r = *store_->Read();
  EXPECT_EQ(r.acquire_time, At(0));
  EXPECT_EQ(r.renew_time, At(60));
  EXPECT_EQ(r.leader_transitions, 1);
}

TEST_F(LeaderElectorTest, Renew_FailingFromT2_StopsLeadingExactlyAtRenewDeadline) {
  auto a = MakeReplica("a");
  auto b = MakeReplica("b");
  StepEvery({a.get(), b.get()}, 0, 2, 2);  // acquire at 0, renew at 2
  a->lock->SetFailing(true);
  StepEvery({a.get(), b.get()}, 4, 10, 2);
  StepAt(a.get(), 11.999);
  EXPECT_TRUE(a->elector->IsLeader()) << "still within 10 s of the renewal that started at 2";
  StepAt(a.get(), 12);
  EXPECT_FALSE(a->elector->IsLeader());
  EXPECT_EQ(a->elector->Epoch(), 0);
  EXPECT_THAT(a->stop_times, ElementsAre(At(12)));
  EXPECT_TRUE(a->token_cancelled_at_stop) << "the context is cancelled before on_stopped_leading";

  // b saw the renewal of t=2 at t=2: it may take over at 17, its first step after is 18.
  StepEvery({a.get(), b.get()}, 14, 16, 2);
  EXPECT_TRUE(b->started.empty());
  StepEvery({a.get(), b.get()}, 18, 30, 2);
  EXPECT_THAT(b->start_times, ElementsAre(At(18)));
  EXPECT_THAT(b->started, ElementsAre(2));
  EXPECT_LT(a->stop_times[0], b->start_times[0]);
  EXPECT_EQ(a->stopped(), 1) << "on_stopped_leading runs once per term";
  EXPECT_TRUE(a->started.size() == 1);
}

TEST_F(LeaderElectorTest, Renew_AnotherHolderAppears_StopsLeadingAtOnce) {
  auto a = MakeReplica("a");
  StepAt(a.get(), 0);
  store_->Put(Held("x", 7, At(0)));  // taken over by hand
  StepAt(a.get(), 2);
  EXPECT_FALSE(a->elector->IsLeader());
  EXPECT_THAT(a->stop_times, ElementsAre(At(2)));
  EXPECT_THAT(a->new_leaders, ElementsAre("a", "x"));
  EXPECT_EQ(store_->Read()->holder_identity, "x") << "the loser does not write";
}

TEST_F(LeaderElectorTest, Resign_WatchdogEndsTheTermAtOnce_ThenLeadsAgainWithHigherEpoch) {
  auto a = MakeReplica("a");
  StepAt(a.get(), 0);
  ASSERT_THAT(a->started, ElementsAre(1));
  a->elector->Resign(7, "not this term's epoch");  // ignored: another term
  a->elector->Resign(1, "fenced");
  // The watchdog ends the term without waiting for the clock.
  ASSERT_TRUE(Eventually([&] { return a->stopped() == 1; }, "the resigned term ends"));
  EXPECT_THAT(a->stop_times, ElementsAre(At(0)));
  EXPECT_TRUE(a->token_cancelled_at_stop);
  StepAt(a.get(), 1);
  // The next attempt finds the lease still this replica's and starts a new term.
  EXPECT_THAT(a->started, ElementsAre(1, 2));
  EXPECT_EQ(a->elector->Epoch(), 2);
  a->elector->Resign(1, "stale");  // the old term's resignation does not touch the new one
  StepAt(a.get(), 2);
  EXPECT_EQ(a->stopped(), 1);
  EXPECT_TRUE(a->elector->IsLeader());
}

TEST_F(LeaderElectorTest, Renew_LeaseDeleted_EndsTermAndRecreatesAboveEpochsSeen) {
  store_->Put(Held("", 2, At(0)));
  auto a = MakeReplica("a");
  StepAt(a.get(), 0);
  EXPECT_THAT(a->started, ElementsAre(3));
  store_->Delete();
  StepAt(a.get(), 2);
  EXPECT_FALSE(a->elector->IsLeader());
  EXPECT_EQ(a->stopped(), 1);
  StepAt(a.get(), 4);
  EXPECT_THAT(a->started, ElementsAre(3, 4));
}

// ---- Releasing ----

TEST_F(LeaderElectorTest, Stop_WhileLeading_EndsTermThenReleases_StandbyAcquiresInOneStep) {
  auto a = MakeReplica("a");
  auto b = MakeReplica("b");
  StepEvery({a.get(), b.get()}, 0, 4, 2);
  a->elector->Stop();
  EXPECT_FALSE(a->elector->IsLeader());
  EXPECT_EQ(a->stopped(), 1);
  EXPECT_TRUE(a->token_cancelled_at_stop);
  ASSERT_TRUE(a->record_at_stop.has_value());
  EXPECT_EQ(a->record_at_stop->holder_identity, "a")
      << "the lease is released only after on_stopped_leading returned";
  LeaderElectionRecord released = *store_->Read();
  EXPECT_EQ(released.holder_identity, "");
  EXPECT_EQ(released.lease_duration, absl::Seconds(1));
  EXPECT_EQ(released.leader_transitions, 1);

  StepAt(b.get(), 4.001);  // b's next attempt
  EXPECT_THAT(b->started, ElementsAre(2));
  a->elector->Stop();  // idempotent
  EXPECT_EQ(a->stopped(), 1);
}

TEST_F(LeaderElectorTest, Stop_WithoutRelease_StandbyWaitsForExpiry) {
  auto a = MakeReplica("a", [](LeaderElector::Config* c) { c->release_on_cancel = false; });
  auto b = MakeReplica("b");
  StepEvery({a.get(), b.get()}, 0, 4, 2);
  a->elector->Stop();
  EXPECT_EQ(a->stopped(), 1);
  EXPECT_EQ(store_->Read()->holder_identity, "a");
  StepEvery({b.get()}, 6, 18, 2);
  EXPECT_TRUE(b->started.empty());
  StepEvery({b.get()}, 20, 20, 2);  // saw the renewal of t=4 at 4: expired at 19
  EXPECT_THAT(b->started, ElementsAre(2));
}

TEST_F(LeaderElectorTest, Destroy_WhileLeading_StopsAndReleases) {
  auto a = MakeReplica("a");
  StepAt(a.get(), 0);
  a->elector.reset();
  EXPECT_EQ(a->stopped(), 1);
  EXPECT_EQ(store_->Read()->holder_identity, "");
}

// ---- Epochs ----

TEST_F(LeaderElectorTest, Epoch_StrictlyIncreasesAcrossTerms_IncludingSameIdentityReacquiring) {
  auto a = MakeReplica("a", [](LeaderElector::Config* c) { c->release_on_cancel = false; });
  auto b = MakeReplica("b");
  std::vector<int64_t> epochs;

  // Term 1: a. Its renewals fail; it stops at 10; b takes over once expired (t=16).
  StepEvery({a.get(), b.get()}, 0, 0, 2);
  a->lock->SetFailing(true);
  StepEvery({a.get(), b.get()}, 2, 16, 2);
  EXPECT_THAT(a->stop_times, ElementsAre(At(10)));
  EXPECT_THAT(b->started, ElementsAre(2));

  // Term 3: b releases; a (healthy again) takes the free lease.
  a->lock->SetFailing(false);
  b->elector->Stop();
  StepEvery({a.get()}, 18, 18, 2);
  EXPECT_THAT(a->started, ElementsAre(1, 3));

  // Term 4: a's renewals fail until its deadline; the lease still names a, and a takes it again
  // as a new term.
  a->lock->SetFailing(true);
  StepEvery({a.get()}, 20, 28, 2);
  EXPECT_FALSE(a->elector->IsLeader());
  a->lock->SetFailing(false);
  StepEvery({a.get()}, 30, 30, 2);
  EXPECT_THAT(a->started, ElementsAre(1, 3, 4));
  EXPECT_EQ(a->elector->Epoch(), 4);

  // Term 5: a "crashes" (no release) and restarts with the same identity: it takes its own lease
  // at once, as a new term.
  a->elector.reset();
  auto a2 = MakeReplica("a");
  StepAt(a2.get(), 31);
  EXPECT_THAT(a2->started, ElementsAre(5));

  epochs.insert(epochs.end(),
                {a->started[0], b->started[0], a->started[1], a->started[2], a2->started[0]});
  EXPECT_THAT(epochs, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(store_->Read()->leader_transitions, 5);
}

// ---- Callbacks ----

TEST_F(LeaderElectorTest, OnNewLeader_CalledOncePerObservedChange) {
  auto a = MakeReplica("a");
  auto b = MakeReplica("b");
  StepEvery({a.get(), b.get()}, 0, 10, 2);  // a leads; b sees it once
  a->elector->Stop();                       // released: b will see "" only if it reads it
  StepAt(b.get(), 11);                      // reads "" then acquires: the last observed holder is b
  EXPECT_THAT(b->new_leaders, ElementsAre("a", "b"));
  EXPECT_THAT(a->new_leaders, ElementsAre("a"));
}

TEST_F(LeaderElectorTest, OnNewLeader_ReportsReleaseAsEmptyIdentity) {
  auto a = MakeReplica("a");
  auto b = MakeReplica("b");
  StepAt(a.get(), 0);
  StepAt(b.get(), 0);
  a->elector->Stop();
  b->lock->SetFailingWrites(true);  // b sees the release but cannot take the lease
  StepAt(b.get(), 2);
  EXPECT_FALSE(b->elector->IsLeader());
  EXPECT_EQ(b->elector->GetLeader(), "");
  EXPECT_THAT(b->new_leaders, ElementsAre("a", ""));
}

TEST_F(LeaderElectorTest, StartedLeading_ContextCancelledWhenTermEnds) {
  auto a = MakeReplica("a");
  StepAt(a.get(), 0);
  ASSERT_TRUE(a->token.has_value());
  std::atomic<bool> called{false};
  a->token->OnCancelled([&] { called = true; });
  EXPECT_FALSE(a->token->Cancelled());
  a->lock->SetFailing(true);
  StepEvery({a.get()}, 2, 10, 2);
  EXPECT_TRUE(a->token->Cancelled());
  EXPECT_TRUE(called);
  EXPECT_TRUE(a->token->WaitForCancellation(absl::Now()));
}

TEST_F(LeaderElectorTest, Metrics_LeadingGaugeAndTermsCounter) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto a = MakeReplica("a", [&](LeaderElector::Config* c) { c->registry = registry; });
  auto value = [&](const std::string& name) -> double {
    for (const prometheus::MetricFamily& f : registry->Collect()) {
      if (f.name != name || f.metric.size() != 1) continue;
      EXPECT_EQ(f.metric[0].label.at(0).value, "leases fake");
      return f.type == prometheus::MetricType::Gauge ? f.metric[0].gauge.value
                                                     : f.metric[0].counter.value;
    }
    ADD_FAILURE() << "no metric " << name;
    return -1;
  };
  EXPECT_EQ(value("shardcache_leader_election_leading"), 0);
  StepAt(a.get(), 0);
  EXPECT_EQ(value("shardcache_leader_election_leading"), 1);
  EXPECT_EQ(value("shardcache_leader_election_terms_total"), 1);
  a->elector->Stop();
  EXPECT_EQ(value("shardcache_leader_election_leading"), 0);
  EXPECT_EQ(value("shardcache_leader_election_terms_total"), 1);
}

// ---- With threads: Run() on the real clock ----

class LeaderElectorRunTest : public ::testing::Test {
 protected:
  std::shared_ptr<FakeLeaseStore> store_ = std::make_shared<FakeLeaseStore>();
};

TEST_F(LeaderElectorRunTest, Run_AcquiresRenewsAndStopReleases) {
  auto lock = std::make_shared<FakeLock>(store_, "a");
  std::atomic<int> started{0}, stopped{0};
  LeaderElector::Config c;
  c.lock = lock;
  c.lease_duration = absl::Milliseconds(600);
  c.renew_deadline = absl::Milliseconds(400);
  c.retry_period = absl::Milliseconds(100);
  c.callbacks.on_started_leading = [&](LeadingContext) { ++started; };
  c.callbacks.on_stopped_leading = [&] { ++stopped; };
  auto e = LeaderElector::Create(c);
  ASSERT_THAT(e, IsOk());
  (*e)->Run();
  EXPECT_TRUE(Eventually([&] { return (*e)->IsLeader(); }, absl::Seconds(5), "(*e)->IsLeader()"));
  int calls = lock->calls();
  EXPECT_TRUE(Eventually([&] { return lock->calls() >= calls + 3; }, absl::Seconds(5),
                         "lock->calls() >= calls + 3"))
      << "renews every retry period";
  EXPECT_TRUE((*e)->IsLeader());
  (*e)->Stop();
  EXPECT_EQ(started.load(), 1);
  EXPECT_EQ(stopped.load(), 1);
  EXPECT_EQ(store_->Read()->holder_identity, "");
}

TEST_F(LeaderElectorRunTest, Watchdog_RenewalHangs_StillStopsLeadingByRenewDeadline) {
  auto lock = std::make_shared<FakeLock>(store_, "a");
  absl::Mutex mu;
  std::optional<absl::Time> last_start, stop;
  LeaderElector::Config c;
  c.lock = lock;
  c.lease_duration = absl::Milliseconds(600);
  c.renew_deadline = absl::Milliseconds(400);
  c.retry_period = absl::Milliseconds(100);
  c.release_on_cancel = false;
  c.callbacks.on_started_leading = [&](LeadingContext) {
    absl::MutexLock l(&mu);
    last_start = absl::Now();
  };
  c.callbacks.on_stopped_leading = [&] {
    absl::MutexLock l(&mu);
    stop = absl::Now();
  };
  auto e = LeaderElector::Create(c);
  ASSERT_THAT(e, IsOk());
  (*e)->Run();
  ASSERT_TRUE(Eventually([&] { return (*e)->IsLeader(); }, absl::Seconds(5), "(*e)->IsLeader()"));
  absl::Time hung = absl::Now();
  lock->Hang();  // the next call blocks: no renewal succeeds after `hung`
  ASSERT_TRUE(Eventually(
      [&] {
        absl::MutexLock l(&mu);
        return stop.has_value();
      },
      absl::Seconds(5), "the term ends"));
  absl::Duration after = *stop - hung;
  // The last successful renewal started at most one retry period before `hung` (plus how late
  // a busy machine wakes the renewal loop); the watchdog ends the term at its renew deadline
  // (plus how late it is woken).
  EXPECT_LE(after, c.renew_deadline + absl::Milliseconds(300)) << after;
  EXPECT_GE(after, c.renew_deadline - c.retry_period - absl::Milliseconds(100)) << after;
  EXPECT_FALSE((*e)->IsLeader());
  lock->Unhang();
  (*e)->Stop();
}

TEST_F(LeaderElectorRunTest, Resign_FromTheLeadersWork_WatchdogEndsTermAtOnce) {
  auto lock = std::make_shared<FakeLock>(store_, "a");
  std::atomic<int> stopped{0};
  std::atomic<int64_t> first_epoch{0};
  LeaderElector::Config c;
  c.lock = lock;
  c.lease_duration = absl::Seconds(30);
  c.renew_deadline = absl::Seconds(20);
  c.retry_period = absl::Seconds(10);  // nothing but Resign can end the term within the test
  c.callbacks.on_started_leading = [&](LeadingContext ctx) {
    int64_t none = 0;
    first_epoch.compare_exchange_strong(none, ctx.epoch);
  };
  c.callbacks.on_stopped_leading = [&] { ++stopped; };
  auto e = LeaderElector::Create(c);
  ASSERT_THAT(e, IsOk());
  (*e)->Run();
  // The epoch as on_started_leading got it (IsLeader() is true a moment before the callback runs).
  ASSERT_TRUE(Eventually([&] { return first_epoch.load() != 0; }, absl::Seconds(5),
                         "on_started_leading ran"));
  absl::Time resigned = absl::Now();
  (*e)->Resign(first_epoch.load(), "fenced");
  ASSERT_TRUE(
      Eventually([&] { return stopped.load() == 1; }, absl::Seconds(5), "stopped.load() == 1"));
  EXPECT_LT(absl::Now() - resigned, absl::Seconds(5));
  EXPECT_FALSE((*e)->IsLeader()) << "the next attempt waits a retry period";
  (*e)->Stop();
  EXPECT_EQ(stopped.load(), 1);
}

// ---- The lease record's JSON form ----

TEST(LeaseRecordTest, FormatMicroTime_Rfc3339UtcWithSixDigits) {
  absl::Time t = absl::FromUnixNanos(1'700'000'000'123'456'789);
  EXPECT_EQ(FormatMicroTime(t), "2023-11-14T22:13:20.123456Z");
  EXPECT_EQ(FormatMicroTime(absl::FromUnixSeconds(1'700'000'000)), "2023-11-14T22:13:20.000000Z");
}

TEST(LeaseRecordTest, ParseMicroTime_AcceptsOffsetsAndFractions) {
  absl::StatusOr<absl::Time> utc = ParseMicroTime("2023-11-14T22:13:20.123456Z");
  ASSERT_THAT(utc, IsOk());
  EXPECT_EQ(*utc, absl::FromUnixMicros(1'700'000'000'123'456));
  absl::StatusOr<absl::Time> t = ParseMicroTime("2023-11-15T00:13:20+02:00");
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(*t, absl::FromUnixSeconds(1'700'000'000));
  EXPECT_THAT(ParseMicroTime("yesterday"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LeaseRecordTest, Spec_RoundTrips) {
  LeaderElectionRecord r;
  r.holder_identity = "replica-1";
  r.lease_duration = absl::Seconds(15);
  r.acquire_time = absl::FromUnixMicros(1'700'000'000'000'001);
  r.renew_time = absl::FromUnixMicros(1'700'000'004'500'000);
  r.leader_transitions = 3;
  google::protobuf::Struct spec = RecordToSpec(r);
  EXPECT_EQ(spec.fields().at("holderIdentity").string_value(), "replica-1");
  EXPECT_EQ(spec.fields().at("leaseDurationSeconds").number_value(), 15);
  EXPECT_EQ(spec.fields().at("acquireTime").string_value(), "2023-11-14T22:13:20.000001Z");
  EXPECT_EQ(spec.fields().at("renewTime").string_value(), "2023-11-14T22:13:24.500000Z");
  EXPECT_EQ(spec.fields().at("leaseTransitions").number_value(), 3);
  absl::StatusOr<LeaderElectionRecord> back = RecordFromSpec(spec);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, r);
}

TEST(LeaseRecordTest, Spec_LeaseTransitionsAboveTwoToThe53_RoundTripExactly) {
  LeaderElectionRecord r;
  r.holder_identity = "replica-1";
  r.leader_transitions = (int64_t{1} << 53) + 1;  // a double would round it to 2^53
  absl::StatusOr<LeaderElectionRecord> back = RecordFromSpec(RecordToSpec(r));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->leader_transitions, r.leader_transitions);
  // Up to 2^53 the spec keeps the JSON number it has always had.
  r.leader_transitions = int64_t{1} << 53;
  EXPECT_EQ(RecordToSpec(r).fields().at("leaseTransitions").number_value(), 9007199254740992.0);
}

TEST(LeaseRecordTest, Spec_LeaseDurationRoundsUpToWholeSeconds) {
  LeaderElectionRecord r;
  r.lease_duration = absl::Milliseconds(1500);
  EXPECT_EQ(RecordToSpec(r).fields().at("leaseDurationSeconds").number_value(), 2);
}

TEST(LeaseRecordTest, Spec_EmptyIsAFreeLease) {
  absl::StatusOr<LeaderElectionRecord> r = RecordFromSpec(google::protobuf::Struct());
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(*r, LeaderElectionRecord{});
}

TEST(LeaseRecordTest, Spec_WrongTypes_InvalidArgumentNamingTheField) {
  struct Case {
    std::string field;
    google::protobuf::Value value;
  };
  google::protobuf::Value number, text, negative, fraction;
  number.set_number_value(1);
  text.set_string_value("x");
  negative.set_number_value(-1);
  fraction.set_number_value(1.5);
  const std::vector<Case> cases = {
      {"holderIdentity", number},
      {"leaseDurationSeconds", text},
      {"leaseDurationSeconds", negative},
      {"acquireTime", number},
      {"renewTime", text},
      {"leaseTransitions", fraction},
  };
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.field);
    google::protobuf::Struct spec;
    (*spec.mutable_fields())[tc.field] = tc.value;
    EXPECT_THAT(RecordFromSpec(spec),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec." + tc.field)));
  }
}

// ---- CancellationToken ----

TEST(CancellationTest, Cancel_RunsCallbacksOnceAndWakesWaiters) {
  CancellationSource source;
  CancellationToken token = source.Token();
  int calls = 0;
  token.OnCancelled([&] { ++calls; });
  EXPECT_FALSE(token.Cancelled());
  EXPECT_FALSE(token.WaitForCancellation(absl::Now() + absl::Milliseconds(10)));
  std::thread t([&] { source.Cancel(); });
  EXPECT_TRUE(token.WaitForCancellation(absl::Now() + absl::Seconds(10)));
  t.join();
  source.Cancel();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(token.Cancelled());
}

TEST(CancellationTest, OnCancelled_AfterCancel_RunsAtOnce) {
  CancellationSource source;
  source.Cancel();
  bool called = false;
  EXPECT_EQ(source.Token().OnCancelled([&] { called = true; }), 0u);
  EXPECT_TRUE(called);
}

TEST(CancellationTest, RemoveCallback_IsNotCalled) {
  CancellationSource source;
  bool called = false;
  CancellationToken::CallbackId id = source.Token().OnCancelled([&] { called = true; });
  source.Token().RemoveCallback(id);
  source.Cancel();
  EXPECT_FALSE(called);
}

TEST(CancellationTest, RemoveCallback_WhileRunning_WaitsForIt) {
  CancellationSource source;
  CancellationToken token = source.Token();
  absl::Notification entered, finish;
  std::atomic<bool> done{false};
  CancellationToken::CallbackId id = token.OnCancelled([&] {
    entered.Notify();
    finish.WaitForNotification();
    done = true;
  });
  std::thread t([&] { source.Cancel(); });
  entered.WaitForNotification();
  // The callback is released once this thread is blocked inside RemoveCallback (or has
  // returned from it: then `done` is still false and the check below fails).
  const pid_t self = testing::ThisThreadId();
  std::atomic<bool> removed{false};
  std::thread releaser([&] {
    EXPECT_TRUE(testing::Eventually([&] { return removed.load() || testing::ThreadAsleep(self); },
                                    "RemoveCallback returns or blocks"));
    finish.Notify();
  });
  token.RemoveCallback(id);
  removed = true;
  EXPECT_TRUE(done.load()) << "RemoveCallback returned while the callback still ran";
  t.join();
  releaser.join();
}

}  // namespace
}  // namespace shardcache
