#include "shard_replicator/replication_controller.h"

#include <spdlog/spdlog.h>

#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/object_key.h"
#include "common/status_macros.h"

namespace shardcache {

// The state that write answers update. Answers arrive on gRPC threads, possibly after the
// controller is gone: they hold this by shared_ptr, and the queue ignores adds once shut down.
struct ReplicationController::Shared {
  // The last acknowledged write of a key, until the cache informer has caught up with it: the
  // copy as written (null: deleted) and its cache revision (for a delete: the revision of the
  // copy that was deleted).
  struct Written {
    ObjectRef object;
    int64_t revision = 0;
  };

  std::unique_ptr<WorkQueue> queue;  // thread-safe
  const Clock* clock = nullptr;
  ReplicatorMetrics* metrics = nullptr;
  CacheWriterInterface* writer = nullptr;  // thread-safe; outlives every write answer
  std::function<void()> on_change;

  absl::Mutex mu;
  std::set<std::string> inflight ABSL_GUARDED_BY(mu);  // keys with a write not yet answered
  std::set<std::string> again ABSL_GUARDED_BY(mu);     // ... that changed meanwhile
  std::map<std::string, Written> written ABSL_GUARDED_BY(mu);
  // How many times the cache informer has listed another store than the one before: an answer
  // to a write sent in an earlier generation says nothing about the store listed now.
  int64_t cache_generation ABSL_GUARDED_BY(mu) = 0;
  // When the first local change of a key not yet written was seen (replication lag).
  std::map<std::string, absl::Time> seen ABSL_GUARDED_BY(mu);
  // Keys whose copy is not known to equal the projection: changed on either side and not yet
  // reconciled to "up to date", or written and not yet acknowledged.
  std::set<std::string> pending ABSL_GUARDED_BY(mu);
  // Keys whose write failed because the cache could not be reached: requeued, their backoff
  // forgotten, as soon as the writer can write again (one WhenAvailable callback for all).
  std::set<std::string> parked ABSL_GUARDED_BY(mu);
  bool parked_waiting ABSL_GUARDED_BY(mu) = false;
  // Keys handed out before both informers had listed: reconciled once they have (a missing local
  // object would otherwise read as deleted, and its copy be deleted).
  std::set<std::string> deferred ABSL_GUARDED_BY(mu);

