#include "cache_server/watch_cache.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <optional>

namespace shardcache {

grpc::ByteBuffer EncodeWatchEvent(v1::WatchEvent::Type type, const v1::Object& object) {
  v1::WatchEvent event;
  event.set_type(type);
  *event.mutable_object() = object;
  grpc::ByteBuffer buffer;
  bool own = false;
  (void)grpc::SerializationTraits<v1::WatchEvent>::Serialize(event, &buffer, &own);
  return buffer;
}

ObjectPtr EffectiveObject(const Event& e, v1::WatchEvent::Type type) {
  if (type != v1::WatchEvent::DELETED || e.type != v1::WatchEvent::MODIFIED) return e.object;
  auto last = std::make_shared<v1::Object>(*e.prev);
  last->mutable_metadata()->set_resource_version(e.object->metadata().resource_version());
  return last;
}

v1::WatchEvent::Type EffectiveType(const Event& e, const ObjectFilter& filter) {
  bool now = filter.Matches(*e.object);
  bool before = e.prev != nullptr && filter.Matches(*e.prev);
  switch (e.type) {
    case v1::WatchEvent::ADDED:
      return now ? v1::WatchEvent::ADDED : v1::WatchEvent::TYPE_UNSPECIFIED;
    case v1::WatchEvent::MODIFIED:
      if (before && now) return v1::WatchEvent::MODIFIED;
      if (now) return v1::WatchEvent::ADDED;
      if (before) return v1::WatchEvent::DELETED;
      return v1::WatchEvent::TYPE_UNSPECIFIED;
    case v1::WatchEvent::DELETED:
      return (now || before) ? v1::WatchEvent::DELETED : v1::WatchEvent::TYPE_UNSPECIFIED;
    default:
      return v1::WatchEvent::TYPE_UNSPECIFIED;
  }
}

WatchCache::WatchCache(Options options, StoreMetrics* metrics)
    : options_(options), metrics_(metrics), dispatcher_([this] { Run(); }) {}

WatchCache::~WatchCache() {
  {
    absl::MutexLock l(&queue_mu_);
    stopping_ = true;
  }
  dispatcher_.join();
}

void WatchCache::Publish(std::vector<EventPtr> events) {
  absl::MutexLock l(&queue_mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
    return stopping_ || queue_.size() < kMaxQueuedEvents;
  };
  queue_mu_.Await(absl::Condition(&room));
  for (auto& e : events) queue_.push_back(Item{std::move(e), {}, {}, 0, absl::OkStatus()});
}

void WatchCache::PublishResourceGone(const std::string& group_resource, const std::string& version,
                                     int64_t revision, absl::Status status) {
  absl::MutexLock l(&queue_mu_);
  queue_.push_back(Item{nullptr, group_resource, version, revision, std::move(status)});
}

absl::Status WatchCache::Register(Watcher* watcher) {
  absl::MutexLock l(&watchers_mu_);
  if (shutting_down_) return absl::UnavailableError("server shutting down");
  watchers_[watcher->spec().group_resource].insert(watcher);
  ++watcher_count_;
  metrics_->watchers.Set(static_cast<double>(watcher_count_));
  return absl::OkStatus();
}

void WatchCache::Unregister(Watcher* watcher) {
  absl::MutexLock l(&watchers_mu_);
  auto it = watchers_.find(watcher->spec().group_resource);
  if (it == watchers_.end() || it->second.erase(watcher) == 0) return;
  if (it->second.empty()) watchers_.erase(it);
  --watcher_count_;
  metrics_->watchers.Set(static_cast<double>(watcher_count_));
}

size_t WatchCache::watcher_count() const {
  absl::MutexLock l(&watchers_mu_);
  return watcher_count_;
}

size_t WatchCache::Shutdown(absl::Duration timeout) {
  absl::MutexLock l(&watchers_mu_);
  shutting_down_ = true;
  for (auto& [gr, set] : watchers_) {
    for (Watcher* w : set) w->End(absl::UnavailableError("server shutting down"));
  }
  auto all_gone = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(watchers_mu_) { return watcher_count_ == 0; };
  watchers_mu_.AwaitWithTimeout(absl::Condition(&all_gone), timeout);
  return watcher_count_;
}

void WatchCache::Run() {
  absl::Time next_bookmark = absl::Now() + options_.bookmark_interval;
  while (true) {
    std::deque<Item> batch;
    {
      absl::MutexLock l(&queue_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return stopping_ || !queue_.empty();
      };
      queue_mu_.AwaitWithDeadline(absl::Condition(&ready), next_bookmark);
      if (stopping_) return;
      batch.swap(queue_);
    }
    absl::MutexLock l(&watchers_mu_);
    for (const Item& item : batch) Dispatch(item);
    if (absl::Now() >= next_bookmark) {
      SendBookmarks();
      next_bookmark = absl::Now() + options_.bookmark_interval;
    }
  }
}

void WatchCache::Dispatch(const Item& item) {
  if (item.event == nullptr) {
    auto it = watchers_.find(item.gone_resource);
    if (it == watchers_.end()) return;
    // Ended watchers leave the set at once, so that nothing more is delivered to them.
    for (auto w = it->second.begin(); w != it->second.end();) {
      if ((item.gone_version.empty() || (*w)->spec().version == item.gone_version) &&
          (*w)->spec().start_revision < item.gone_revision) {
        (*w)->End(item.gone_status);
        w = it->second.erase(w);
        --watcher_count_;
      } else {
        ++w;
      }
    }
    if (it->second.empty()) watchers_.erase(it);
    metrics_->watchers.Set(static_cast<double>(watcher_count_));
    return;
  }
  const Event& e = *item.event;
  dispatched_revision_ = std::max(dispatched_revision_, e.revision);
  auto it = watchers_.find(e.group_resource);
  if (it == watchers_.end()) return;
  // Encoded at most once per type, for all the watchers that see the event that way.
  std::optional<Delivery> deliveries[4];
  for (Watcher* w : it->second) {
    const WatchSpec& spec = w->spec();
    if (e.revision <= spec.start_revision) continue;
    v1::WatchEvent::Type type = EffectiveType(e, spec.filter);
    if (type == v1::WatchEvent::TYPE_UNSPECIFIED) continue;
    std::optional<Delivery>& d = deliveries[type];
    if (!d.has_value()) {
      ObjectPtr object = EffectiveObject(e, type);
      d = Delivery{type, object, EncodeWatchEvent(type, *object)};
    }
    w->Deliver(*d);
    metrics_->events_dispatched.Increment();
  }
}

void WatchCache::SendBookmarks() {
  for (auto& [gr, set] : watchers_) {
    for (Watcher* w : set) {
      w->Bookmark(std::max(dispatched_revision_, w->spec().start_revision));
    }
  }
}

}  // namespace shardcache
