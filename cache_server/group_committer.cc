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
}

void GroupCommitter::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
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
    bool idle = false;
    std::vector<Item> items;
    CommitBatch batch;
    int64_t batch_claims = 0;
    {
      absl::MutexLock l(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !pending_.empty() || !pending_epochs_.empty();
      };
      mu_.AwaitWithDeadline(absl::Condition(&work), next_idle_check);
      if (pending_.empty() && pending_epochs_.empty()) {
        if (stopping_) return;
        next_idle_check = absl::Now() + absl::Seconds(1);
        idle = true;
      }
    }
    if (idle) {
      owner_->OnIdle();
      continue;
    }
    {
      // Taken under the owner's operation lock (before ours, in the owner's order), so that the
      // batch holds whole operations only. Only this thread empties pending_.
      absl::MutexLock operation(owner_->OperationLock());
      absl::MutexLock l(&mu_);
      items.swap(pending_);
      batch.epochs.swap(pending_epochs_);
      batch.revision = revision_;
      batch.compacted_revision = compacted_revision_;
      batch_claims = epoch_claims_;
    }
    for (const Item& item : items) {
      if (item.event != nullptr) batch.events.push_back(item.event);
    }
    if (storage_ != nullptr) {
      const absl::Time commit_start = absl::Now();
      absl::Status written = storage_->Commit(batch);
      metrics_->commit_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - commit_start));
      if (!written.ok()) {
        // Memory is ahead of the disk and cannot be taken back: stop, and recover on restart.
        spdlog::critical("cannot make writes durable, stopping: {}", written.ToString());
        std::abort();
      }
    }
    owner_->OnDurable(batch.revision);
    std::vector<Waiter> done;
    {
      absl::MutexLock l(&mu_);
      durable_revision_ = batch.revision;
      durable_epoch_claims_ = batch_claims;
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        if (it->revision <= durable_revision_ && it->epoch_claims <= durable_epoch_claims_) {
          done.push_back(std::move(*it));
          it = waiters_.erase(it);
        } else {
          ++it;
        }
      }
    }
    Publish(std::move(items));
    for (Waiter& w : done) w.complete();
  }
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
