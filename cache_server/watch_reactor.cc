#include "cache_server/watch_reactor.h"

#include <google/protobuf/io/coded_stream.h>

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

// The tag and length that make an encoded WatchEvent one element of WatchEvent.events (field 4).
grpc::Slice BatchElementHeader(size_t length) {
  uint8_t buf[1 + 5];
  buf[0] = (4 << 3) | 2;
  uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint32ToArray(
      static_cast<uint32_t>(length), buf + 1);
  return grpc::Slice(buf, static_cast<size_t>(end - buf));  // small: inlined, no allocation
}

}  // namespace

WatchReactor::WatchReactor(WatchCache* cache, StoreMetrics* metrics, size_t max_pending_events,
                           const std::string& store_id)
    : cache_(cache),
      metrics_(metrics),
      max_pending_events_(max_pending_events),
      max_queue_bytes_(cache->options().watcher_queue_bytes),
      stall_timeout_(cache->options().stall_timeout),
      store_id_suffix_(StoreIdSuffix(store_id)) {}

void WatchReactor::Begin() {
  Action a;
  {
    absl::MutexLock l(&mu_);
    a = NextLocked();
  }
  Act(a);
}

void WatchReactor::Reject(const grpc::Status& status) {
  Action a;
  {
    absl::MutexLock l(&mu_);
    RequestFinishLocked(status);
    a = NextLocked();
  }
  Act(a);
}

void WatchReactor::Init(WatchSpec spec,
                        std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial) {
  spec_ = std::move(spec);
  absl::MutexLock l(&mu_);
  for (auto& item : initial) initial_.push_back(std::move(item));
}

void WatchReactor::Deliver(const Delivery& delivery) {
  absl::MutexLock l(&mu_);
  if (finish_requested_) return;
  live_.push_back(delivery.encoded);
  live_bytes_ += delivery.encoded.size();
  UpdateBacklogLocked();
  if (over_bound_.load(std::memory_order_relaxed)) CheckStalledLocked(absl::Now());
}

void WatchReactor::Flush() {
  Action a;
  {
    absl::MutexLock l(&mu_);
    a = NextLocked();
  }
  Act(a);
}

void WatchReactor::Bookmark(int64_t revision) {
  Action a;
  {
    absl::MutexLock l(&mu_);
    // A bookmark only helps a watcher with nothing else to receive.
    if (finish_requested_ || !live_.empty() || !initial_.empty()) return;
    v1::Object bookmark;
    bookmark.mutable_metadata()->set_resource_version(absl::StrCat(revision));
    live_.push_back(EncodeWatchEvent(v1::WatchEvent::BOOKMARK, bookmark));
    live_bytes_ += live_.back().size();
    a = NextLocked();
  }
  Act(a);
}

void WatchReactor::Sweep(absl::Time now) {
  if (!over_bound_.load(std::memory_order_relaxed)) return;
  Action a;
  {
    absl::MutexLock l(&mu_);
    CheckStalledLocked(now);
    a = NextLocked();
  }
  Act(a);
}

