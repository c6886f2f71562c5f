#include "common/client/shared_informer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <unordered_set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/object_key.h"

namespace shardcache {
namespace {

class FuncHandler : public ResourceEventHandler {
 public:
  explicit FuncHandler(ResourceEventHandlerFuncs funcs) : funcs_(std::move(funcs)) {}
  void OnAdd(const ObjectRef& object, bool is_initial_list) override {
    if (funcs_.on_add) funcs_.on_add(object, is_initial_list);
  }
  void OnUpdate(const ObjectRef& old_object, const ObjectRef& new_object) override {
    if (funcs_.on_update) funcs_.on_update(old_object, new_object);
  }
  void OnDelete(const ObjectRef& object) override {
    if (funcs_.on_delete) funcs_.on_delete(object);
  }

 private:
  const ResourceEventHandlerFuncs funcs_;
};

}  // namespace

std::shared_ptr<ResourceEventHandler> MakeHandler(ResourceEventHandlerFuncs funcs) {
  return std::make_shared<FuncHandler>(std::move(funcs));
}

// ---- FilteringResourceEventHandler ----

FilteringResourceEventHandler::FilteringResourceEventHandler(
    Predicate predicate, std::shared_ptr<ResourceEventHandler> inner)
    : predicate_(std::move(predicate)), inner_(std::move(inner)) {}

void FilteringResourceEventHandler::OnAdd(const ObjectRef& object, bool is_initial_list) {
  if (predicate_(*object)) inner_->OnAdd(object, is_initial_list);
}

void FilteringResourceEventHandler::OnUpdate(const ObjectRef& old_object,
                                             const ObjectRef& new_object) {
  bool was = predicate_(*old_object);
  bool is = predicate_(*new_object);
  if (was && is) {
    inner_->OnUpdate(old_object, new_object);
  } else if (is) {
    inner_->OnAdd(new_object, false);
  } else if (was) {
    inner_->OnDelete(old_object);
  }
}

void FilteringResourceEventHandler::OnDelete(const ObjectRef& object) {
  if (predicate_(*object)) inner_->OnDelete(object);
}

// ---- Internal state ----

// A registration's bounded buffer and the state its delivery thread (or its turns on the pool)
// keeps.
class SharedInformer::Listener final : public WorkerPool::Client,
                                       public std::enable_shared_from_this<Listener> {
 public:
  Listener(int64_t id, std::shared_ptr<ResourceEventHandler> handler, size_t capacity,
           absl::Duration resync_period, std::weak_ptr<SharedInformer> informer, WorkerPool* pool)
      : id(id),
        handler(std::move(handler)),
        capacity(capacity),
        resync_period(resync_period),
        informer(std::move(informer)),
        pool(pool) {}

  // On a pool: asks for a turn, unless one is queued or running or the registration is removed.
  // Called whenever work may have come (a change, a resync, the informer's stop).
  void WakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (pool == nullptr || scheduled || removed.load()) return;
    scheduled = true;
    pool->Schedule(this);
  }

  // WorkerPool::Client. A turn keeps the listener and its informer alive while it runs.
  void RunTurn() override {
    std::shared_ptr<Listener> self = shared_from_this();
    if (std::shared_ptr<SharedInformer> owner = informer.lock()) {
      owner->DeliverTurn(this);
      return;
    }
    absl::MutexLock l(&mu);
    scheduled = false;
  }
  void Tick(absl::Time) override {
    absl::MutexLock l(&mu);
    WakeLocked();
  }

  // Constant after construction.
  const int64_t id;
  const std::shared_ptr<ResourceEventHandler> handler;
  const size_t capacity;
  const absl::Duration resync_period;
  const std::weak_ptr<SharedInformer> informer;
  WorkerPool* const pool;  // null: a delivery thread

  // Set (also under mu) by the remover; read before every call of the handler.
  std::atomic<bool> removed{false};
  std::atomic<bool> synced{false};
  std::atomic<int64_t> overflows{0};

  // Guarded by the informer's mu_: the remover takes it.
  std::thread thread;

  absl::Mutex mu ABSL_ACQUIRED_AFTER(SharedInformer::mu_);
  std::deque<Change> queue ABSL_GUARDED_BY(mu);
  // The queue was dropped (or never filled): the handler must be brought to the cache's state.
  bool needs_resync ABSL_GUARDED_BY(mu) = true;
  bool informer_stopped ABSL_GUARDED_BY(mu) = false;
  // On a pool: a turn is queued or running (there is never more than one).
  bool scheduled ABSL_GUARDED_BY(mu) = false;

