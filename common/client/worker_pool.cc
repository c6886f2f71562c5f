#include "common/client/worker_pool.h"

#include <algorithm>

#include "common/client/work_queue.h"

namespace shardcache {

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Create(Options options) {
  if (options.threads < 1) return absl::InvalidArgumentError("worker pool: threads must be >= 1");
  if (options.clock == nullptr) return absl::InvalidArgumentError("worker pool: clock is null");
  std::unique_ptr<WorkerPool> pool(new WorkerPool(options));
  for (int i = 0; i < options.threads; ++i) {
    pool->workers_.emplace_back([p = pool.get()] { p->RunWorker(); });
  }
  pool->timer_ = std::thread([p = pool.get()] { p->RunTimer(); });
  return pool;
}

WorkerPool::WorkerPool(const Options& options) : clock_(options.clock) {}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
  if (timer_.joinable()) timer_.join();
}

void WorkerPool::Schedule(WorkQueue* queue) {
  absl::MutexLock l(&mu_);
  if (detaching_.contains(queue)) return;
  turns_.push_back(queue);
}

void WorkerPool::WakeAt(WorkQueue* queue, absl::Time when) {
  absl::MutexLock l(&mu_);
  if (detaching_.contains(queue)) return;
  auto [it, inserted] = wake_.try_emplace(queue, when);
  if (!inserted) {
    if (it->second <= when) return;
    wake_by_time_.erase({it->second, queue});
    it->second = when;
  }
  wake_by_time_.emplace(when, queue);
  if (wake_by_time_.begin()->second == queue) timer_wakeup_ = true;
}

void WorkerPool::Detach(WorkQueue* queue) {
  absl::MutexLock l(&mu_);
  detaching_.insert(queue);
  turns_.erase(std::remove(turns_.begin(), turns_.end(), queue), turns_.end());
  if (auto it = wake_.find(queue); it != wake_.end()) {
    wake_by_time_.erase({it->second, queue});
    wake_.erase(it);
  }
  auto idle = [this, queue]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto it = running_.find(queue);
    return it == running_.end() || it->second == 0;
  };
  mu_.Await(absl::Condition(&idle));
  running_.erase(queue);
  // The address may be a later queue's: forget this one entirely.
  detaching_.erase(queue);
}

void WorkerPool::RunWorker() {
  absl::MutexLock l(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &WorkerPool::HasTurnLocked));
    if (stop_) return;
    WorkQueue* queue = turns_.front();
    turns_.pop_front();
    ++running_[queue];
    mu_.Unlock();
    queue->RunOne();
    mu_.Lock();
    --running_[queue];
  }
}

void WorkerPool::RunTimer() {
  absl::MutexLock l(&mu_);
  while (!stop_) {
    absl::Time now = clock_->Now();
    while (!wake_by_time_.empty() && wake_by_time_.begin()->first <= now) {
      WorkQueue* queue = wake_by_time_.begin()->second;
      wake_by_time_.erase(wake_by_time_.begin());
      wake_.erase(queue);
      ++running_[queue];
      mu_.Unlock();
      queue->Tick(now);  // asks for its next wake-up itself (WakeAt)
      mu_.Lock();
      --running_[queue];
    }
    absl::Time wake = wake_by_time_.empty() ? absl::InfiniteFuture() : wake_by_time_.begin()->first;
    timer_wakeup_ = false;
    clock_->AwaitWithDeadline(&mu_, absl::Condition(this, &WorkerPool::TimerWakeupLocked), wake);
  }
}

}  // namespace shardcache
