#include "common/client/reflector.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"

namespace shardcache {

struct Reflector::Metrics {
  Metrics(prometheus::Registry& r, const std::string& name)
      : watch_idle_restarts(
            prometheus::BuildCounter()
                .Name("shardcache_reflector_watch_idle_restarts_total")
                .Help("Watches taken for dead after receiving neither an event nor a bookmark "
                      "for the reflector's watch idle timeout, and opened again.")
                .Register(r)
                .Add({{"name", name}})),
        store_changes(prometheus::BuildCounter()
                          .Name("shardcache_reflector_store_changes_total")
                          .Help("Watches dropped, and lists done again, because the store behind "
                                "the address is not the one of the last list (another store_id).")
                          .Register(r)
                          .Add({{"name", name}})) {}
  prometheus::Counter& watch_idle_restarts;
  prometheus::Counter& store_changes;
};

namespace {

// The reflector whose step (or final call to its sink) this thread is running, if any: Stop() from
// inside a sink method must not wait for itself.
thread_local const Reflector* current_reflector = nullptr;

// Sets current_reflector for the scope (touching nothing of the reflector itself, which the sink
// may destroy meanwhile).
class CurrentReflector {
 public:
  explicit CurrentReflector(const Reflector* r) : previous_(current_reflector) {
    current_reflector = r;
  }
  ~CurrentReflector() { current_reflector = previous_; }
  CurrentReflector(const CurrentReflector&) = delete;
  CurrentReflector& operator=(const CurrentReflector&) = delete;

