#include "common/backoff.h"

#include <algorithm>

namespace shardcache {

absl::StatusOr<Backoff> Backoff::Create(Options options, const Clock* clock) {
  if (options.initial <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("backoff: initial must be positive");
  }
  if (options.factor < 1.0) return absl::InvalidArgumentError("backoff: factor must be >= 1");
  if (options.max < options.initial) {
    return absl::InvalidArgumentError("backoff: max must be >= initial");
  }
  if (options.jitter < 0) return absl::InvalidArgumentError("backoff: jitter must be >= 0");
  return Backoff(options, clock);
}

absl::Duration Backoff::Next() {
  if (healthy_since_ != absl::InfiniteFuture() &&
      clock_->Now() - healthy_since_ >= options_.reset_after) {
    current_ = absl::ZeroDuration();
  }
  healthy_since_ = absl::InfiniteFuture();
  current_ = current_ == absl::ZeroDuration() ? options_.initial
                                              : std::min(options_.max, current_ * options_.factor);
  double spread = options_.jitter > 0 ? absl::Uniform(rng_, 0.0, options_.jitter) : 0.0;
  return current_ * (1.0 + spread);
}

void Backoff::Succeeded() { healthy_since_ = clock_->Now(); }

void Backoff::Reset() {
  current_ = absl::ZeroDuration();
  healthy_since_ = absl::InfiniteFuture();
}

}  // namespace shardcache
