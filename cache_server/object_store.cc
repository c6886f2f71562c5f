#include "cache_server/object_store.h"

#include <google/protobuf/util/message_differencer.h>
#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cache_server/list_token.h"
#include "cache_server/object_validation.h"
#include "cache_server/uuid.h"
#include "common/error_info.h"
#include "common/resources.h"
#include "common/status_macros.h"
#include "common/validation.h"

namespace shardcache {
namespace {

using google::protobuf::util::MessageDifferencer;
using google::protobuf::util::TimeUtil;

std::string Describe(const v1::GroupVersionResource& gvr, const std::string& name) {
  std::string r =
      gvr.group().empty() ? gvr.resource() : absl::StrCat(gvr.resource(), ".", gvr.group());
  return absl::StrCat(r, " \"", name, "\"");
}

absl::Status Conflict(const v1::GroupVersionResource& gvr, const std::string& name,
                      const std::string& why) {
  return absl::AbortedError(absl::StrCat(
      "Operation cannot be fulfilled on ", Describe(gvr, name), ": ", why,
      "; the object has been modified; please apply your changes to the latest version and try "
      "again"));
}

// The leading key prefix that every object matching `f` has.
std::string KeyPrefix(const ObjectFilter& f) {
  if (f.shard.empty()) return "";
  std::string p = f.shard + '\0';
  if (f.cluster.empty()) return p;
  p.append(f.cluster).push_back('\0');
  if (f.namespace_.empty()) return p;
  p.append(f.namespace_).push_back('\0');
  return p;
}

// The object of the last version at or before `revision` (null: absent or deleted then).
template <typename Versions>
const ObjectRef& VersionAt(const Versions& versions, int64_t revision) {
  static const ObjectRef* const kNone = new ObjectRef();
  auto v = std::upper_bound(versions.begin(), versions.end(), revision,
                            [](int64_t rev, const auto& ver) { return rev < ver.revision; });
  return v == versions.begin() ? *kNone : std::prev(v)->object;
}

int64_t RevisionOf(const ObjectRef& o) {
  int64_t rv = 0;
  (void)absl::SimpleAtoi(o->metadata().resource_version(), &rv);
  return rv;
}

// Runs an asynchronous store call and waits for its callback.
template <typename T>
absl::StatusOr<T> Await(const std::function<void(std::function<void(absl::StatusOr<T>)>)>& start) {
  absl::Notification done;
  absl::StatusOr<T> result = absl::UnknownError("not completed");
  start([&](absl::StatusOr<T> r) {
    result = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

// Gives `result` to `done` once revision `revision` (0: none) and every epoch claimed so far
// are durable.
template <typename T>
void AnswerWhenDurable(GroupCommitter* committer, int64_t revision,
                       std::function<void(absl::StatusOr<T>)> done, absl::StatusOr<T> result) {
  committer->CompleteWhenDurable(
      revision,
      [done = std::move(done), result = std::move(result)]() mutable { done(std::move(result)); });
}

}  // namespace

ObjectStore::ObjectStore(Options options, WatchCache* watch_cache, StoreMetrics* metrics,
                         PersistedState state)
    : options_(options),
      watch_cache_(watch_cache),
      metrics_(metrics),
      store_id_(state.store_id.empty() ? NewUuid() : state.store_id),
      registry_(options.role),
      committer_(options.storage, watch_cache, metrics, this, state.revision,
                 state.compacted_revision) {
  const int64_t loaded_revision = state.revision;
  {
    absl::MutexLock l(&mu_);
    RecoverLocked(std::move(state));
    etcd_seen_revision_ = loaded_revision;
  }
  watch_cache_->SetHistory(this);
  committer_.Start();
  if (on_etcd()) {
    progress_writer_ = std::make_unique<EtcdProgressWriter>(
        options_.etcd, EtcdProgressKey(options_.etcd_prefix),
        [this](const absl::Status& status) {
          // Nothing may come to release the waiters: end them (their writers may try again).
          FailSeenWaiters(status);
        },
        [this] { metrics_->etcd_progress_writes.Increment(); });
    const std::string all = options_.etcd_prefix + "/";
    etcd_watch_ = options_.etcd->Watch(all, EtcdClient::PrefixEnd(all), loaded_revision + 1, this);
  }
}

ObjectStore::~ObjectStore() {
  if (on_etcd()) {
    // No write starts from now on, nothing more is applied, and every transaction on its way is
    // answered; the committer's Stop then answers the writes that etcd committed but the watch
    // has not brought back.
    {
      absl::MutexLock l(&etcd_mu_);
      etcd_stopping_ = true;
    }
    etcd_watch_->Stop();
    progress_writer_->Stop();
    {
      absl::MutexLock l(&etcd_mu_);
      etcd_mu_.Await(absl::Condition(
          +[](int* txns) { return *txns == 0; }, &etcd_txns_));
    }
    // Writes waiting to be decided again end UNAVAILABLE.
    FailSeenWaiters(absl::UnavailableError("server shutting down"));
  }
  committer_.Stop();
  watch_cache_->SetHistory(nullptr);
}

absl::Status ObjectStore::ReadHistory(const std::string& group_resource, int64_t after,
                                      int64_t up_to, size_t max_events,
                                      std::vector<EventPtr>* out) const {
  absl::ReaderMutexLock l(&mu_);
  if (after < compacted_revision_) {
    return absl::OutOfRangeError(absl::StrCat("events after revision ", after,
                                              " have left the history window (oldest ",
                                              compacted_revision_, ")"));
  }
  auto first = std::upper_bound(history_.begin(), history_.end(), after,
                                [](int64_t rev, const EventPtr& e) { return rev < e->revision; });
  size_t appended = 0;
  for (auto it = first; it != history_.end() && (*it)->revision <= up_to; ++it) {
    if ((*it)->group_resource != group_resource) continue;
    out->push_back(*it);
    if (++appended == max_events) break;
  }
  return absl::OkStatus();
}

void ObjectStore::RecoverLocked(PersistedState state) {
  revision_ = durable_revision_ = state.revision;
  compacted_revision_ = state.compacted_revision;
  epochs_ = std::move(state.epochs);
  // The history gives each key its versions inside the window (and the one before it).
  for (EventPtr& e : state.history) {
    std::vector<Version>& versions =
        resources_[e->group_resource].keys[ObjectKey(e->object->metadata())];
    if (versions.empty() && e->prev != nullptr) {
      versions.push_back(Version{RevisionOf(e->prev), e->prev});
    }
    versions.push_back(
        Version{e->revision, e->type == v1::WatchEvent::DELETED ? nullptr : e->object});
    history_.push_back(std::move(e));
  }
  const std::string definitions = absl::StrCat(kDefinitionGroup, "/", kDefinitionResource);
  for (auto& [gr, obj] : state.objects) {
    std::vector<Version>& versions = resources_[gr].keys[ObjectKey(obj->metadata())];
    if (versions.empty()) versions.push_back(Version{RevisionOf(obj), obj});
    ++live_objects_;
    if (gr == definitions) OnDefinitionChangedLocked(nullptr, versions.back().object);
  }
  // Definitions are applied directly: OnDefinitionChangedLocked(nullptr, ...) queues nothing
  // for the committer.
  // The stored window may be a batch wider than the limits (the committer compacts after it
  // writes); apply them now so that the window is the same as before the restart.
  CompactLocked();
  metrics_->revision.Set(static_cast<double>(revision_));
  metrics_->objects.Set(static_cast<double>(live_objects_));
  metrics_->history_events.Set(static_cast<double>(history_.size()));
}

int64_t ObjectStore::revision() const {
  absl::ReaderMutexLock l(&mu_);
  return durable_revision_;
}

ObjectRef ObjectStore::DurableLocked(const std::string& group_resource,
                                     const std::string& key) const {
  auto r = resources_.find(group_resource);
  if (r == resources_.end()) return nullptr;
  auto k = r->second.keys.find(key);
  if (k == r->second.keys.end()) return nullptr;
  return VersionAt(k->second, durable_revision_);
}

std::vector<ObjectStore::ResourceSummary> ObjectStore::Resources() const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<ResourceSummary> out;
  for (const auto& [group_resource, data] : resources_) {
    for (const auto& [key, versions] : data.keys) {
      ObjectRef live = VersionAt(versions, durable_revision_);
      if (live == nullptr) continue;
      out.push_back({group_resource, !live->metadata().namespace_().empty()});
      break;
    }
  }
  std::sort(out.begin(), out.end(), [](const ResourceSummary& a, const ResourceSummary& b) {
    return a.group_resource < b.group_resource;
  });
  return out;
}

void ObjectStore::OnDurable(int64_t revision) {
  {
    absl::MutexLock l(&mu_);
    durable_revision_ = revision;
    CompactLocked();
    metrics_->revision.Set(static_cast<double>(durable_revision_));
  }
  if (on_etcd()) MaybeCompactEtcd();
}

void ObjectStore::OnIdle() {
  (void)CheckSpace();  // keeps the metric current while no write comes
  {
    absl::MutexLock l(&mu_);
    CompactLocked();  // let old events leave the window by age
  }
  if (on_etcd()) MaybeCompactEtcd();
}

absl::StatusOr<ObjectRef> ObjectStore::Create(const v1::CreateRequest& req) {
  return Await<ObjectRef>([&](ObjectCallback done) { CreateAsync(req, std::move(done)); });
}

absl::StatusOr<ObjectRef> ObjectStore::Update(const v1::UpdateRequest& req) {
  return Await<ObjectRef>([&](ObjectCallback done) { UpdateAsync(req, std::move(done)); });
}

absl::StatusOr<ObjectRef> ObjectStore::UpdateStatus(const v1::UpdateRequest& req) {
  return Await<ObjectRef>([&](ObjectCallback done) { UpdateStatusAsync(req, std::move(done)); });
}

absl::StatusOr<ObjectRef> ObjectStore::Upsert(const v1::UpdateRequest& req) {
  return Await<ObjectRef>([&](ObjectCallback done) { UpsertAsync(req, std::move(done)); });
}

absl::StatusOr<ObjectStore::DeleteResult> ObjectStore::Delete(const v1::DeleteRequest& req) {
  return Await<DeleteResult>([&](DeleteCallback done) { DeleteAsync(req, std::move(done)); });
}

absl::StatusOr<int64_t> ObjectStore::ClaimEpoch(const v1::ClaimEpochRequest& req) {
  return Await<int64_t>([&](EpochCallback done) { ClaimEpochAsync(req, std::move(done)); });
}

absl::StatusOr<int64_t> ObjectStore::ClaimEpochLocked(const v1::ClaimEpochRequest& req) {
  const v1::Fence& fence = req.fence();
  // A write's fence is optional; a claim's is the whole request.
  RETURN_IF_ERROR(ValidateDNS1123Label("fence.shard", fence.shard()));
  if (fence.epoch() == 0) {
    return absl::InvalidArgumentError("fence.epoch: Required value: the epoch to claim");
  }
  RETURN_IF_ERROR(CheckFenceLocked(fence, "claim"));
  return fence.epoch();  // the shard's highest epoch now
}

void ObjectStore::ClaimEpochAsync(const v1::ClaimEpochRequest& req, EpochCallback done) {
  if (on_etcd()) {
    auto op = std::make_shared<EtcdOp>();
    auto request = std::make_shared<v1::ClaimEpochRequest>(req);
    auto result = std::make_shared<absl::StatusOr<int64_t>>();
    op->queue_key = absl::StrCat("e/", req.fence().shard());
    op->decide = [this, request, result]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      *result = ClaimEpochLocked(*request);
      return result->status();
    };
    op->answer = [result, done = std::move(done)](absl::Status status, int64_t) {
      if (status.ok()) {
        done(*result);
      } else {
        done(std::move(status));
      }
    };
    StartEtcdOp(std::move(op));
    return;
  }
  absl::StatusOr<int64_t> result = [&]() -> absl::StatusOr<int64_t> {
    absl::MutexLock l(&mu_);
    return ClaimEpochLocked(req);
  }();
  // No revision to wait for; CompleteWhenDurable also waits for every epoch claimed so far, this
  // one included (the committer writes a batch of epochs alone when nothing else is pending).
  AnswerWhenDurable(&committer_, 0, std::move(done), std::move(result));
}

ObjectRef ObjectStore::CurrentLocked(const std::string& group_resource,
                                     const std::string& key) const {
  auto r = resources_.find(group_resource);
  if (r == resources_.end()) return nullptr;
  auto k = r->second.keys.find(key);
  if (k == r->second.keys.end() || k->second.empty()) return nullptr;
  return k->second.back().object;
}

absl::StatusOr<ObjectRef> ObjectStore::Get(const v1::GetRequest& req, bool consistent) const {
  if (consistent) RETURN_IF_ERROR(AwaitConsistentRead());
  absl::ReaderMutexLock l(&mu_);
  ASSIGN_OR_RETURN(ResourceInfo info, registry_.Resolve(req.resource()));
  RETURN_IF_ERROR(ValidateKey(info, "", req.shard(), req.cluster(), req.namespace_(), req.name()));
  ObjectRef cur = DurableLocked(
      info.group_resource, ObjectKey(req.shard(), req.cluster(), req.namespace_(), req.name()));
  if (cur == nullptr) {
    return absl::NotFoundError(absl::StrCat(Describe(req.resource(), req.name()), " not found"));
  }
  return cur;
}

absl::StatusOr<v1::ListResponse> ObjectStore::List(const v1::ListRequest& req) const {
  ASSIGN_OR_RETURN(ListPage page, ListObjects(req));
  v1::ListResponse resp = std::move(page.header);
  resp.mutable_items()->Reserve(static_cast<int>(page.items.size()));
  for (const ObjectRef& obj : page.items) *resp.add_items() = *obj;
  return resp;
}

absl::StatusOr<ObjectStore::ListPage> ObjectStore::ListObjects(const v1::ListRequest& req) const {
  if (req.limit() < 0) {
    return absl::InvalidArgumentError("limit: Invalid value: must not be negative");
  }
  ASSIGN_OR_RETURN(ObjectFilter filter,
                   MakeFilter(req.shard(), req.cluster(), req.namespace_(), req.label_selector()));
  bool continued = !req.continue_token().empty();
  ListPosition position;
  if (continued) {
    ASSIGN_OR_RETURN(position, DecodeContinueToken(req.continue_token()));
  }
  int64_t at = position.revision;
  const std::string& last_key = position.last_key;
  if (!continued) {
    RETURN_IF_ERROR(AwaitConsistentRead());
  } else if (on_etcd()) {
    // A page of a list that another replica began: this one may not have reached its revision.
    auto reached = [this, at]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return durable_revision_ >= at; };
    const bool caught_up =
        mu_.ReaderLockWhenWithTimeout(absl::Condition(&reached), options_.consistent_read_timeout);
    mu_.ReaderUnlock();
    if (!caught_up) {
      return absl::UnavailableError(
          absl::StrCat("this replica has not reached the list's revision ", at, " yet; try again"));
    }
  }

