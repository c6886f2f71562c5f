#include "cache_server/watch_cache.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace shardcache {

WatchCache::WatchCache(Options options, StoreMetrics* metrics)
    : options_(options), metrics_(metrics) {
  FanOut::Source* source = this;
  int n = std::max(1, options_.dispatchers);
  for (int i = 0; i < n; ++i) {
    Dispatcher::Options d;
    d.fan_out.bookmark_interval = options_.bookmark_interval;
    d.fan_out.clock = options_.clock;
    d.fan_out.count_changed = [this, i](int delta) {
      dispatchers_[i]->CountChanged(delta);
      CountChanged(delta);
    };
    d.max_queued_events = options_.max_queued_events;
    d.other_clock_poll_interval = options_.other_clock_poll_interval;
    d.release_idle_chunks = i == 0 ? &chunks_ : nullptr;
    dispatchers_.push_back(std::make_unique<Dispatcher>(std::move(d), source, metrics_));
  }
}

WatchCache::~WatchCache() {
  ShutdownCompletionQueues();
  dispatchers_.clear();
}

void WatchCache::SetHistory(const EventHistory* history) {
  absl::MutexLock l(&history_mu_);
  history_ = history;
}

absl::Status WatchCache::ReadHistory(const std::string& group_resource, int64_t after,
                                     int64_t up_to, size_t max_events, std::vector<EventPtr>* out) {
  absl::ReaderMutexLock l(&history_mu_);
  if (history_ == nullptr) return absl::OutOfRangeError("no history is kept");
  return history_->ReadHistory(group_resource, after, up_to, max_events, out);
}

EventFormsPtr WatchCache::Forms(const EventPtr& event) {
  {
    absl::MutexLock l(&forms_mu_);
    auto it = std::lower_bound(
        kept_forms_.begin(), kept_forms_.end(), event->revision,
        [](const KeptForms& k, int64_t rev) { return k.forms->event()->revision < rev; });
    if (it != kept_forms_.end() && it->forms->event()->revision == event->revision) {
      return it->forms;
    }
  }
  // Gone from the kept ones: encoded again, for this watcher alone.
  return std::make_shared<EventForms>(event, &chunks_);
}

void WatchCache::Publish(std::vector<EventPtr> events) {
  if (events.empty()) return;
  std::vector<Dispatcher::Item> items;
  items.reserve(events.size());
  for (EventPtr& e : events) {
    items.push_back(
        Dispatcher::Item::ForEvent(std::make_shared<EventForms>(std::move(e), &chunks_)));
  }
  {
    absl::MutexLock l(&forms_mu_);
    for (const Dispatcher::Item& item : items) {
      size_t bytes = item.forms->event()->object->ByteSizeLong();
      kept_forms_.push_back(KeptForms{item.forms, bytes});
      kept_forms_bytes_ += bytes;
    }
    while (!kept_forms_.empty() && (kept_forms_.size() > options_.kept_forms ||
                                    kept_forms_bytes_ > options_.kept_forms_bytes)) {
      kept_forms_bytes_ -= kept_forms_.front().bytes;
      kept_forms_.pop_front();
    }
  }
  for (auto& d : dispatchers_) d->Enqueue(items);
}

void WatchCache::PublishResourceGone(const std::string& group_resource, const std::string& version,
                                     int64_t revision, absl::Status status) {
  std::vector<Dispatcher::Item> items;
  items.push_back(
      Dispatcher::Item::ForResourceGone(group_resource, version, revision, std::move(status)));
  for (auto& d : dispatchers_) d->Enqueue(items);
}

void WatchCache::CountChanged(int delta) {
  int64_t total = watcher_count_.fetch_add(delta) + delta;
  metrics_->watchers.Set(static_cast<double>(total));
}

absl::Status WatchCache::Register(Watcher* watcher) {
  absl::MutexLock r(&reg_mu_);
  if (shutting_down_) return absl::UnavailableError("server shutting down");
  int best = watcher->pinned_dispatcher();
  if (best < 0 || best >= static_cast<int>(dispatchers_.size())) best = LeastLoadedDispatcher();
  registered_[watcher] = best;
  dispatchers_[best]->Add(watcher);
  CountChanged(1);
  return absl::OkStatus();
}

void WatchCache::Unregister(Watcher* watcher) {
  absl::MutexLock r(&reg_mu_);
  auto it = registered_.find(watcher);
  if (it == registered_.end()) return;
  int index = it->second;
  registered_.erase(it);
  // Not there any more when the fan-out ended it by itself (and counted it out then).
  if (dispatchers_[index]->Remove(watcher)) CountChanged(-1);
  // Releasing reg_mu_ wakes a Shutdown waiting for the count to reach zero.
}

size_t WatchCache::watcher_count() const { return static_cast<size_t>(watcher_count_.load()); }

size_t WatchCache::Shutdown(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock r(&reg_mu_);
  shutting_down_ = true;
  for (auto& d : dispatchers_) d->EndAll(absl::UnavailableError("server shutting down"));
  auto all_gone = [this]() { return watcher_count_.load() == 0; };
  // Unregister takes reg_mu_ after each removal, which re-evaluates the condition; watchers
  // ended by the fan-out itself do not, hence the bounded waits.
  while (!all_gone() && absl::Now() < deadline) {
    reg_mu_.AwaitWithDeadline(absl::Condition(&all_gone),
                              std::min(deadline, absl::Now() + absl::Milliseconds(50)));
  }
  return static_cast<size_t>(watcher_count_.load());
}

void WatchCache::StartCompletionQueues() {
  for (auto& d : dispatchers_) d->StartCompletionQueue();
}

void WatchCache::HoldCompletionQueues() {
  absl::MutexLock l(&holders_mu_);
  ++holders_;
}

void WatchCache::ReleaseCompletionQueues() {
  absl::MutexLock l(&holders_mu_);
  --holders_;
}

void WatchCache::ShutdownCompletionQueues() {
  {
    // No operation may be started on a queue once it is shut down (gRPC aborts): wait until the
    // streams that could start one are gone (after grpc::Server::Shutdown, each is cancelled and
    // ends as its dispatcher runs its completions).
    absl::MutexLock l(&holders_mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(holders_mu_) { return holders_ == 0; };
    holders_mu_.Await(absl::Condition(&none));
  }
  for (auto& d : dispatchers_) d->ShutdownCompletionQueue();
}

int WatchCache::LeastLoadedDispatcher() const {
  int best = 0;
  for (int i = 1; i < static_cast<int>(dispatchers_.size()); ++i) {
    if (dispatchers_[i]->count() < dispatchers_[best]->count()) best = i;
  }
  return best;
}

}  // namespace shardcache