  // Used only by the delivery thread (or the one turn): what the handler has been told, by key.
  absl::flat_hash_map<std::string, ObjectRef> view;
  absl::Time next_resync = absl::InfiniteFuture();
};

// ---- Registration ----

SharedInformer::Registration::~Registration() {
  if (std::shared_ptr<SharedInformer> informer = informer_.lock()) {
    (void)informer->RemoveEventHandler(this);
  }
}

bool SharedInformer::Registration::HasSynced() const { return listener_->synced.load(); }

bool SharedInformer::Registration::WaitForSync(absl::Duration timeout) const {
  Listener* l = listener_.get();
  absl::MutexLock lock(&l->mu);
  auto done = [l]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu) {
    return l->synced.load() || l->informer_stopped;
  };
  l->mu.AwaitWithTimeout(absl::Condition(&done), timeout);
  return l->synced.load();
}

int64_t SharedInformer::Registration::overflows() const { return listener_->overflows.load(); }

// ---- SharedInformer ----

absl::StatusOr<std::shared_ptr<SharedInformer>> SharedInformer::Create(
    std::unique_ptr<ListerWatcher> lw, Options options) {
  if (lw == nullptr) return absl::InvalidArgumentError("lister_watcher: Required value");
  if (options.clock == nullptr) return absl::InvalidArgumentError("options.clock: Required value");
  if (options.handler_buffer == 0) {
    return absl::InvalidArgumentError("options.handler_buffer: must be positive");
  }
  std::string name = options.name.empty() ? lw->Describe() : options.name;
  if (options.pool != nullptr && options.pool->clock() != options.clock) {
    return absl::InvalidArgumentError("options.pool: runs on another clock than options.clock");
  }
  std::shared_ptr<SharedInformer> informer(
      new SharedInformer(name, options.clock, options.handler_buffer, options.pool));
  for (auto& [index, func] : options.indexers) {
    if (absl::Status s = informer->store_.AddIndex(index, func); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("options.indexers[", index, "]: ", s.message()));
    }
  }
  Reflector::Options ro = options.reflector;
  ro.clock = options.clock;
  ro.pool = options.pool;
  ro.name = name;
  absl::StatusOr<std::unique_ptr<Reflector>> reflector =
      Reflector::Create(std::move(lw), static_cast<ReflectorSink*>(informer.get()), ro);
  if (!reflector.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.reflector: ", reflector.status().message()));
  }
  informer->reflector_ = *std::move(reflector);
  return informer;
}

SharedInformer::SharedInformer(std::string name, const Clock* clock, size_t handler_buffer,
                               WorkerPool* pool)
    : name_(std::move(name)), clock_(clock), handler_buffer_(handler_buffer), pool_(pool) {}

SharedInformer::~SharedInformer() {
  if (reflector_ != nullptr) Stop();
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<Listener>> listeners;
  {
    absl::MutexLock l(&mu_);
    for (const std::shared_ptr<Listener>& listener : listeners_) {
      absl::MutexLock b(&listener->mu);
      listener->removed = true;
      threads.push_back(std::move(listener->thread));
    }
    listeners.swap(listeners_);
  }
  // A turn holds a reference too: only the one running this destructor (if any) can be in
  // progress, and Detach does not wait for that one.
  if (pool_ != nullptr) {
    for (const std::shared_ptr<Listener>& listener : listeners) pool_->Detach(listener.get());
  }
  // Every delivery thread holds a reference: only the one running this destructor (if any) can
  // still be alive.
  for (std::thread& t : threads) {
    if (!t.joinable()) continue;
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();
    } else {
      t.join();
    }
  }
  reflector_.reset();  // detaches its thread if this runs on it
}

absl::Status SharedInformer::Run() {
  absl::MutexLock l(&mu_);
  if (stopped_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "informer ", name_, " is stopped (", stop_reason_.ToString(), "): it cannot run again"));
  }
  if (!running_) {
    running_ = true;
    reflector_->Start();
  }
  return absl::OkStatus();
}

void SharedInformer::Stop() {
  Stop(absl::CancelledError(absl::StrCat("informer ", name_, " was stopped by Stop()")));
}

