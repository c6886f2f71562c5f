#include "cache_server/dispatcher.h"

#include <algorithm>
#include <utility>

#include "cache_server/socket_cork.h"
#include "common/tsan_annotations.h"

namespace shardcache {

void* Completion::AsTag() {
  TsanRelease(this);
  return this;
}

Completion* Completion::FromTag(void* tag) {
  auto* completion = static_cast<Completion*>(tag);
  TsanAcquire(completion);
  return completion;
}

void Dispatcher::WakeTag::Complete(bool /*ok*/) {
  absl::MutexLock l(&d->queue_mu_);
  d->wake_pending_ = false;
}

Dispatcher::Dispatcher(Options options, FanOut::Source* source, StoreMetrics* metrics)
    : options_(std::move(options)), source_(source), fan_out_(options_.fan_out, metrics) {
  wake_.d = this;
  thread_ = std::thread([this] { Run(); });
}

Dispatcher::~Dispatcher() {
  {
    absl::MutexLock l(&queue_mu_);
    stopping_ = true;
  }
  thread_.join();
}

void Dispatcher::Enqueue(const std::vector<Item>& items) {
  absl::MutexLock l(&queue_mu_);
  for (const Item& item : items) {
    if (item.forms == nullptr) {
      // A marker comes after the events before it, skipped or not.
      if (pending_skip_ > 0) queue_.push_back(Item::ForSkip(pending_skip_));
      pending_skip_ = 0;
      queue_.push_back(item);
      continue;
    }
    if (queued_events_ >= options_.max_queued_events) {
      // This thread is far behind: it skips these and catches its watchers up from the
      // history.
      pending_skip_ = item.forms->event()->revision;
      continue;
    }
    queue_.push_back(item);
    ++queued_events_;
  }
  // A thread waiting on its completion queue does not see the condition: wake it there.
  if (cq_state_ == QueueState::kOpen && sleeping_ && !wake_pending_) {
    wake_pending_ = true;
    alarm_.Set(cq_.get(), gpr_time_0(GPR_CLOCK_REALTIME), wake_.AsTag());
  }
}

void Dispatcher::Add(Watcher* watcher) {
  absl::MutexLock l(&watchers_mu_);
  fan_out_.Add(watcher);
  count_.fetch_add(1);
}

bool Dispatcher::Remove(Watcher* watcher) {
  absl::MutexLock l(&watchers_mu_);
  if (!fan_out_.Remove(watcher)) return false;
  count_.fetch_sub(1);
  return true;
}

void Dispatcher::EndAll(const absl::Status& status) {
  absl::MutexLock l(&watchers_mu_);
  fan_out_.EndAll(status);
}

void Dispatcher::Run() {
  const Clock* clock = options_.fan_out.clock;
  absl::Time next_tick = clock->Now();
  absl::Time next_release = next_tick;
  // Real time: when the parked watchers are looked at next (InfiniteFuture: none is parked).
  absl::Time next_catch_up = absl::InfiniteFuture();
  std::deque<Item> batch;
  // The writes that this thread starts are held corked until Wait releases them (socket_cork.h).
  SocketCork::Scope cork;
  while (true) {
    if (!Wait(next_tick, next_catch_up)) return;
    {
      absl::MutexLock l(&queue_mu_);
      batch.swap(queue_);
      queued_events_ = 0;
      if (pending_skip_ > 0) batch.push_back(Item::ForSkip(pending_skip_));
      pending_skip_ = 0;
    }
    bool parked;
    {
      absl::MutexLock l(&watchers_mu_);
      // Every event taken goes out before any is sent: a watcher gets the run in one write (as
      // one batch, when it asked for batches) rather than the first event alone.
      for (const Item& item : batch) {
        if (item.forms != nullptr) {
          fan_out_.Dispatch(*item.forms);
        } else if (item.skip_to > 0) {
          fan_out_.Skip(item.skip_to);
        } else {
          fan_out_.ResourceGone(item.gone_resource, item.gone_version, item.gone_revision,
                                item.gone_status);
        }
      }
      absl::Time now = clock->Now();
      fan_out_.Flush(now);
      next_tick = fan_out_.Tick(now);
      parked = fan_out_.parked() > 0;
      if (options_.release_idle_chunks != nullptr && now >= next_release) {
        options_.release_idle_chunks->ReleaseIdle();
        next_release = now + FanOut::kSweepInterval;
      }
    }
    batch.clear();
    if (!parked) {
      next_catch_up = absl::InfiniteFuture();
    } else if (next_catch_up == absl::InfiniteFuture()) {
      next_catch_up = absl::Now() + options_.catch_up_poll_interval;
    } else if (absl::Now() >= next_catch_up) {
      next_catch_up =
          CatchUp() ? absl::Now() + options_.catch_up_poll_interval : absl::InfiniteFuture();
    }
    // The writes just started that completed at once (their clients keep up) are followed up
    // here, on this thread, before waiting again.
    RunReadyCompletions();
  }
}

bool Dispatcher::CatchUp() {
  std::vector<FanOut::CatchUpRead> reads;
  {
    absl::MutexLock l(&watchers_mu_);
    reads = fan_out_.PlanCatchUp();
    if (reads.empty()) return fan_out_.parked() > 0;
  }
  // The history is read under the store's lock: never under watchers_mu_.
  FanOut::ReadCatchUp(source_, &reads);
  absl::MutexLock l(&watchers_mu_);
  fan_out_.ApplyCatchUp(std::move(reads));
  fan_out_.Flush(options_.fan_out.clock->Now());
  return fan_out_.parked() > 0;
}

bool Dispatcher::Wait(absl::Time deadline, absl::Time real_wake) {
  const Clock* clock = options_.fan_out.clock;
  while (true) {
    // What the last pass (or completion) wrote goes out before the thread may block.
    SocketCork::Release();
    if (absl::Now() >= real_wake) return true;
    {
      absl::MutexLock l(&queue_mu_);
      if (stopping_) return false;
      if (!queue_.empty() || pending_skip_ > 0 || clock->Now() >= deadline) return true;
      if (!OnCompletionQueueLocked()) {
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
          return stopping_ || !queue_.empty() || OnCompletionQueueLocked();
        };
        if (real_wake == absl::InfiniteFuture()) {
          clock->AwaitWithDeadline(&queue_mu_, absl::Condition(&ready), deadline);
        } else {
          // Parked watchers: on any clock, look at them again in real time.
          queue_mu_.AwaitWithDeadline(
              absl::Condition(&ready),
              std::min(real_wake, absl::Now() + options_.other_clock_poll_interval));
        }
        continue;
      }
      sleeping_ = true;
    }
    // gRPC waits in real time: on another clock (a test's), look at it again every few
    // milliseconds.
    absl::Time real_deadline =
        clock == RealClock::Get() ? deadline : absl::Now() + options_.other_clock_poll_interval;
    real_deadline = std::min(real_deadline, real_wake);
    bool drained =
        RunCompletion(absl::ToChronoTime(real_deadline)) == grpc::CompletionQueue::SHUTDOWN;
    absl::MutexLock l(&queue_mu_);
    sleeping_ = false;
    if (drained) cq_state_ = QueueState::kDrained;
  }
}

