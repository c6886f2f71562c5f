#include "common/client/watch_stream.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace shardcache {
namespace {

// The response header of a Watch that names the store (see the Store service's Watch).
constexpr char kStoreIdHeader[] = "shardcache-store-id";

v1::WatchRequest WithBatches(v1::WatchRequest request, bool batch_events) {
  request.set_batch_events(batch_events);
  return request;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CallSet

bool CallSet::Register(grpc::ClientContext* context) {
  absl::MutexLock l(&mu_);
  if (shut_down_) return false;
  active_.insert(context);
  return true;
}

void CallSet::Unregister(grpc::ClientContext* context) {
  absl::MutexLock l(&mu_);
  active_.erase(context);
}

void CallSet::Shutdown() {
  absl::MutexLock l(&mu_);
  shut_down_ = true;
  for (grpc::ClientContext* context : active_) context->TryCancel();  // thread-safe, never blocks
}

// ---------------------------------------------------------------------------------------------
// WatchStreamCounters

void WatchStreamCounters::Add(int64_t events) {
  messages_.fetch_add(1, std::memory_order_relaxed);
  events_.fetch_add(events, std::memory_order_relaxed);
  if (events > 1) batched_messages_.fetch_add(1, std::memory_order_relaxed);
}

WatchStreamStats WatchStreamCounters::Get() const {
  WatchStreamStats s;
  s.messages = messages_.load(std::memory_order_relaxed);
  s.events = events_.load(std::memory_order_relaxed);
  s.batched_messages = batched_messages_.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------------------------------------
// WatchStream

WatchStream::WatchStream(std::shared_ptr<v1::Store::StubInterface> stub, v1::WatchRequest request,
                         Options options)
    : stub_(std::move(stub)),
      request_(WithBatches(std::move(request), options.batch_events)),
      options_(std::move(options)) {
  if (options_.deadline != absl::InfiniteFuture()) {
    context_.set_deadline(absl::ToChronoTime(options_.deadline));
  }
}

WatchStream::~WatchStream() {
  Finish().IgnoreError();  // cancels the call if it is still open
  if (registered_) options_.calls->Unregister(&context_);
}

bool WatchStream::Open() {
  if (ended_) return false;
  if (reader_ != nullptr) return true;
  if (options_.calls != nullptr) {
    if (!options_.calls->Register(&context_)) {
      ended_ = finished_ = true;
      status_ = absl::CancelledError(absl::StrCat(What(), ": the client was shut down"));
      return false;
    }
    registered_ = true;
  }
  reader_ = stub_->Watch(&context_, request_);
  return true;
}

bool WatchStream::Next(v1::WatchEvent* event) {
  if (batch_next_ >= batch_.events_size()) {
    if (!Open()) return false;
    if (!reader_->Read(event)) {
      ended_ = true;
      return false;
    }
    const int events = event->events_size();
    own_counters_.Add(events == 0 ? 1 : events);
    if (options_.counters != nullptr) options_.counters->Add(events == 0 ? 1 : events);
    if (events == 0) return true;  // a single event, as itself
    batch_.Swap(event);
    batch_next_ = 0;
  }
  *event = std::move(*batch_.mutable_events(batch_next_++));
  if (!batch_.store_id().empty()) event->set_store_id(batch_.store_id());
  return true;
}

void WatchStream::Cancel() { context_.TryCancel(); }

absl::Status WatchStream::Finish() {
  if (finished_) return status_;
  finished_ = true;
  if (reader_ == nullptr) {
    ended_ = true;
    status_ = absl::CancelledError(absl::StrCat(What(), ": ended before it started"));
    return status_;
  }
  if (!ended_) {
    // gRPC's Finish waits for the server to end the stream: end it ourselves, then drain what
    // was already received (Read returns false soon after the cancellation).
    context_.TryCancel();
    v1::WatchEvent discard;
    while (reader_->Read(&discard)) {
    }
    ended_ = true;
  }
  batch_.Clear();
  batch_next_ = 0;
  absl::Status s = FromGrpcStatus(reader_->Finish());
  // The same code and payloads (machine-readable details), with what was watched.
  status_ = WithMessage(s, absl::StrCat(What(), ": ", s.message()));
  return status_;
}

std::string WatchStream::StoreId() {
  if (headers_read_ || !Open()) return store_id_;
  headers_read_ = true;
  reader_->WaitForInitialMetadata();
  const std::multimap<grpc::string_ref, grpc::string_ref>& headers =
      context_.GetServerInitialMetadata();
  auto it = headers.find(kStoreIdHeader);
  if (it != headers.end()) store_id_ = std::string(it->second.data(), it->second.size());
  return store_id_;
}

std::string WatchStream::What() const {
  std::string what = absl::StrCat("watch ", options_.description);
  if (!request_.resource_version().empty()) {
    absl::StrAppend(&what, " from resourceVersion ", request_.resource_version());
  }
  return what;
}

}  // namespace shardcache