  absl::ReaderMutexLock l(&mu_);
  ASSIGN_OR_RETURN(ResourceInfo info, registry_.Resolve(req.resource()));
  if (!continued) {
    at = durable_revision_;
  } else if (at < compacted_revision_) {
    return absl::OutOfRangeError(
        absl::StrCat("continue_token: too old resource version: the list's revision ", at,
                     " has left the history window (oldest ", compacted_revision_,
                     "); list again without a continue token"));
  } else if (at > durable_revision_) {
    return absl::InvalidArgumentError(
        "continue_token: Invalid value: its revision is newer than the store's");
  }
  ListPage page;
  v1::ListResponse& resp = page.header;
  resp.set_resource_version(absl::StrCat(at));
  resp.set_store_id(store_id_);
  auto r = resources_.find(info.group_resource);
  if (r == resources_.end()) return page;
  const auto& keys = r->second.keys;
  std::string prefix = KeyPrefix(filter);
  auto it = continued ? keys.upper_bound(last_key) : keys.lower_bound(prefix);
  if (continued && last_key < prefix) it = keys.lower_bound(prefix);
  std::string last_returned;
  for (; it != keys.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    const ObjectRef& obj = VersionAt(it->second, at);
    if (obj == nullptr || !filter.Matches(*obj)) continue;
    if (req.limit() > 0 && static_cast<int64_t>(page.items.size()) == req.limit()) {
      resp.set_continue_token(EncodeContinueToken(at, last_returned));
      break;
    }
    page.items.push_back(obj);
    last_returned = it->first;
  }
  return page;
}

absl::Status ObjectStore::CheckFenceLocked(const v1::Fence& fence, const char* what) {
  if (fence.shard().empty() && fence.epoch() == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDNS1123Label("fence.shard", fence.shard()));
  if (fence.epoch() <= 0) {
    return absl::InvalidArgumentError("fence.epoch: Invalid value: must be positive");
  }
  auto known = epochs_.find(fence.shard());
  const int64_t highest = known == epochs_.end() ? 0 : known->second;
  if (fence.epoch() < highest) {
    return FencedError(
        absl::StrCat("fenced: shard \"", fence.shard(), "\" is at epoch ", highest, " and this ",
                     what, " carries epoch ", fence.epoch(), " (a newer leader holds the shard)"),
        fence.shard(), highest, fence.epoch());
  }
  if (on_etcd()) {
    // Compared in the write's transaction; the watch brings the raised epoch back.
    proposal_.fence_shard = fence.shard();
    proposal_.fence_epoch = fence.epoch();
    proposal_.seen_epoch = highest;
    return absl::OkStatus();
  }
  if (fence.epoch() > highest) {
    epochs_[fence.shard()] = fence.epoch();
    committer_.AddEpoch(fence.shard(), fence.epoch());
  }
  return absl::OkStatus();
}

void ObjectStore::NoteUnchangedLocked(const std::string& group_resource, const ObjectRef& cur) {
  if (!on_etcd()) return;
  proposal_.check_only = true;
  proposal_.group_resource = group_resource;
  proposal_.object = cur;
  proposal_.expected_mod_revision = RevisionOf(cur);
}

void ObjectStore::CommitLocked(const std::string& group_resource, v1::WatchEvent::Type type,
                               ObjectRef object, ObjectRef prev) {
  if (!on_etcd()) {
    ApplyLocked(revision_ + 1, group_resource, type, std::move(object), std::move(prev));
    return;
  }
  // Proposed to etcd; the watch applies it.
  proposal_.has_change = true;
  proposal_.group_resource = group_resource;
  proposal_.is_delete = type == v1::WatchEvent::DELETED;
  proposal_.expected_mod_revision = prev == nullptr ? 0 : RevisionOf(prev);
  if (proposal_.is_delete && options_.role == Role::kShard &&
      group_resource == absl::StrCat(kDefinitionGroup, "/", kDefinitionResource)) {
    // Its objects go in the same transaction (validated when the definition was written).
    absl::StatusOr<ResourceInfo> info = ResourceRegistry::ParseDefinition(*prev, nullptr);
    if (info.ok()) proposal_.purge_group_resource = info->group_resource;
  }
  if (auto d = definition_keys_.find(group_resource); d != definition_keys_.end()) {
    // The definition must still be as this replica saw it when the transaction commits.
    const std::string definitions = absl::StrCat(kDefinitionGroup, "/", kDefinitionResource);
    if (ObjectRef definition = CurrentLocked(definitions, d->second); definition != nullptr) {
      proposal_.definition_key =
          EtcdObjectKey(options_.etcd_prefix, definitions, definition->metadata());
      proposal_.definition_mod_revision = RevisionOf(definition);
    }
  }
  proposal_.object = std::move(object);
}

void ObjectStore::ApplyLocked(int64_t revision, const std::string& group_resource,
                              v1::WatchEvent::Type type, ObjectRef object, ObjectRef prev) {
  revision_ = revision;
  auto event = std::make_shared<Event>();
  event->revision = revision_;
  event->type = type;
  event->group_resource = group_resource;
  event->object = object;
  event->prev = prev;
  event->time = options_.clock->Now();

  std::vector<Version>& versions = resources_[group_resource].keys[ObjectKey(object->metadata())];
  versions.push_back(Version{revision_, type == v1::WatchEvent::DELETED ? nullptr : object});
  if (type == v1::WatchEvent::ADDED) ++live_objects_;
  if (type == v1::WatchEvent::DELETED) --live_objects_;
  history_.push_back(event);
  committer_.AddEvent(std::move(event));
  metrics_->objects.Set(static_cast<double>(live_objects_));
  metrics_->writes.Increment();
  if (group_resource == absl::StrCat(kDefinitionGroup, "/", kDefinitionResource)) {
    OnDefinitionChangedLocked(prev, type == v1::WatchEvent::DELETED ? nullptr : object);
  }
}

void ObjectStore::CompactLocked() {
  absl::Time oldest_kept = options_.history_age > absl::ZeroDuration()
                               ? options_.clock->Now() - options_.history_age
                               : absl::InfinitePast();
  // Only durable events leave the window: readers at the durable revision need their versions.
  while (!history_.empty() && history_.front()->revision <= durable_revision_ &&
         (static_cast<int64_t>(history_.size()) > options_.history_events ||
          history_.front()->time < oldest_kept)) {
    EventPtr oldest = std::move(history_.front());
    history_.pop_front();
    compacted_revision_ = oldest->revision;
    auto r = resources_.find(oldest->group_resource);
    if (r == resources_.end()) continue;
    auto k = r->second.keys.find(ObjectKey(oldest->object->metadata()));
    if (k == r->second.keys.end()) continue;
    std::vector<Version>& versions = k->second;
    // Keep the last version at or before the compacted revision, and all after it.
    auto keep =
        std::upper_bound(versions.begin(), versions.end(), compacted_revision_,
                         [](int64_t rev, const Version& ver) { return rev < ver.revision; });
    if (keep != versions.begin()) versions.erase(versions.begin(), std::prev(keep));
    if (versions.size() == 1 && versions.front().object == nullptr &&
        versions.front().revision <= compacted_revision_) {
      r->second.keys.erase(k);
    }
  }
  committer_.SetCompactedRevision(compacted_revision_);
  metrics_->history_events.Set(static_cast<double>(history_.size()));
}

absl::Status ObjectStore::CheckSpace() const {
  if (options_.storage == nullptr) return absl::OkStatus();
  // One check at a time, so that the metric ends as the latest answer says.
  absl::MutexLock l(&space_mu_);
  absl::Status space = options_.storage->CheckSpace();
  metrics_->writes_refused_no_space.Set(space.ok() ? 0 : 1);
  return space;
}

absl::StatusOr<ObjectRef> ObjectStore::CreateOpLocked(const v1::CreateRequest& req) {
  ASSIGN_OR_RETURN(ResourceInfo info, registry_.Resolve(req.resource()));
  if (!req.object().metadata().resource_version().empty()) {
    return absl::InvalidArgumentError(
        "metadata.resourceVersion: Invalid value: must be empty when creating an object");
  }
  return CreateLocked(info, req.resource(), req.object(), req.fence(), /*keep_status=*/false);
}

void ObjectStore::CreateAsync(const v1::CreateRequest& req, ObjectCallback done) {
  if (on_etcd()) {
    auto request = std::make_shared<v1::CreateRequest>(req);
    EtcdObjectWrite(
        absl::StrCat("o/", GroupResource(req.resource()), "/", ObjectKey(req.object().metadata())),
        [this, request]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return CreateOpLocked(*request); },
        std::move(done));
    return;
  }
  absl::StatusOr<ObjectRef> result = [&]() -> absl::StatusOr<ObjectRef> {
    RETURN_IF_ERROR(CheckSpace());
    absl::MutexLock l(&mu_);
    return CreateOpLocked(req);
  }();
  int64_t wait = result.ok() ? RevisionOf(*result) : 0;
  AnswerWhenDurable(&committer_, wait, std::move(done), std::move(result));
}

