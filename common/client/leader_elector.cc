#include "common/client/leader_elector.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcache {

absl::StatusOr<std::unique_ptr<LeaderElector>> LeaderElector::Create(Config config) {
  auto invalid = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("leader election config: ", what));
  };
  if (config.lease_duration <= absl::ZeroDuration()) {
    return invalid("lease_duration must be greater than zero");
  }
  if (config.renew_deadline <= absl::ZeroDuration()) {
    return invalid("renew_deadline must be greater than zero");
  }
  if (config.retry_period <= absl::ZeroDuration()) {
    return invalid("retry_period must be greater than zero");
  }
  if (config.lease_duration <= config.renew_deadline) {
    return invalid("lease_duration must be greater than renew_deadline");
  }
  if (config.renew_deadline <= config.retry_period * kJitterFactor) {
    return invalid("renew_deadline must be greater than retry_period*1.2");
  }
  if (config.lock == nullptr) return invalid("lock must not be null");
  if (config.lock->Identity().empty()) return invalid("lock identity must not be empty");
  if (!config.callbacks.on_started_leading) {
    return invalid("callbacks.on_started_leading must be set");
  }
  if (!config.callbacks.on_stopped_leading) {
    return invalid("callbacks.on_stopped_leading must be set");
  }
  if (config.clock == nullptr) return invalid("clock must not be null");
  return std::unique_ptr<LeaderElector>(new LeaderElector(std::move(config)));
}

LeaderElector::LeaderElector(Config config)
    : config_(std::move(config)), identity_(config_.lock->Identity()) {
  if (config_.registry != nullptr) {
    prometheus::Labels labels = {{"lease", config_.lock->Describe()}};
    leading_gauge_ = &prometheus::BuildGauge()
                          .Name("shardcache_leader_election_leading")
                          .Help("1 while this replica leads the lease, else 0")
                          .Register(*config_.registry)
                          .Add(labels);
    terms_counter_ = &prometheus::BuildCounter()
                          .Name("shardcache_leader_election_terms_total")
                          .Help("Leadership terms this replica has started")
                          .Register(*config_.registry)
                          .Add(labels);
  }
}

LeaderElector::~LeaderElector() { Stop(); }

bool LeaderElector::IsLeader() const {
  absl::MutexLock l(&mu_);
  return leading_;
}

std::string LeaderElector::GetLeader() const {
  absl::MutexLock l(&mu_);
  return observed_.holder_identity;
}

int64_t LeaderElector::Epoch() const {
  absl::MutexLock l(&mu_);
  return leading_ ? epoch_ : 0;
}

void LeaderElector::Run() {
  absl::MutexLock l(&mu_);
  if (running_ || stopping_) return;
  running_ = true;
  loop_thread_ = std::thread([this] { LoopThread(); });
  watchdog_thread_ = std::thread([this] { WatchdogThread(); });
}

void LeaderElector::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) {  // another Stop is under way or done: wait for it
      mu_.Await(absl::Condition(&stopped_));
      return;
    }
    stopping_ = true;
  }
  if (loop_thread_.joinable()) loop_thread_.join();
  if (watchdog_thread_.joinable()) watchdog_thread_.join();
  uint64_t term;
  bool leading;
  {
    absl::MutexLock l(&mu_);
    term = term_;
    leading = leading_;
  }
  if (leading) EndTerm(term, "the elector is stopping", /*clean=*/true);
  if (config_.release_on_cancel) Release();
  absl::MutexLock l(&mu_);
  stopped_ = true;
}

void LeaderElector::Step() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
  }
  CheckRenewDeadline();
  bool leading;
  int64_t epoch;
  uint64_t term;
  {
    absl::MutexLock l(&mu_);
    leading = leading_;
    epoch = epoch_;
    term = term_;
  }
  absl::Time start = config_.clock->Now();
  int64_t new_epoch = 0;
  switch (TryAcquireOrRenew(start, leading, epoch, &new_epoch)) {
    case Attempt::kRenewed: {
      absl::MutexLock l(&mu_);
      if (leading_ && term_ == term) last_renew_ = std::max(last_renew_, start);
      break;
    }
    case Attempt::kAcquired:
      BeginTerm(new_epoch, start);
      break;
    case Attempt::kLost:
      EndTerm(term, "the lease is no longer this replica's");
      break;
    case Attempt::kNone:
      break;
  }
  MaybeReportLeader();
  CheckRenewDeadline();
}

