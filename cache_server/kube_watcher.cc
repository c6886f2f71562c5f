// KubeWatcher: see kube_watcher.h.
#include "cache_server/kube_watcher.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcache {

void KubeWatcher::Init(WatchSpec spec,
                       std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial) {
  spec_ = std::move(spec);
  absl::MutexLock l(&mu_);
  if (ended_.has_value()) return;  // cancelled already
  for (auto& item : initial) initial_.push_back(std::move(item));
}

bool KubeWatcher::Deliver(const Delivery& delivery) {
  absl::MutexLock l(&mu_);
  if (ended_.has_value()) return true;  // ending: dropped
  if (FullLocked()) {
    // Parked by the fan-out: it catches this watcher up from the history once it has room.
    CheckStalledLocked(options_.clock->Now());
    return false;
  }
  size_t bytes = delivery.encoded.size();
  live_.push_back(Live{delivery.type, delivery.object, bytes});
  live_bytes_ += bytes;
  return true;
}

bool KubeWatcher::HasRoom() const {
  absl::MutexLock l(&mu_);
  return ended_.has_value() || !FullLocked(2);
}

void KubeWatcher::Flush() {
  absl::MutexLock l(&mu_);
  // One wake-up per run of events, and none for a taker that is busy writing.
  if (taker_waiting_ && ReadyLocked()) ready_.Signal();
}

void KubeWatcher::Bookmark(int64_t revision) {
  absl::MutexLock l(&mu_);
  // A bookmark only helps a watcher with nothing else to receive.
  if (ended_.has_value() || !live_.empty() || !initial_.empty()) return;
  auto bookmark = std::make_shared<v1::Object>();
  bookmark->mutable_metadata()->set_resource_version(absl::StrCat(revision));
  live_.push_back(Live{v1::WatchEvent::BOOKMARK, std::move(bookmark), 0});
  if (taker_waiting_) ready_.Signal();
}

void KubeWatcher::Sweep(absl::Time now) {
  absl::MutexLock l(&mu_);
  if (!ended_.has_value() && FullLocked()) CheckStalledLocked(now);
}

void KubeWatcher::End(const absl::Status& status) {
  absl::MutexLock l(&mu_);
  // Shutting down: do not hold the server up for a slow reader.
  EndLocked(status, status.code() == absl::StatusCode::kUnavailable);
}

void KubeWatcher::Cancel(const absl::Status& why) {
  absl::MutexLock l(&mu_);
  EndLocked(why, true);
}

KubeWatcher::Taken KubeWatcher::Take(absl::Time deadline) {
  Taken taken;
  absl::MutexLock l(&mu_);
  taker_waiting_ = true;
  while (!ReadyLocked() && !ready_.WaitWithDeadline(&mu_, deadline)) {
  }
  taker_waiting_ = false;
  while (!initial_.empty() && taken.events.size() < options_.max_take) {
    taken.events.push_back(std::move(initial_.front()));
    initial_.pop_front();
  }
  // A bounded piece of the live queue, so that what the connection's thread holds while it
  // writes stays within the watcher's bound too.
  const size_t take_bytes = std::min(kMaxTakeBytes, options_.max_queue_bytes / 2);
  size_t bytes = 0;
  while (!live_.empty() && taken.events.size() < options_.max_take &&
         (taken.events.empty() || bytes + live_.front().bytes <= take_bytes)) {
    Live& e = live_.front();
    bytes += e.bytes;
    taken.events.emplace_back(e.type, std::move(e.object));
    live_bytes_ -= e.bytes;
    live_.pop_front();
  }
  if (initial_.empty() && live_.empty()) taken.ended = ended_;
  last_take_ = options_.clock->Now();
  return taken;
}

void KubeWatcher::EndLocked(const absl::Status& status, bool drop) {
  if (ended_.has_value()) return;
  ended_ = status;
  if (drop) {
    initial_.clear();
    live_.clear();
    live_bytes_ = 0;
  }
  ready_.Signal();
}

bool KubeWatcher::FullLocked(size_t divisor) const {
  return live_bytes_ >= options_.max_queue_bytes / divisor;
}

void KubeWatcher::CheckStalledLocked(absl::Time now) {
  if (now - last_take_ < options_.stall_timeout) return;
  size_t bytes = live_bytes_, events = live_.size();
  if (options_.metrics != nullptr) options_.metrics->watchers_too_slow.Increment();
  EndLocked(absl::ResourceExhaustedError(absl::StrCat(
                "watcher too slow: its client has read nothing for ",
                absl::FormatDuration(now - last_take_), " while ", events, " events (", bytes,
                " bytes) were waiting to be sent; watch again from the last resourceVersion "
                "received, or list again")),
            true);
}

bool KubeWatcher::ReadyLocked() const {
  return !initial_.empty() || !live_.empty() || ended_.has_value();
}

}  // namespace shardcache