absl::StatusOr<ObjectRef> ObjectStore::CreateLocked(const ResourceInfo& info,
                                                    const v1::GroupVersionResource& gvr,
                                                    v1::Object object, const v1::Fence& fence,
                                                    bool keep_status) {
  RETURN_IF_ERROR(ValidateObject(info, object));
  RETURN_IF_ERROR(
      RefuseShardInShardRole(options_.role, "metadata.shard", object.metadata().shard()));
  v1::ObjectMeta& m = *object.mutable_metadata();
  if (m.has_deletion_timestamp()) {
    return absl::InvalidArgumentError(
        "metadata.deletionTimestamp: Forbidden: may not be set when creating an object");
  }
  std::string key = ObjectKey(m);
  if (CurrentLocked(info.group_resource, key) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat(Describe(gvr, m.name()), " already exists"));
  }
  bool is_definition =
      info.group_resource == absl::StrCat(kDefinitionGroup, "/", kDefinitionResource);
  if (is_definition) RETURN_IF_ERROR(ResourceRegistry::ParseDefinition(object, nullptr).status());
  // The cache role keeps the origin's identity; a shard store owns it.
  bool keep_identity = options_.role == Role::kCache;
  if (!keep_identity || m.uid().empty()) m.set_uid(NewUuid());
  if (!keep_identity || !m.has_creation_timestamp()) {
    *m.mutable_creation_timestamp() =
        TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(options_.clock->Now()));
  }
  if (!keep_identity || m.generation() == 0) m.set_generation(1);
  // As Kubernetes does: with a status subresource, a create sets no status (shard role).
  if (!keep_status && !keep_identity && info.status_subresource) object.clear_status();
  m.set_resource_version(absl::StrCat(revision_ + 1));
  Normalize(&object);
  RETURN_IF_ERROR(CheckSize(object, options_.max_object_bytes));
  RETURN_IF_ERROR(CheckFenceLocked(fence));
  auto stored = std::make_shared<const v1::Object>(std::move(object));
  CommitLocked(info.group_resource, v1::WatchEvent::ADDED, stored, nullptr);
  return stored;
}

