#include "cache_server/watch_call.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace shardcache {

namespace {

grpc::Slice StoreIdSuffix(const std::string& store_id) {
  if (store_id.empty()) return grpc::Slice();
  v1::WatchEvent only_id;
  only_id.set_store_id(store_id);
  return grpc::Slice(only_id.SerializeAsString());
}

}  // namespace

WatchCall::WatchCall(WatchCache* cache, StoreMetrics* metrics, size_t max_pending_events,
                     const std::string& store_id, int dispatcher, AcceptedCallback on_accepted)
    : cache_(cache),
      metrics_(metrics),
      max_pending_events_(max_pending_events),
      max_queue_bytes_(cache->options().watcher_queue_bytes),
      stall_timeout_(cache->options().stall_timeout),
      clock_(cache->options().clock),
      store_id_suffix_(StoreIdSuffix(store_id)),
      dispatcher_(dispatcher),
      on_accepted_(std::move(on_accepted)),
      hold_(cache),
      writer_(&ctx_) {
  ctx_.AsyncNotifyWhenDone(done_.get());
}

void WatchCall::SendInitialMetadata() {
  Ref();
  writer_.SendInitialMetadata(metadata_sent_.get());
}

void WatchCall::Begin() {
  Action a;
  {
    absl::MutexLock l(&mu_);
    started_ = true;
    a = NextLocked();
  }
  Act(a);
  Unref();
}

void WatchCall::Reject(const grpc::Status& status) {
  {
    absl::MutexLock l(&mu_);
    // The initial events of a watcher that could not be registered are not sent.
    ClearLocked();
    RequestFinishLocked(status);
  }
  // Nothing is queued: Begin sends the Finish.
  Begin();
}

void WatchCall::Init(WatchSpec spec,
                     std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial) {
  spec_ = std::move(spec);
  absl::MutexLock l(&mu_);
  if (finish_requested_) return;  // cancelled already
  for (auto& item : initial) initial_.push_back(std::move(item));
}

bool WatchCall::Deliver(const Delivery& delivery) {
  absl::MutexLock l(&mu_);
  if (finish_requested_) return true;  // ending: dropped
  if (FullLocked()) {
    // Parked by the fan-out: it catches this watcher up from the history once it has room.
    full_.store(true, std::memory_order_relaxed);
    CheckStalledLocked(clock_->Now());
    return false;
  }
  if (!batch_) {
    live_.push_back(Pending{delivery.encoded, 1, false});
    live_bytes_ += delivery.encoded.size();
  } else {
    // Most of the time the event follows the previous one in the same chunk: one longer run.
    if (live_.empty() || !live_.back().elements ||
        !ExtendRun(&live_.back().bytes, delivery.element)) {
      live_.push_back(Pending{delivery.element, 0, true});
    }
    ++live_.back().events;
    live_bytes_ += delivery.element.size();
  }
  ++live_events_;
  return true;
}

bool WatchCall::HasRoom() const {
  absl::MutexLock l(&mu_);
  return finish_requested_ || !FullLocked(2);
}

bool WatchCall::FullLocked(size_t divisor) const {
  return live_bytes_ >= max_queue_bytes_ / divisor ||
         (max_pending_events_ > 0 && live_events_ >= max_pending_events_ / divisor);
}

void WatchCall::Flush() {
  Action a;
  {
    absl::MutexLock l(&mu_);
    a = NextLocked();
  }
  Act(a);
}

void WatchCall::Bookmark(int64_t revision) {
  Action a;
  {
    absl::MutexLock l(&mu_);
    // A bookmark only helps a watcher with nothing else to receive.
    if (finish_requested_ || !live_.empty() || !initial_.empty()) return;
    v1::Object bookmark;
    bookmark.mutable_metadata()->set_resource_version(absl::StrCat(revision));
    live_.push_back(
        Pending{EncodeWatchEvent(v1::WatchEvent::BOOKMARK, bookmark, spec_.encoding), 1, false});
    live_bytes_ += live_.back().bytes.size();
    ++live_events_;
    a = NextLocked();
  }
  Act(a);
}

void WatchCall::Sweep(absl::Time now) {
  if (!full_.load(std::memory_order_relaxed)) return;
  Action a;
  {
    absl::MutexLock l(&mu_);
    CheckStalledLocked(now);
    a = NextLocked();
  }
  Act(a);
}

void WatchCall::End(const absl::Status& status) {
  Action a;
  {
    absl::MutexLock l(&mu_);
    // Shutting down: do not hold the server up for a slow reader.
    if (status.code() == absl::StatusCode::kUnavailable) ClearLocked();
    RequestFinishLocked(ToGrpcStatus(status));
    a = NextLocked();
  }
  Act(a);
}

void WatchCall::OnAccepted(bool ok) {
  if (!ok) {
    // The server is shutting down: no call came, and none of the other tags will complete.
    delete this;
    return;
  }
  if (cache_->options().cork_writes) socket_ = cache_->sockets()->Find(ctx_.peer());
  // A copy: starting the call may end it, and delete the reactor, before the callback returns.
  AcceptedCallback start = on_accepted_;
  start(this);
}