  // A write of `key` failed because the cache cannot be reached: retry it when it can.
  void Park(const std::string& key, const std::shared_ptr<Shared>& self) ABSL_LOCKS_EXCLUDED(mu) {
    {
      absl::MutexLock l(&mu);
      parked.insert(key);
      if (parked_waiting) return;
      parked_waiting = true;
    }
    writer->WhenAvailable([self] {
      std::set<std::string> keys;
      {
        absl::MutexLock l(&self->mu);
        keys.swap(self->parked);
        self->parked_waiting = false;
      }
      for (const std::string& k : keys) {
        self->queue->Forget(k);
        self->queue->Add(k);
      }
    });
  }
};

namespace {

// "namespace\0name": a key of the controller's queue.
std::string QueueKey(const v1::ObjectMeta& m) {
  return absl::StrCat(m.namespace_(), std::string(1, '\0'), m.name());
}

std::pair<std::string, std::string> SplitQueueKey(const std::string& key) {
  size_t zero = key.find('\0');
  if (zero == std::string::npos) return {"", key};
  return {key.substr(0, zero), key.substr(zero + 1)};
}

enum class Outcome { kDone, kWriting, kRetry };

// Not a key of an object ("namespace\0name"): how a controller whose informers have not listed
// yet looks again.
constexpr char kSyncCheckKey[] = "\x01informers-synced";
constexpr absl::Duration kSyncCheckPeriod = absl::Milliseconds(20);

}  // namespace

absl::StatusOr<std::unique_ptr<ReplicationController>> ReplicationController::Start(
    Options options, std::shared_ptr<SharedInformer> local, std::shared_ptr<SharedInformer> cache) {
  if (options.writer == nullptr || local == nullptr || cache == nullptr || options.workers < 1) {
    return absl::InvalidArgumentError(
        "a replication controller needs a writer, two informers "
        "and at least one worker");
  }
  std::unique_ptr<ReplicationController> c(
      new ReplicationController(std::move(options), std::move(local), std::move(cache)));
  WorkQueue::Options q;
  q.name = "replication";
  q.clock = c->options_.clock;
  q.registry = c->options_.registry;
  q.pool = c->options_.pool;
  if (q.pool == nullptr) {
    WorkerPool::Options p;
    p.threads = c->options_.workers;
    p.clock = c->options_.clock;
    ASSIGN_OR_RETURN(c->own_pool_, WorkerPool::Create(p));
    q.pool = c->own_pool_.get();
  }
  ASSIGN_OR_RETURN(c->shared_->queue, WorkQueue::Create(std::move(q)));

  c->local_stopped_ =
      c->local_->OnStopped([raw = c.get()](const absl::Status& s) { raw->InformerStopped(s); });
  c->cache_stopped_ =
      c->cache_->OnStopped([raw = c.get()](const absl::Status& s) { raw->InformerStopped(s); });
  c->cache_store_changed_ = c->cache_->OnStoreChanged(
      [raw = c.get()](const std::string& store_id) { raw->CacheStoreChanged(store_id); });
  SharedInformer::HandlerOptions handler_options;
  handler_options.resync_period = c->options_.resync_period;
  ASSIGN_OR_RETURN(c->local_registration_,
                   c->local_->AddEventHandler(c->Handler(true), handler_options));
  ASSIGN_OR_RETURN(c->cache_registration_,
                   c->cache_->AddEventHandler(c->Handler(false), handler_options));
  if (c->Stopped()) return absl::FailedPreconditionError(c->StopReason().ToString());
  c->shared_->queue->Process(c->options_.workers,
                             [raw = c.get()](const std::string& key) { raw->Process(key); });
  c->processing_ = true;
  if (c->options_.metrics != nullptr) c->options_.metrics->replication_controllers.Increment();
  spdlog::info(
      "replication of {} in cluster {} (clustercachedresource {}) started, selector \"{}\"",
      GvrKey(c->options_.spec.resource), c->options_.cluster, c->options_.ccr_name,
      c->options_.spec.selector_string);
  return c;
}

ReplicationController::ReplicationController(Options options, std::shared_ptr<SharedInformer> local,
                                             std::shared_ptr<SharedInformer> cache)
    : options_(std::move(options)),
      local_(std::move(local)),
      cache_(std::move(cache)),
      shared_(std::make_shared<Shared>()) {
  shared_->clock = options_.clock;
  shared_->metrics = options_.metrics;
  shared_->writer = options_.writer;
  shared_->on_change = options_.on_change;
}

ReplicationController::~ReplicationController() { Stop(); }

void ReplicationController::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (joined_) return;
    joined_ = true;
    if (!stopped_) {
      stopped_ = true;
      stop_reason_ = absl::CancelledError("the replication controller was stopped");
    }
  }
  // No handler runs after these return; then nothing adds to the queue but write answers,
  // which the shut-down queue ignores.
  local_registration_.reset();
  cache_registration_.reset();
  local_stopped_.Cancel();
  cache_stopped_.Cancel();
  cache_store_changed_.Cancel();
  // The queue outlives the pool if write answers still hold it: detached, it never calls it.
  if (shared_->queue != nullptr) shared_->queue->ShutDownAndWait();
  own_pool_.reset();
  if (processing_ && options_.metrics != nullptr) {
    options_.metrics->replication_controllers.Decrement();
  }
  processing_ = false;
  spdlog::info("replication of {} in cluster {} (clustercachedresource {}) stopped",
               GvrKey(options_.spec.resource), options_.cluster, options_.ccr_name);
}

void ReplicationController::InformerStopped(const absl::Status& reason) {
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_reason_ = reason;
  }
  // No write is started after this: the workers see the queue shut down.
  if (shared_->queue != nullptr) shared_->queue->ShutDown();
  spdlog::warn(
      "replication of {} in cluster {} (clustercachedresource {}) stops: an informer "
      "stopped: {}",
      GvrKey(options_.spec.resource), options_.cluster, options_.ccr_name, reason.ToString());
  if (options_.on_stopped) options_.on_stopped(reason);
}

void ReplicationController::CacheStoreChanged(const std::string& store_id) {
  std::set<std::string> keys;
  for (const ObjectRef& o : local_->store().List()) keys.insert(QueueKey(o->metadata()));
  for (const ObjectRef& o : cache_->store().List()) keys.insert(QueueKey(o->metadata()));
  size_t unconfirmed = 0;
  {
    absl::MutexLock l(&shared_->mu);
    ++shared_->cache_generation;
    unconfirmed = shared_->written.size();
    for (const auto& [key, written] : shared_->written) keys.insert(key);
    shared_->written.clear();
    shared_->pending.insert(keys.begin(), keys.end());
  }
  spdlog::info(
      "replication of {} in cluster {} (clustercachedresource {}): the cache is store {}; "
      "reconciling all {} objects again ({} writes not yet seen there are not trusted)",
      GvrKey(options_.spec.resource), options_.cluster, options_.ccr_name, store_id, keys.size(),
      unconfirmed);
  for (const std::string& key : keys) shared_->queue->Add(key);
  if (options_.on_change) options_.on_change();
}