void ObjectStore::UpdateAsync(const v1::UpdateRequest& req, ObjectCallback done) {
  UpdateAsyncImpl(req, UpdateKind::kUpdate, std::move(done));
}

void ObjectStore::UpdateStatusAsync(const v1::UpdateRequest& req, ObjectCallback done) {
  UpdateAsyncImpl(req, UpdateKind::kStatus, std::move(done));
}

void ObjectStore::UpsertAsync(const v1::UpdateRequest& req, ObjectCallback done) {
  UpdateAsyncImpl(req, UpdateKind::kUpsert, std::move(done));
}

void ObjectStore::UpdateAsyncImpl(const v1::UpdateRequest& req, UpdateKind kind,
                                  ObjectCallback done) {
  if (on_etcd()) {
    auto request = std::make_shared<v1::UpdateRequest>(req);
    EtcdObjectWrite(
        absl::StrCat("o/", GroupResource(req.resource()), "/", ObjectKey(req.object().metadata())),
        [this, request, kind]()
            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return UpdateLocked(*request, kind); },
        std::move(done));
    return;
  }
  absl::StatusOr<ObjectRef> result = [&]() -> absl::StatusOr<ObjectRef> {
    RETURN_IF_ERROR(CheckSpace());
    absl::MutexLock l(&mu_);
    return UpdateLocked(req, kind);
  }();
  int64_t wait = result.ok() ? RevisionOf(*result) : 0;
  AnswerWhenDurable(&committer_, wait, std::move(done), std::move(result));
}