void SharedInformer::Stop(absl::Status reason) {
  if (reason.ok()) reason = absl::CancelledError(absl::StrCat("informer ", name_, " was stopped"));
  {
    absl::MutexLock l(&mu_);
    if (!stopped_ && requested_stop_.ok()) requested_stop_ = std::move(reason);
  }
  // The reflector ends its loop and reports Stopped(), which marks this informer stopped with
  // the reason above.
  reflector_->Stop();
}

bool SharedInformer::HasSynced() const {
  absl::MutexLock l(&mu_);
  return synced_;
}

bool SharedInformer::WaitForSync(absl::Duration timeout) const {
  absl::MutexLock l(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return synced_ || stopped_; };
  mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  return synced_;
}

bool SharedInformer::IsStopped() const {
  absl::MutexLock l(&mu_);
  return stopped_;
}

absl::Status SharedInformer::StopReason() const {
  absl::MutexLock l(&mu_);
  return stop_reason_;
}

std::string SharedInformer::LastSyncResourceVersion() const {
  return reflector_->LastResourceVersion();
}

Subscription SharedInformer::OnStopped(std::function<void(const absl::Status&)> callback) {
  // Stopped but not yet closed, the list would hand the callback to the stopping thread: the
  // documented "at once, on this thread" is kept by looking at stopped_ first.
  absl::Status reason;
  {
    absl::MutexLock l(&mu_);
    if (stopped_) reason = stop_reason_;
  }
  if (!reason.ok()) {
    callback(reason);
    return Subscription();
  }
  return stop_callbacks_.Add(std::move(callback));
}

Subscription SharedInformer::OnStoreChanged(std::function<void(const std::string&)> callback) {
  return store_callbacks_.Add(std::move(callback));
}

std::string SharedInformer::StoreId() const { return reflector_->StoreId(); }

absl::StatusOr<std::unique_ptr<SharedInformer::Registration>> SharedInformer::AddEventHandler(
    std::shared_ptr<ResourceEventHandler> handler, HandlerOptions options) {
  if (handler == nullptr) return absl::InvalidArgumentError("handler: Required value");
  if (options.resync_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("options.resync_period: must not be negative");
  }
  size_t capacity = options.buffer_size > 0 ? options.buffer_size : handler_buffer_;
  absl::MutexLock l(&mu_);
  if (stopped_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "informer ", name_, " is stopped (", stop_reason_.ToString(),
        "): it will never deliver another event, so the handler was not added; get a running "
        "informer (e.g. from DynamicInformerFactory::ForResource) and add it there"));
  }
  auto listener = std::make_shared<Listener>(next_listener_id_++, std::move(handler), capacity,
                                             options.resync_period, weak_from_this(), pool_);
  listeners_.push_back(listener);
  if (pool_ == nullptr) {
    listener->thread =
        std::thread([self = shared_from_this(), listener] { self->Deliver(listener); });
  } else {
    absl::MutexLock b(&listener->mu);
    listener->WakeLocked();  // its first turn brings it the cache's content
  }
  return std::unique_ptr<Registration>(new Registration(weak_from_this(), listener));
}

absl::Status SharedInformer::RemoveEventHandler(Registration* registration) {
  if (registration == nullptr) return absl::InvalidArgumentError("registration: Required value");
  if (registration->informer_.lock().get() != this) {
    return absl::InvalidArgumentError(
        absl::StrCat("the registration does not belong to informer ", name_));
  }
  Listener* listener = registration->listener_.get();
  std::thread thread;
  {
    absl::MutexLock l(&mu_);
    auto it = std::find_if(listeners_.begin(), listeners_.end(),
                           [listener](const auto& p) { return p.get() == listener; });
    if (it == listeners_.end()) return absl::OkStatus();  // already removed
    listeners_.erase(it);
    {
      absl::MutexLock b(&listener->mu);
      listener->removed = true;
    }
    thread = std::move(listener->thread);
  }
  if (thread.joinable()) {
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();  // called from its own handler: the thread ends after this call returns
    } else {
      thread.join();  // waits for a call in progress; the thread then sees `removed` and ends
    }
  }
  // Waits for a turn in progress, unless called from inside it (that turn then sees `removed`).
  if (pool_ != nullptr) pool_->Detach(listener);
  return absl::OkStatus();
}

// ---- ReflectorSink (the reflector's thread or turn) ----

