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
  if (thread_.joinable() && thread_.get_id() == std::this_thread::get_id()) thread_.detach();
  // The loop has ended (stopped_ is set before the sink's last call), so the watchdog has too.
  if (watchdog_.joinable()) watchdog_.join();
  if (options_.pool != nullptr) options_.pool->Detach(&pool_watchdog_);
}

void Reflector::Start() {
  absl::MutexLock t(&thread_mu_);
  {
    absl::MutexLock l(&mu_);
    if (started_) return;
    started_ = true;
  }
  thread_ = std::thread([this] { Run(); });
  if (options_.watch_idle_timeout > absl::ZeroDuration() && options_.pool == nullptr) {
    watchdog_ = std::thread([this] { RunWatchdog(); });
  }
}

void Reflector::Stop() {
  bool on_loop_thread = false;
  bool never_started = false;
  {
    absl::MutexLock l(&mu_);
    if (!stop_requested_) {
      stop_requested_ = true;
      if (current_stream_ != nullptr) current_stream_->Cancel();
    }
    on_loop_thread = loop_thread_id_ == std::this_thread::get_id();
    if (!started_) {
      started_ = true;  // Start() must not run the loop any more
      never_started = true;
      stopped_ = true;
      stop_reason_ = absl::CancelledError(
          absl::StrCat("reflector ", name_, ": stopped by Stop() before it started"));
    }
  }
  lw_->Shutdown();  // cancels a List in flight
  if (never_started) {
    sink_->Stopped(StopReason());
    return;
  }
  if (on_loop_thread) return;
  absl::MutexLock t(&thread_mu_);
  if (thread_.joinable()) thread_.join();
  if (watchdog_.joinable()) watchdog_.join();
  if (options_.pool != nullptr) options_.pool->Detach(&pool_watchdog_);
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

void Reflector::SawEvent(const std::string& rv) {
  absl::MutexLock l(&mu_);
  if (!rv.empty()) last_rv_ = rv;
  last_activity_ = options_.clock->Now();
}

bool Reflector::WatchdogShouldWake() const {
  return stop_requested_ || stopped_ || stream_generation_ != watchdog_generation_;
}

absl::Time Reflector::WatchdogCheckLocked(absl::Time now) {
  // Without an open watch (or with one cancelled already), only a new watch or the end wakes
  // it; with one, also the moment it will have been idle for the limit if nothing arrives.
  if (stop_requested_ || stopped_ || current_stream_ == nullptr || idle_cancelled_) {
    return absl::InfiniteFuture();
  }
  if (now - last_activity_ >= options_.watch_idle_timeout) {
    // Not a word from the store for several bookmark intervals: the connection is most likely
    // dead without having been reset. The loop reports it once the stream ends.
    idle_cancelled_ = true;
    current_stream_->Cancel();
    return absl::InfiniteFuture();
  }
  return last_activity_ + options_.watch_idle_timeout;
}

void Reflector::RunWatchdog() {
  absl::MutexLock l(&mu_);
  while (!stop_requested_ && !stopped_) {
    absl::Time deadline = WatchdogCheckLocked(options_.clock->Now());
    watchdog_generation_ = stream_generation_;
    options_.clock->AwaitWithDeadline(&mu_, absl::Condition(this, &Reflector::WatchdogShouldWake),
                                      deadline);
  }
}

void Reflector::WatchdogTick(absl::Time now) {
  absl::MutexLock l(&mu_);
  absl::Time next = WatchdogCheckLocked(now);
  if (next != absl::InfiniteFuture()) options_.pool->WakeAt(&pool_watchdog_, next);
}

void Reflector::Run() {
  {
    absl::MutexLock l(&mu_);
    loop_thread_id_ = std::this_thread::get_id();
  }
  absl::Status reason = Loop();
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
  sink_->Stopped(reason);
}

absl::Status Reflector::Loop() {
  const absl::Status cancelled =
      absl::CancelledError(absl::StrCat("reflector ", name_, ": stopped by Stop()"));
  bool need_list = true;
  int watches_since_list = 0;
  while (true) {
    if (StopRequested()) return cancelled;
    if (need_list) {
      absl::Status listed = ListAll();
      if (StopRequested()) return cancelled;
      if (IsTerminal(listed)) return listed;
      if (!listed.ok()) {
        spdlog::warn("reflector {}: list failed: {}", name_, listed.ToString());
        if (!WaitBackoff()) return cancelled;
        continue;
      }
      need_list = false;
      watches_since_list = 0;
    }
    ++watches_since_list;
    WatchResult watched = WatchOnce();
    if (StopRequested()) return cancelled;
    if (watched.store_changed) {
      // Another store answers at this address: its revisions say nothing about what this
      // reflector has seen. Only a list can tell what it holds.
      need_list = true;
      if (watches_since_list > 1) continue;  // a resumed watch: relist at once
      // The list itself came from the store that now answers otherwise: back off below.
    } else if (watched.idle) {
      spdlog::warn(
          "reflector {}: the watch received neither an event nor a bookmark for {}; taking it "
          "for dead and watching again from resourceVersion {}",
          name_, absl::FormatDuration(options_.watch_idle_timeout), LastResourceVersion());
    } else if (IsTerminal(watched.status)) {
      return watched.status;
    } else if (watched.status.code() == absl::StatusCode::kOutOfRange) {
      // The last revision left the store's history window: only a list can catch up.
      spdlog::info("reflector {}: {}; listing again", name_, watched.status.ToString());
      need_list = true;
      if (watches_since_list > 1) continue;  // a resumed watch: relist at once
      // The list's own revision was already too old (heavy writes): back off below.
    } else if (watched.events > 0 &&
               (watched.status.ok() ||
                watched.status.code() == absl::StatusCode::kDeadlineExceeded)) {
      continue;  // a healthy watch that reached its deadline: resume at once
    } else {
      spdlog::warn("reflector {}: watch ended after {} events: {}", name_, watched.events,
                   watched.status.ToString());
    }
    if (!WaitBackoff()) return cancelled;
  }
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

Reflector::WatchResult Reflector::WatchOnce() {
  WatchResult result;
  std::unique_ptr<WatchEventStream> stream = lw_->Watch(LastResourceVersion());
  std::string store_id;
  {
    absl::MutexLock l(&mu_);
    if (stop_requested_) stream->Cancel();
    current_stream_ = stream.get();
    store_id = store_id_;
    last_activity_ = options_.clock->Now();
    idle_cancelled_ = false;
    ++stream_generation_;
    if (options_.pool != nullptr && options_.watch_idle_timeout > absl::ZeroDuration()) {
      options_.pool->WakeAt(&pool_watchdog_, last_activity_ + options_.watch_idle_timeout);
    }
  }
  watches_started_.fetch_add(1);
  v1::WatchEvent event;
  // Whether `served_by` (when known) is another store than the last list's; if so, ends the
  // stream: nothing it says may reach the sink.
  auto store_changed = [&](const std::string& served_by) {
    if (served_by.empty() || served_by == store_id) return false;
    spdlog::warn(
        "reflector {}: the watch from resourceVersion {} is served by store {}, not by store {} "
        "of the last list (its data was replaced); listing again",
        name_, LastResourceVersion(), served_by, store_id.empty() ? "(none)" : store_id);
    store_changes_.fetch_add(1);
    if (metrics_ != nullptr) metrics_->store_changes.Increment();
    result.store_changed = true;
    stream->Cancel();
    while (stream->Next(&event)) {
    }
    return true;
  };
  // The response headers name the store before any event (a store that sends none is checked
  // at its first event instead).
  bool changed = store_changed(stream->StoreId());
  while (!changed && stream->Next(&event)) {
    // Checked before the event is applied: an event of another store must not reach the sink.
    if (store_changed(event.store_id())) break;
    if (result.events++ == 0) backoff_.Succeeded();
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
        continue;
    }
    SawEvent(rv);
  }
  {
    absl::MutexLock l(&mu_);
    current_stream_ = nullptr;
    result.idle = idle_cancelled_ && !result.store_changed;
  }
  if (result.idle) {
    watch_idle_restarts_.fetch_add(1);
    if (metrics_ != nullptr) metrics_->watch_idle_restarts.Increment();
  }
  result.status = stream->Finish();
  return result;
}

bool Reflector::WaitBackoff() {
  absl::Duration delay = backoff_.Next();
  backoff_waits_.fetch_add(1);
  const Clock* clock = options_.clock;
  absl::Time deadline = clock->Now() + delay;
  absl::MutexLock l(&mu_);
  return !clock->AwaitWithDeadline(&mu_, absl::Condition(&stop_requested_), deadline);
}

}  // namespace shardcache