absl::StatusOr<ObjectRef> ObjectStore::UpdateLocked(const v1::UpdateRequest& req, UpdateKind kind) {
  ASSIGN_OR_RETURN(ResourceInfo info, registry_.Resolve(req.resource()));
  const v1::GroupVersionResource& gvr = req.resource();
  if (kind == UpdateKind::kStatus && options_.role == Role::kShard && !info.status_subresource) {
    return absl::NotFoundError(absl::StrCat("the server could not find the requested resource ",
                                            GvrString(gvr),
                                            "/status: the resource has no status subresource"));
  }
  const v1::ObjectMeta& in = req.object().metadata();
  int64_t expected_rv = 0;
  if (!in.resource_version().empty()) {
    ASSIGN_OR_RETURN(expected_rv, ParseRevision("metadata.resourceVersion", in.resource_version()));
  }
  RETURN_IF_ERROR(ValidateObject(info, req.object()));
  RETURN_IF_ERROR(RefuseShardInShardRole(options_.role, "metadata.shard", in.shard()));
  std::string key = ObjectKey(in);
  ObjectRef cur = CurrentLocked(info.group_resource, key);
  if (cur == nullptr) {
    if (kind != UpdateKind::kUpsert) {
      return absl::NotFoundError(absl::StrCat(Describe(gvr, in.name()), " not found"));
    }
    v1::Object object = req.object();
    object.mutable_metadata()->clear_resource_version();
    return CreateLocked(info, gvr, std::move(object), req.fence(), /*keep_status=*/true);
  }
  const v1::ObjectMeta& cm = cur->metadata();
  if (expected_rv != 0 && absl::StrCat(expected_rv) != cm.resource_version()) {
    return Conflict(gvr, in.name(),
                    absl::StrCat("resourceVersion ", in.resource_version(),
                                 " is not the current one (", cm.resource_version(), ")"));
  }
  // In the cache role uid is the origin's, written through; in a shard store it is a
  // precondition.
  bool keep_identity = options_.role == Role::kCache;
  if (!keep_identity && !in.uid().empty() && in.uid() != cm.uid()) {
    return Conflict(gvr, in.name(),
                    absl::StrCat("uid ", in.uid(), " is not the current one (", cm.uid(), ")"));
  }

  v1::Object next;
  if (kind == UpdateKind::kStatus) {
    next = *cur;
    *next.mutable_status() = req.object().status();
  } else {
    next = req.object();
    v1::ObjectMeta& nm = *next.mutable_metadata();
    if (!keep_identity || nm.uid().empty()) nm.set_uid(cm.uid());
    if (!keep_identity || !nm.has_creation_timestamp()) {
      *nm.mutable_creation_timestamp() = cm.creation_timestamp();
    }
    if (cm.has_deletion_timestamp()) {
      *nm.mutable_deletion_timestamp() = cm.deletion_timestamp();
    } else {
      nm.clear_deletion_timestamp();
    }
    if (!keep_identity || nm.generation() == 0) {
      bool spec_changed = !MessageDifferencer::Equals(next.spec(), cur->spec());
      nm.set_generation(cm.generation() + (spec_changed ? 1 : 0));
    }
    if (kind == UpdateKind::kUpdate && info.status_subresource) {
      *next.mutable_status() = cur->status();
    }
    if (cm.has_deletion_timestamp()) {
      std::set<std::string> old(cm.finalizers().begin(), cm.finalizers().end());
      for (int i = 0; i < nm.finalizers_size(); ++i) {
        if (old.count(nm.finalizers(i)) == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("metadata.finalizers[", i,
                           "]: Forbidden: no new finalizers can be added if the "
                           "object is being deleted"));
        }
      }
    }
  }
  next.mutable_metadata()->set_resource_version(cm.resource_version());
  Normalize(&next);
  if (MessageDifferencer::Equals(next, *cur)) {
    RETURN_IF_ERROR(CheckFenceLocked(req.fence()));
    NoteUnchangedLocked(info.group_resource, cur);
    return cur;  // no change: no new revision
  }

  bool is_definition =
      info.group_resource == absl::StrCat(kDefinitionGroup, "/", kDefinitionResource);
  if (is_definition) RETURN_IF_ERROR(ResourceRegistry::ParseDefinition(next, cur.get()).status());
  next.mutable_metadata()->set_resource_version(absl::StrCat(revision_ + 1));
  RETURN_IF_ERROR(CheckSize(next, options_.max_object_bytes));
  RETURN_IF_ERROR(CheckFenceLocked(req.fence()));
  bool finalized =
      next.metadata().has_deletion_timestamp() && next.metadata().finalizers_size() == 0;
  auto stored = std::make_shared<const v1::Object>(std::move(next));
  CommitLocked(info.group_resource, finalized ? v1::WatchEvent::DELETED : v1::WatchEvent::MODIFIED,
               stored, cur);
  return stored;
}