void WatchReactor::End(const absl::Status& status) {
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

void WatchReactor::OnWriteDone(bool ok) {
  Action a;
  {
    absl::MutexLock l(&mu_);
    writing_ = false;
    writing_bytes_ = 0;
    UpdateBacklogLocked();
    if (!ok) {
      ClearLocked();
      RequestFinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke"));
    }
    a = NextLocked();
  }
  Act(a);
}

void WatchReactor::OnCancel() {
  Action a;
  {
    absl::MutexLock l(&mu_);
    ClearLocked();
    RequestFinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
    a = NextLocked();
  }
  Act(a);
}

void WatchReactor::OnDone() {
  cache_->Unregister(this);
  {
    absl::MutexLock l(&mu_);
    ClearLocked(/*done=*/true);
    metrics_->ObserveRequest(
        "Watch",
        absl::StatusCodeToString(static_cast<absl::StatusCode>(final_status_.error_code())), -1);
  }
  delete this;
}

void WatchReactor::RequestFinishLocked(const grpc::Status& status) {
  if (finish_requested_) return;
  finish_requested_ = true;
  final_status_ = status;
}

void WatchReactor::ClearLocked(bool done) {
  live_.clear();
  initial_.clear();
  live_bytes_ = 0;
  if (done) writing_bytes_ = 0;
  UpdateBacklogLocked();
}

void WatchReactor::UpdateBacklogLocked() {
  size_t held = live_bytes_ + writing_bytes_;
  if (held != backlog_) {
    cache_->AddBacklog(static_cast<int64_t>(held) - static_cast<int64_t>(backlog_));
    backlog_ = held;
  }
  over_bound_.store(live_bytes_ > max_queue_bytes_ ||
                        (max_pending_events_ > 0 && live_.size() > max_pending_events_),
                    std::memory_order_relaxed);
}

void WatchReactor::CheckStalledLocked(absl::Time now) {
  if (finish_requested_ || !over_bound_.load(std::memory_order_relaxed)) return;
  if (!writing_ || now - write_started_ < stall_timeout_) return;
  size_t bytes = live_bytes_, events = live_.size();
  // Its message in flight stays with gRPC until the client reads or goes away, but no longer
  // holds the writers back.
  ClearLocked(/*done=*/true);
  metrics_->watchers_too_slow.Increment();
  RequestFinishLocked(
      grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                   absl::StrCat("watcher too slow: its client has read nothing for ",
                                absl::FormatDuration(now - write_started_), " while ", events,
                                " events (", bytes,
                                " bytes) were waiting to be sent; watch again from the last "
                                "resourceVersion received, or list again")));
}

WatchReactor::Action WatchReactor::NextLocked() {
  if (writing_ || finished_) return Action::kNone;
  if (initial_.empty() && live_.empty()) {
    if (!finish_requested_) return Action::kNone;
    finished_ = true;
    return Action::kFinish;
  }
  // The events of this message: the initial ones first (encoded now), then live ones.
  std::vector<grpc::Slice> events;
  size_t bytes = 0;
  while (!initial_.empty() || !live_.empty()) {
    if (!events.empty() && (!batch_ || bytes >= kMaxBatchBytes)) break;
    if (!initial_.empty()) {
      auto& [type, object] = initial_.front();
      if (!events.empty() && bytes + object->ByteSizeLong() > kMaxBatchBytes) break;
      events.push_back(EncodeWatchEvent(type, *object));
      initial_.pop_front();
    } else {
      if (!events.empty() && bytes + live_.front().size() > kMaxBatchBytes) break;
      events.push_back(std::move(live_.front()));
      live_.pop_front();
      live_bytes_ -= events.back().size();
    }
    bytes += events.back().size();
  }
  writing_bytes_ = bytes;
  UpdateBacklogLocked();

  std::vector<grpc::Slice> slices;
  if (events.size() == 1) {
    slices.push_back(std::move(events.front()));
  } else {
    slices.reserve(2 * events.size() + 1);
    for (grpc::Slice& e : events) {
      slices.push_back(BatchElementHeader(e.size()));
      slices.push_back(std::move(e));
    }
  }
  if (store_id_suffix_.size() > 0) slices.push_back(store_id_suffix_);
  out_ = grpc::ByteBuffer(slices.data(), slices.size());
  writing_ = true;
  write_started_ = absl::Now();
  return Action::kWrite;
}

void WatchReactor::Act(Action action) {
  switch (action) {
    case Action::kWrite:
      StartWrite(&out_);
      break;
    case Action::kFinish: {
      grpc::Status status;
      {
        absl::MutexLock l(&mu_);
        status = final_status_;
      }
      Finish(status);
      break;
    }
    case Action::kNone:
      break;
  }
}

}  // namespace shardcache
