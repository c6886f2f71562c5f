#include "cache_server/group_committer.h"

#include <cstdlib>
#include <utility>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace shardcache {

GroupCommitter::GroupCommitter(Storage* storage, WatchCache* watch_cache, StoreMetrics* metrics,
                               Owner* owner, int64_t revision, int64_t compacted_revision)
    : storage_(storage),
      watch_cache_(watch_cache),
      metrics_(metrics),
      owner_(owner),
      revision_(revision),
      durable_revision_(revision),
      compacted_revision_(compacted_revision) {}

GroupCommitter::~GroupCommitter() { Stop(); }

void GroupCommitter::Start() {
  thread_ = std::thread([this] { Run(); });
  if (storage_ != nullptr) sync_thread_ = std::thread([this] { RunSync(); });
}

void GroupCommitter::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  // The committer thread ends once everything is written, synced and finished; the sync thread
  // then has nothing left to sync.
  if (thread_.joinable()) thread_.join();
  if (sync_thread_.joinable()) sync_thread_.join();
  // With a Storage every waiter was finished above; without one (a store on etcd) the revisions
  // still awaited are durable in etcd.
  std::deque<Waiter> left;
  {
    absl::MutexLock l(&mu_);
    if (storage_ == nullptr) left.swap(waiters_);
  }
  for (Waiter& w : left) w.complete();
}

void GroupCommitter::AddEvent(EventPtr event) {
  absl::MutexLock l(&mu_);
  revision_ = event->revision;
  pending_.push_back(Item{std::move(event), {}, {}, 0, absl::OkStatus()});
}

void GroupCommitter::AddResourceGone(std::string group_resource, std::string version,
                                     int64_t revision, absl::Status status) {
  absl::MutexLock l(&mu_);
  pending_.push_back(
      Item{nullptr, std::move(group_resource), std::move(version), revision, std::move(status)});
}

void GroupCommitter::AddEpoch(const std::string& shard, int64_t epoch) {
  absl::MutexLock l(&mu_);
  pending_epochs_[shard] = epoch;
  ++epoch_claims_;
}

void GroupCommitter::SetCompactedRevision(int64_t revision) {
  absl::MutexLock l(&mu_);
  compacted_revision_ = revision;
}

int64_t GroupCommitter::durable_revision() const {
  absl::MutexLock l(&mu_);
  return durable_revision_;
}

void GroupCommitter::CompleteWhenDurable(int64_t revision, std::function<void()> complete) {
  {
    absl::MutexLock l(&mu_);
    if (revision > durable_revision_ || epoch_claims_ > durable_epoch_claims_) {
      waiters_.push_back(Waiter{revision, epoch_claims_, std::move(complete)});
      return;
    }
  }
  complete();
}

void GroupCommitter::Run() {
  absl::Time next_idle_check = absl::Now() + absl::Seconds(1);
  while (true) {
    std::vector<Written> synced;
    bool write = false;
    {
      absl::MutexLock l(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return HasPendingLocked() || HasSyncedLocked() || (stopping_ && written_.empty());
      };
      mu_.AwaitWithDeadline(absl::Condition(&work), next_idle_check);
      while (HasSyncedLocked()) {
        synced.push_back(std::move(written_.front()));
        written_.pop_front();
      }
      write = HasPendingLocked();
      if (synced.empty() && !write) {
        if (stopping_ && written_.empty()) {
          committer_done_ = true;
          return;
        }
        // A second without anything to write: idle, unless a sync is still running.
        next_idle_check = absl::Now() + absl::Seconds(1);
        if (!written_.empty()) continue;
      }
    }
    if (synced.empty() && !write) {
      owner_->OnIdle();
      continue;
    }
    // Finish first: the answers let clients send their next writes while the next sync runs.
    for (Written& batch : synced) Finish(std::move(batch));
    if (write) TakeAndWrite();
  }
}