LeaderElector::Attempt LeaderElector::TryAcquireOrRenew(absl::Time now, bool leading, int64_t epoch,
                                                        int64_t* new_epoch) {
  ResourceLock& lock = *config_.lock;
  LeaderElectionRecord desired;
  desired.holder_identity = identity_;
  desired.lease_duration = config_.lease_duration;
  desired.acquire_time = now;
  desired.renew_time = now;

  // A leader renews from the record it wrote last, without reading first (one call); the
  // resourceVersion precondition makes that safe. On a conflict it reads below.
  if (leading) {
    LeaderElectionRecord last;
    {
      absl::MutexLock l(&mu_);
      last = observed_;
    }
    if (last.holder_identity == identity_ && last.leader_transitions == epoch) {
      desired.acquire_time = last.acquire_time;
      desired.leader_transitions = epoch;
      absl::StatusOr<std::string> version = lock.Update(desired);
      if (version.ok()) {
        Observe(ObservedRecord{desired, *version});
        return Attempt::kRenewed;
      }
      if (version.status().code() != absl::StatusCode::kAborted &&
          version.status().code() != absl::StatusCode::kNotFound) {
        spdlog::warn("{}: {} failed to renew: {}", lock.Describe(), identity_,
                     version.status().ToString());
        return Attempt::kNone;
      }
    }
  }

  absl::StatusOr<ObservedRecord> got = lock.Get();
  if (!got.ok()) {
    if (got.status().code() != absl::StatusCode::kNotFound) {
      spdlog::warn("{}: {} failed to read the lease: {}", lock.Describe(), identity_,
                   got.status().ToString());
      return Attempt::kNone;
    }
    if (leading) return Attempt::kLost;  // the lease object is gone
    {
      absl::MutexLock l(&mu_);
      desired.leader_transitions = max_transitions_seen_ + 1;
    }
    absl::StatusOr<std::string> version = lock.Create(desired);
    if (!version.ok()) {
      spdlog::info("{}: {} failed to create the lease: {}", lock.Describe(), identity_,
                   version.status().ToString());
      return Attempt::kNone;
    }
    Observe(ObservedRecord{desired, *version});
    *new_epoch = desired.leader_transitions;
    return Attempt::kAcquired;
  }

  Observe(*got);
  const LeaderElectionRecord& current = got->record;
  bool ours = current.holder_identity == identity_;
  if (leading) {
    // Still ours only if nobody started a term since ours (same identity, same epoch).
    if (!ours || current.leader_transitions != epoch) return Attempt::kLost;
    desired.acquire_time = current.acquire_time;
    desired.leader_transitions = epoch;
    absl::StatusOr<std::string> version = lock.Update(desired);
    if (!version.ok()) {
      spdlog::warn("{}: {} failed to renew: {}", lock.Describe(), identity_,
                   version.status().ToString());
      return Attempt::kNone;
    }
    Observe(ObservedRecord{desired, *version});
    return Attempt::kRenewed;
  }

  if (!current.holder_identity.empty() && !ours) {
    absl::MutexLock l(&mu_);
    // Valid while its version, as first seen here, is younger than its duration.
    if (observed_time_ + current.lease_duration > config_.clock->Now()) return Attempt::kNone;
  }
  // A new term: free, expired, or ours from a term that has ended (e.g. before a restart).
  desired.leader_transitions = current.leader_transitions + 1;
  absl::StatusOr<std::string> version = lock.Update(desired);
  if (!version.ok()) {
    spdlog::info("{}: {} failed to acquire: {}", lock.Describe(), identity_,
                 version.status().ToString());
    return Attempt::kNone;
  }
  Observe(ObservedRecord{desired, *version});
  *new_epoch = desired.leader_transitions;
  return Attempt::kAcquired;
}

void LeaderElector::Observe(const ObservedRecord& observed) {
  absl::Time now = config_.clock->Now();
  absl::MutexLock l(&mu_);
  if (!have_observed_ || observed.resource_version != observed_version_) observed_time_ = now;
  have_observed_ = true;
  observed_ = observed.record;
  observed_version_ = observed.resource_version;
  max_transitions_seen_ = std::max(max_transitions_seen_, observed.record.leader_transitions);
}

void LeaderElector::MaybeReportLeader() {
  std::string holder;
  {
    absl::MutexLock l(&mu_);
    if (!have_observed_) return;
    holder = observed_.holder_identity;
  }
  absl::MutexLock cl(&callback_mu_);
  if (holder == reported_leader_) return;
  reported_leader_ = holder;
  if (config_.callbacks.on_new_leader) config_.callbacks.on_new_leader(holder);
}

void LeaderElector::BeginTerm(int64_t epoch, absl::Time renewed) {
  std::unique_ptr<CancellationToken> token;
  {
    absl::MutexLock l(&mu_);
    // The previous term's on_stopped_leading comes first.
    mu_.Await(absl::Condition(this, &LeaderElector::NoStopPending));
    if (stopping_) return;  // Stop() releases the lease
  }
  absl::MutexLock cl(&callback_mu_);
  {
    absl::MutexLock l(&mu_);
    leading_ = true;
    ++term_;
    epoch_ = epoch;
    last_renew_ = renewed;
    cancellation_ = std::make_unique<CancellationSource>();
    token = std::make_unique<CancellationToken>(cancellation_->Token());
  }
  spdlog::info("{}: {} started leading (epoch {})", config_.lock->Describe(), identity_, epoch);
  config_.callbacks.on_started_leading(LeadingContext{epoch, *token});
  // After the callback, so that what it publishes (e.g. the epoch) is there when the gauge is 1.
  if (terms_counter_ != nullptr) terms_counter_->Increment();
  if (leading_gauge_ != nullptr) leading_gauge_->Set(1);
}