 private:
  const Reflector* const previous_;
};

// Errors that retrying cannot cure: the reflector stops.
bool IsTerminal(const absl::Status& s) {
  return s.code() == absl::StatusCode::kNotFound ||
         s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kUnimplemented;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reflector>> Reflector::Create(std::unique_ptr<ListerWatcher> lw,
                                                             ReflectorSink* sink, Options options) {
  if (lw == nullptr) return absl::InvalidArgumentError("lister_watcher: Required value");
  if (sink == nullptr) return absl::InvalidArgumentError("sink: Required value");
  if (options.clock == nullptr) return absl::InvalidArgumentError("options.clock: Required value");
  if (options.page_size < 0) {
    return absl::InvalidArgumentError("options.page_size: must not be negative");
  }
  if (options.watch_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("options.watch_idle_timeout: must not be negative");
  }
  if (options.pool != nullptr && options.pool->clock() != options.clock) {
    return absl::InvalidArgumentError("options.pool: runs on another clock than options.clock");
  }
  absl::StatusOr<Backoff> backoff = Backoff::Create(options.backoff, options.clock);
  if (!backoff.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("options.", backoff.status().message()));
  }
  std::unique_ptr<Metrics> metrics;
  if (options.registry != nullptr) {
    metrics = std::make_unique<Metrics>(*options.registry,
                                        options.name.empty() ? lw->Describe() : options.name);
  }
  return std::unique_ptr<Reflector>(new Reflector(std::move(lw), sink, std::move(options),
                                                  *std::move(backoff), std::move(metrics)));
}

Reflector::Reflector(std::unique_ptr<ListerWatcher> lw, ReflectorSink* sink, Options options,
                     Backoff backoff, std::unique_ptr<Metrics> metrics)
    : lw_(std::move(lw)),
      sink_(sink),
      options_(std::move(options)),
      name_(options_.name.empty() ? lw_->Describe() : options_.name),
      metrics_(std::move(metrics)),
      backoff_(std::move(backoff)) {}

Reflector::~Reflector() {
  Stop();
  // Destroyed on its own loop thread: from inside sink_->Stopped, the loop's last call (the
  // owner of the last reference to the sink dropped it there). That thread touches nothing of
  // this object after the call returns, so it is let go instead of joined.
  absl::MutexLock t(&thread_mu_);
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  // Stop() detached both, unless it ran inside a turn (from Stopped, on a pool): detaching the
  // turns from inside one returns at once, and that turn touches nothing after Stopped; a Tick
  // in progress is waited for.
  if (options_.pool != nullptr) {
    options_.pool->Detach(&turns_);
    options_.pool->Detach(&timer_);
  }
}

void Reflector::Start() {
  absl::MutexLock t(&thread_mu_);
  {
    absl::MutexLock l(&mu_);
    if (started_) return;
    started_ = true;
    if (options_.pool != nullptr) {
      NotifyLocked();  // the first turn
      return;
    }
  }
  thread_ = std::thread([this] { RunThread(); });
}

void Reflector::Stop() {
  const std::shared_ptr<absl::Notification> stopped_returned = stopped_returned_;
  std::shared_ptr<AsyncWatchEventStream> stream;
  bool never_started = false;
  {
    absl::MutexLock l(&mu_);
    if (!stop_requested_) {
      stop_requested_ = true;
      stream = current_stream_;
    }
    if (!started_) {
      started_ = true;  // Start() must not run the loop any more
      never_started = true;
      finished_ = true;
      stopped_ = true;
      stop_reason_ = absl::CancelledError(
          absl::StrCat("reflector ", name_, ": stopped by Stop() before it started"));
    }
  }
  if (stream != nullptr) {
    stream->Cancel();  // without mu_: the stream may call Notify from here
    stream.reset();
  }
  lw_->Shutdown();  // cancels a List in flight
  if (never_started) {
    sink_->Stopped(StopReason());
    stopped_returned->Notify();
    return;
  }
  if (current_reflector == this) return;  // from a sink method: the loop ends after it
  if (options_.pool == nullptr) {
    absl::MutexLock t(&thread_mu_);
    if (thread_.joinable()) thread_.join();
    return;
  }
  // No turn is queued after these (Notify schedules none once a stop is requested), and the one
  // in progress, if any, has returned: either it ended the loop, or it is left to this thread.
  options_.pool->Detach(&turns_);
  options_.pool->Detach(&timer_);
  Finish(CancelledByStop());
  // Another thread may be in the sink's Stopped (a concurrent Stop()): wait for it to return.
  stopped_returned->WaitForNotification();
}

bool Reflector::HasSynced() const {
  absl::MutexLock l(&mu_);
  return synced_;
}

std::string Reflector::LastResourceVersion() const {
  absl::MutexLock l(&mu_);
  return last_rv_;
}

bool Reflector::IsStopped() const {
  absl::MutexLock l(&mu_);
  return stopped_;
}

absl::Status Reflector::StopReason() const {
  absl::MutexLock l(&mu_);
  return stop_reason_;
}

bool Reflector::StopRequested() const {
  absl::MutexLock l(&mu_);
  return stop_requested_;
}

std::string Reflector::StoreId() const {
  absl::MutexLock l(&mu_);
  return store_id_;
}

absl::Status Reflector::CancelledByStop() const {
  return absl::CancelledError(absl::StrCat("reflector ", name_, ": stopped by Stop()"));
}

void Reflector::SawEvent(const std::string& rv) {
  absl::MutexLock l(&mu_);
  if (!rv.empty()) last_rv_ = rv;
  last_activity_ = options_.clock->Now();
}

// ---- Drivers ----

void Reflector::NotifyLocked() {
  wake_ = true;
  if (options_.pool == nullptr || scheduled_ || stop_requested_ || finished_ || !started_) return;
  scheduled_ = true;
  options_.pool->Schedule(&turns_);
}

void Reflector::Notify() {
  absl::MutexLock l(&mu_);
  NotifyLocked();
}

absl::Time Reflector::TimersLocked(absl::Time now, std::shared_ptr<AsyncWatchEventStream>* idle) {
  if (stop_requested_ || finished_) return absl::InfiniteFuture();
  absl::Time next = absl::InfiniteFuture();
  if (backoff_until_ != absl::InfiniteFuture()) {
    if (now >= backoff_until_) {
      backoff_until_ = absl::InfiniteFuture();
      NotifyLocked();
    } else {
      next = backoff_until_;
    }
  }
  // Without an open watch (or with one cancelled already), only a new watch arms the watchdog.
  if (options_.watch_idle_timeout > absl::ZeroDuration() && current_stream_ != nullptr &&
      !idle_cancelled_) {
    if (now - last_activity_ >= options_.watch_idle_timeout) {
      // Not a word from the store for several bookmark intervals: the connection is most likely
      // dead without having been reset. The loop reports it once the stream ends.
      idle_cancelled_ = true;
      *idle = current_stream_;
    } else {
      next = std::min(next, last_activity_ + options_.watch_idle_timeout);
    }
  }
  return next;
}

void Reflector::RunThread() {
  CurrentReflector current(this);
  while (true) {
    {
      absl::MutexLock l(&mu_);
      wake_ = false;  // what wakes it from here on is for the step below or the next
    }
    Next next = Step();
    if (next == Next::kFinished) return;  // the sink may have destroyed this reflector
    if (next != Next::kRunAgain) WaitForWork();
  }
}

void Reflector::WaitForWork() {
  mu_.Lock();
  while (!WokenLocked()) {
    std::shared_ptr<AsyncWatchEventStream> idle;
    absl::Time deadline = TimersLocked(options_.clock->Now(), &idle);
    if (idle != nullptr) {
      mu_.Unlock();
      idle->Cancel();  // without mu_: the stream may call Notify from here
      idle.reset();
      mu_.Lock();
      continue;
    }
    if (deadline == absl::InfiniteFuture()) {
      // Nothing timed: no wait on the clock (a test's FakeClock then counts only timed waits).
      mu_.Await(absl::Condition(this, &Reflector::WokenLocked));
    } else {
      options_.clock->AwaitWithDeadline(&mu_, absl::Condition(this, &Reflector::WokenLocked),
                                        deadline);
    }
  }
  mu_.Unlock();
}

void Reflector::RunTurn() {
  CurrentReflector current(this);
  bool stop = false;
  {
    absl::MutexLock l(&mu_);
    wake_ = false;
    stop = stop_requested_;
  }
  Next next = stop ? Next::kRunAgain : Step();
  if (next == Next::kFinished) return;  // the sink may have destroyed this reflector
  {
    absl::MutexLock l(&mu_);
    scheduled_ = false;
    stop = stop_requested_;
    if (!stop && (next == Next::kRunAgain || wake_)) NotifyLocked();
  }
  // Stop() was called from a sink method of this turn, or is waiting for it to end: no other
  // turn comes, so this one ends the loop.
  if (stop) Finish(CancelledByStop());
}

void Reflector::Tick(absl::Time now) {
  std::shared_ptr<AsyncWatchEventStream> idle;
  {
    absl::MutexLock l(&mu_);
    absl::Time next = TimersLocked(now, &idle);
    if (next != absl::InfiniteFuture()) options_.pool->WakeAt(&timer_, next);
  }
  if (idle != nullptr) idle->Cancel();  // without mu_: the stream may call Notify from here
}

// ---- Steps ----

Reflector::Next Reflector::Step() {
  if (StopRequested()) {
    Finish(CancelledByStop());
    return Next::kFinished;
  }
  switch (phase_) {
    case Phase::kList:
      return StepList();
    case Phase::kWatch:
      return StepWatch();
    case Phase::kBackoff: {
      absl::MutexLock l(&mu_);
      if (backoff_until_ != absl::InfiniteFuture()) return Next::kWaitTime;
      phase_ = after_backoff_;
      return Next::kRunAgain;
    }
  }
  return Next::kRunAgain;
}

Reflector::Next Reflector::StepList() {
  absl::Status listed = ListAll();
  if (StopRequested()) {
    Finish(CancelledByStop());
    return Next::kFinished;
  }
  if (IsTerminal(listed)) {
    Finish(listed);
    return Next::kFinished;
  }
  if (!listed.ok()) {
    spdlog::warn("reflector {}: list failed: {}", name_, listed.ToString());
    return StartBackoff(Phase::kList);
  }
  watches_since_list_ = 0;
  phase_ = Phase::kWatch;
  return Next::kRunAgain;
}

Reflector::Next Reflector::StepWatch() {
  if (watch_ == nullptr) OpenWatch();
  switch (PumpWatch()) {
    case Pumped::kPending:
      return Next::kWaitReady;
    case Pumped::kBudget:
      return Next::kRunAgain;
    case Pumped::kEnded:
      break;
  }
  return AfterWatch(EndWatch());
}

Reflector::Next Reflector::AfterWatch(const WatchResult& watched) {
  if (StopRequested()) {
    Finish(CancelledByStop());
    return Next::kFinished;
  }
  if (watched.store_changed) {
    // Another store answers at this address: its revisions say nothing about what this
    // reflector has seen. Only a list can tell what it holds.
    phase_ = Phase::kList;
    if (watches_since_list_ > 1) return Next::kRunAgain;  // a resumed watch: relist at once
    // The list itself came from the store that now answers otherwise: back off.
    return StartBackoff(Phase::kList);
  }
  if (watched.idle) {
    spdlog::warn(
        "reflector {}: the watch received neither an event nor a bookmark for {}; taking it "
        "for dead and watching again from resourceVersion {}",
        name_, absl::FormatDuration(options_.watch_idle_timeout), LastResourceVersion());
    return StartBackoff(Phase::kWatch);
  }
  if (IsTerminal(watched.status)) {
    Finish(watched.status);
    return Next::kFinished;
  }
  if (watched.status.code() == absl::StatusCode::kOutOfRange) {
    // The last revision left the store's history window: only a list can catch up.
    spdlog::info("reflector {}: {}; listing again", name_, watched.status.ToString());
    phase_ = Phase::kList;
    if (watches_since_list_ > 1) return Next::kRunAgain;  // a resumed watch: relist at once
    // The list's own revision was already too old (heavy writes): back off.
    return StartBackoff(Phase::kList);
  }
  if (watched.events > 0 &&
      (watched.status.ok() || watched.status.code() == absl::StatusCode::kDeadlineExceeded)) {
    return Next::kRunAgain;  // a healthy watch that reached its deadline: resume at once
  }
  spdlog::warn("reflector {}: watch ended after {} events: {}", name_, watched.events,
               watched.status.ToString());
  return StartBackoff(Phase::kWatch);
}

Reflector::Next Reflector::StartBackoff(Phase after) {
  absl::Duration delay = backoff_.Next();
  phase_ = Phase::kBackoff;
  after_backoff_ = after;
  {
    absl::MutexLock l(&mu_);
    backoff_until_ = options_.clock->Now() + delay;
    if (options_.pool != nullptr) options_.pool->WakeAt(&timer_, backoff_until_);
  }
  backoff_waits_.fetch_add(1);  // after the deadline is set: a test may move the clock now
  return Next::kWaitTime;
}

absl::Status Reflector::ListAll() {
  lists_started_.fetch_add(1);
  std::vector<ObjectRef> objects;
  std::string continue_token;
  std::string revision;
  std::string store_id;
  do {
    if (StopRequested()) return absl::CancelledError("stopped");
    absl::StatusOr<v1::ListResponse> page = lw_->List(options_.page_size, continue_token);
    if (!page.ok() && absl::IsOutOfRange(page.status()) && !continue_token.empty()) {
      // The snapshot of the first page left the store's history window while we paged (a long
      // list under many writes): as client-go's pager, list everything again in one page, which
      // needs no history, rather than paging again into the same failure.
      spdlog::warn("reflector {}: paged list expired ({}); listing in one page", name_,
                   page.status().ToString());
      objects.clear();
      revision.clear();
      page = lw_->List(0, "");
    }
    if (!page.ok()) return page.status();
    if (revision.empty()) {
      revision = page->resource_version();
      store_id = page->store_id();
    }
    objects.reserve(objects.size() + page->items_size());
    for (v1::Object& item : *page->mutable_items()) {
      objects.push_back(std::make_shared<const v1::Object>(std::move(item)));
    }
    continue_token = page->continue_token();
  } while (!continue_token.empty());
  if (revision.empty()) {
    return absl::InternalError(
        absl::StrCat("list ", name_, ": the store returned no resourceVersion"));
  }
  backoff_.Succeeded();
  size_t count = objects.size();
  sink_->Replace(std::move(objects), revision);
  std::string previous_store_id;
  {
    absl::MutexLock l(&mu_);
    last_rv_ = revision;
    previous_store_id = std::exchange(store_id_, store_id);
    synced_ = true;
  }
  if (previous_store_id != store_id) {
    spdlog::info("reflector {}: listed store {} (previously {})", name_, store_id,
                 previous_store_id.empty() ? "none" : previous_store_id);
    sink_->StoreChanged(store_id);
  }
  spdlog::debug("reflector {}: listed {} objects at revision {}", name_, count, revision);
  return absl::OkStatus();
}

void Reflector::OpenWatch() {
  ++watches_since_list_;
  watch_ = lw_->Watch(LastResourceVersion());
  watch_result_ = WatchResult();
  headers_checked_ = false;
  bool cancel = false;
  {
    absl::MutexLock l(&mu_);
    cancel = stop_requested_;
    current_stream_ = watch_;
    watch_store_id_ = store_id_;
    last_activity_ = options_.clock->Now();
    idle_cancelled_ = false;
    if (options_.pool != nullptr && options_.watch_idle_timeout > absl::ZeroDuration()) {
      options_.pool->WakeAt(&timer_, last_activity_ + options_.watch_idle_timeout);
    }
  }
  watches_started_.fetch_add(1);
  // The stream outlives no call of this: the reflector destroys it (waiting for its callbacks)
  // before it goes.
  watch_->Start([this] { Notify(); });
  if (cancel) watch_->Cancel();
}

Reflector::Pumped Reflector::PumpWatch() {
  if (!headers_checked_) {
    // The response headers name the store before any event (a store that sends none is checked
    // at its first event instead).
    std::optional<std::string> served_by = watch_->StoreId();
    if (!served_by.has_value()) return Pumped::kPending;
    headers_checked_ = true;
    StoreChanged(*served_by);
  }
  v1::WatchEvent event;
  for (int i = 0; i < kEventsPerTurn; ++i) {
    if (StopRequested()) return Pumped::kBudget;  // the step that follows ends the loop
    switch (watch_->Next(&event)) {
      case AsyncWatchEventStream::Poll::kPending:
        return Pumped::kPending;
      case AsyncWatchEventStream::Poll::kEnded:
        return Pumped::kEnded;
      case AsyncWatchEventStream::Poll::kEvent:
        break;
    }
    // A dropped stream is drained until it ends; an event is checked before it is applied: an
    // event of another store must not reach the sink.
    if (watch_result_.store_changed || StoreChanged(event.store_id())) continue;
    Apply(event);
  }
  return Pumped::kBudget;
}

bool Reflector::StoreChanged(const std::string& served_by) {
  if (served_by.empty() || served_by == watch_store_id_) return false;
  spdlog::warn(
      "reflector {}: the watch from resourceVersion {} is served by store {}, not by store {} "
      "of the last list (its data was replaced); listing again",
      name_, LastResourceVersion(), served_by,
      watch_store_id_.empty() ? "(none)" : watch_store_id_);
  store_changes_.fetch_add(1);
  if (metrics_ != nullptr) metrics_->store_changes.Increment();
  watch_result_.store_changed = true;
  watch_->Cancel();
  return true;
}

void Reflector::Apply(v1::WatchEvent& event) {
  if (watch_result_.events++ == 0) backoff_.Succeeded();
  std::string rv = event.object().metadata().resource_version();
  switch (event.type()) {
    case v1::WatchEvent::ADDED:
      sink_->Add(std::make_shared<const v1::Object>(std::move(*event.mutable_object())));
      break;
    case v1::WatchEvent::MODIFIED:
      sink_->Update(std::make_shared<const v1::Object>(std::move(*event.mutable_object())));
      break;
    case v1::WatchEvent::DELETED:
      sink_->Delete(std::make_shared<const v1::Object>(std::move(*event.mutable_object())));
      break;
    case v1::WatchEvent::BOOKMARK:
      sink_->Bookmark(rv);
      break;
    default:
      spdlog::warn("reflector {}: ignoring a watch event of unknown type {}", name_,
                   static_cast<int>(event.type()));
      return;
  }
  SawEvent(rv);
}

Reflector::WatchResult Reflector::EndWatch() {
  WatchResult result = watch_result_;
  {
    absl::MutexLock l(&mu_);
    current_stream_ = nullptr;
    result.idle = idle_cancelled_ && !result.store_changed;
  }
  if (result.idle) {
    watch_idle_restarts_.fetch_add(1);
    if (metrics_ != nullptr) metrics_->watch_idle_restarts.Increment();
  }
  result.status = watch_->Finish();
  watch_.reset();  // its callbacks are over, or waited for
  return result;
}

void Reflector::Finish(const absl::Status& reason) {
  std::shared_ptr<AsyncWatchEventStream> stream;
  {
    absl::MutexLock l(&mu_);
    if (finished_) return;
    finished_ = true;
    stream = std::move(current_stream_);
    backoff_until_ = absl::InfiniteFuture();
  }
  // Cancels the watch if it is open and waits for its callbacks, which call Notify: that does
  // nothing now, and this object is still whole.
  stream.reset();
  watch_.reset();
  if (reason.code() == absl::StatusCode::kCancelled) {
    spdlog::info("reflector {}: stopped", name_);
  } else {
    spdlog::warn("reflector {}: stopped for good: {}", name_, reason.ToString());
  }
  {
    absl::MutexLock l(&mu_);
    stopped_ = true;
    stop_reason_ = reason;
  }
  const std::shared_ptr<absl::Notification> stopped_returned = stopped_returned_;
  {
    CurrentReflector current(this);
    sink_->Stopped(reason);  // the sink may destroy this reflector
  }
  stopped_returned->Notify();
}

}  // namespace shardcache
