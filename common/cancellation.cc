#include "common/cancellation.h"

#include <map>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace shardcache {

namespace internal {

struct CancellationState {
  absl::Notification cancelled;
  absl::Mutex mu;
  bool cancelling ABSL_GUARDED_BY(mu) = false;
  CancellationToken::CallbackId next_id ABSL_GUARDED_BY(mu) = 1;
  std::map<CancellationToken::CallbackId, std::function<void()>> callbacks ABSL_GUARDED_BY(mu);
  // The callback that Cancel is running now (0: none), and on which thread.
  CancellationToken::CallbackId running ABSL_GUARDED_BY(mu) = 0;
  std::thread::id running_thread ABSL_GUARDED_BY(mu);
};

}  // namespace internal

bool CancellationToken::Cancelled() const { return state_->cancelled.HasBeenNotified(); }

bool CancellationToken::WaitForCancellation(absl::Time deadline) const {
  return state_->cancelled.WaitForNotificationWithDeadline(deadline);
}

CancellationToken::CallbackId CancellationToken::OnCancelled(std::function<void()> f) const {
  {
    absl::MutexLock l(&state_->mu);
    if (!state_->cancelling) {
      CallbackId id = state_->next_id++;
      state_->callbacks.emplace(id, std::move(f));
      return id;
    }
  }
  f();
  return 0;
}

void CancellationToken::RemoveCallback(CallbackId id) const {
  if (id == 0) return;  // OnCancelled ran it at once: nothing registered, nothing running
  internal::CancellationState& s = *state_;
  absl::MutexLock l(&s.mu);
  if (s.callbacks.erase(id) > 0) return;
  if (s.running == id && s.running_thread != std::this_thread::get_id()) {
    auto done = [&s, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return s.running != id; };
    s.mu.Await(absl::Condition(&done));
  }
}

CancellationSource::CancellationSource()
    : state_(std::make_shared<internal::CancellationState>()) {}

void CancellationSource::Cancel() {
  internal::CancellationState& s = *state_;
  {
    absl::MutexLock l(&s.mu);
    if (s.cancelling) return;
    s.cancelling = true;
  }
  s.cancelled.Notify();
  while (true) {
    std::function<void()> f;
    {
      absl::MutexLock l(&s.mu);
      s.running = 0;
      if (s.callbacks.empty()) return;
      auto it = s.callbacks.begin();
      s.running = it->first;
      s.running_thread = std::this_thread::get_id();
      f = std::move(it->second);
      s.callbacks.erase(it);
    }
    f();
  }
}

}  // namespace shardcache
