// LeaderElector: leader election over a ResourceLock (client-go's leaderelection), with an epoch
// per term for fencing.
//
//   LeaderElector::Config config;
//   config.lock = std::make_shared<LeaseLock>(stub, LeaseLock::Options{...});
//   config.callbacks.on_started_leading = [&](LeadingContext ctx) {
//     StartControllers(ctx.epoch, ctx.cancellation);  // returns at once; work stops on cancel
//   };
//   config.callbacks.on_stopped_leading = [&] { JoinControllers(); };
//   ASSIGN_OR_RETURN(std::unique_ptr<LeaderElector> elector, LeaderElector::Create(config));
//   elector->Run();   // returns at once; the election runs on the elector's own threads
//   ...
//   elector->Stop();  // ends the term (if any), then releases the lease
//
// Timing (all measured on config.clock; defaults as client-go):
//  - Not leading: try to acquire every RetryPeriod (each wait shortened by a random fraction of up
//    to 20%, so standbys spread out yet a released lease is taken within one RetryPeriod). The
//    lease can be taken when nobody holds it (holderIdentity empty, e.g. released), when this
//    identity holds it, or when it has expired: when the record has not changed for its
//    leaseDurationSeconds, counted on THIS replica's clock from the moment this replica first saw
//    that version of the record (as client-go does: no replica trusts another's clock).
//  - Leading: renew every RetryPeriod. When no renewal has succeeded for RenewDeadline, counted
//    from the START of the last successful renewal, the term ends: IsLeader() turns false, the
//    context is cancelled and on_stopped_leading runs. A watchdog thread enforces this even while
//    a call to the lock hangs. The term also ends at once when a read shows another holder.
//
// Why no other replica can acquire while this one still leads: a renewal that started at time t
// (this replica's clock) writes a record that others can first see at some t' >= t; they wait
// leaseDurationSeconds after t' on their own clocks before taking the lease. This replica stops
// leading at t + RenewDeadline, and RenewDeadline < LeaseDuration. The difference
// (LeaseDuration - RenewDeadline, 5 s by default) absorbs differences in clock RATE between
// replicas and the time the leader's work takes to notice the cancellation; clock skew (offsets)
// never enters, since every replica only measures intervals on its own clock. Bounded rate drift
// is assumed; fencing with the epoch covers a leader that was paused (GC, SIGSTOP) across this.
//
// Epoch: the lease's leaseTransitions as written by the acquisition that started the term. Each
// new term (any holder, including this identity taking the lease again after its term ended, or
// after a restart) raises it by one, and every write is conditional on the resourceVersion last
// read, so epochs strictly increase across terms and replicas (see lease_lock.h). Renewals and
// releases keep it.
//
// Release (config.release_on_cancel, default true): Stop() ends the term first (cancel, then
// on_stopped_leading, which should return only when the leader's work has stopped), and only then
// writes the lease with holderIdentity empty and leaseDurationSeconds 1, so a standby takes over
// within one RetryPeriod and never while this replica's work is still running.
//
// Callbacks run on the elector's threads (or the thread calling Stop), one at a time, never
// concurrently, without the elector's lock held; a term's on_started_leading returns before its
// on_stopped_leading is called, which runs exactly once per term, after the term's context is
// cancelled. They must return promptly: start long work on other threads. (Callbacks registered
// on a term's CancellationToken run on the thread that ends the term, possibly the watchdog, and
// may overlap with on_started_leading if the term ends while that still runs.)
//
// Time: every wait of the elector's threads (the loop's retry period, the watchdog's renew
// deadline) is a wait on config.clock, so a test on a FakeClock drives the elector by advancing
// the clock: once Run() has started it, each running elector has exactly two threads waiting on
// the clock whenever it is idle (FakeClock::AwaitWaiters).
//
// Thread-safety: IsLeader, GetLeader, Epoch and Stop may be called from any thread (Stop not from
// a callback).
#ifndef SHARDCACHE_COMMON_CLIENT_LEADER_ELECTOR_H_
#define SHARDCACHE_COMMON_CLIENT_LEADER_ELECTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/client/lease_lock.h"
#include "common/clock.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace shardcache {

