// Backoff: exponential backoff with jitter, reset after a healthy period (client-go's
// wait.Backoff plus the reflector's "reset after a stable period").
//
//   Backoff b(Backoff::Options{...}, clock);
//   absl::Duration d = b.Next();   // the delay before the next attempt (grows each call)
//   b.Succeeded();                 // a healthy attempt started now: after options.reset_after
//                                  // without a failure, Next() starts over from initial
//
// The delays are initial * factor^n, capped at max, each multiplied by a random factor in
// [1, 1 + jitter]. Time comes from a Clock, so tests control it.
//
// Thread-compatible: one owner calls it (e.g. a reflector's loop).
#ifndef SHARDCACHE_COMMON_BACKOFF_H_
#define SHARDCACHE_COMMON_BACKOFF_H_

#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shardcache {

class Backoff {
 public:
  struct Options {
    absl::Duration initial = absl::Milliseconds(800);  // the first delay
    double factor = 2.0;                               // growth per failure (>= 1)
    absl::Duration max = absl::Seconds(30);            // the largest delay (before jitter)
    double jitter = 1.0;                               // up to +100%
    // After this long since Succeeded() without a Next(), the next delay is `initial` again.
    absl::Duration reset_after = absl::Minutes(2);
  };

  // Validates the options: initial > 0, factor >= 1, max >= initial, jitter >= 0.
  static absl::StatusOr<Backoff> Create(Options options, const Clock* clock);

  // The delay before the next attempt.
  absl::Duration Next();
  // An attempt succeeded now (e.g. a watch was established).
  void Succeeded();
  // Forget all failures: the next delay is `initial`.
  void Reset();

 private:
  Backoff(Options options, const Clock* clock) : options_(options), clock_(clock) {}

  Options options_;
  const Clock* clock_;
  absl::BitGen rng_;
  absl::Duration current_ = absl::ZeroDuration();  // zero: no failure since the last reset
  absl::Time healthy_since_ = absl::InfiniteFuture();
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_BACKOFF_H_
