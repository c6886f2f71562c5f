#include "common/client/work_queue.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace shardcache {

// The series of one queue. prometheus-cpp metrics are thread-safe.
struct WorkQueue::Metrics {
  prometheus::Gauge& depth;
  prometheus::Counter& adds;
  prometheus::Counter& retries;
  prometheus::Histogram& queue_duration;
  prometheus::Histogram& work_duration;
  prometheus::Gauge& unfinished_work;
  prometheus::Gauge& longest_running;
};

namespace {

prometheus::Gauge& MakeGauge(prometheus::Registry& r, const std::string& name,
                             const std::string& help, const std::string& queue) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({{"name", queue}});
}

prometheus::Counter& MakeCounter(prometheus::Registry& r, const std::string& name,
                                 const std::string& help, const std::string& queue) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({{"name", queue}});
}

prometheus::Histogram& MakeHistogram(prometheus::Registry& r, const std::string& name,
                                     const std::string& help, const std::string& queue) {
  // client-go's buckets: 10 ns to 10 s, a factor of 10 apart.
  static const prometheus::Histogram::BucketBoundaries kBuckets = {1e-8, 1e-7, 1e-6, 1e-5, 1e-4,
                                                                   1e-3, 1e-2, 1e-1, 1,    10};
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({{"name", queue}},
                                                                            kBuckets);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkQueue>> WorkQueue::Create(Options options) {
  if (options.clock == nullptr) return absl::InvalidArgumentError("work queue: clock is null");
  if (options.tick_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("work queue: tick_period must be positive");
  }
  std::unique_ptr<Metrics> metrics;
  if (options.registry != nullptr) {
    if (options.name.empty()) {
      return absl::InvalidArgumentError("work queue: a queue with metrics needs a name");
    }
    prometheus::Registry& r = *options.registry;
    const std::string& q = options.name;
    try {
      metrics.reset(new Metrics{
          MakeGauge(r, "shardcache_workqueue_depth", "Keys waiting in the work queue.", q),
          MakeCounter(r, "shardcache_workqueue_adds_total", "Keys that became waiting.", q),
          MakeCounter(r, "shardcache_workqueue_retries_total",
                      "Keys added after a delay (AddAfter, AddRateLimited).", q),
          MakeHistogram(r, "shardcache_workqueue_queue_duration_seconds",
                        "How long a key waited in the queue before a worker got it.", q),
          MakeHistogram(r, "shardcache_workqueue_work_duration_seconds",
                        "How long a worker processed a key, from Get to Done.", q),
          MakeGauge(r, "shardcache_workqueue_unfinished_work_seconds",
                    "The summed age of the keys being processed now.", q),
          MakeGauge(r, "shardcache_workqueue_longest_running_processor_seconds",
                    "The age of the key processed for the longest time now.", q),
      });
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("work queue ", q, ": cannot register its metrics: ", e.what()));
    }
  }
  if (options.pool != nullptr && options.pool->clock() != options.clock) {
    return absl::InvalidArgumentError("work queue: its pool runs on another clock");
  }
  if (options.rate_limiter == nullptr) {
    options.rate_limiter = DefaultControllerRateLimiter(options.clock);
  }
  std::unique_ptr<WorkQueue> queue(new WorkQueue(std::move(options), std::move(metrics)));
  if (queue->pool_ == nullptr) queue->ticker_ = std::thread([q = queue.get()] { q->RunTicker(); });
  return queue;
}

WorkQueue::WorkQueue(Options options, std::unique_ptr<Metrics> metrics)
    : name_(std::move(options.name)),
      clock_(options.clock),
      tick_period_(options.tick_period),
      rate_limiter_(std::move(options.rate_limiter)),
      metrics_(std::move(metrics)),
      pool_(options.pool) {}

WorkQueue::~WorkQueue() {
  if (pool_ != nullptr) ShutDownAndWait();
  {
    absl::MutexLock l(&mu_);
    ShutDownLocked();
    ticker_stop_ = true;
  }
  if (ticker_.joinable()) ticker_.join();
  if (metrics_ != nullptr) {
    // Take this queue's share out of the gauges that a later queue of the same name shares.
    absl::MutexLock l(&mu_);
    metrics_->depth.Decrement(static_cast<double>(dirty_.size()));
    metrics_->unfinished_work.Set(0);
    metrics_->longest_running.Set(0);
  }
}

void WorkQueue::Add(const std::string& key) {
  int turns = 0;
  {
    absl::MutexLock l(&mu_);
    AddLocked(key, clock_->Now());
    turns = TurnsNeededLocked();
  }
  CallPool(turns, absl::InfiniteFuture());
}

