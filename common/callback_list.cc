#include "common/callback_list.h"

#include <algorithm>

namespace shardcache {

// ---- Subscription ----

Subscription::Subscription(Subscription&& other) noexcept
    : core_(std::move(other.core_)), id_(std::exchange(other.id_, 0)) {}

Subscription& Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    Cancel();
    core_ = std::move(other.core_);  // leaves other's empty
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void Subscription::Cancel() {
  std::weak_ptr<internal::CallbackListCore> weak = std::move(core_);  // leaves core_ empty
  Id id = std::exchange(id_, 0);
  if (id == 0) return;
  // Gone: the list and every Notify or Close of it have ended, so the callback is not running.
  if (std::shared_ptr<internal::CallbackListCore> core = weak.lock()) core->Remove(id);
}

Subscription::Id Subscription::Release() {
  core_.reset();
  return std::exchange(id_, 0);
}

namespace internal {

// ---- CallbackListCore ----

uint64_t CallbackListCore::Add(InvokerRef invoker, std::shared_ptr<const void>* closed_values) {
  absl::MutexLock l(&mu_);
  if (closed_) {
    *closed_values = closed_values_;
    return 0;
  }
  uint64_t id = next_id_++;
  callbacks_.emplace(id, std::move(invoker));
  return id;
}

void CallbackListCore::Remove(uint64_t id) {
  if (id == 0) return;
  InvokerRef removed;  // destroyed (with what the callback holds) after the lock is released
  absl::MutexLock l(&mu_);
  if (auto it = callbacks_.find(id); it != callbacks_.end()) {
    removed = std::move(it->second);
    callbacks_.erase(it);
  }
  // No call of `id` starts from now on. Wait for those in progress, but on this thread: from
  // inside the callback, the call in progress is the caller itself.
  const std::thread::id self = std::this_thread::get_id();
  auto done = [this, id, self]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::none_of(running_.begin(), running_.end(),
                        [&](const Call& c) { return c.id == id && c.thread != self; });
  };
  mu_.Await(absl::Condition(&done));
}

void CallbackListCore::Notify(const void* args) {
  absl::MutexLock l(&mu_);
  const uint64_t end = next_id_;  // those added from now on wait for the next Notify
  uint64_t last = 0;
  while (true) {
    auto it = callbacks_.upper_bound(last);
    if (it == callbacks_.end() || it->first >= end) return;
    last = it->first;
    CallLocked(it->first, it->second, args);
  }
}

bool CallbackListCore::NotifyOne(uint64_t id, const void* args) {
  absl::MutexLock l(&mu_);
  auto it = callbacks_.find(id);
  if (it == callbacks_.end()) return false;
  CallLocked(id, it->second, args);
  return true;
}

bool CallbackListCore::Close(std::shared_ptr<const void> values, const void* args) {
  absl::MutexLock l(&mu_);
  if (closed_) return false;
  closed_ = true;
  closed_values_ = std::move(values);
  while (!callbacks_.empty()) {
    auto it = callbacks_.begin();
    uint64_t id = it->first;
    InvokerRef invoker = std::move(it->second);
    callbacks_.erase(it);  // once: a Remove from now on finds it running, or done
    CallLocked(id, std::move(invoker), args);
  }
  return true;
}

void CallbackListCore::CallLocked(uint64_t id, InvokerRef invoker, const void* args) {
  const std::thread::id self = std::this_thread::get_id();
  running_.push_back(Call{id, self});
  mu_.Unlock();
  (*invoker)(args);
  invoker.reset();  // what the callback holds goes without the lock, if it was removed meanwhile
  mu_.Lock();
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const Call& c) { return c.id == id && c.thread == self; });
  running_.erase(it);  // wakes a Remove waiting for this call
}

}  // namespace internal
}  // namespace shardcache
