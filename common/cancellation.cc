#include "common/cancellation.h"

#include <atomic>
#include <utility>

#include "absl/synchronization/notification.h"
#include "common/callback_list.h"

namespace shardcache {

namespace internal {

struct CancellationState {
  // Set once, by the Cancel that notifies, before `cancelled` and the callbacks.
  std::atomic<bool> cancelling{false};
  absl::Notification cancelled;
  // Closed by that Cancel, after `cancelled` is notified.
  CallbackList<> callbacks;
};

}  // namespace internal

bool CancellationToken::Cancelled() const { return state_->cancelled.HasBeenNotified(); }

bool CancellationToken::WaitForCancellation(absl::Time deadline) const {
  return state_->cancelled.WaitForNotificationWithDeadline(deadline);
}

CancellationToken::CallbackId CancellationToken::OnCancelled(std::function<void()> f) const {
  if (Cancelled()) {  // the list may not be closed yet: do not hand `f` to the cancelling thread
    f();
    return 0;
  }
  // 0 when the list was closed meanwhile: then Add ran `f` at once.
  return state_->callbacks.Add(std::move(f)).Release();
}

void CancellationToken::RemoveCallback(CallbackId id) const { state_->callbacks.Remove(id); }

CancellationSource::CancellationSource()
    : state_(std::make_shared<internal::CancellationState>()) {}

void CancellationSource::Cancel() {
  internal::CancellationState& s = *state_;
  if (s.cancelling.exchange(true)) return;
  s.cancelled.Notify();
  s.callbacks.Close();
}

}  // namespace shardcache