void WorkQueue::AddLocked(const std::string& key, absl::Time now) {
  if (shutting_down_) return;
  if (!dirty_.insert(key).second) return;  // already waiting
  if (metrics_ != nullptr) {
    metrics_->adds.Increment();
    metrics_->depth.Increment();
    added_at_.emplace(key, now);
  }
  // A key that is processing waits in dirty_ only; Done puts it in the queue.
  if (!processing_.contains(key)) queue_.push_back(key);
}

std::optional<std::string> WorkQueue::Get() {
  absl::MutexLock l(&mu_);
  PromoteDueLocked(clock_->Now());
  mu_.Await(absl::Condition(this, &WorkQueue::CanGetLocked));
  return TakeLocked(clock_->Now());  // none: shut down and drained
}

std::optional<std::string> WorkQueue::TakeLocked(absl::Time now) {
  if (queue_.empty()) return std::nullopt;
  std::string key = std::move(queue_.front());
  queue_.pop_front();
  dirty_.erase(key);
  processing_.insert(key);
  if (metrics_ != nullptr) {
    metrics_->depth.Decrement();
    if (auto it = added_at_.find(key); it != added_at_.end()) {
      metrics_->queue_duration.Observe(absl::ToDoubleSeconds(now - it->second));
      added_at_.erase(it);
    }
    started_at_[key] = now;
  }
  return key;
}

void WorkQueue::Done(const std::string& key) {
  int turns = 0;
  {
    absl::MutexLock l(&mu_);
    DoneLocked(key);
    turns = TurnsNeededLocked();
  }
  CallPool(turns, absl::InfiniteFuture());
}

void WorkQueue::DoneLocked(const std::string& key) {
  if (processing_.erase(key) == 0) return;
  if (metrics_ != nullptr) {
    if (auto it = started_at_.find(key); it != started_at_.end()) {
      metrics_->work_duration.Observe(absl::ToDoubleSeconds(clock_->Now() - it->second));
      started_at_.erase(it);
    }
  }
  if (!dirty_.contains(key)) return;
  if (discarding_) {  // ShutDownAndWait: nothing is handed out any more
    dirty_.erase(key);
    added_at_.erase(key);
    if (metrics_ != nullptr) metrics_->depth.Decrement();
    return;
  }
  queue_.push_back(key);  // added while it was processing
}

size_t WorkQueue::Len() {
  size_t len = 0;
  int turns = 0;
  {
    absl::MutexLock l(&mu_);
    PromoteDueLocked(clock_->Now());
    len = queue_.size();
    turns = TurnsNeededLocked();
  }
  CallPool(turns, absl::InfiniteFuture());
  return len;
}

void WorkQueue::AddAfter(const std::string& key, absl::Duration delay) {
  int turns = 0;
  absl::Time wake = absl::InfiniteFuture();
  {
    absl::MutexLock l(&mu_);
    if (shutting_down_) return;
    if (metrics_ != nullptr) metrics_->retries.Increment();
    absl::Time now = clock_->Now();
    if (delay <= absl::ZeroDuration()) {
      AddLocked(key, now);
      turns = TurnsNeededLocked();
    } else {
      absl::Time due = now + delay;
      auto [it, inserted] = delayed_.try_emplace(key, due);
      if (!inserted) {
        if (it->second <= due) return;  // already due as early
        delayed_by_time_.erase({it->second, key});
        it->second = due;
      }
      delayed_by_time_.emplace(due, key);
      if (delayed_by_time_.begin()->second == key) {  // a new earliest
        ticker_wakeup_ = true;
        wake = due;
      }
    }
  }
  CallPool(turns, wake);
}

void WorkQueue::AddRateLimited(const std::string& key) {
  if (ShuttingDown()) return;
  AddAfter(key, rate_limiter_->When(key));
}

void WorkQueue::Forget(const std::string& key) { rate_limiter_->Forget(key); }

int WorkQueue::NumRequeues(const std::string& key) { return rate_limiter_->NumRequeues(key); }

void WorkQueue::ShutDown() {
  absl::MutexLock l(&mu_);
  ShutDownLocked();
  draining_ = false;
}

void WorkQueue::ShutDownWithDrain() {
  absl::MutexLock l(&mu_);
  ShutDownLocked();
  draining_ = true;
  mu_.Await(absl::Condition(this, &WorkQueue::DrainedLocked));
  draining_ = false;
}

void WorkQueue::Process(int max_parallel, std::function<void(const std::string& key)> process) {
  int turns = 0;
  {
    absl::MutexLock l(&mu_);
    if (pool_ == nullptr || max_parallel_ != 0 || max_parallel < 1) {
      std::fprintf(stderr, "WorkQueue::Process: %s\n",
                   pool_ == nullptr     ? "the queue is not on a pool"
                   : max_parallel_ != 0 ? "called twice"
                                        : "max_parallel < 1");
      std::abort();
    }
    process_ = std::move(process);
    max_parallel_ = max_parallel;
    PromoteDueLocked(clock_->Now());
    turns = TurnsNeededLocked();
  }
  CallPool(turns, absl::InfiniteFuture());
}

