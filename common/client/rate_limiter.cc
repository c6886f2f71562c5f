#include "common/client/rate_limiter.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "common/status_macros.h"

namespace shardcache {

absl::StatusOr<std::unique_ptr<ItemExponentialFailureRateLimiter>>
ItemExponentialFailureRateLimiter::Create(Options options) {
  if (options.base_delay <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("rate limiter: base_delay must be positive");
  }
  if (options.max_delay < options.base_delay) {
    return absl::InvalidArgumentError("rate limiter: max_delay must be >= base_delay");
  }
  return std::unique_ptr<ItemExponentialFailureRateLimiter>(
      new ItemExponentialFailureRateLimiter(options));
}

absl::Duration ItemExponentialFailureRateLimiter::When(const std::string& key) {
  int exponent;
  {
    absl::MutexLock l(&mu_);
    int& failures = failures_[key];
    exponent = failures;
    if (failures < INT_MAX) ++failures;
  }
  // In double nanoseconds, so that a large exponent saturates instead of overflowing.
  double delay_ns = absl::ToDoubleNanoseconds(options_.base_delay) * std::ldexp(1.0, exponent);
  if (!(delay_ns < absl::ToDoubleNanoseconds(options_.max_delay))) return options_.max_delay;
  return absl::Nanoseconds(static_cast<int64_t>(delay_ns));
}

void ItemExponentialFailureRateLimiter::Forget(const std::string& key) {
  absl::MutexLock l(&mu_);
  failures_.erase(key);
}

int ItemExponentialFailureRateLimiter::NumRequeues(const std::string& key) {
  absl::MutexLock l(&mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

absl::StatusOr<std::unique_ptr<BucketRateLimiter>> BucketRateLimiter::Create(Options options,
                                                                             const Clock* clock) {
  if (!(options.qps > 0) || std::isinf(options.qps)) {
    return absl::InvalidArgumentError("rate limiter: qps must be positive and finite");
  }
  if (options.burst < 1) return absl::InvalidArgumentError("rate limiter: burst must be >= 1");
  if (clock == nullptr) return absl::InvalidArgumentError("rate limiter: clock is null");
  return std::unique_ptr<BucketRateLimiter>(new BucketRateLimiter(options, clock));
}

BucketRateLimiter::BucketRateLimiter(Options options, const Clock* clock)
    : options_(options), clock_(clock), tokens_(options.burst), last_(clock->Now()) {}

absl::Duration BucketRateLimiter::When(const std::string&) {
  absl::MutexLock l(&mu_);
  absl::Time now = clock_->Now();
  if (now > last_) {
    tokens_ = std::min<double>(options_.burst,
                               tokens_ + absl::ToDoubleSeconds(now - last_) * options_.qps);
  }
  last_ = now;
  tokens_ -= 1;
  if (tokens_ >= 0) return absl::ZeroDuration();
  // Rounded to whole nanoseconds, so that 1 token at 10 qps is exactly 100 ms.
  return absl::Nanoseconds(std::llround(-tokens_ / options_.qps * 1e9));
}

absl::StatusOr<std::unique_ptr<MaxOfRateLimiter>> MaxOfRateLimiter::Create(
    std::vector<std::unique_ptr<RateLimiter>> limiters) {
  if (limiters.empty()) return absl::InvalidArgumentError("rate limiter: no limiters to combine");
  for (const auto& limiter : limiters) {
    if (limiter == nullptr) return absl::InvalidArgumentError("rate limiter: null limiter");
  }
  return std::unique_ptr<MaxOfRateLimiter>(new MaxOfRateLimiter(std::move(limiters)));
}

absl::Duration MaxOfRateLimiter::When(const std::string& key) {
  absl::Duration longest = absl::ZeroDuration();
  // Every limiter is asked, so that each one counts the failure (or spends its token).
  for (const auto& limiter : limiters_) longest = std::max(longest, limiter->When(key));
  return longest;
}

void MaxOfRateLimiter::Forget(const std::string& key) {
  for (const auto& limiter : limiters_) limiter->Forget(key);
}

int MaxOfRateLimiter::NumRequeues(const std::string& key) {
  int most = 0;
  for (const auto& limiter : limiters_) most = std::max(most, limiter->NumRequeues(key));
  return most;
}

absl::StatusOr<std::unique_ptr<RateLimiter>> NewControllerRateLimiter(
    const ControllerRateLimiterOptions& options, const Clock* clock) {
  ASSIGN_OR_RETURN(auto per_key, ItemExponentialFailureRateLimiter::Create(options.per_key));
  ASSIGN_OR_RETURN(auto overall, BucketRateLimiter::Create(options.overall, clock));
  std::vector<std::unique_ptr<RateLimiter>> limiters;
  limiters.push_back(std::move(per_key));
  limiters.push_back(std::move(overall));
  ASSIGN_OR_RETURN(auto max_of, MaxOfRateLimiter::Create(std::move(limiters)));
  return std::unique_ptr<RateLimiter>(std::move(max_of));
}

std::unique_ptr<RateLimiter> DefaultControllerRateLimiter(const Clock* clock) {
  auto limiter = NewControllerRateLimiter(ControllerRateLimiterOptions(), clock);
  // Only a null clock can fail here, which the REQUIRES rules out.
  if (!limiter.ok()) std::abort();
  return *std::move(limiter);
}

}  // namespace shardcache