bool ReplicationController::HasSynced() const {
  return local_registration_ != nullptr && cache_registration_ != nullptr &&
         local_registration_->HasSynced() && cache_registration_->HasSynced();
}

bool ReplicationController::Stopped() const {
  absl::MutexLock l(&mu_);
  return stopped_;
}

absl::Status ReplicationController::StopReason() const {
  absl::MutexLock l(&mu_);
  return stop_reason_;
}

bool ReplicationController::Matches(const v1::Object& object) const {
  return options_.spec.selector.Matches(object.metadata().labels());
}

int64_t ReplicationController::LocalCount() const {
  int64_t n = 0;
  for (const ObjectRef& o : local_->store().List()) n += Matches(*o) ? 1 : 0;
  return n;
}

int64_t ReplicationController::CacheCount() const {
  return static_cast<int64_t>(cache_->store().Size());
}

int64_t ReplicationController::Pending() const {
  absl::MutexLock l(&shared_->mu);
  return static_cast<int64_t>(shared_->pending.size());
}

std::shared_ptr<ResourceEventHandler> ReplicationController::Handler(bool local_side) {
  std::shared_ptr<Shared> shared = shared_;
  auto on_change = options_.on_change;
  const Clock* clock = options_.clock;
  // `resync`: the informer delivers an object it delivered before (a periodic resync, or a
  // relist that found it unchanged): reconciled again, but not a change that makes it pending.
  auto changed = [shared, on_change, clock, local_side](const ObjectRef& object, bool resync) {
    std::string key = QueueKey(object->metadata());
    {
      absl::MutexLock l(&shared->mu);
      bool echo = false;  // the cache informer shows our own last write of the key
      if (local_side) {
        shared->seen.emplace(key, clock->Now());
      } else {
        // The cache informer caught up with the last write of this key: forget it.
        auto w = shared->written.find(key);
        int64_t revision = ResourceVersionNumber(*object);
        if (w != shared->written.end() && revision >= w->second.revision) {
          echo = revision == w->second.revision;
          shared->written.erase(w);
        }
      }
      if (!echo && !resync) shared->pending.insert(key);
    }
    shared->queue->Add(key);
    if (on_change) on_change();
  };
  ResourceEventHandlerFuncs funcs;
  funcs.on_add = [changed](const ObjectRef& o, bool) { changed(o, false); };
  funcs.on_update = [changed](const ObjectRef& old_object, const ObjectRef& o) {
    changed(o, old_object->metadata().resource_version() == o->metadata().resource_version());
  };
  funcs.on_delete = [changed](const ObjectRef& o) { changed(o, false); };
  return MakeHandler(std::move(funcs));
}

void ReplicationController::Process(const std::string& key) {
  if (!local_->HasSynced() || !cache_->HasSynced()) {
    // Not yet: the key waits, and one check key polls until both have listed.
    bool first = false;
    if (key != kSyncCheckKey) {
      absl::MutexLock l(&shared_->mu);
      first = shared_->deferred.empty();
      shared_->deferred.insert(key);
    }
    if (first || key == kSyncCheckKey) shared_->queue->AddAfter(kSyncCheckKey, kSyncCheckPeriod);
    return;
  }
  if (key == kSyncCheckKey) {
    std::set<std::string> deferred;
    {
      absl::MutexLock l(&shared_->mu);
      deferred.swap(shared_->deferred);
    }
    for (const std::string& k : deferred) shared_->queue->Add(k);
    return;
  }
  absl::Time start = options_.clock->Now();
  if (Reconcile(key)) shared_->queue->Forget(key);
  if (options_.metrics != nullptr) {
    options_.metrics->ObserveReconcile("replication",
                                       absl::ToDoubleSeconds(options_.clock->Now() - start));
  }
}

void ReplicationController::UpToDate(const std::string& key) {
  bool synced = false;
  {
    absl::MutexLock l(&shared_->mu);
    shared_->seen.erase(key);
    synced = shared_->pending.erase(key) > 0 && shared_->pending.empty();
  }
  if (synced && options_.on_change) options_.on_change();
}

