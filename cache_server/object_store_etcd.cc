// ObjectStore on etcd: its writes as etcd transactions, its state fed by its watch of the prefix,
// and consistent reads (object_store.h, "Storage on etcd").
#include <algorithm>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "cache_server/object_store.h"
#include "spdlog/spdlog.h"

namespace shardcache {
namespace {

// How many times a write is decided again after its transaction's compares failed, before it
// fails with ABORTED (another replica keeps changing the key).
constexpr int kMaxEtcdAttempts = 16;
// How long a consistent read waits for the watch before it writes the progress key (the watch
// passes etcd's revision by itself when a change of the prefix is committed at it, which is the
// usual case under writes).
constexpr absl::Duration kProgressWriteAfter = absl::Milliseconds(20);

absl::Status Unavailable(absl::string_view what, const absl::Status& cause) {
  return absl::UnavailableError(absl::StrCat(what, ": ", cause.message()));
}

}  // namespace

void ObjectStore::EtcdObjectWrite(std::string queue_key,
                                  std::function<absl::StatusOr<ObjectRef>()> decide,
                                  ObjectCallback done) {
  auto op = std::make_shared<EtcdOp>();
  auto result = std::make_shared<absl::StatusOr<ObjectRef>>();
  op->queue_key = std::move(queue_key);
  op->decide = [decide = std::move(decide), result] {
    *result = decide();
    return result->status();
  };
  op->answer = [result, done = std::move(done)](absl::Status status, int64_t revision) {
    if (!status.ok()) {
      done(std::move(status));
      return;
    }
    done(WithRevision(**result, revision));
  };
  StartEtcdOp(std::move(op));
}

void ObjectStore::StartEtcdOp(EtcdOpPtr op) {
  {
    absl::MutexLock l(&etcd_mu_);
    std::deque<EtcdOpPtr>& queue = etcd_queues_[op->queue_key];
    queue.push_back(op);
    if (queue.size() > 1) return;  // runs when the writes before it are answered
  }
  absl::Status error;
  if (!RunEtcdOp(op, &error)) FinishEtcdOp(std::move(op), std::move(error), 0);
}

bool ObjectStore::RunEtcdOp(const EtcdOpPtr& op, absl::Status* error) {
  EtcdWrite write;
  {
    absl::MutexLock l(&mu_);
    proposal_ = EtcdWrite();
    absl::Status decided = op->decide();
    write = std::move(proposal_);
    proposal_ = EtcdWrite();
    if (!decided.ok()) {
      *error = std::move(decided);
      return false;
    }
  }
  etcdserverpb::TxnRequest txn = MakeEtcdTxn(options_.etcd_prefix, write);
  {
    absl::MutexLock l(&etcd_mu_);
    if (etcd_stopping_) {
      *error = absl::UnavailableError("server shutting down");
      return false;
    }
    ++etcd_txns_;
  }
  options_.etcd->TxnAsync(std::move(txn),
                          [this, op, object_changed = write.has_change,
                           sent = absl::Now()](absl::StatusOr<etcdserverpb::TxnResponse> answer) {
                            OnTxnAnswer(op, object_changed, sent, std::move(answer));
                            absl::MutexLock l(&etcd_mu_);
                            --etcd_txns_;
                          });
  return true;
}

void ObjectStore::OnTxnAnswer(const EtcdOpPtr& op, bool object_changed, absl::Time sent,
                              absl::StatusOr<etcdserverpb::TxnResponse> answer) {
  metrics_->etcd_txn_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - sent));
  if (!answer.ok()) {
    // Whether a transaction that timed out was committed is unknown, as for etcd's own clients;
    // the writer learns it by reading (or from a conflict when it writes again).
    FinishEtcdOp(op, std::move(answer).status(), 0);
    return;
  }
  const int64_t revision = answer->header().revision();
  if (!answer->succeeded()) {
    if (++op->attempts >= kMaxEtcdAttempts) {
      FinishEtcdOp(op,
                   absl::AbortedError(absl::StrCat(
                       "the write was decided ", kMaxEtcdAttempts,
                       " times, and each time another writer changed what it was decided on "
                       "first; try again")),
                   0);
      return;
    }
    // Someone changed the key or the shard's epoch first: decide again once this replica has
    // seen what the transaction was compared with.
    metrics_->etcd_txn_retries.Increment();
    WhenSeen(
        revision,
        [this, op] {
          absl::Status error;
          if (!RunEtcdOp(op, &error)) FinishEtcdOp(op, std::move(error), 0);
        },
        [this, op](absl::Status status) { FinishEtcdOp(op, std::move(status), 0); });
    return;
  }
  // An object change is answered once the replica's readers see it; an epoch alone at once (the
  // next write's compare catches a replica that has not seen it yet).
  const int64_t at = object_changed ? revision : 0;
  committer_.CompleteWhenDurable(at, [this, op, at] { FinishEtcdOp(op, absl::OkStatus(), at); });
}