void ObjectStore::DeleteAsync(const v1::DeleteRequest& req, DeleteCallback done) {
  if (on_etcd()) {
    auto op = std::make_shared<EtcdOp>();
    auto request = std::make_shared<v1::DeleteRequest>(req);
    auto result = std::make_shared<absl::StatusOr<DeleteResult>>();
    op->queue_key =
        absl::StrCat("o/", GroupResource(req.resource()), "/",
                     ObjectKey(req.shard(), req.cluster(), req.namespace_(), req.name()));
    op->decide = [this, request, result]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      *result = DeleteLocked(*request);
      return result->status();
    };
    op->answer = [result, done = std::move(done)](absl::Status status, int64_t revision) {
      if (!status.ok()) {
        done(std::move(status));
        return;
      }
      DeleteResult r = **result;
      r.object = WithRevision(r.object, revision);
      done(std::move(r));
    };
    StartEtcdOp(std::move(op));
    return;
  }
  absl::StatusOr<DeleteResult> result = [&] {
    absl::MutexLock l(&mu_);
    return DeleteLocked(req);
  }();
  int64_t wait = result.ok() ? RevisionOf(result->object) : 0;
  AnswerWhenDurable(&committer_, wait, std::move(done), std::move(result));
}

absl::StatusOr<ObjectStore::DeleteResult> ObjectStore::DeleteLocked(const v1::DeleteRequest& req) {
  ASSIGN_OR_RETURN(ResourceInfo info, registry_.Resolve(req.resource()));
  const v1::GroupVersionResource& gvr = req.resource();
  RETURN_IF_ERROR(ValidateKey(info, "", req.shard(), req.cluster(), req.namespace_(), req.name()));
  RETURN_IF_ERROR(RefuseShardInShardRole(options_.role, "shard", req.shard()));
  int64_t expected_rv = 0;
  if (!req.preconditions().resource_version().empty()) {
    ASSIGN_OR_RETURN(expected_rv, ParseRevision("preconditions.resourceVersion",
                                                req.preconditions().resource_version()));
  }
  ObjectRef cur = CurrentLocked(
      info.group_resource, ObjectKey(req.shard(), req.cluster(), req.namespace_(), req.name()));
  if (cur == nullptr) {
    return absl::NotFoundError(absl::StrCat(Describe(gvr, req.name()), " not found"));
  }
  const v1::ObjectMeta& cm = cur->metadata();
  if (expected_rv != 0 && absl::StrCat(expected_rv) != cm.resource_version()) {
    return Conflict(
        gvr, req.name(),
        absl::StrCat("precondition resourceVersion ", req.preconditions().resource_version(),
                     " is not the current one (", cm.resource_version(), ")"));
  }
  if (!req.preconditions().uid().empty() && req.preconditions().uid() != cm.uid()) {
    return Conflict(gvr, req.name(),
                    absl::StrCat("precondition uid ", req.preconditions().uid(),
                                 " is not the current one (", cm.uid(), ")"));
  }
  RETURN_IF_ERROR(CheckFenceLocked(req.fence()));
  if (cm.finalizers_size() > 0 && cm.has_deletion_timestamp()) {
    NoteUnchangedLocked(info.group_resource, cur);
    return DeleteResult{cur, false};  // already being deleted
  }
  v1::Object next = *cur;
  v1::ObjectMeta& nm = *next.mutable_metadata();
  nm.set_resource_version(absl::StrCat(revision_ + 1));
  if (cm.finalizers_size() > 0) {
    *nm.mutable_deletion_timestamp() =
        TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(options_.clock->Now()));
    nm.set_generation(cm.generation() + 1);
    auto stored = std::make_shared<const v1::Object>(std::move(next));
    CommitLocked(info.group_resource, v1::WatchEvent::MODIFIED, stored, cur);
    return DeleteResult{stored, false};
  }
  auto stored = std::make_shared<const v1::Object>(std::move(next));
  CommitLocked(info.group_resource, v1::WatchEvent::DELETED, stored, cur);
  return DeleteResult{stored, true};
}

