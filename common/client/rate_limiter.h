// RateLimiter: how long a work queue key waits before it is retried (client-go's
// util/workqueue/default_rate_limiters.go, typed).
//
//   auto limiter = DefaultControllerRateLimiter(RealClock::Get());
//   queue->AddAfter(key, limiter->When(key));   // a failure: wait longer each time
//   limiter->Forget(key);                       // a success: start over next time
//
// Implementations:
//   ItemExponentialFailureRateLimiter  per key: base, 2*base, 4*base, ... capped at max.
//   BucketRateLimiter                  overall: a token bucket (qps, burst), as
//                                      golang.org/x/time/rate's Reserve().Delay().
//   MaxOfRateLimiter                   the largest delay of several limiters.
//   NewControllerRateLimiter           max(per key 5 ms..1000 s, overall 10/s burst 100).
//
// Every limiter here is thread-safe: any thread may call any method at any time.
// Per-key state (failure counts) lives until Forget(key): callers Forget every key they are done
// with, or the state grows with the number of distinct keys.
#ifndef SHARDCACHE_COMMON_CLIENT_RATE_LIMITER_H_
#define SHARDCACHE_COMMON_CLIENT_RATE_LIMITER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shardcache {

class RateLimiter {
 public:
  virtual ~RateLimiter() = default;

  // How long `key` waits before it may be processed again. Counts one failure of `key` (the
  // per-key limiters) or reserves one token (the bucket). Never negative.
  virtual absl::Duration When(const std::string& key) = 0;
  // `key` succeeded (or was given up on): forget its failures. Tokens already reserved stay spent.
  virtual void Forget(const std::string& key) = 0;
  // The failures of `key` counted since it was last forgotten.
  virtual int NumRequeues(const std::string& key) = 0;
};

// Per key: base_delay * 2^failures, capped at max_delay.
class ItemExponentialFailureRateLimiter : public RateLimiter {
 public:
  struct Options {
    absl::Duration base_delay = absl::Milliseconds(5);  // the first delay (> 0)
    absl::Duration max_delay = absl::Seconds(1000);     // the largest delay (>= base_delay)
  };

  // INVALID_ARGUMENT for options that break the rules above.
  static absl::StatusOr<std::unique_ptr<ItemExponentialFailureRateLimiter>> Create(Options options);

  absl::Duration When(const std::string& key) override ABSL_LOCKS_EXCLUDED(mu_);
  void Forget(const std::string& key) override ABSL_LOCKS_EXCLUDED(mu_);
  int NumRequeues(const std::string& key) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit ItemExponentialFailureRateLimiter(Options options) : options_(options) {}

  const Options options_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> failures_ ABSL_GUARDED_BY(mu_);
};

// Overall: a token bucket that holds up to `burst` tokens and refills at `qps` per second. When()
// takes a token now if one is there (delay zero), else reserves the next one to come and returns
// how long until it arrives; later callers queue behind it. Keys are ignored. Time comes from the
// Clock, so tests control it.
class BucketRateLimiter : public RateLimiter {
 public:
  struct Options {
    double qps = 10;  // tokens added per second (> 0)
    int burst = 100;  // bucket size, and the tokens it starts with (>= 1)
  };

  // INVALID_ARGUMENT for options that break the rules above or a null clock. The clock must
  // outlive the limiter.
  static absl::StatusOr<std::unique_ptr<BucketRateLimiter>> Create(Options options,
                                                                   const Clock* clock);

  absl::Duration When(const std::string& key) override ABSL_LOCKS_EXCLUDED(mu_);
  void Forget(const std::string&) override {}
  int NumRequeues(const std::string&) override { return 0; }

 private:
  BucketRateLimiter(Options options, const Clock* clock);

  const Options options_;
  const Clock* const clock_;

  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);    // negative: tokens reserved ahead of time
  absl::Time last_ ABSL_GUARDED_BY(mu_);  // when tokens_ was last brought up to date
};

// The largest delay (and requeue count) of several limiters. When() and Forget() go to all.
class MaxOfRateLimiter : public RateLimiter {
 public:
  // INVALID_ARGUMENT if `limiters` is empty or holds a null.
  static absl::StatusOr<std::unique_ptr<MaxOfRateLimiter>> Create(
      std::vector<std::unique_ptr<RateLimiter>> limiters);

  absl::Duration When(const std::string& key) override;
  void Forget(const std::string& key) override;
  int NumRequeues(const std::string& key) override;

 private:
  explicit MaxOfRateLimiter(std::vector<std::unique_ptr<RateLimiter>> limiters)
      : limiters_(std::move(limiters)) {}

  // Constant after construction; each limiter provides its own synchronization.
  const std::vector<std::unique_ptr<RateLimiter>> limiters_;
};

// A controller's limiter: the max of a per-key exponential backoff and an overall token bucket.
struct ControllerRateLimiterOptions {
  ItemExponentialFailureRateLimiter::Options per_key;  // default 5 ms doubling to 1000 s
  BucketRateLimiter::Options overall;                  // default 10 per second, burst 100
};

// INVALID_ARGUMENT if any part of the options is invalid, or the clock is null.
absl::StatusOr<std::unique_ptr<RateLimiter>> NewControllerRateLimiter(
    const ControllerRateLimiterOptions& options, const Clock* clock);

// NewControllerRateLimiter with the default options (client-go's DefaultControllerRateLimiter).
// REQUIRES: clock is not null and outlives the limiter.
std::unique_ptr<RateLimiter> DefaultControllerRateLimiter(const Clock* clock);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_RATE_LIMITER_H_