bool ReplicationController::Reconcile(const std::string& key) {
  auto [ns, name] = SplitQueueKey(key);
  ObjectRef local = local_->store().Get(ObjectKey("", options_.cluster, ns, name));
  ObjectRef copy = cache_->store().Get(ObjectKey(options_.shard, options_.cluster, ns, name));
  std::shared_ptr<Shared> shared = shared_;
  {
    absl::MutexLock l(&shared->mu);
    if (shared->inflight.count(key) > 0) {
      shared->again.insert(key);  // reconciled again once the write in flight is answered
      return true;
    }
    // The cache informer may not have seen our last write yet: trust the write.
    auto w = shared->written.find(key);
    if (w != shared->written.end()) {
      int64_t seen_revision = copy != nullptr ? ResourceVersionNumber(*copy) : 0;
      if (w->second.object != nullptr && seen_revision < w->second.revision) {
        copy = w->second.object;
      } else if (w->second.object == nullptr && copy != nullptr &&
                 seen_revision <= w->second.revision) {
        copy = nullptr;
      }
    }
  }

  std::optional<v1::Object> desired;
  if (local != nullptr && Matches(*local)) desired = ProjectCopy(*local, options_.shard);
  v1::WriteRequest request;
  int64_t deleted_revision = 0;
  if (desired.has_value()) {
    if (copy != nullptr && CopyUpToDate(*desired, *copy)) {
      UpToDate(key);
      return true;
    }
    v1::UpdateRequest& upsert = *request.mutable_upsert();
    *upsert.mutable_resource() = options_.spec.resource;
    *upsert.mutable_object() = *std::move(desired);
  } else {
    if (copy == nullptr) {
      UpToDate(key);
      return true;
    }
    v1::DeleteRequest& del = *request.mutable_delete_();
    *del.mutable_resource() = options_.spec.resource;
    del.set_shard(options_.shard);
    del.set_cluster(options_.cluster);
    del.set_namespace_(ns);
    del.set_name(name);
    deleted_revision = ResourceVersionNumber(*copy);
  }
  bool is_delete = request.has_delete_();
  int64_t generation = 0;
  {
    absl::MutexLock l(&shared->mu);
    shared->inflight.insert(key);
    shared->pending.insert(key);  // until the write is acknowledged
    generation = shared->cache_generation;
  }
  absl::Status sent = options_.writer->Write(
      std::move(request), [shared, key, is_delete, deleted_revision, generation](
                              const absl::Status& status, const v1::WriteResponse& answer) {
        bool gone = is_delete && absl::IsNotFound(status);
        bool notify = false;
        {
          absl::MutexLock l(&shared->mu);
          shared->inflight.erase(key);
          bool again = shared->again.erase(key) > 0;
          if ((status.ok() || gone) && generation != shared->cache_generation) {
            // Answered by the store that the cache informer no longer lists: reconcile the key
            // against the one it lists now.
            shared->queue->Add(key);
            return;
          }
          if (status.ok() || gone) {
            Shared::Written w;
            if (is_delete) {
              w.revision = deleted_revision;
            } else {
              w.object = std::make_shared<const v1::Object>(answer.object());
              w.revision = ResourceVersionNumber(answer.object());
            }
            shared->written[key] = std::move(w);
            auto seen = shared->seen.find(key);
            if (seen != shared->seen.end()) {
              if (shared->metrics != nullptr) {
                shared->metrics->ObserveLag(
                    absl::ToDoubleSeconds(shared->clock->Now() - seen->second));
              }
              shared->seen.erase(seen);
            }
            if (shared->metrics != nullptr && status.ok()) {
              shared->metrics->WriteAcknowledged(is_delete ? "delete" : "upsert");
            }
            shared->queue->Forget(key);
            if (again) {
              shared->queue->Add(key);
            } else {
              shared->pending.erase(key);
              notify = shared->pending.empty();
            }
            // Retried with backoff, or parked until the cache can be reached again: never
            // dropped while the term lasts. The term's end is the writer's state, whatever the
            // code (a write cancelled by Stop, or one of a stream that broke).
          } else if (shared->writer->Stopped()) {
            return;
          } else if (!absl::IsUnavailable(status)) {
            spdlog::debug("cache write of {} failed: {}", key, status.ToString());
            shared->queue->AddRateLimited(key);
            return;
          }
        }
        if (!status.ok() && !gone) {
          shared->Park(key, shared);
          notify = true;
        }
        if (notify && shared->on_change) shared->on_change();
      });
  if (!sent.ok()) {
    {
      absl::MutexLock l(&shared->mu);
      shared->inflight.erase(key);
      shared->again.erase(key);
    }
    if (options_.writer->Stopped()) return true;  // the term is ending
    if (absl::IsUnavailable(sent)) {
      shared->Park(key, shared);
      if (options_.on_change) options_.on_change();
      return true;  // retried once the cache can be reached, with its backoff forgotten
    }
    spdlog::debug("cache write of {} not sent: {}", key, sent.ToString());
    shared->queue->AddRateLimited(key);
    return false;
  }
  return false;  // the answer decides whether to forget the key's backoff
}

}  // namespace shardcache