void ObjectStore::OnDefinitionChangedLocked(const ObjectRef& before, const ObjectRef& after) {
  if (options_.role != Role::kShard) return;
  // Both were validated when written.
  absl::StatusOr<ResourceInfo> old_info =
      before ? ResourceRegistry::ParseDefinition(*before, nullptr)
             : absl::StatusOr<ResourceInfo>(absl::NotFoundError(""));
  if (after == nullptr) {
    if (!old_info.ok()) return;
    registry_.RemoveDefinition(old_info->group_resource);
    definition_keys_.erase(old_info->group_resource);
    // On etcd, the objects went in the definition's own transaction (CommitLocked).
    if (!on_etcd()) PurgeResourceLocked(old_info->group_resource);
    committer_.AddResourceGone(
        old_info->group_resource, "", revision_,
        absl::NotFoundError(absl::StrCat("the resource ", before->metadata().name(),
                                         " is no longer served: its ResourceDefinition was "
                                         "deleted")));
    return;
  }
  absl::StatusOr<ResourceInfo> new_info = ResourceRegistry::ParseDefinition(*after, nullptr);
  if (!new_info.ok()) return;
  registry_.ApplyDefinition(*new_info);
  definition_keys_[new_info->group_resource] = ObjectKey(after->metadata());
  if (!old_info.ok()) return;
  for (const std::string& v : old_info->versions) {
    if (std::find(new_info->versions.begin(), new_info->versions.end(), v) ==
        new_info->versions.end()) {
      committer_.AddResourceGone(
          new_info->group_resource, v, revision_,
          absl::NotFoundError(absl::StrCat("version ", v, " of ", after->metadata().name(),
                                           " is no longer served")));
    }
  }
}