// What on_started_leading gets: the term's epoch and its cancellation.
struct LeadingContext {
  // The term's epoch (>= 1): pass it as Fence.epoch on writes.
  int64_t epoch;
  // Cancelled when the term ends (before on_stopped_leading).
  CancellationToken cancellation;
};

struct LeaderCallbacks {
  // A term started. Required.
  std::function<void(LeadingContext)> on_started_leading;
  // The term ended; exactly once per term, after its context was cancelled. Required.
  std::function<void()> on_stopped_leading;
  // The observed holder changed; "" means nobody holds the lease (e.g. released). Optional.
  std::function<void(const std::string& identity)> on_new_leader;
};

class LeaderElector {
 public:
  // client-go's JitterFactor: RenewDeadline must exceed it times RetryPeriod.
  static constexpr double kJitterFactor = 1.2;

  struct Config {
    // The lock competed for; its Identity() is this replica's identity. Required.
    std::shared_ptr<ResourceLock> lock;
    // How long a lease is valid after its last renewal, as the others see it.
    absl::Duration lease_duration = absl::Seconds(15);
    // How long the leader keeps leading without a successful renewal. < lease_duration.
    absl::Duration renew_deadline = absl::Seconds(10);
    // The interval between attempts to acquire or renew. renew_deadline > 1.2 * retry_period.
    absl::Duration retry_period = absl::Seconds(2);
    // On Stop() while leading, write the lease as free (after on_stopped_leading returns).
    bool release_on_cancel = true;
    LeaderCallbacks callbacks;
    // Where "now" comes from, and what the elector's threads wait on; not owned, must outlive
    // the elector.
    const Clock* clock = RealClock::Get();
    // Optional: exports shardcache_leader_election_leading (gauge: 1 from the return of a term's
    // on_started_leading until its on_stopped_leading has returned, so 0 means the term's work
    // has stopped) and
    // shardcache_leader_election_terms_total (counter), labelled lease=<lock->Describe()>.
    std::shared_ptr<prometheus::Registry> registry;
  };

  // Validates as client-go does: all durations positive, lease_duration > renew_deadline,
  // renew_deadline > kJitterFactor * retry_period, a lock with a non-empty identity, and both
  // required callbacks. INVALID_ARGUMENT naming the problem otherwise.
  static absl::StatusOr<std::unique_ptr<LeaderElector>> Create(Config config);