void SharedInformer::Replace(std::vector<ObjectRef> objects, const std::string&) {
  absl::MutexLock l(&mu_);
  store_.Replace(std::move(objects));
  synced_ = true;
  // Every handler is brought to the new content by the difference with what it has seen.
  for (const std::shared_ptr<Listener>& listener : listeners_) {
    absl::MutexLock b(&listener->mu);
    listener->queue.clear();
    listener->needs_resync = true;
    listener->WakeLocked();
  }
}

void SharedInformer::Add(ObjectRef object) {
  absl::MutexLock l(&mu_);
  store_.Upsert(object);
  EnqueueLocked(object, false);
}

void SharedInformer::Update(ObjectRef object) {
  absl::MutexLock l(&mu_);
  store_.Upsert(object);
  EnqueueLocked(object, false);
}

void SharedInformer::Delete(ObjectRef object) {
  absl::MutexLock l(&mu_);
  store_.Delete(ObjectKey(object->metadata()));
  EnqueueLocked(object, true);
}

void SharedInformer::Bookmark(const std::string&) {}

void SharedInformer::StoreChanged(const std::string& store_id) {
  store_callbacks_.Notify(store_id);
}

void SharedInformer::Stopped(const absl::Status& reason) {
  // Keeps the informer alive while the stop callbacks run, even if one of them drops the last
  // other reference; it is then destroyed on this thread when this returns (which the reflector
  // allows: Stopped() is the last thing its loop does).
  std::shared_ptr<SharedInformer> self = weak_from_this().lock();
  MarkStopped(reason);
}

void SharedInformer::EnqueueLocked(const ObjectRef& object, bool deleted) {
  for (const std::shared_ptr<Listener>& listener : listeners_) {
    absl::MutexLock b(&listener->mu);
    if (listener->needs_resync) continue;  // the resync will read the cache, this included
    if (listener->queue.size() >= listener->capacity) {
      listener->queue.clear();
      listener->needs_resync = true;
      listener->WakeLocked();
      listener->overflows.fetch_add(1);
      spdlog::warn(
          "informer {}: handler #{} is {} events behind (its buffer is full): its pending events "
          "were dropped and it will be resynced from the cache",
          name_, listener->id, listener->capacity);
      continue;
    }
    listener->queue.push_back(Change{object, deleted});
    listener->WakeLocked();
  }
}

void SharedInformer::MarkStopped(absl::Status reason) {
  absl::Status final_reason;
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    if (!requested_stop_.ok()) reason = requested_stop_;
    if (reason.ok()) reason = absl::UnknownError(absl::StrCat("informer ", name_, " stopped"));
    stop_reason_ = reason;
    final_reason = reason;
    for (const std::shared_ptr<Listener>& listener : listeners_) {
      absl::MutexLock b(&listener->mu);
      listener->informer_stopped = true;
      listener->WakeLocked();  // to deliver what it has queued, and end
    }
  }
  if (final_reason.code() == absl::StatusCode::kCancelled) {
    spdlog::info("informer {}: stopped: {}", name_, final_reason.ToString());
  } else {
    spdlog::warn("informer {}: stopped: {}", name_, final_reason.ToString());
  }
  // Nothing of this informer is touched after the callbacks: one may destroy it (Close keeps
  // what it needs).
  stop_callbacks_.Close(final_reason);
}

// ---- Delivery (a registration's thread or turns) ----

SharedInformer::Work SharedInformer::TakeWork(Listener* l, Change* change) {
  if (l->removed.load()) return Work::kEnd;
  if (l->needs_resync) return Work::kResync;
  if (l->resync_period > absl::ZeroDuration() && l->synced.load() &&
      clock_->Now() >= l->next_resync) {
    return Work::kPeriodic;
  }
  if (!l->queue.empty()) {
    *change = std::move(l->queue.front());
    l->queue.pop_front();
    return Work::kChange;
  }
  // Stopped, and everything queued was delivered.
  return l->informer_stopped ? Work::kEnd : Work::kNone;
}