void ObjectStore::PurgeResourceLocked(const std::string& group_resource) {
  auto r = resources_.find(group_resource);
  if (r == resources_.end()) return;
  std::vector<ObjectRef> live;
  for (const auto& [key, versions] : r->second.keys) {
    if (!versions.empty() && versions.back().object != nullptr) {
      live.push_back(versions.back().object);
    }
  }
  for (const ObjectRef& cur : live) {
    v1::Object last = *cur;
    last.mutable_metadata()->set_resource_version(absl::StrCat(revision_ + 1));
    CommitLocked(group_resource, v1::WatchEvent::DELETED,
                 std::make_shared<const v1::Object>(std::move(last)), cur);
  }
}

absl::Status ObjectStore::StartWatch(const v1::WatchRequest& req, Watcher* watcher) {
  ASSIGN_OR_RETURN(ObjectFilter filter,
                   MakeFilter(req.shard(), req.cluster(), req.namespace_(), req.label_selector()));
  int64_t from = 0;
  if (!req.resource_version().empty()) {
    ASSIGN_OR_RETURN(from, ParseRevision("resource_version", req.resource_version()));
  }
  absl::ReaderMutexLock l(&mu_);
  ASSIGN_OR_RETURN(ResourceInfo info, registry_.Resolve(req.resource()));
  std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial;
  if (from != 0) {
    if (from < compacted_revision_) {
      return absl::OutOfRangeError(absl::StrCat(
          "too old resource version: ", from, " (the oldest revision a watch can start from is ",
          compacted_revision_, "); list again and watch from the list's resourceVersion"));
    }
    if (from > durable_revision_ && on_etcd()) {
      // Another replica gave the revision, and this one has not reached it yet.
      return absl::UnavailableError(absl::StrCat("this replica has not reached revision ", from,
                                                 " yet (it is at ", durable_revision_,
                                                 "); try again"));
    }
    if (from > durable_revision_) {
      return absl::OutOfRangeError(absl::StrCat("too large resource version: ", from,
                                                " (the store is at revision ", durable_revision_,
                                                "); list again"));
    }
    auto first = std::upper_bound(history_.begin(), history_.end(), from,
                                  [](int64_t rev, const EventPtr& e) { return rev < e->revision; });
    for (auto it = first; it != history_.end() && (*it)->revision <= durable_revision_; ++it) {
      const Event& e = **it;
      if (e.group_resource != info.group_resource) continue;
      v1::WatchEvent::Type type = EffectiveType(e, filter);
      if (type != v1::WatchEvent::TYPE_UNSPECIFIED) {
        initial.emplace_back(type, EffectiveObject(e, type));
      }
    }
  } else {
    if (auto r = resources_.find(info.group_resource); r != resources_.end()) {
      std::string prefix = KeyPrefix(filter);
      for (auto it = r->second.keys.lower_bound(prefix); it != r->second.keys.end(); ++it) {
        if (it->first.compare(0, prefix.size(), prefix) != 0) break;
        const ObjectRef& obj = VersionAt(it->second, durable_revision_);
        if (obj != nullptr && filter.Matches(*obj))
          initial.emplace_back(v1::WatchEvent::ADDED, obj);
      }
    }
    auto bookmark = std::make_shared<v1::Object>();
    bookmark->mutable_metadata()->set_resource_version(absl::StrCat(durable_revision_));
    (*bookmark->mutable_metadata()->mutable_annotations())[kInitialEventsEndAnnotation] = "true";
    initial.emplace_back(v1::WatchEvent::BOOKMARK, std::move(bookmark));
  }
  WatchSpec spec;
  spec.group_resource = info.group_resource;
  spec.version = req.resource().version();
  spec.filter = std::move(filter);
  spec.start_revision = durable_revision_;
  spec.encoding = req.json_objects() ? ObjectEncoding::kJson : ObjectEncoding::kProto;
  spec.periodic_bookmarks = req.allow_bookmarks();
  watcher->Init(std::move(spec), std::move(initial));
  return watch_cache_->Register(watcher);
}

}  // namespace shardcache