  // Stops (see Stop).
  ~LeaderElector();
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Starts the election loop and the renew-deadline watchdog on the elector's own threads, and
  // returns. REQUIRES: called at most once, and not after Stop.
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops the loop (waiting for a lock call in flight, at most the lock's call timeout), ends the
  // term if leading (cancel, on_stopped_leading), then releases the lease if configured and the
  // last record seen names this identity. Idempotent. REQUIRES: not called from a callback.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, callback_mu_);

  // Ends the current term if its epoch is `epoch` (the leader's work learnt that it must stop,
  // e.g. a store rejected its writes as fenced by a newer epoch). Returns at once: the watchdog
  // thread (or the loop's next attempt) ends the term as it does at the renew deadline.
  // The elector keeps competing and may lead again in a new term, with a new epoch. Does nothing
  // when that term has already ended. Any thread, including the leader's work and callbacks.
  void Resign(int64_t epoch, absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_);

  bool IsLeader() const ABSL_LOCKS_EXCLUDED(mu_);
  // The holder in the last record seen ("" if none or nothing seen yet).
  std::string GetLeader() const ABSL_LOCKS_EXCLUDED(mu_);
  // The current term's epoch; 0 when not leading.
  int64_t Epoch() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& Identity() const { return identity_; }

 private:
  explicit LeaderElector(Config config);

  // One iteration of the loop: end the term if the renew deadline has passed, then try to
  // acquire or renew once, and start or end a term accordingly (running the callbacks). The loop
  // thread calls it every RetryPeriod.
  void Step() ABSL_LOCKS_EXCLUDED(mu_, callback_mu_);

  // The outcome of one TryAcquireOrRenew.
  enum class Attempt { kNone, kAcquired, kRenewed, kLost };

  // One read-modify-write of the lock (client-go's tryAcquireOrRenew). `leading` and `epoch`
  // describe the term in effect when the attempt started; `*new_epoch` is set on kAcquired.
  Attempt TryAcquireOrRenew(absl::Time now, bool leading, int64_t epoch, int64_t* new_epoch)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records a record read or written; when its resourceVersion is new, it is observed now.
  void Observe(const ObservedRecord& observed) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls on_new_leader when the observed holder differs from the one last reported.
  void MaybeReportLeader() ABSL_LOCKS_EXCLUDED(mu_, callback_mu_);

  // Starts a term with this epoch whose last successful renewal started at `renewed`.
  void BeginTerm(int64_t epoch, absl::Time renewed) ABSL_LOCKS_EXCLUDED(mu_, callback_mu_);
  // Ends term number `term` (see term_) if it is still current: returns false otherwise. `clean`:
  // the replica ends it on purpose (logged at info; a lost term is a warning).
  bool EndTerm(uint64_t term, absl::string_view why, bool clean = false)
      ABSL_LOCKS_EXCLUDED(mu_, callback_mu_);
  // Ends the current term if its renew deadline has passed, or if it was asked to resign.
  void CheckRenewDeadline() ABSL_LOCKS_EXCLUDED(mu_, callback_mu_);
  // Writes the lease as free, if the last record seen names this identity.
  void Release() ABSL_LOCKS_EXCLUDED(mu_);

  void LoopThread() ABSL_LOCKS_EXCLUDED(mu_);
  void WatchdogThread() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until `t` on clock_, or until stopping_. Returns false when stopping.
  bool WaitUntil(absl::Time t) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration JitteredRetryPeriod() ABSL_LOCKS_EXCLUDED(mu_);
  bool StoppingOrLeading() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || leading_;
  }
  bool NoStopPending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stops_pending_ == 0; }
  bool StoppingOrResigning() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (leading_ && resign_epoch_ == epoch_);
  }

  // Constant after construction.
  const Config config_;
  const std::string identity_;
  prometheus::Gauge* leading_gauge_ = nullptr;  // null without a registry
  prometheus::Counter* terms_counter_ = nullptr;

  // Held while a callback runs (and while a term starts or ends), so that callbacks never run
  // concurrently and a term's start and end callbacks come in order. Acquired before mu_.
  absl::Mutex callback_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::string reported_leader_ ABSL_GUARDED_BY(callback_mu_);

  // Threads started by Run(); joined by Stop().
  std::thread loop_thread_;
  std::thread watchdog_thread_;

  // State below is protected by mu_.
  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // The record last read or written, its resourceVersion, and when (clock_) that version was
  // first seen.
  bool have_observed_ ABSL_GUARDED_BY(mu_) = false;
  LeaderElectionRecord observed_ ABSL_GUARDED_BY(mu_);
  std::string observed_version_ ABSL_GUARDED_BY(mu_);
  absl::Time observed_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The highest leaseTransitions seen; a re-created lease starts above it.
  int64_t max_transitions_seen_ ABSL_GUARDED_BY(mu_) = 0;
  // The current term, when leading.
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t term_ ABSL_GUARDED_BY(mu_) = 0;  // counts terms started by this elector
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_renew_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The epoch of a term asked to end by Resign (0: none), and why.
  int64_t resign_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::string resign_reason_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CancellationSource> cancellation_ ABSL_GUARDED_BY(mu_);
  // Terms that have ended whose on_stopped_leading has not returned yet.
  int stops_pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_LEADER_ELECTOR_H_
