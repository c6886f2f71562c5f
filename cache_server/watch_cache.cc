#include "cache_server/watch_cache.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

#include "absl/time/clock.h"
#include "common/tsan_annotations.h"

namespace shardcache {

ObjectRef EffectiveObject(const Event& e, v1::WatchEvent::Type type) {
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

// std::call_once (pthread_once) rather than absl::call_once: a thread that waits for another's
// call in absl's version waits inside Debian's abseil, where ThreadSanitizer cannot see the edge.
struct WatchCache::Encodings {
  std::once_flag once[4];
  std::optional<Delivery> deliveries[4];

  // The event as watchers that see it as `type` receive it. Thread-safe.
  const Delivery& Get(const Event& e, v1::WatchEvent::Type type, EventChunks* chunks) {
    std::call_once(once[type], [&] {
      ObjectRef object = EffectiveObject(e, type);
      EncodedEvent encoded = chunks->Write(e.group_resource, type, *object);
      deliveries[type] =
          Delivery{type, std::move(object), std::move(encoded.bare), std::move(encoded.element)};
    });
    return *deliveries[type];
  }
};

WatchCache::WatchCache(Options options, StoreMetrics* metrics)
    : options_(options), metrics_(metrics) {
  int n = std::max(1, options_.dispatchers);
  for (int i = 0; i < n; ++i) dispatchers_.push_back(std::make_unique<Dispatcher>());
  for (auto& d : dispatchers_) {
    Dispatcher* raw = d.get();
    d->thread = std::thread([this, raw] { Run(raw); });
  }
}

WatchCache::~WatchCache() {
  ShutdownCompletionQueues();
  for (auto& d : dispatchers_) {
    absl::MutexLock l(&d->queue_mu);
    d->stopping = true;
  }
  for (auto& d : dispatchers_) d->thread.join();
}

void WatchCache::Publish(std::vector<EventPtr> events) {
  // In chunks, each once the backlog has room: a large commit batch (the writes that queued
  // while the committer was held back) must not land on the watchers all at once.
  for (size_t begin = 0; begin < events.size(); begin += kPublishChunk) {
    WaitForBacklog();
    size_t end = std::min(events.size(), begin + kPublishChunk);
    std::vector<Item> items;
    items.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) {
      items.push_back(
          Item{std::move(events[i]), std::make_shared<Encodings>(), {}, {}, 0, absl::OkStatus()});
    }
    Enqueue(std::move(items));
  }
}

void WatchCache::WaitForBacklog() {
  // Backpressure from the watchers: their clients read, but the server sends more slowly than
  // events come. Polled: it only waits while the server is overloaded.
  if (backlog_.load(std::memory_order_relaxed) <= static_cast<int64_t>(options_.backlog_bytes)) {
    return;
  }
  absl::Time start = absl::Now();
  while (backlog_.load(std::memory_order_relaxed) > static_cast<int64_t>(options_.backlog_bytes)) {
    {
      absl::MutexLock l(&dispatchers_[0]->queue_mu);
      if (dispatchers_[0]->stopping) break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  metrics_->watch_backpressure_seconds.Increment(absl::ToDoubleSeconds(absl::Now() - start));
}

void WatchCache::PublishResourceGone(const std::string& group_resource, const std::string& version,
                                     int64_t revision, absl::Status status) {
  std::vector<Item> items;
  items.push_back(Item{nullptr, nullptr, group_resource, version, revision, std::move(status)});
  Enqueue(std::move(items));
}

void WatchCache::Enqueue(std::vector<Item> items) {
  for (auto& d : dispatchers_) {
    absl::MutexLock l(&d->queue_mu);
    auto room = [&d]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->queue_mu) {
      return d->stopping || d->queue.size() < kMaxQueuedEvents;
    };
    if (!room()) {
      absl::Time start = absl::Now();
      d->queue_mu.Await(absl::Condition(&room));
      metrics_->watch_backpressure_seconds.Increment(absl::ToDoubleSeconds(absl::Now() - start));
    }
    d->queue.insert(d->queue.end(), items.begin(), items.end());
    // A dispatcher waiting on its completion queue does not see the condition: wake it there.
    if (d->cq_state == QueueState::kOpen && d->sleeping && !d->wake_pending) {
      d->wake_pending = true;
      d->alarm.Set(d->cq.get(), gpr_time_0(GPR_CLOCK_REALTIME), d->wake.AsTag());
    }
  }
}

void WatchCache::CountChanged(Dispatcher* d, int delta) {
  d->count.fetch_add(delta);
  int64_t total = watcher_count_.fetch_add(delta) + delta;
  metrics_->watchers.Set(static_cast<double>(total));
}

absl::Status WatchCache::Register(Watcher* watcher) {
  absl::MutexLock r(&reg_mu_);
  if (shutting_down_) return absl::UnavailableError("server shutting down");
  int best = watcher->pinned_dispatcher();
  if (best < 0 || best >= static_cast<int>(dispatchers_.size())) best = LeastLoadedDispatcher();
  Dispatcher* d = dispatchers_[best].get();
  watcher->dispatcher_ = best;
  absl::MutexLock l(&d->watchers_mu);
  d->watchers[watcher->spec().group_resource].insert(watcher);
  watcher->last_sent_ = options_.clock->Now();  // its initial events
  watcher->bookmark_slot_ = static_cast<int>(d->registered++ % kBookmarkSlots);
  CountChanged(d, 1);
  return absl::OkStatus();
}

void WatchCache::Unregister(Watcher* watcher) {
  int index;
  {
    absl::MutexLock r(&reg_mu_);
    index = watcher->dispatcher_;
  }
  if (index < 0) return;
  Dispatcher* d = dispatchers_[index].get();
  {
    absl::MutexLock l(&d->watchers_mu);
    auto it = d->watchers.find(watcher->spec().group_resource);
    if (it == d->watchers.end() || it->second.erase(watcher) == 0) return;
    if (it->second.empty()) d->watchers.erase(it);
    CountChanged(d, -1);
  }
  // Wakes a Shutdown waiting for the count to reach zero.
  absl::MutexLock r(&reg_mu_);
}

size_t WatchCache::watcher_count() const { return static_cast<size_t>(watcher_count_.load()); }

size_t WatchCache::Shutdown(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock r(&reg_mu_);
  shutting_down_ = true;
  for (auto& d : dispatchers_) {
    absl::MutexLock l(&d->watchers_mu);
    for (auto& [gr, set] : d->watchers) {
      for (Watcher* w : set) w->End(absl::UnavailableError("server shutting down"));
    }
  }
  auto all_gone = [this]() { return watcher_count_.load() == 0; };
  // Unregister takes reg_mu_ after each removal, which re-evaluates the condition; watchers
  // ended by a resource-gone marker do not, hence the bounded waits.
  while (!all_gone() && absl::Now() < deadline) {
    reg_mu_.AwaitWithDeadline(absl::Condition(&all_gone),
                              std::min(deadline, absl::Now() + absl::Milliseconds(50)));
  }
  return static_cast<size_t>(watcher_count_.load());
}

void WatchCache::Run(Dispatcher* d) {
  const absl::Duration slot_period = options_.bookmark_interval / kBookmarkSlots;
  const absl::Duration idle_for_bookmark = options_.bookmark_interval / 2;
  int slot = 0;
  const Clock* clock = options_.clock;
  absl::Time next_bookmark = clock->Now() + slot_period;
  absl::Time next_sweep = clock->Now() + kSweepInterval;
  std::deque<Item> batch;
  std::vector<Watcher*> unflushed;
  // The writes that this thread starts are held corked until Wait releases them (socket_cork.h).
  SocketCork::Scope cork;
  while (true) {
    if (!Wait(d, std::min(next_bookmark, next_sweep))) return;
    {
      absl::MutexLock l(&d->queue_mu);
      batch.swap(d->queue);
    }
    {
      absl::MutexLock l(&d->watchers_mu);
      // Every event taken goes out before any is sent: a watcher gets the run in one write (as
      // one batch, when it asked for batches) rather than the first event alone.
      for (const Item& item : batch) Dispatch(d, item, &unflushed);
      batch.clear();
      absl::Time now = clock->Now();
      for (Watcher* w : unflushed) {
        w->unflushed_ = false;
        w->last_sent_ = now;
        w->Flush();
      }
      unflushed.clear();
      if (now >= next_sweep) {
        for (auto& [gr, set] : d->watchers) {
          for (Watcher* w : set) w->Sweep(now);
        }
        if (d == dispatchers_.front().get()) chunks_.ReleaseIdle();
        next_sweep = now + kSweepInterval;
      }
      if (now >= next_bookmark) {
        for (auto& [gr, set] : d->watchers) {
          for (Watcher* w : set) {
            if (w->bookmark_slot_ != slot || now - w->last_sent_ < idle_for_bookmark) continue;
            w->Bookmark(std::max(d->dispatched_revision, w->spec().start_revision));
            w->last_sent_ = now;
          }
        }
        slot = (slot + 1) % kBookmarkSlots;
        next_bookmark = now + slot_period;
      }
    }
    // The writes just started that completed at once (their clients keep up) are followed up
    // here, on this thread, before waiting again.
    RunReadyCompletions(d);
  }
}

bool WatchCache::Wait(Dispatcher* d, absl::Time deadline) {
  const Clock* clock = options_.clock;
  while (true) {
    // What the last pass (or completion) wrote goes out before the thread may block.
    SocketCork::Release();
    {
      absl::MutexLock l(&d->queue_mu);
      if (d->stopping) return false;
      if (!d->queue.empty() || clock->Now() >= deadline) return true;
      if (!d->OnCompletionQueue()) {
        auto ready = [d]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->queue_mu) {
          return d->stopping || !d->queue.empty() || d->OnCompletionQueue();
        };
        clock->AwaitWithDeadline(&d->queue_mu, absl::Condition(&ready), deadline);
        continue;
      }
      d->sleeping = true;
    }
    // gRPC waits in real time: on another clock (a test's), look at it again every few
    // milliseconds.
    absl::Time real_deadline =
        clock == RealClock::Get() ? deadline : absl::Now() + options_.other_clock_poll_interval;
    bool drained =
        RunCompletion(d, absl::ToChronoTime(real_deadline)) == grpc::CompletionQueue::SHUTDOWN;
    absl::MutexLock l(&d->queue_mu);
    d->sleeping = false;
    if (drained) d->cq_state = QueueState::kDrained;
  }
}

grpc::CompletionQueue::NextStatus WatchCache::RunCompletion(
    Dispatcher* d, std::chrono::system_clock::time_point deadline) {
  void* tag = nullptr;
  bool ok = false;
  grpc::CompletionQueue::NextStatus status = d->cq->AsyncNext(&tag, &ok, deadline);
  if (status == grpc::CompletionQueue::GOT_EVENT) Completion::FromTag(tag)->Complete(ok);
  return status;
}

void WatchCache::RunReadyCompletions(Dispatcher* d) {
  {
    absl::MutexLock l(&d->queue_mu);
    if (!d->OnCompletionQueue()) return;
  }
  // A deadline in the past: only what is ready.
  grpc::CompletionQueue::NextStatus status;
  do {
    status = RunCompletion(d, std::chrono::system_clock::time_point());
  } while (status == grpc::CompletionQueue::GOT_EVENT);
  if (status == grpc::CompletionQueue::SHUTDOWN) {
    absl::MutexLock l(&d->queue_mu);
    d->cq_state = QueueState::kDrained;
  }
}

void* WatchCache::Completion::AsTag() {
  TsanRelease(this);
  return this;
}

WatchCache::Completion* WatchCache::Completion::FromTag(void* tag) {
  auto* completion = static_cast<Completion*>(tag);
  TsanAcquire(completion);
  return completion;
}

void WatchCache::WakeTag::Complete(bool /*ok*/) {
  absl::MutexLock l(&d->queue_mu);
  d->wake_pending = false;
}

void WatchCache::StartCompletionQueues() {
  // Not polling: the dispatcher never waits for gRPC's I/O (the server's own threads do it), only
  // for its watchers' completions and for its wake-up alarm.
  grpc_completion_queue_attributes attributes{GRPC_CQ_CURRENT_VERSION, GRPC_CQ_NEXT,
                                              GRPC_CQ_NON_POLLING, nullptr};
  for (auto& d : dispatchers_) {
    d->cq = std::make_unique<grpc::CompletionQueue>(grpc_completion_queue_create(
        grpc_completion_queue_factory_lookup(&attributes), &attributes, nullptr));
    d->wake.d = d.get();
    absl::MutexLock l(&d->queue_mu);
    d->cq_state = QueueState::kOpen;
  }
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
  for (auto& d : dispatchers_) {
    {
      absl::MutexLock l(&d->queue_mu);
      if (d->cq_state != QueueState::kOpen) continue;
      // No alarm is set from now on.
      d->cq_state = QueueState::kShuttingDown;
    }
    d->cq->Shutdown();
  }
  for (auto& d : dispatchers_) {
    absl::MutexLock l(&d->queue_mu);
    Dispatcher* raw = d.get();
    auto drained = [raw]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(raw->queue_mu) {
      return raw->cq_state != QueueState::kShuttingDown;
    };
    d->queue_mu.Await(absl::Condition(&drained));
  }
}

int WatchCache::LeastLoadedDispatcher() const {
  int best = 0;
  for (int i = 1; i < static_cast<int>(dispatchers_.size()); ++i) {
    if (dispatchers_[i]->count.load() < dispatchers_[best]->count.load()) best = i;
  }
  return best;
}

void WatchCache::Dispatch(Dispatcher* d, const Item& item, std::vector<Watcher*>* unflushed) {
  if (item.event == nullptr) {
    auto it = d->watchers.find(item.gone_resource);
    if (it == d->watchers.end()) return;
    // Ended watchers leave the set at once, so that nothing more is delivered to them.
    for (auto w = it->second.begin(); w != it->second.end();) {
      if ((item.gone_version.empty() || (*w)->spec().version == item.gone_version) &&
          (*w)->spec().start_revision < item.gone_revision) {
        // Counted out before it ends, so that whoever sees the end sees the count without it.
        Watcher* ended = *w;
        w = it->second.erase(w);
        CountChanged(d, -1);
        ended->End(item.gone_status);
      } else {
        ++w;
      }
    }
    if (it->second.empty()) d->watchers.erase(it);
    return;
  }
  const Event& e = *item.event;
  d->dispatched_revision = std::max(d->dispatched_revision, e.revision);
  auto it = d->watchers.find(e.group_resource);
  if (it == d->watchers.end()) return;
  int64_t delivered = 0;
  for (Watcher* w : it->second) {
    const WatchSpec& spec = w->spec();
    if (e.revision <= spec.start_revision) continue;
    v1::WatchEvent::Type type = EffectiveType(e, spec.filter);
    if (type == v1::WatchEvent::TYPE_UNSPECIFIED) continue;
    w->Deliver(item.forms->Get(e, type, &chunks_));
    if (!w->unflushed_) {
      w->unflushed_ = true;
      unflushed->push_back(w);
    }
    ++delivered;
  }
  if (delivered > 0) metrics_->events_dispatched.Increment(static_cast<double>(delivered));
}

}  // namespace shardcache