bool LeaderElector::EndTerm(uint64_t term, absl::string_view why, bool clean) {
  std::unique_ptr<CancellationSource> cancellation;
  int64_t epoch;
  {
    absl::MutexLock l(&mu_);
    if (!leading_ || term_ != term) return false;
    leading_ = false;
    epoch = epoch_;
    epoch_ = 0;
    cancellation = std::move(cancellation_);
    ++stops_pending_;
  }
  // A term that its replica ends on purpose (shutdown, handover) is news; one that is lost is a
  // warning.
  spdlog::log(clean ? spdlog::level::info : spdlog::level::warn,
              "{}: {} stopped leading (epoch {}): {}", config_.lock->Describe(), identity_, epoch,
              std::string(why));
  cancellation->Cancel();
  {
    absl::MutexLock cl(&callback_mu_);
    config_.callbacks.on_stopped_leading();
  }
  // Only now: whoever sees the gauge at 0 knows the term's work has stopped.
  if (leading_gauge_ != nullptr) leading_gauge_->Set(0);
  absl::MutexLock l(&mu_);
  --stops_pending_;
  return true;
}

void LeaderElector::Resign(int64_t epoch, absl::string_view why) {
  absl::MutexLock l(&mu_);
  if (!leading_ || epoch_ != epoch || resign_epoch_ == epoch) return;
  resign_epoch_ = epoch;
  resign_reason_ = std::string(why);
}

void LeaderElector::CheckRenewDeadline() {
  uint64_t term;
  std::string why;
  {
    absl::MutexLock l(&mu_);
    if (!leading_) return;
    if (resign_epoch_ == epoch_) {
      why = absl::StrCat("resigned: ", resign_reason_);
    } else if (config_.clock->Now() < last_renew_ + config_.renew_deadline) {
      return;
    } else {
      why =
          absl::StrCat("no successful renewal for ", absl::FormatDuration(config_.renew_deadline));
    }
    term = term_;
  }
  EndTerm(term, why);
}

void LeaderElector::Release() {
  LeaderElectionRecord record;
  {
    absl::MutexLock l(&mu_);
    if (!have_observed_ || observed_.holder_identity != identity_) return;
    record.leader_transitions = observed_.leader_transitions;
  }
  absl::Time now = config_.clock->Now();
  record.lease_duration = absl::Seconds(1);
  record.acquire_time = now;
  record.renew_time = now;
  absl::StatusOr<std::string> version = config_.lock->Update(record);
  if (!version.ok()) {
    spdlog::warn("{}: {} failed to release the lease: {}", config_.lock->Describe(), identity_,
                 version.status().ToString());
    return;
  }
  Observe(ObservedRecord{record, *version});
  spdlog::info("{}: {} released the lease", config_.lock->Describe(), identity_);
}

void LeaderElector::LoopThread() {
  while (true) {
    Step();
    absl::Duration wait = IsLeader() ? config_.retry_period : JitteredRetryPeriod();
    if (!WaitUntil(config_.clock->Now() + wait)) return;
  }
}

void LeaderElector::WatchdogThread() {
  const Clock* clock = config_.clock;
  mu_.Lock();
  while (!stopping_) {
    if (!leading_) {
      clock->AwaitWithDeadline(&mu_, absl::Condition(this, &LeaderElector::StoppingOrLeading),
                               absl::InfiniteFuture());
      continue;
    }
    // Woken at the renew deadline of the last renewal seen when it started to wait (a renewal
    // meanwhile moves the deadline: it then waits again), or at once by Stop or Resign.
    clock->AwaitWithDeadline(&mu_, absl::Condition(this, &LeaderElector::StoppingOrResigning),
                             last_renew_ + config_.renew_deadline);
    if (stopping_) break;
    mu_.Unlock();
    CheckRenewDeadline();
    mu_.Lock();
  }
  mu_.Unlock();
}

bool LeaderElector::WaitUntil(absl::Time t) {
  absl::MutexLock l(&mu_);
  config_.clock->AwaitWithDeadline(&mu_, absl::Condition(&stopping_), t);
  return !stopping_;
}

absl::Duration LeaderElector::JitteredRetryPeriod() {
  absl::MutexLock l(&mu_);
  return config_.retry_period * (1.0 - absl::Uniform(rng_, 0.0, 0.2));
}

}  // namespace shardcache
