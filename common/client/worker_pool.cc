#include "common/client/worker_pool.h"

#include <algorithm>

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

namespace {
// The client whose RunTurn or Tick this thread is in, if any (for Detach from inside it).
thread_local const WorkerPool::Client* current_client = nullptr;
}  // namespace

void WorkerPool::Schedule(Client* client) {
  absl::MutexLock l(&mu_);
  if (detaching_.contains(client)) return;
  turns_.push_back(client);
}

void WorkerPool::WakeAt(Client* client, absl::Time when) {
  absl::MutexLock l(&mu_);
  if (detaching_.contains(client)) return;
  auto [it, inserted] = wake_.try_emplace(client, when);
  if (!inserted) {
    if (it->second <= when) return;
    wake_by_time_.erase({it->second, client});
    it->second = when;
  }
  wake_by_time_.emplace(when, client);
  if (wake_by_time_.begin()->second == client) timer_wakeup_ = true;
}

void WorkerPool::Detach(Client* client) {
  absl::MutexLock l(&mu_);
  turns_.erase(std::remove(turns_.begin(), turns_.end(), client), turns_.end());
  if (auto it = wake_.find(client); it != wake_.end()) {
    wake_by_time_.erase({it->second, client});
    wake_.erase(it);
  }
  if (current_client == client) return;  // from its own call: that call cannot be waited for
  detaching_.insert(client);
  auto idle = [this, client]()
                  ABSL_NO_THREAD_SAFETY_ANALYSIS { return running_.count(client) == 0; };
  mu_.Await(absl::Condition(&idle));
  // The address may be a later client's: forget this one entirely.
  detaching_.erase(client);
}

void WorkerPool::Call(Client* client, const std::function<void(Client*)>& call) {
  ++running_[client];
  mu_.Unlock();
  current_client = client;
  call(client);
  current_client = nullptr;
  mu_.Lock();
  if (--running_[client] == 0) running_.erase(client);
}

void WorkerPool::RunWorker() {
  absl::MutexLock l(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &WorkerPool::HasTurnLocked));
    if (stop_) return;
    Client* client = turns_.front();
    turns_.pop_front();
    Call(client, [](Client* c) { c->RunTurn(); });
  }
}

void WorkerPool::RunTimer() {
  absl::MutexLock l(&mu_);
  while (!stop_) {
    absl::Time now = clock_->Now();
    while (!wake_by_time_.empty() && wake_by_time_.begin()->first <= now) {
      Client* client = wake_by_time_.begin()->second;
      wake_by_time_.erase(wake_by_time_.begin());
      wake_.erase(client);
      Call(client, [now](Client* c) { c->Tick(now); });  // asks for its next wake-up (WakeAt)
    }
    absl::Time wake = wake_by_time_.empty() ? absl::InfiniteFuture() : wake_by_time_.begin()->first;
    timer_wakeup_ = false;
    clock_->AwaitWithDeadline(&mu_, absl::Condition(this, &WorkerPool::TimerWakeupLocked), wake);
  }
}

}  // namespace shardcache
