#include "common/client/watch_stream.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace shardcache {
namespace {

// The response header of a Watch that names the store (see the Store service's Watch).
constexpr char kStoreIdHeader[] = "shardcache-store-id";

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
// WatchBatch

void WatchBatch::Load(v1::WatchEvent message) {
  message_ = std::move(message);
  single_ = message_.events_size() == 0;
  next_ = 0;
}

bool WatchBatch::Take(v1::WatchEvent* event) {
  if (single_) {
    single_ = false;
    *event = std::move(message_);
    return true;
  }
  if (next_ >= message_.events_size()) return false;
  *event = std::move(*message_.mutable_events(next_++));
  if (!message_.store_id().empty()) event->set_store_id(message_.store_id());
  return true;
}

void WatchBatch::Clear() {
  message_.Clear();
  single_ = false;
  next_ = 0;
}

// ---------------------------------------------------------------------------------------------
// WatchStream

v1::WatchRequest WatchStream::WithBatches(v1::WatchRequest request, bool batch_events) {
  request.set_batch_events(batch_events);
  return request;
}

std::string WatchStream::What(const v1::WatchRequest& request, const std::string& description) {
  std::string what = absl::StrCat("watch ", description);
  if (!request.resource_version().empty()) {
    absl::StrAppend(&what, " from resourceVersion ", request.resource_version());
  }
  return what;
}

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
      status_ = absl::CancelledError(
          absl::StrCat(What(request_, options_.description), ": the client was shut down"));
      return false;
    }
    registered_ = true;
  }
  reader_ = stub_->Watch(&context_, request_);
  return true;
}

bool WatchStream::Next(v1::WatchEvent* event) {
  while (!batch_.Take(event)) {
    if (!Open()) return false;
    v1::WatchEvent message;
    if (!reader_->Read(&message)) {
      ended_ = true;
      return false;
    }
    const int64_t events = WatchBatch::EventsIn(message);
    own_counters_.Add(events);
    if (options_.counters != nullptr) options_.counters->Add(events);
    batch_.Load(std::move(message));
  }
  return true;
}

void WatchStream::Cancel() { context_.TryCancel(); }

absl::Status WatchStream::Finish() {
  if (finished_) return status_;
  finished_ = true;
  if (reader_ == nullptr) {
    ended_ = true;
    status_ = absl::CancelledError(
        absl::StrCat(What(request_, options_.description), ": ended before it started"));
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
  absl::Status s = FromGrpcStatus(reader_->Finish());
  // The same code and payloads (machine-readable details), with what was watched.
  status_ = WithMessage(s, absl::StrCat(What(request_, options_.description), ": ", s.message()));
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

}  // namespace shardcache