bool SharedInformer::DoWork(Listener* l, Work work, Change change) {
  ResourceEventHandler* handler = l->handler.get();
  switch (work) {
    case Work::kNone:
    case Work::kEnd:
      break;
    case Work::kResync:
      return Resync(l);
    case Work::kPeriodic: {
      std::vector<ObjectRef> known;
      known.reserve(l->view.size());
      for (const auto& [key, object] : l->view) known.push_back(object);
      for (const ObjectRef& object : known) {
        if (l->removed.load()) return false;
        handler->OnUpdate(object, object);
      }
      l->next_resync = clock_->Now() + l->resync_period;
      break;
    }
    case Work::kChange: {
      std::string key = ObjectKey(change.object->metadata());
      if (change.deleted) {
        auto it = l->view.find(key);
        if (it == l->view.end()) break;  // it never saw the object
        l->view.erase(it);
        if (l->removed.load()) return false;
        handler->OnDelete(change.object);
      } else {
        auto [it, inserted] = l->view.try_emplace(key, change.object);
        if (l->removed.load()) return false;
        if (inserted) {
          handler->OnAdd(change.object, false);
        } else {
          ObjectRef old = std::exchange(it->second, change.object);
          handler->OnUpdate(old, change.object);
        }
      }
      break;
    }
  }
  return true;
}

void SharedInformer::Deliver(const std::shared_ptr<Listener>& listener_ref) {
  Listener* l = listener_ref.get();
  while (true) {
    Work work;
    Change change;
    {
      absl::MutexLock lock(&l->mu);
      auto ready = [l]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu) {
        return l->removed.load() || l->needs_resync || !l->queue.empty() || l->informer_stopped;
      };
      while ((work = TakeWork(l, &change)) == Work::kNone) {
        // Until the next periodic resync (when due), or new work.
        absl::Time deadline = absl::InfiniteFuture();
        if (l->resync_period > absl::ZeroDuration() && l->synced.load()) {
          deadline = l->next_resync;
        }
        clock_->AwaitWithDeadline(&l->mu, absl::Condition(&ready), deadline);
      }
    }
    if (work == Work::kEnd || !DoWork(l, work, std::move(change))) return;
  }
}

void SharedInformer::DeliverTurn(Listener* l) {
  for (int i = 0; i < kEventsPerTurn; ++i) {
    Work work;
    Change change;
    {
      absl::MutexLock lock(&l->mu);
      work = TakeWork(l, &change);
      if (work == Work::kNone || work == Work::kEnd) {
        l->scheduled = false;
        if (work == Work::kNone && l->resync_period > absl::ZeroDuration() && l->synced.load() &&
            !l->removed.load()) {
          pool_->WakeAt(l, l->next_resync);
        }
        return;
      }
    }
    if (!DoWork(l, work, std::move(change))) {
      absl::MutexLock lock(&l->mu);
      l->scheduled = false;
      return;
    }
  }
  // More may be waiting: the back of the line, after the other registrations' turns.
  absl::MutexLock lock(&l->mu);
  l->scheduled = false;
  l->WakeLocked();
}

bool SharedInformer::Resync(Listener* l) {
  std::vector<ObjectRef> snapshot;
  bool informer_synced;
  {
    absl::MutexLock a(&mu_);
    absl::MutexLock b(&l->mu);
    snapshot = store_.List();
    l->queue.clear();  // the snapshot already includes these
    l->needs_resync = false;
    informer_synced = synced_;
  }
  ResourceEventHandler* handler = l->handler.get();
  const bool initial = !l->synced.load();
  std::unordered_set<std::string> present;
  present.reserve(snapshot.size());
  for (const ObjectRef& object : snapshot) present.insert(ObjectKey(object->metadata()));
  std::vector<ObjectRef> gone;
  for (auto it = l->view.begin(); it != l->view.end();) {
    if (present.count(it->first) == 0) {
      gone.push_back(it->second);
      l->view.erase(it++);
    } else {
      ++it;
    }
  }
  for (const ObjectRef& object : gone) {
    if (l->removed.load()) return false;
    handler->OnDelete(object);
  }
  for (const ObjectRef& object : snapshot) {
    auto [it, inserted] = l->view.try_emplace(ObjectKey(object->metadata()), object);
    if (inserted) {
      if (l->removed.load()) return false;
      handler->OnAdd(object, initial);
    } else if (it->second->metadata().resource_version() != object->metadata().resource_version()) {
      ObjectRef old = std::exchange(it->second, object);
      if (l->removed.load()) return false;
      handler->OnUpdate(old, object);
    } else {
      it->second = object;  // the same version: share the cache's copy
    }
  }
  if (informer_synced && !l->synced.load()) {
    if (l->resync_period > absl::ZeroDuration()) {
      l->next_resync = clock_->Now() + l->resync_period;
    }
    absl::MutexLock lock(&l->mu);  // wakes WaitForSync
    l->synced = true;
  }
  return true;
}

}  // namespace shardcache
