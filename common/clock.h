// Clock: the source of "now" for everything timing-sensitive, so that tests can control time.
//
// RealClock reads the system clock. FakeClock only moves when a test calls Advance or Set.
// Both are thread-safe.
#ifndef SHARDCACHE_COMMON_CLOCK_H_
#define SHARDCACHE_COMMON_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardcache {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  // A process-wide instance; never destroyed.
  static RealClock* Get() {
    static RealClock* clock = new RealClock();
    return clock;
  }
};

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) {
    absl::MutexLock l(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLOCK_H_