void ObjectStore::FinishEtcdOp(EtcdOpPtr op, absl::Status status, int64_t revision) {
  while (op != nullptr) {
    op->answer(std::move(status), revision);
    EtcdOpPtr next;
    {
      absl::MutexLock l(&etcd_mu_);
      auto queue = etcd_queues_.find(op->queue_key);
      queue->second.pop_front();
      if (queue->second.empty()) {
        etcd_queues_.erase(queue);
      } else {
        next = queue->second.front();
      }
    }
    op = nullptr;
    if (next == nullptr) return;
    absl::Status error;
    if (RunEtcdOp(next, &error)) return;
    // Decided as an error: answer it here, and go on with the one after it.
    op = std::move(next);
    status = std::move(error);
    revision = 0;
  }
}

void ObjectStore::OnEvents(const std::vector<mvccpb::Event>& events, int64_t) {
  // A progress notification (no events) is not trusted to raise the revision: etcd before 3.4.25
  // may send one before events of the revisions it names (etcd issue 15220), and a watcher
  // registered at such a revision would miss them. The revision moves with events only; a
  // consistent read that finds no change coming writes the progress key (AwaitConsistentRead).
  if (events.empty()) return;
  std::vector<std::function<void()>> ready;
  ApplyEtcdEvents(events, &ready);
  for (auto& then : ready) then();
}

void ObjectStore::ApplyEtcdEvents(const std::vector<mvccpb::Event>& events,
                                  std::vector<std::function<void()>>* ready) {
  absl::MutexLock l(&mu_);
  const std::string& prefix = options_.etcd_prefix;
  const std::string definitions = absl::StrCat(kDefinitionGroup, "/", kDefinitionResource);
  // The resources whose definitions these events delete, and at which revision: their objects'
  // deletions at that revision are the definitions' purges.
  std::map<std::string, int64_t> purged;
  for (const mvccpb::Event& e : events) {
    if (e.type() == mvccpb::Event::PUT) continue;
    EtcdKey key = ParseEtcdKey(prefix, e.kv().key());
    if (key.kind != EtcdKey::kObject || key.group_resource != definitions) continue;
    ObjectRef definition = CurrentLocked(key.group_resource, key.object_key);
    if (definition == nullptr) continue;
    absl::StatusOr<ResourceInfo> info = ResourceRegistry::ParseDefinition(*definition, nullptr);
    if (info.ok()) purged[info->group_resource] = e.kv().mod_revision();
  }
  for (const mvccpb::Event& e : events) {
    const mvccpb::KeyValue& kv = e.kv();
    etcd_seen_revision_ = std::max(etcd_seen_revision_, kv.mod_revision());
    EtcdKey key = ParseEtcdKey(prefix, kv.key());
    const bool put = e.type() == mvccpb::Event::PUT;
    if (key.kind == EtcdKey::kEpoch) {
      if (!put) {
        epochs_.erase(key.shard);
        continue;
      }
      absl::StatusOr<int64_t> epoch = ParseEtcdEpoch(kv.value());
      if (!epoch.ok()) {
        spdlog::error("etcd key {} at revision {}: {}; ignored", kv.key(), kv.mod_revision(),
                      std::string(epoch.status().message()));
        continue;
      }
      epochs_[key.shard] = *epoch;
      continue;
    }
    if (key.kind != EtcdKey::kObject) continue;
    const int64_t at = kv.mod_revision();
    ObjectRef prev = CurrentLocked(key.group_resource, key.object_key);
    if (put) {
      absl::StatusOr<ObjectRef> object = ParseEtcdObject(kv.value(), at);
      if (!object.ok()) {
        spdlog::error("etcd key {} at revision {}: {}; ignored", kv.key(), at,
                      std::string(object.status().message()));
        continue;
      }
      ApplyLocked(at, key.group_resource,
                  prev == nullptr ? v1::WatchEvent::ADDED : v1::WatchEvent::MODIFIED,
                  *std::move(object), prev);
    } else if (auto p = purged.find(key.group_resource); p != purged.end() && p->second == at) {
      // Purged with its definition: gone without an event of its own.
      auto r = resources_.find(key.group_resource);
      if (r != resources_.end() && r->second.keys.erase(key.object_key) > 0 && prev != nullptr) {
        --live_objects_;
        metrics_->objects.Set(static_cast<double>(live_objects_));
      }
    } else if (prev != nullptr) {
      ApplyLocked(at, key.group_resource, v1::WatchEvent::DELETED, WithRevision(prev, at), prev);
    }
  }
  metrics_->etcd_watch_revision.Set(static_cast<double>(etcd_seen_revision_));
  auto end = seen_waiters_.upper_bound(etcd_seen_revision_);
  for (auto it = seen_waiters_.begin(); it != end; ++it) {
    ready->push_back(std::move(it->second.then));
  }
  seen_waiters_.erase(seen_waiters_.begin(), end);
}