void GroupCommitter::TakeAndWrite() {
  const absl::Time take_start = absl::Now();
  Written batch;
  CommitBatch commit;
  {
    // Taken under the owner's operation lock (before ours, in the owner's order), so that the
    // batch holds whole operations only. Only this thread empties pending_.
    absl::MutexLock operation(owner_->OperationLock());
    absl::MutexLock l(&mu_);
    batch.items.swap(pending_);
    commit.epochs.swap(pending_epochs_);
    commit.revision = batch.revision = revision_;
    commit.compacted_revision = compacted_revision_;
    batch.epoch_claims = epoch_claims_;
  }
  for (const Item& item : batch.items) {
    if (item.event != nullptr) commit.events.push_back(item.event);
  }
  batch.write_start = absl::Now();
  metrics_->commit_take_seconds.Observe(absl::ToDoubleSeconds(batch.write_start - take_start));
  metrics_->commit_batch_events.Observe(static_cast<double>(commit.events.size()));
  if (storage_ != nullptr) {
    absl::Status written = storage_->Write(commit);
    metrics_->commit_write_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - batch.write_start));
    if (!written.ok()) {
      // Memory is ahead of the disk and cannot be taken back: stop, and recover on restart.
      spdlog::critical("cannot make writes durable, stopping: {}", written.ToString());
      std::abort();
    }
  }
  absl::MutexLock l(&mu_);
  batch.sequence = ++written_sequence_;
  // Without a storage a batch is durable once taken.
  if (storage_ == nullptr) synced_sequence_ = written_sequence_;
  written_.push_back(std::move(batch));
}

void GroupCommitter::RunSync() {
  while (true) {
    int64_t target = 0;
    int64_t synced_before = 0;
    {
      absl::MutexLock l(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return written_sequence_ > synced_sequence_ || committer_done_;
      };
      mu_.Await(absl::Condition(&work));
      if (written_sequence_ == synced_sequence_) return;  // the committer is done
      // Every batch whose Write has returned: this sync covers them all.
      target = written_sequence_;
      synced_before = synced_sequence_;
    }
    const absl::Time sync_start = absl::Now();
    absl::Status synced = storage_->Sync();
    const absl::Time sync_end = absl::Now();
    metrics_->commit_sync_seconds.Observe(absl::ToDoubleSeconds(sync_end - sync_start));
    if (!synced.ok()) {
      // A failed sync is never retried: what it should have synced may be lost, and memory is
      // ahead of the disk. Stop, and recover on restart.
      spdlog::critical("cannot make writes durable, stopping: {}", synced.ToString());
      std::abort();
    }
    absl::MutexLock l(&mu_);
    // Batches above synced_before are still in written_: the committer finishes only synced ones.
    for (const Written& w : written_) {
      if (w.sequence > target) break;
      if (w.sequence > synced_before) {
        metrics_->commit_seconds.Observe(absl::ToDoubleSeconds(sync_end - w.write_start));
      }
    }
    synced_sequence_ = target;
  }
}

void GroupCommitter::Finish(Written batch) {
  const absl::Time publish_start = absl::Now();
  owner_->OnDurable(batch.revision);
  std::vector<Waiter> done;
  {
    absl::MutexLock l(&mu_);
    durable_revision_ = batch.revision;
    durable_epoch_claims_ = batch.epoch_claims;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->revision <= durable_revision_ && it->epoch_claims <= durable_epoch_claims_) {
        done.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  Publish(std::move(batch.items));
  const absl::Time complete_start = absl::Now();
  metrics_->commit_publish_seconds.Observe(absl::ToDoubleSeconds(complete_start - publish_start));
  for (Waiter& w : done) w.complete();
  metrics_->commit_complete_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - complete_start));
}

void GroupCommitter::Publish(std::vector<Item> items) {
  std::vector<EventPtr> run;
  for (Item& item : items) {
    if (item.event != nullptr) {
      run.push_back(std::move(item.event));
      continue;
    }
    if (!run.empty()) watch_cache_->Publish(std::move(run));
    run.clear();
    watch_cache_->PublishResourceGone(item.gone_resource, item.gone_version, item.gone_revision,
                                      std::move(item.gone_status));
  }
  if (!run.empty()) watch_cache_->Publish(std::move(run));
}

}  // namespace shardcache