void WatchCall::OnMetadataSent(bool /*ok*/) { Unref(); }

void WatchCall::OnWriteDone(bool ok) {
  Action a;
  {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!FullLocked(2)) full_.store(false, std::memory_order_relaxed);
    if (!ok) {
      ClearLocked();
      RequestFinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke"));
    }
    a = NextLocked();
  }
  Act(a);
  Unref();
}

void WatchCall::OnFinished(bool /*ok*/) { Unref(); }

void WatchCall::OnDone(bool /*ok*/) {
  Action a;
  {
    absl::MutexLock l(&mu_);
    // Reported once the call is over: before our Finish, only when the client cancelled (or the
    // connection broke, or the server is stopping). That may be before the call was started (it
    // completes on another queue than the call's arrival): the starter then finishes it.
    if (ctx_.IsCancelled()) {
      ClearLocked();
      RequestFinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
    }
    a = NextLocked();
  }
  Act(a);
  Unref();
}

void WatchCall::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // Nothing of the call is in flight any more; after Unregister no dispatcher calls in either.
  cache_->Unregister(this);
  {
    absl::MutexLock l(&mu_);
    ClearLocked();
    metrics_->ObserveRequest(
        "Watch",
        absl::StatusCodeToString(static_cast<absl::StatusCode>(final_status_.error_code())), -1);
  }
  delete this;
}

void WatchCall::RequestFinishLocked(const grpc::Status& status) {
  if (finish_requested_) return;
  finish_requested_ = true;
  final_status_ = status;
}

void WatchCall::ClearLocked() {
  live_.clear();
  initial_.clear();
  live_bytes_ = 0;
  live_events_ = 0;
}

void WatchCall::CheckStalledLocked(absl::Time now) {
  if (finish_requested_ || !full_.load(std::memory_order_relaxed)) return;
  if (!writing_ || now - write_started_ < stall_timeout_) return;
  size_t bytes = live_bytes_, events = live_events_;
  // Its message in flight stays with gRPC until the client reads or goes away.
  ClearLocked();
  metrics_->watchers_too_slow.Increment();
  RequestFinishLocked(
      grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                   absl::StrCat("watcher too slow: its client has read nothing for ",
                                absl::FormatDuration(now - write_started_), " while ", events,
                                " events (", bytes,
                                " bytes) were waiting to be sent; watch again from the last "
                                "resourceVersion received, or list again")));
}

WatchCall::Action WatchCall::NextLocked() {
  if (!started_ || writing_ || finished_) return Action::kNone;
  if (initial_.empty() && live_.empty()) {
    if (!finish_requested_) return Action::kNone;
    finished_ = true;
    Ref();  // for the Finish, taken under mu_: whoever acts on it may hold no ref of its own
    return Action::kFinish;
  }
  // The events of this message: the initial ones first (encoded now), then live ones.
  std::vector<Pending> parts;
  size_t bytes = 0, events = 0;
  while (!initial_.empty() || !live_.empty()) {
    if (events > 0 && (!batch_ || bytes >= kMaxBatchBytes)) break;
    if (!initial_.empty()) {
      auto& [type, object] = initial_.front();
      if (events > 0 && bytes + object->ByteSizeLong() > kMaxBatchBytes) break;
      parts.push_back(Pending{EncodeWatchEvent(type, *object, spec_.encoding), 1, false});
      initial_.pop_front();
    } else {
      if (events > 0 && bytes + live_.front().bytes.size() > kMaxBatchBytes) break;
      parts.push_back(std::move(live_.front()));
      live_.pop_front();
      live_bytes_ -= parts.back().bytes.size();
      live_events_ -= parts.back().events;
    }
    bytes += parts.back().bytes.size();
    events += parts.back().events;
  }

  // One event goes out as itself; several as the elements of one WatchEvent.
  std::vector<grpc::Slice> slices;
  if (events == 1) {
    Pending& only = parts.front();
    slices.push_back(only.elements ? ElementEvent(only.bytes) : std::move(only.bytes));
  } else {
    slices.reserve(2 * parts.size() + 1);
    for (Pending& part : parts) {
      if (!part.elements) slices.push_back(BatchElementHeader(part.bytes.size()));
      slices.push_back(std::move(part.bytes));
    }
  }
  if (store_id_suffix_.size() > 0) slices.push_back(store_id_suffix_);
  out_ = grpc::ByteBuffer(slices.data(), slices.size());
  writing_ = true;
  write_started_ = clock_->Now();
  Ref();  // for the write (as for the Finish)
  return Action::kWrite;
}

void WatchCall::Act(Action action) {
  switch (action) {
    case Action::kWrite:
      // On a dispatcher, the connection holds the message until the end of the pass.
      SocketCork::Hold(socket_);
      writer_.Write(out_, write_done_.get());
      break;
    case Action::kFinish: {
      grpc::Status status;
      {
        absl::MutexLock l(&mu_);
        status = final_status_;
      }
      writer_.Finish(status, finished_tag_.get());
      break;
    }
    case Action::kNone:
      break;
  }
}

}  // namespace shardcache