void ObjectStore::WhenSeen(int64_t revision, std::function<void()> then,
                           std::function<void(absl::Status)> fail) {
  {
    absl::MutexLock l(&mu_);
    if (etcd_seen_revision_ < revision) {
      seen_waiters_.emplace(revision, SeenWaiter{std::move(then), std::move(fail)});
      then = nullptr;
    }
  }
  if (then != nullptr) {
    then();
    return;
  }
  WriteProgressKey();
}

void ObjectStore::FailSeenWaiters(const absl::Status& status) {
  std::multimap<int64_t, SeenWaiter> failed;
  {
    absl::MutexLock l(&mu_);
    failed.swap(seen_waiters_);
  }
  for (auto& [revision, waiter] : failed) waiter.fail(status);
}

void ObjectStore::WriteProgressKey() const { progress_writer_->Request(); }

void ObjectStore::OnEnd(absl::Status status) {
  // The replica cannot follow etcd any more (its next revision was compacted while it was cut
  // off): what it serves would go stale. Stop; on restart it loads the current state.
  spdlog::critical("the watch of etcd prefix {} ended, stopping: {}", options_.etcd_prefix,
                   status.ToString());
  spdlog::default_logger()->flush();
  std::_Exit(1);
}

absl::Status ObjectStore::AwaitConsistentRead() const {
  if (!on_etcd()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.consistent_read_timeout;
  absl::StatusOr<int64_t> current =
      options_.etcd->CurrentRevision(EtcdFormatKey(options_.etcd_prefix), deadline);
  if (!current.ok()) {
    return Unavailable("cannot read etcd's current revision, so cannot read consistently",
                       current.status());
  }
  const int64_t target = *current;
  auto seen = [this, target]()
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) { return etcd_seen_revision_ >= target; };
  bool caught_up = mu_.ReaderLockWhenWithTimeout(absl::Condition(&seen), kProgressWriteAfter);
  mu_.ReaderUnlock();
  if (!caught_up) {
    // No change of the prefix is coming: make one (shared with the other readers that wait).
    // Its event comes after every event of the revisions before it, so once the watch has
    // brought it, it has brought etcd's revision.
    WriteProgressKey();
    caught_up = mu_.ReaderLockWhenWithDeadline(absl::Condition(&seen), deadline);
    mu_.ReaderUnlock();
  }
  int64_t applied = 0;
  if (caught_up) {
    // Every change up to `target` is applied; readers see it once the committer has published
    // it.
    {
      absl::ReaderMutexLock l(&mu_);
      applied = revision_;
    }
    auto visible = [this, applied]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return durable_revision_ >= applied; };
    caught_up = mu_.ReaderLockWhenWithDeadline(absl::Condition(&visible), deadline);
    mu_.ReaderUnlock();
  }
  if (caught_up) {
    metrics_->etcd_read_wait_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - start));
    return absl::OkStatus();
  }
  int64_t at;
  {
    absl::ReaderMutexLock l(&mu_);
    at = etcd_seen_revision_;
  }
  metrics_->etcd_stale_reads_refused.Increment();
  return absl::UnavailableError(absl::StrCat(
      "this replica has not caught up with etcd: etcd is at revision ", target,
      " and the replica at ", at, " after ", absl::FormatDuration(options_.consistent_read_timeout),
      "; try again, or another replica"));
}

absl::Status ObjectStore::CheckCaughtUp() const { return AwaitConsistentRead(); }

void ObjectStore::MaybeCompactEtcd() {
  const absl::Time now = options_.clock->Now();
  if (now - etcd_compacted_at_ < options_.etcd_compaction_interval) return;
  etcd_compacted_at_ = now;
  {
    absl::ReaderMutexLock l(&mu_);
    etcd_seen_at_.emplace_back(now, etcd_seen_revision_);
  }
  // The newest revision seen at least the retention ago.
  int64_t target = 0;
  while (!etcd_seen_at_.empty() &&
         now - etcd_seen_at_.front().first >= options_.etcd_history_retention) {
    target = etcd_seen_at_.front().second;
    etcd_seen_at_.pop_front();
  }
  {
    absl::MutexLock l(&etcd_mu_);
    if (target <= etcd_compacted_revision_ || etcd_compacting_ || etcd_stopping_) return;
    etcd_compacting_ = true;
    ++etcd_txns_;
  }
  // Asynchronous: an etcd that is slow to answer does not hold the committer up.
  options_.etcd->CompactAsync(target, [this, target](absl::Status compacted) {
    if (!compacted.ok()) {
      spdlog::warn("compacting etcd's history to revision {} failed: {}", target,
                   compacted.ToString());
    } else {
      metrics_->etcd_compacted_revision.Set(static_cast<double>(target));
      spdlog::debug("compacted etcd's history to revision {}", target);
    }
    absl::MutexLock l(&etcd_mu_);
    if (compacted.ok()) etcd_compacted_revision_ = target;
    etcd_compacting_ = false;
    --etcd_txns_;
  });
}

}  // namespace shardcache
