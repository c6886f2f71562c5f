#include "cache_server/watch_reactor.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace shardcache {

namespace {

std::string StoreIdSuffix(const std::string& store_id) {
  if (store_id.empty()) return "";
  v1::WatchEvent only_id;
  only_id.set_store_id(store_id);
  return only_id.SerializeAsString();
}

}  // namespace

WatchReactor::WatchReactor(WatchCache* cache, StoreMetrics* metrics, size_t max_pending,
                           const std::string& store_id)
    : cache_(cache),
      metrics_(metrics),
      max_pending_(max_pending),
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
                        std::vector<std::pair<v1::WatchEvent::Type, ObjectPtr>> initial) {
  spec_ = std::move(spec);
  absl::MutexLock l(&mu_);
  for (auto& [type, object] : initial) initial_.push_back(Item{type, std::move(object), {}});
}

void WatchReactor::Deliver(const Delivery& delivery) {
  Action a;
  {
    absl::MutexLock l(&mu_);
    if (finish_requested_) return;
    if (live_.size() >= max_pending_) {
      live_.clear();
      initial_.clear();
      metrics_->watchers_too_slow.Increment();
      RequestFinishLocked(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("watcher too slow: ", max_pending_,
                                    " events were waiting to be sent; watch again from the last "
                                    "resourceVersion received, or list again")));
    } else {
      live_.push_back(Item{delivery.type, delivery.object, delivery.encoded});
    }
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
    auto bookmark = std::make_shared<v1::Object>();
    bookmark->mutable_metadata()->set_resource_version(absl::StrCat(revision));
    live_.push_back(Item{v1::WatchEvent::BOOKMARK, std::move(bookmark), {}});
    a = NextLocked();
  }
  Act(a);
}

void WatchReactor::End(const absl::Status& status) {
  Action a;
  {
    absl::MutexLock l(&mu_);
    if (status.code() == absl::StatusCode::kUnavailable) {
      live_.clear();  // shutting down: do not hold the server up for a slow reader
      initial_.clear();
    }
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
    if (!ok) {
      live_.clear();
      initial_.clear();
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
    live_.clear();
    initial_.clear();
    RequestFinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
    a = NextLocked();
  }
  Act(a);
}

void WatchReactor::OnDone() {
  cache_->Unregister(this);
  {
    absl::MutexLock l(&mu_);
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

WatchReactor::Action WatchReactor::NextLocked() {
  if (writing_ || finished_) return Action::kNone;
  std::deque<Item>* q = !initial_.empty() ? &initial_ : (!live_.empty() ? &live_ : nullptr);
  if (q == nullptr) {
    if (!finish_requested_) return Action::kNone;
    finished_ = true;
    return Action::kFinish;
  }
  Item& next = q->front();
  out_ = next.encoded.has_value() ? *next.encoded : EncodeWatchEvent(next.type, *next.object);
  if (!store_id_suffix_.empty()) {
    std::vector<grpc::Slice> slices;
    (void)out_.Dump(&slices);
    slices.emplace_back(store_id_suffix_);
    out_ = grpc::ByteBuffer(slices.data(), slices.size());
  }
  q->pop_front();
  writing_ = true;
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
