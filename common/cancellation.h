// CancellationToken and CancellationSource: telling work that something (a leadership term, a
// controller's run) has ended, by flag, by blocking wait, or by callback.
//
//   CancellationSource source;
//   StartWork(source.Token());   // the work checks Cancelled(), waits, or registers a callback
//   ...
//   source.Cancel();             // runs the registered callbacks on this thread, then returns
//
// Guarantees: Cancel is idempotent; each registered callback runs exactly once (on the thread
// that cancels, or at once on the registering thread when already cancelled); after
// RemoveCallback returns, its callback is not running and will not run, unless RemoveCallback is
// called from inside that callback: then it returns at once. That is CallbackList's rule
// (common/callback_list.h), which keeps the callbacks.
//
// Thread-safe: every method may be called from any thread. Copies of a token share its state.
#ifndef SHARDCACHE_COMMON_CANCELLATION_H_
#define SHARDCACHE_COMMON_CANCELLATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/time/time.h"

namespace shardcache {

namespace internal {
struct CancellationState;
}  // namespace internal

// Observes whether something (a leadership term) has ended. Copyable; copies share state.
// Thread-safe.
class CancellationToken {
 public:
  using CallbackId = uint64_t;

  bool Cancelled() const;
  // Blocks until cancelled or until `deadline` (real time, absl::Now()); returns Cancelled().
  bool WaitForCancellation(absl::Time deadline = absl::InfiniteFuture()) const;
  // Calls `f` once when cancelled: on the thread that cancels, or at once on this thread when
  // already cancelled (then returns 0).
  CallbackId OnCancelled(std::function<void()> f) const;
  // Unregisters a callback. When it is running on another thread, waits until it has returned;
  // afterwards it will not be called. Id 0 (the callback already ran) is a no-op.
  void RemoveCallback(CallbackId id) const;

 private:
  friend class CancellationSource;
  explicit CancellationToken(std::shared_ptr<internal::CancellationState> state)
      : state_(std::move(state)) {}
  std::shared_ptr<internal::CancellationState> state_;
};

// Owns the cancelling side of a CancellationToken. Thread-safe.
class CancellationSource {
 public:
  CancellationSource();
  CancellationToken Token() const { return CancellationToken(state_); }
  // Cancels (idempotent); runs the registered callbacks on this thread before returning.
  void Cancel();

 private:
  std::shared_ptr<internal::CancellationState> state_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CANCELLATION_H_