void WorkQueue::ShutDownAndWait() {
  {
    absl::MutexLock l(&mu_);
    ShutDownLocked();
    discarding_ = true;
    for (const std::string& key : queue_) {
      dirty_.erase(key);
      added_at_.erase(key);
    }
    if (metrics_ != nullptr) metrics_->depth.Decrement(static_cast<double>(queue_.size()));
    queue_.clear();
  }
  if (pool_ != nullptr) {
    absl::MutexLock l(&detach_mu_);
    if (!detached_) pool_->Detach(this);
    detached_ = true;  // the pool may be destroyed from now on
    return;
  }
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<std::string>* processing) { return processing->empty(); },
      &processing_));
}

int WorkQueue::TurnsNeededLocked() {
  if (pool_ == nullptr || max_parallel_ == 0 || discarding_) return 0;
  // Each queued turn takes one waiting key; no more turns than keys or than max_parallel.
  int uncovered = static_cast<int>(queue_.size()) - queued_turns_;
  int room = max_parallel_ - queued_turns_ - running_turns_;
  int turns = std::max(0, std::min(uncovered, room));
  queued_turns_ += turns;
  return turns;
}

void WorkQueue::CallPool(int turns, absl::Time wake) {
  if (pool_ == nullptr) return;
  for (int i = 0; i < turns; ++i) pool_->Schedule(this);
  if (wake != absl::InfiniteFuture()) pool_->WakeAt(this, wake);
}

void WorkQueue::RunTurn() {
  std::optional<std::string> key;
  std::function<void(const std::string&)>* process = nullptr;
  absl::Time wake = absl::InfiniteFuture();
  {
    absl::MutexLock l(&mu_);
    --queued_turns_;
    ++running_turns_;
    absl::Time now = clock_->Now();
    PromoteDueLocked(now);
    key = TakeLocked(now);
    process = &process_;
    if (key.has_value() && metrics_ != nullptr && next_refresh_ == absl::InfiniteFuture()) {
      next_refresh_ = now + tick_period_;
      wake = next_refresh_;
    }
  }
  if (key.has_value()) (*process)(*key);
  int turns = 0;
  {
    absl::MutexLock l(&mu_);
    if (key.has_value()) DoneLocked(*key);
    --running_turns_;
    turns = TurnsNeededLocked();
  }
  CallPool(turns, wake);
}

void WorkQueue::Tick(absl::Time now) {
  int turns = 0;
  absl::Time wake = absl::InfiniteFuture();
  {
    absl::MutexLock l(&mu_);
    PromoteDueLocked(now);
    if (now >= next_refresh_) {
      RefreshGaugesLocked(now);
      next_refresh_ = processing_.empty() ? absl::InfiniteFuture() : now + tick_period_;
    }
    wake = next_refresh_;
    if (!delayed_by_time_.empty()) wake = std::min(wake, delayed_by_time_.begin()->first);
    turns = TurnsNeededLocked();
  }
  CallPool(turns, wake);
}

void WorkQueue::ShutDownLocked() {
  shutting_down_ = true;
  delayed_.clear();
  delayed_by_time_.clear();
}

bool WorkQueue::ShuttingDown() const {
  absl::MutexLock l(&mu_);
  return shutting_down_;
}

void WorkQueue::PromoteDueLocked(absl::Time now) {
  while (!delayed_by_time_.empty() && delayed_by_time_.begin()->first <= now) {
    std::string key = delayed_by_time_.begin()->second;
    delayed_by_time_.erase(delayed_by_time_.begin());
    delayed_.erase(key);
    AddLocked(key, now);
  }
}

void WorkQueue::RefreshGaugesLocked(absl::Time now) {
  if (metrics_ == nullptr) return;
  absl::Duration total = absl::ZeroDuration();
  absl::Duration longest = absl::ZeroDuration();
  for (const auto& [key, started] : started_at_) {
    total += now - started;
    longest = std::max(longest, now - started);
  }
  metrics_->unfinished_work.Set(absl::ToDoubleSeconds(total));
  metrics_->longest_running.Set(absl::ToDoubleSeconds(longest));
}

void WorkQueue::RunTicker() {
  absl::MutexLock l(&mu_);
  absl::Time next_refresh = absl::InfinitePast();
  while (!ticker_stop_) {
    absl::Time now = clock_->Now();
    PromoteDueLocked(now);
    if (now >= next_refresh) {
      RefreshGaugesLocked(now);
      next_refresh = now + tick_period_;
    }
    absl::Time wake = next_refresh;
    if (!delayed_by_time_.empty()) wake = std::min(wake, delayed_by_time_.begin()->first);
    ticker_wakeup_ = false;
    clock_->AwaitWithDeadline(&mu_, absl::Condition(this, &WorkQueue::TickerWakeupLocked), wake);
  }
}

}  // namespace shardcache