grpc::CompletionQueue::NextStatus Dispatcher::RunCompletion(
    std::chrono::system_clock::time_point deadline) {
  void* tag = nullptr;
  bool ok = false;
  grpc::CompletionQueue::NextStatus status = cq_->AsyncNext(&tag, &ok, deadline);
  if (status == grpc::CompletionQueue::GOT_EVENT) Completion::FromTag(tag)->Complete(ok);
  return status;
}

void Dispatcher::RunReadyCompletions() {
  {
    absl::MutexLock l(&queue_mu_);
    if (!OnCompletionQueueLocked()) return;
  }
  // A deadline in the past: only what is ready.
  grpc::CompletionQueue::NextStatus status;
  do {
    status = RunCompletion(std::chrono::system_clock::time_point());
  } while (status == grpc::CompletionQueue::GOT_EVENT);
  if (status == grpc::CompletionQueue::SHUTDOWN) {
    absl::MutexLock l(&queue_mu_);
    cq_state_ = QueueState::kDrained;
  }
}

void Dispatcher::StartCompletionQueue() {
  // Not polling: the thread never waits for gRPC's I/O (the server's own threads do it), only
  // for its watchers' completions and for its wake-up alarm.
  grpc_completion_queue_attributes attributes{GRPC_CQ_CURRENT_VERSION, GRPC_CQ_NEXT,
                                              GRPC_CQ_NON_POLLING, nullptr};
  cq_ = std::make_unique<grpc::CompletionQueue>(grpc_completion_queue_create(
      grpc_completion_queue_factory_lookup(&attributes), &attributes, nullptr));
  absl::MutexLock l(&queue_mu_);
  cq_state_ = QueueState::kOpen;
}

void Dispatcher::ShutdownCompletionQueue() {
  {
    absl::MutexLock l(&queue_mu_);
    if (cq_state_ != QueueState::kOpen) return;
    // No alarm is set from now on.
    cq_state_ = QueueState::kShuttingDown;
  }
  cq_->Shutdown();
  absl::MutexLock l(&queue_mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
    return cq_state_ != QueueState::kShuttingDown;
  };
  queue_mu_.Await(absl::Condition(&drained));
}

}  // namespace shardcache
