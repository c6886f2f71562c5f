#include "shard_replicator/ccr_controller.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/error_info.h"
#include "common/object_key.h"
#include "common/resources.h"
#include "common/status_macros.h"

namespace shardcache {
namespace {

constexpr char kController[] = "clustercachedresources";

bool HasFinalizer(const v1::Object& o) {
  const auto& f = o.metadata().finalizers();
  return std::find(f.begin(), f.end(), kReplicatorFinalizer) != f.end();
}

std::string CcrKey(const std::string& cluster, const std::string& name) {
  return ObjectKey("", cluster, "", name);
}

// (cluster, name) of a CCR key.
std::pair<std::string, std::string> SplitCcrKey(const std::string& key) {
  std::vector<std::string> parts = absl::StrSplit(key, '\0');
  if (parts.size() != 4) return {"", key};
  return {parts[1], parts[3]};
}

// Which of two CCRs came first: creation time, then name.
bool CreatedBefore(const v1::Object& a, const v1::Object& b) {
  const auto& ta = a.metadata().creation_timestamp();
  const auto& tb = b.metadata().creation_timestamp();
  if (ta.seconds() != tb.seconds()) return ta.seconds() < tb.seconds();
  if (ta.nanos() != tb.nanos()) return ta.nanos() < tb.nanos();
  return a.metadata().name() < b.metadata().name();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CcrController>> CcrController::Start(Options options) {
  if (options.shard_writer == nullptr || options.shard_informers == nullptr ||
      options.cache_informers == nullptr || options.writer == nullptr || options.ccrs == nullptr ||
      options.cache_ccrs == nullptr || options.workers < 1) {
    return absl::InvalidArgumentError("CcrController: missing dependencies");
  }
  std::unique_ptr<CcrController> c(new CcrController(std::move(options)));
  c->pool_ = c->options_.pool;
  if (c->pool_ == nullptr) {
    WorkerPool::Options p;
    p.threads = c->options_.workers;
    p.clock = c->options_.clock;
    ASSIGN_OR_RETURN(c->own_pool_, WorkerPool::Create(p));
    c->pool_ = c->own_pool_.get();
  }
  WorkQueue::Options q;
  q.name = kController;
  q.clock = c->options_.clock;
  q.registry = c->options_.registry;
  q.pool = c->pool_;
  ASSIGN_OR_RETURN(c->queue_, WorkQueue::Create(std::move(q)));

  CcrController* raw = c.get();
  ResourceEventHandlerFuncs ccr_funcs;
  ccr_funcs.on_add = [raw](const ObjectRef& o, bool) {
    raw->Enqueue(o->metadata());
    raw->EnqueueCluster(o->metadata().cluster());
  };
  ccr_funcs.on_update = [raw](const ObjectRef& old_object, const ObjectRef& o) {
    raw->Enqueue(o->metadata());
    // Validity depends on the other CCRs of the cluster: only a spec change or a deletion can
    // change it (status updates do not).
    if (old_object->metadata().generation() != o->metadata().generation() ||
        old_object->metadata().has_deletion_timestamp() != o->metadata().has_deletion_timestamp()) {
      raw->EnqueueCluster(o->metadata().cluster());
    }
  };
  ccr_funcs.on_delete = [raw](const ObjectRef& o) {
    raw->Enqueue(o->metadata());
    raw->EnqueueCluster(o->metadata().cluster());
  };
  SharedInformer::HandlerOptions handler_options;
  handler_options.resync_period = c->options_.resync_period;
  ASSIGN_OR_RETURN(c->ccrs_registration_, c->options_.ccrs->AddEventHandler(
                                              MakeHandler(std::move(ccr_funcs)), handler_options));
  ResourceEventHandlerFuncs copy_funcs;
  copy_funcs.on_add = [raw](const ObjectRef& o, bool) { raw->Enqueue(o->metadata()); };
  copy_funcs.on_update = [raw](const ObjectRef&, const ObjectRef& o) {
    raw->Enqueue(o->metadata());
  };
  copy_funcs.on_delete = [raw](const ObjectRef& o) { raw->Enqueue(o->metadata()); };
  ASSIGN_OR_RETURN(
      c->cache_ccrs_registration_,
      c->options_.cache_ccrs->AddEventHandler(MakeHandler(std::move(copy_funcs)), handler_options));
  // A cache replaced behind its address may lack copies that this term wrote to the one before
  // (and that the copies' informer never showed): every CCR is reconciled against the new one.
  c->cache_store_subscription_ = c->options_.cache_ccrs->OnStoreChanged([raw](const std::string&) {
    for (const ObjectRef& ccr : raw->options_.ccrs->store().List()) raw->Enqueue(ccr->metadata());
  });
  c->resources_subscription_ =
      c->options_.shard_informers->Subscribe([raw](const ResourceEvent& event) {
        bool served = event.type == ResourceEvent::Type::kServed;
        raw->EnqueueNaming(event.resource, /*reset=*/served);
      });
  c->queue_->Process(c->options_.workers, [raw](const std::string& key) { raw->Process(key); });
  return c;
}

CcrController::CcrController(Options options) : options_(std::move(options)) {}

CcrController::~CcrController() { Stop(); }

void CcrController::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  {
    // Waits for a write to the shard store in flight; none starts after this.
    absl::WriterMutexLock l(&write_gate_);
    writes_open_ = false;
  }
  ccrs_registration_.reset();
  cache_ccrs_registration_.reset();
  resources_subscription_.Cancel();
  cache_store_subscription_.Cancel();
  if (queue_ != nullptr) queue_->ShutDownAndWait();
  std::map<std::string, std::unique_ptr<ReplicationController>> controllers;
  {
    absl::MutexLock l(&mu_);
    controllers.swap(controllers_);
  }
  controllers.clear();  // each stops: handlers removed, queue shut down, reconciles done
  own_pool_.reset();    // after every queue on it is detached
}

void CcrController::Enqueue(const v1::ObjectMeta& ccr) {
  queue_->Add(CcrKey(ccr.cluster(), ccr.name()));
}

void CcrController::EnqueueCluster(const std::string& cluster) {
  for (const ObjectRef& o : options_.ccrs->store().List()) {
    if (o->metadata().cluster() == cluster) Enqueue(o->metadata());
  }
}

void CcrController::EnqueueNaming(const v1::GroupVersionResource& resource, bool reset) {
  for (const ObjectRef& o : options_.ccrs->store().List()) {
    absl::StatusOr<CcrSpec> spec = ParseCcrSpec(*o, nullptr);
    if (!spec.ok() || GvrKey(spec->resource) != GvrKey(resource)) continue;
    std::string key = CcrKey(o->metadata().cluster(), o->metadata().name());
    if (reset) queue_->Forget(key);
    queue_->Add(key);
  }
}

void CcrController::Process(const std::string& key) {
  absl::Time start = options_.clock->Now();
  switch (Reconcile(key)) {
    case Next::kDone:
      queue_->Forget(key);
      break;
    case Next::kRetry:
      queue_->AddRateLimited(key);
      break;
    case Next::kSoon:
      queue_->AddAfter(key, absl::Milliseconds(100));
      break;
  }
  if (options_.metrics != nullptr) {
    options_.metrics->ObserveReconcile(kController,
                                       absl::ToDoubleSeconds(options_.clock->Now() - start));
  }
}

v1::Fence CcrController::Fence() const {
  v1::Fence f;
  f.set_shard(options_.shard);
  f.set_epoch(options_.epoch);
  return f;
}

absl::StatusOr<v1::Object> CcrController::WriteShardStore(const v1::UpdateRequest& request,
                                                          bool status) {
  absl::ReaderMutexLock l(&write_gate_);
  if (!writes_open_) return absl::CancelledError("the leadership term ended");
  return status ? options_.shard_writer->UpdateStatus(request)
                : options_.shard_writer->Update(request);
}

void CcrController::CheckFenced(const absl::Status& status) {
  if (IsFenced(status) && options_.on_fenced) {
    options_.on_fenced(status);
  }
}

std::unique_ptr<ReplicationController> CcrController::TakeController(const std::string& key) {
  absl::MutexLock l(&mu_);
  auto it = controllers_.find(key);
  if (it == controllers_.end()) return nullptr;
  std::unique_ptr<ReplicationController> c = std::move(it->second);
  controllers_.erase(it);
  return c;
}

ObjectRef CcrController::EarlierDuplicate(const v1::Object& ccr, const CcrSpec& spec) const {
  ObjectRef first;
  for (const ObjectRef& o : options_.ccrs->store().List()) {
    if (o->metadata().cluster() != ccr.metadata().cluster() ||
        o->metadata().name() == ccr.metadata().name() || !CreatedBefore(*o, ccr)) {
      continue;
    }
    absl::StatusOr<CcrSpec> other = ParseCcrSpec(*o, nullptr);
    if (!other.ok() || GroupResource(other->resource) != GroupResource(spec.resource)) {
      continue;
    }
    if (first == nullptr || CreatedBefore(*o, *first)) first = o;
  }
  return first;
}

absl::StatusOr<std::shared_ptr<SharedInformer>> CcrController::CacheInformer(
    const v1::GroupVersionResource& resource, const std::string& cluster) {
  RETURN_IF_ERROR(options_.cache_informers->ServeAlways(resource));
  ListWatchFilters filters;
  filters.shard = options_.shard;
  filters.cluster = cluster;
  return options_.cache_informers->ForResource(resource, filters);
}

int64_t CcrController::Purge(const v1::GroupVersionResource& resource, const std::string& cluster) {
  absl::StatusOr<std::shared_ptr<SharedInformer>> informer = CacheInformer(resource, cluster);
  if (!informer.ok()) return -1;
  // Held until the purge is seen complete, so that the factory does not release the informer
  // between two attempts (its sync, and what it shows of the deletes, would start over).
  const std::string purge_key = absl::StrCat(GvrKey(resource), "|", cluster);
  std::shared_ptr<SharedInformer> done;  // let go of outside mu_
  if (!(*informer)->HasSynced()) {
    absl::MutexLock l(&mu_);
    purging_[purge_key] = *informer;
    return -1;
  }
  std::vector<ObjectRef> copies = (*informer)->store().List();
  {
    absl::MutexLock l(&mu_);
    if (copies.empty()) {
      if (auto it = purging_.find(purge_key); it != purging_.end()) {
        done = std::move(it->second);
        purging_.erase(it);
      }
    } else {
      purging_[purge_key] = *informer;
    }
  }
  for (const ObjectRef& copy : copies) {
    v1::WriteRequest request;
    v1::DeleteRequest& del = *request.mutable_delete_();
    *del.mutable_resource() = resource;
    del.set_shard(options_.shard);
    del.set_cluster(cluster);
    del.set_namespace_(copy->metadata().namespace_());
    del.set_name(copy->metadata().name());
    // A failed delete shows as a copy still there at the next reconcile, which tries again.
    (void)options_.writer->Write(std::move(request),
                                 [](const absl::Status&, const v1::WriteResponse&) {});
  }
  return static_cast<int64_t>(copies.size());
}

void CcrController::SyncCopy(const std::string& cluster, const std::string& name,
                             const v1::Object* ccr) {
  ObjectRef copy = options_.cache_ccrs->store().Get(ObjectKey(options_.shard, cluster, "", name));
  v1::WriteRequest request;
  if (ccr != nullptr) {
    v1::Object desired = ProjectCopy(*ccr, options_.shard);
    if (copy != nullptr && CopyUpToDate(desired, *copy)) return;
    *request.mutable_upsert()->mutable_resource() = CcrResource();
    *request.mutable_upsert()->mutable_object() = std::move(desired);
  } else {
    if (copy == nullptr) return;
    v1::DeleteRequest& del = *request.mutable_delete_();
    *del.mutable_resource() = CcrResource();
    del.set_shard(options_.shard);
    del.set_cluster(cluster);
    del.set_name(name);
  }
  // The copies informer sees the result and enqueues the CCR again if it still differs.
  std::string key = CcrKey(cluster, name);
  std::optional<v1::GroupVersionResource> names;
  if (ccr != nullptr) {
    absl::StatusOr<CcrSpec> spec = ParseCcrSpec(*ccr, nullptr);
    if (spec.ok()) names = spec->resource;
  }
  // Never dropped while the term lasts: retried with backoff, or as soon as the cache can be
  // reached again. (The writer runs or drops its callbacks before this controller stops.)
  auto retry = [this, key](const absl::Status& s) {
    if (s.ok() || absl::IsNotFound(s) || options_.writer->Stopped()) return;
    if (!absl::IsUnavailable(s)) {
      queue_->AddRateLimited(key);
      return;
    }
    RequeueWhenAvailable(key);
  };
  absl::Status sent = options_.writer->Write(
      std::move(request),
      [this, key, names, retry](const absl::Status& s, const v1::WriteResponse& answer) {
        if (s.ok()) CopyWritten(key, ResourceVersionNumber(answer.object()), names);
        retry(s);
      });
  if (!sent.ok()) retry(sent);
}

void CcrController::CopyWritten(const std::string& key, int64_t resource_version,
                                std::optional<v1::GroupVersionResource> names) {
  bool awaited;
  {
    absl::MutexLock l(&mu_);
    WrittenCopy& written = copies_written_[key];
    if (resource_version >= written.resource_version) {
      written.resource_version = resource_version;
      written.names = std::move(names);
    }
    awaited = awaiting_copy_.erase(key) > 0;
  }
  if (awaited) queue_->Add(key);
}

void CcrController::RequeueWhenAvailable(const std::string& key) {
  {
    absl::MutexLock l(&mu_);
    if (!waiting_for_cache_.insert(key).second) return;  // already waiting for the cache
  }
  options_.writer->WhenAvailable([this, key] {
    {
      absl::MutexLock l(&mu_);
      waiting_for_cache_.erase(key);
    }
    queue_->Forget(key);
    queue_->Add(key);
  });
}

absl::StatusOr<v1::Object> CcrController::WriteStatus(const v1::Object& ccr,
                                                      const CcrState& state) {
  absl::Time now = options_.clock->Now();
  google::protobuf::Struct status = CcrStatusStruct(state, ccr.status(), now);
  if (StatusEquals(status, ccr.status())) return ccr;
  status = WithUpdateTime(std::move(status), now);
  v1::UpdateRequest request;
  *request.mutable_resource() = CcrResource();
  *request.mutable_object() = ccr;
  *request.mutable_object()->mutable_status() = std::move(status);
  *request.mutable_fence() = Fence();
  absl::StatusOr<v1::Object> updated = WriteShardStore(request, /*status=*/true);
  if (!updated.ok()) {
    CheckFenced(updated.status());
    return updated.status();
  }
  spdlog::info(
      "clustercachedresource {}|{}: phase {}, ResourceValid={} ({}), "
      "ReplicationStarted={} ({}), Synced={} ({}), counts local={} cache={}, epoch {}",
      ccr.metadata().cluster(), ccr.metadata().name(), PhaseName(state.phase),
      state.valid ? "True" : "False", state.valid_reason, state.started ? "True" : "False",
      state.started_reason, state.synced ? "True" : "False", state.synced_reason, state.local_count,
      state.cache_count, state.epoch);
  return updated;
}

void CcrController::SetSynced(int64_t pending, CcrState* state) const {
  if (pending == 0) {
    state->synced = true;
    state->synced_reason = "InSync";
    state->synced_message = "the cache holds a copy of every selected object, equal to it";
    return;
  }
  state->synced = false;
  absl::Time since = options_.writer->UnavailableSince();
  if (since != absl::InfinitePast()) {
    state->synced_reason = "CacheUnavailable";
    state->synced_message =
        absl::StrCat("the cache server cannot be reached (since ",
                     absl::FormatTime("%Y-%m-%d%ET%H:%M:%SZ", since, absl::UTCTimeZone()), "); ",
                     pending, " objects wait to be written to it");
  } else {
    state->synced_reason = "Pending";
    state->synced_message = absl::StrCat(pending, " objects are not yet written to the cache");
  }
}

CcrController::Next CcrController::Reconcile(const std::string& key) {
  auto [cluster, name] = SplitCcrKey(key);
  ObjectRef ccr = options_.ccrs->store().Get(key);
  if (ccr == nullptr) return ReconcileGone(cluster, name);

  CcrState state;
  state.generation = ccr->metadata().generation();
  state.epoch = options_.epoch;
  CcrInvalid invalid;
  absl::StatusOr<CcrSpec> spec = ParseCcrSpec(*ccr, &invalid);
  ObjectRef duplicate_of = Validate(*ccr, spec, invalid, &state);
  // Every path below may update the CCR's copy: what it names now is purged first.
  if (std::optional<Next> held =
          PurgeFormerResource(key, cluster, name, spec.ok() ? &*spec : nullptr)) {
    return *held;
  }
  if (ccr->metadata().has_deletion_timestamp()) {
    return ReconcileDeleting(*ccr, spec, state.valid, &state);
  }
  if (!HasFinalizer(*ccr)) return AddFinalizer(*ccr);
  Next next = ReconcileReplication(key, *ccr, spec, duplicate_of, &state);
  SetNotSynced(&state);
  state.phase =
      state.valid && state.started ? CcrState::Phase::kReady : CcrState::Phase::kInitializing;
  absl::StatusOr<v1::Object> stored = Publish(*ccr, state);
  if (!stored.ok()) return Next::kRetry;
  return next;
}

CcrController::Next CcrController::ReconcileGone(const std::string& cluster,
                                                 const std::string& name) {
  std::string key = CcrKey(cluster, name);
  TakeController(key).reset();
  if (std::optional<Next> held = PurgeFormerResource(key, cluster, name, nullptr)) return *held;
  if (options_.metrics != nullptr) options_.metrics->RemoveCacheObjects(cluster, name);
  SyncCopy(cluster, name, nullptr);
  return Next::kDone;
}

std::optional<CcrController::Next> CcrController::PurgeFormerResource(const std::string& key,
                                                                      const std::string& cluster,
                                                                      const std::string& name,
                                                                      const CcrSpec* current) {
  std::optional<v1::GroupVersionResource> former = NamedByCopy(cluster, name);
  if (!former.has_value()) return std::nullopt;
  if (current != nullptr && GvrKey(current->resource) == GvrKey(*former)) return std::nullopt;
  // A controller that still replicates the former resource would restore what is purged.
  std::unique_ptr<ReplicationController> old;
  {
    absl::MutexLock l(&mu_);
    auto it = controllers_.find(key);
    if (it != controllers_.end() &&
        (current == nullptr || GvrKey(it->second->spec().resource) != GvrKey(current->resource))) {
      old = std::move(it->second);
      controllers_.erase(it);
    }
  }
  old.reset();
  if (BackedByAnother(cluster, name, *former)) return std::nullopt;
  int64_t left = Purge(*former, cluster);
  if (left == 0) return std::nullopt;
  if (left > 0) {
    spdlog::info(
        "clustercachedresource {}|{}: its copy in the cache names {}, which it no longer "
        "replicates: {} copies are purged before the copy changes",
        cluster, name, GvrKey(*former), left);
  }
  if (!options_.writer->Available()) {
    RequeueWhenAvailable(key);
    return Next::kDone;
  }
  return left < 0 ? Next::kRetry : Next::kSoon;  // until the cache informer shows none left
}

std::optional<v1::GroupVersionResource> CcrController::NamedByCopy(const std::string& cluster,
                                                                   const std::string& name) const {
  ObjectRef copy = options_.cache_ccrs->store().Get(ObjectKey(options_.shard, cluster, "", name));
  int64_t seen = copy != nullptr ? ResourceVersionNumber(*copy) : 0;
  {
    absl::MutexLock l(&mu_);
    auto it = copies_written_.find(CcrKey(cluster, name));
    if (it != copies_written_.end() && it->second.resource_version > seen) return it->second.names;
  }
  if (copy == nullptr) return std::nullopt;
  absl::StatusOr<CcrSpec> spec = ParseCcrSpec(*copy, nullptr);
  if (!spec.ok()) return std::nullopt;
  return spec->resource;
}

bool CcrController::BackedByAnother(const std::string& cluster, const std::string& name,
                                    const v1::GroupVersionResource& resource) const {
  for (const ObjectRef& o : options_.ccrs->store().List()) {
    if (o->metadata().cluster() != cluster || o->metadata().name() == name ||
        o->metadata().has_deletion_timestamp()) {
      continue;
    }
    absl::StatusOr<CcrSpec> spec = ParseCcrSpec(*o, nullptr);
    if (!spec.ok() || GvrKey(spec->resource) != GvrKey(resource) ||
        EarlierDuplicate(*o, *spec) != nullptr) {
      continue;
    }
    std::optional<v1::GroupVersionResource> named = NamedByCopy(cluster, o->metadata().name());
    if (named.has_value() && GvrKey(*named) == GvrKey(resource)) return true;
  }
  return false;
}

ObjectRef CcrController::Validate(const v1::Object& ccr, const absl::StatusOr<CcrSpec>& spec,
                                  const CcrInvalid& invalid, CcrState* state) const {
  const std::string& cluster = ccr.metadata().cluster();
  ObjectRef duplicate_of = spec.ok() ? EarlierDuplicate(ccr, *spec) : nullptr;
  state->valid = spec.ok() && duplicate_of == nullptr;
  if (!spec.ok()) {
    state->valid_reason = invalid.reason;
    state->valid_message = invalid.message;
  } else if (duplicate_of != nullptr) {
    state->valid_reason = "DuplicateResource";
    state->valid_message =
        absl::StrCat("clustercachedresource \"", duplicate_of->metadata().name(),
                     "\" in cluster \"", cluster, "\" already replicates ",
                     GroupResource(spec->resource), "; only the first one for a resource is used");
  } else {
    state->valid_reason = "Valid";
    state->valid_message = absl::StrCat(
        "replicates ", GvrKey(spec->resource), " in cluster \"", cluster, "\"",
        spec->selector_string.empty() ? std::string()
                                      : absl::StrCat(" matching \"", spec->selector_string, "\""));
  }
  return duplicate_of;
}

CcrController::Next CcrController::AddFinalizer(const v1::Object& ccr) {
  v1::UpdateRequest request;
  *request.mutable_resource() = CcrResource();
  *request.mutable_object() = ccr;
  request.mutable_object()->mutable_metadata()->add_finalizers(kReplicatorFinalizer);
  *request.mutable_fence() = Fence();
  absl::StatusOr<v1::Object> updated = WriteShardStore(request, /*status=*/false);
  if (!updated.ok()) {
    CheckFenced(updated.status());
    spdlog::warn("clustercachedresource {}|{}: adding the finalizer failed: {}",
                 ccr.metadata().cluster(), ccr.metadata().name(), updated.status().ToString());
    return Next::kRetry;
  }
  return Next::kDone;  // the update comes back through the informer
}

CcrController::Next CcrController::ReconcileReplication(const std::string& key,
                                                        const v1::Object& ccr,
                                                        const absl::StatusOr<CcrSpec>& spec,
                                                        const ObjectRef& duplicate_of,
                                                        CcrState* state) {
  const std::string& cluster = ccr.metadata().cluster();
  absl::Status old_stop_reason = RetireController(key, cluster, spec, *state, duplicate_of);
  if (!state->valid) {
    state->started = false;
    state->started_reason = "InvalidResource";
    state->started_message = "nothing is replicated while ResourceValid is False";
    return Next::kDone;
  }
  if (!options_.shard_informers->IsServed(spec->resource)) {
    return ReconcileUnserved(*spec, cluster, state);
  }
  return ReconcileServed(key, ccr, *spec, old_stop_reason, state);
}

absl::Status CcrController::RetireController(const std::string& key, const std::string& cluster,
                                             const absl::StatusOr<CcrSpec>& spec,
                                             const CcrState& state, const ObjectRef& duplicate_of) {
  std::unique_ptr<ReplicationController> old;
  {
    absl::MutexLock l(&mu_);
    auto it = controllers_.find(key);
    if (it != controllers_.end()) {
      const CcrSpec& running = it->second->spec();
      bool same = state.valid && GvrKey(running.resource) == GvrKey(spec->resource) &&
                  running.selector_string == spec->selector_string;
      if (!same || it->second->Stopped()) {
        old = std::move(it->second);
        controllers_.erase(it);
      }
    }
  }
  if (old == nullptr) return absl::OkStatus();
  absl::Status old_stop_reason = old->Stopped() ? old->StopReason() : absl::OkStatus();
  v1::GroupVersionResource old_resource = old->spec().resource;
  old.reset();
  // Copies under a resource that this CCR no longer names go.
  if (!state.valid || GvrKey(old_resource) != GvrKey(spec->resource)) {
    if (!state.valid && spec.ok() && duplicate_of != nullptr) {
      // Another CCR owns the resource now: leave its copies alone.
    } else {
      Purge(old_resource, cluster);
    }
  }
  return old_stop_reason;
}

CcrController::Next CcrController::ReconcileUnserved(const CcrSpec& spec,
                                                     const std::string& cluster, CcrState* state) {
  state->started = false;
  state->started_reason = "ResourceNotServed";
  state->started_message = absl::StrCat(
      "the shard does not serve ", GvrKey(spec.resource),
      ": no ResourceDefinition defines it in this version; replication starts when one does");
  int64_t left = Purge(spec.resource, cluster);
  state->cache_count = std::max<int64_t>(left, 0);
  return Next::kRetry;
}

CcrController::Next CcrController::ReconcileServed(const std::string& key, const v1::Object& ccr,
                                                   const CcrSpec& spec,
                                                   const absl::Status& old_stop_reason,
                                                   CcrState* state) {
  bool running_now;
  {
    absl::MutexLock l(&mu_);
    running_now = controllers_.count(key) > 0;
  }
  if (!running_now) {
    std::optional<v1::GroupVersionResource> named =
        NamedByCopy(ccr.metadata().cluster(), ccr.metadata().name());
    if (!named.has_value() || GvrKey(*named) != GvrKey(spec.resource)) {
      // The copy that Publish writes names the resource first; its acknowledgement enqueues.
      {
        absl::MutexLock l(&mu_);
        awaiting_copy_.insert(key);
      }
      state->started = false;
      state->started_reason = "WaitingForSync";
      state->started_message = absl::StrCat(
          "replication starts once the cache holds the clustercachedresource's copy naming ",
          GvrKey(spec.resource));
      state->synced_reason = "WaitingForSync";
      state->synced_message = "the clustercachedresource's copy is not yet in the cache";
      return Next::kSoon;
    }
  }
  absl::StatusOr<ReplicationController*> running = EnsureController(key, ccr, spec);
  if (!running.ok()) {
    const absl::Status& failed = running.status();
    state->started = false;
    bool unserved = absl::IsNotFound(failed);
    state->started_reason = unserved ? "ResourceNotServed" : "InformerStopped";
    state->started_message =
        absl::StrCat(unserved ? "the shard does not serve " : "the informers of ",
                     GvrKey(spec.resource), unserved ? "" : " are not available",
                     old_stop_reason.ok()
                         ? ""
                         : absl::StrCat(" (replication stopped: ", old_stop_reason.message(), ")"),
                     ": ", failed.message(), "; retrying");
    return Next::kRetry;
  }
  state->local_count = (*running)->LocalCount();
  state->cache_count = (*running)->CacheCount();
  if (!(*running)->HasSynced()) {
    state->started = false;
    state->started_reason = "WaitingForSync";
    state->started_message = "replication waits for the informers' initial lists";
    return Next::kSoon;
  }
  state->started = true;
  state->started_reason = "Started";
  state->started_message = absl::StrCat("replicating ", GvrKey(spec.resource), " into the cache");
  SetSynced((*running)->Pending(), state);
  return Next::kDone;
}

absl::StatusOr<ReplicationController*> CcrController::EnsureController(const std::string& key,
                                                                       const v1::Object& ccr,
                                                                       const CcrSpec& spec) {
  {
    absl::MutexLock l(&mu_);
    auto it = controllers_.find(key);
    if (it != controllers_.end()) return it->second.get();
  }
  const std::string& cluster = ccr.metadata().cluster();
  ListWatchFilters local_filters;
  local_filters.cluster = cluster;
  absl::StatusOr<std::shared_ptr<SharedInformer>> local =
      options_.shard_informers->ForResource(spec.resource, local_filters);
  if (!local.ok()) return local.status();
  absl::StatusOr<std::shared_ptr<SharedInformer>> copies = CacheInformer(spec.resource, cluster);
  if (!copies.ok()) return copies.status();
  ReplicationController::Options o;
  o.shard = options_.shard;
  o.cluster = cluster;
  o.ccr_name = ccr.metadata().name();
  o.spec = spec;
  o.workers = options_.workers;
  o.pool = pool_;
  o.resync_period = options_.resync_period;
  o.clock = options_.clock;
  o.writer = options_.writer;
  o.metrics = options_.metrics;
  o.registry = options_.registry;
  WorkQueue* queue = queue_.get();
  o.on_stopped = [queue, key](const absl::Status&) { queue->Add(key); };
  o.on_change = [queue, key] { queue->AddAfter(key, absl::Milliseconds(300)); };
  absl::StatusOr<std::unique_ptr<ReplicationController>> started =
      ReplicationController::Start(std::move(o), *local, *copies);
  if (!started.ok()) return started.status();
  ReplicationController* running = started->get();
  absl::MutexLock l(&mu_);
  controllers_[key] = *std::move(started);
  return running;
}

void CcrController::SetNotSynced(CcrState* state) {
  if (state->started || !state->synced_reason.empty()) return;
  bool waiting = state->started_reason == "WaitingForSync";
  state->synced_reason = waiting ? "WaitingForSync" : "NotReplicating";
  state->synced_message = waiting ? "the informers' initial lists are not complete yet"
                                  : "nothing is replicated while ReplicationStarted is False";
}

absl::StatusOr<v1::Object> CcrController::Publish(const v1::Object& ccr, const CcrState& state) {
  const std::string& cluster = ccr.metadata().cluster();
  const std::string& name = ccr.metadata().name();
  if (options_.metrics != nullptr) {
    options_.metrics->SetCacheObjects(cluster, name, state.cache_count);
  }
  absl::StatusOr<v1::Object> stored = WriteStatus(ccr, state);
  if (!stored.ok()) {
    if (!absl::IsAborted(stored.status())) {
      spdlog::warn("clustercachedresource {}|{}: writing the status failed: {}", cluster, name,
                   stored.status().ToString());
    }
    return stored.status();  // a conflict: the informer brings the newer CCR
  }
  SyncCopy(cluster, name, &*stored);
  return stored;
}

CcrController::Next CcrController::ReconcileDeleting(const v1::Object& ccr,
                                                     const absl::StatusOr<CcrSpec>& spec,
                                                     bool owner, CcrState* state) {
  const std::string& cluster = ccr.metadata().cluster();
  const std::string& name = ccr.metadata().name();
  std::string key = CcrKey(cluster, name);
  TakeController(key).reset();
  state->started = false;
  state->started_reason = "Deleting";
  state->started_message = "the clustercachedresource is being deleted; its copies are removed";
  state->synced_reason = "Deleting";
  state->synced_message = "the clustercachedresource is being deleted";
  if (!HasFinalizer(ccr)) {
    // Not ours to hold: only keep the copy of the CCR current.
    SyncCopy(cluster, name, &ccr);
    return Next::kDone;
  }
  // Deleting is shown before anything is purged, so that it is seen even with no copies.
  auto phase = ccr.status().fields().find("phase");
  bool shown = phase != ccr.status().fields().end() &&
               (phase->second.string_value() == PhaseName(CcrState::Phase::kDeleting) ||
                phase->second.string_value() == PhaseName(CcrState::Phase::kDeleted));
  int64_t left = -1;
  if (shown) left = owner && spec.ok() ? Purge(spec->resource, cluster) : 0;
  state->cache_count = std::max<int64_t>(left, 0);
  if (!shown && owner && spec.ok()) {
    absl::StatusOr<std::shared_ptr<SharedInformer>> copies = CacheInformer(spec->resource, cluster);
    if (copies.ok()) state->cache_count = static_cast<int64_t>((*copies)->store().Size());
  }
  state->phase = left == 0 ? CcrState::Phase::kDeleted : CcrState::Phase::kDeleting;
  if (options_.metrics != nullptr) {
    options_.metrics->SetCacheObjects(cluster, name, state->cache_count);
  }
  absl::StatusOr<v1::Object> stored = WriteStatus(ccr, *state);
  if (!stored.ok()) return Next::kRetry;
  SyncCopy(cluster, name, &*stored);
  if (left != 0) return Next::kSoon;  // until the cache informer shows the copies gone
  return RemoveFinalizer(*stored);
}

CcrController::Next CcrController::RemoveFinalizer(const v1::Object& ccr) {
  const std::string& cluster = ccr.metadata().cluster();
  const std::string& name = ccr.metadata().name();
  v1::UpdateRequest request;
  *request.mutable_resource() = CcrResource();
  *request.mutable_object() = ccr;
  auto* finalizers = request.mutable_object()->mutable_metadata()->mutable_finalizers();
  finalizers->erase(std::remove(finalizers->begin(), finalizers->end(), kReplicatorFinalizer),
                    finalizers->end());
  *request.mutable_fence() = Fence();
  absl::StatusOr<v1::Object> updated = WriteShardStore(request, /*status=*/false);
  if (!updated.ok()) {
    CheckFenced(updated.status());
    if (!absl::IsNotFound(updated.status())) {
      spdlog::warn("clustercachedresource {}|{}: removing the finalizer failed: {}", cluster, name,
                   updated.status().ToString());
      return Next::kRetry;
    }
  }
  spdlog::info("clustercachedresource {}|{}: copies purged, finalizer removed", cluster, name);
  return Next::kDone;
}

}  // namespace shardcache
