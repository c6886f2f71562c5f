#include "common/client/async_watch_stream.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"

namespace shardcache {
namespace {

// The response header of a Watch that names the store (see the Store service's Watch).
constexpr char kStoreIdHeader[] = "shardcache-store-id";

}  // namespace

// The reactor of one Watch call. gRPC calls its reactions on its own threads; the reader takes
// what they stored. One read is in flight at a time, and only while no message waits to be
// taken. The reader starts reads from outside the reactions, so a hold keeps gRPC from ending the
// call (OnDone) until the reader is done reading: it is released when a read fails (the stream
// is over) or when the reader closes the stream.
class AsyncWatchStream::Call final : public grpc::ClientReadReactor<v1::WatchEvent> {
 public:
  Call(std::shared_ptr<v1::Store::StubInterface> stub, v1::WatchRequest request,
       absl::Time deadline)
      : stub_(std::move(stub)), request_(std::move(request)) {
    if (deadline != absl::InfiniteFuture()) context.set_deadline(absl::ToChronoTime(deadline));
  }

  // Starts the call; `self` keeps this object alive until OnDone has returned.
  void Begin(std::shared_ptr<Call> self, std::function<void()> ready) ABSL_LOCKS_EXCLUDED(mu_) {
    self_ = std::move(self);
    ready_ = std::move(ready);
    stub_->async()->Watch(&context, &request_, this);
    AddHold();
    {
      absl::MutexLock l(&mu_);
      reading_ = true;
    }
    StartRead(&incoming_);
    StartCall();
  }

  // The store's identity, once the headers arrived or the call ended.
  std::optional<std::string> StoreId() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (!headers_ && !ended_) return std::nullopt;
    return store_id_;
  }

  // Moves the message that arrived into *message and asks for the next one. False when none is
  // there (or the headers are not yet known: events never come before them).
  bool TakeMessage(v1::WatchEvent* message) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock l(&mu_);
      if (!has_message_ || !(headers_ || ended_)) return false;
      *message = std::move(incoming_);
      incoming_.Clear();
      has_message_ = false;
      if (closing_) return true;
      // The last read succeeded, so the hold is still held: another read may start.
      reading_ = true;
    }
    StartRead(&incoming_);  // outside mu_: gRPC may run a reaction on this thread
    return true;
  }

  // True once the call is over (OnDone), with its status.
  bool Ended(grpc::Status* status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (!ended_) return false;
    *status = status_;
    return true;
  }

  // The reader is done: ends the call and waits until OnDone has returned.
  // REQUIRES: Begin was called.
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    bool release = false;
    {
      absl::MutexLock l(&mu_);
      closing_ = true;
      if (!reading_ && hold_) {
        hold_ = false;
        release = true;
      }
    }
    context.TryCancel();
    if (release) RemoveHold();
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

  // Reactions, on gRPC's threads.
  void OnReadInitialMetadataDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    std::string store_id;
    if (ok) {
      const std::multimap<grpc::string_ref, grpc::string_ref>& headers =
          context.GetServerInitialMetadata();
      auto it = headers.find(kStoreIdHeader);
      if (it != headers.end()) store_id.assign(it->second.data(), it->second.size());
    }
    {
      absl::MutexLock l(&mu_);
      headers_ = true;
      store_id_ = std::move(store_id);
    }
    ready_();
  }

  void OnReadDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    bool release = false;
    {
      absl::MutexLock l(&mu_);
      reading_ = false;
      if (ok) has_message_ = true;
      // A failed read ends the stream; after Close nobody reads again.
      if ((!ok || closing_) && hold_) {
        hold_ = false;
        release = true;
      }
    }
    if (release) RemoveHold();  // OnDone follows, on another callback
    ready_();
  }

  // The last reaction: every other one has returned.
  void OnDone(const grpc::Status& status) override ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<Call> self = std::move(self_);  // this lives until the end of OnDone
    {
      absl::MutexLock l(&mu_);
      ended_ = true;
      status_ = status;
    }
    ready_();
    absl::MutexLock l(&mu_);
    done_ = true;
  }

  // Provides its own synchronization (TryCancel is thread-safe). Registered in the owner's
  // CallSet by the AsyncWatchStream.
  grpc::ClientContext context;

 private:
  // Constant after construction (ready_ and self_: set by Begin, before the call starts).
  const std::shared_ptr<v1::Store::StubInterface> stub_;  // keeps the channel alive
  const v1::WatchRequest request_;
  std::function<void()> ready_;
  std::shared_ptr<Call> self_;  // released by OnDone

  // Written by gRPC while a read is in flight; otherwise under mu_.
  v1::WatchEvent incoming_;

  absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;      // a read is in flight
  bool has_message_ ABSL_GUARDED_BY(mu_) = false;  // incoming_ holds a message not yet taken
  bool hold_ ABSL_GUARDED_BY(mu_) = true;          // the hold taken by Begin is held
  bool closing_ ABSL_GUARDED_BY(mu_) = false;      // Close was called: no more reads
  bool headers_ ABSL_GUARDED_BY(mu_) = false;
  std::string store_id_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // OnDone has begun: status_ is final
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // OnDone has called ready_ for the last time
};

AsyncWatchStream::AsyncWatchStream(std::shared_ptr<v1::Store::StubInterface> stub,
                                   v1::WatchRequest request, WatchStream::Options options)
    : options_(std::move(options)),
      what_(WatchStream::What(request, options_.description)),
      call_(std::make_shared<Call>(
          std::move(stub), WatchStream::WithBatches(std::move(request), options_.batch_events),
          options_.deadline)) {}

AsyncWatchStream::~AsyncWatchStream() {
  if (began_) call_->Close();  // cancels it if open; waits for OnDone
  if (registered_) options_.calls->Unregister(&call_->context);
}

void AsyncWatchStream::Start(std::function<void()> ready) {
  if (started_) return;
  started_ = true;
  if (options_.calls != nullptr) {
    if (!options_.calls->Register(&call_->context)) {
      finished_ = true;
      status_ = absl::CancelledError(absl::StrCat(what_, ": the client was shut down"));
      return;
    }
    registered_ = true;
  }
  began_ = true;
  call_->Begin(call_, std::move(ready));
}

std::optional<std::string> AsyncWatchStream::StoreId() {
  if (!began_) return std::string();
  return call_->StoreId();
}

AsyncWatchEventStream::Poll AsyncWatchStream::Next(v1::WatchEvent* event) {
  if (!began_) return Poll::kEnded;
  while (!batch_.Take(event)) {
    v1::WatchEvent message;
    if (!call_->TakeMessage(&message)) {
      // Nothing waits. Once ended, nothing will: a message arrives only while a read is in
      // flight, which holds the call open.
      grpc::Status unused;
      return call_->Ended(&unused) ? Poll::kEnded : Poll::kPending;
    }
    const int64_t events = WatchBatch::EventsIn(message);
    own_counters_.Add(events);
    if (options_.counters != nullptr) options_.counters->Add(events);
    batch_.Load(std::move(message));
  }
  return Poll::kEvent;
}

void AsyncWatchStream::Cancel() { call_->context.TryCancel(); }

absl::Status AsyncWatchStream::Finish() {
  if (finished_) return status_;
  grpc::Status status;
  if (!call_->Ended(&status)) {
    // Misuse (Next has not returned kEnded): say so rather than wait.
    return absl::FailedPreconditionError(absl::StrCat(what_, ": Finish before the stream ended"));
  }
  finished_ = true;
  batch_.Clear();
  absl::Status s = FromGrpcStatus(status);
  // The same code and payloads (machine-readable details), with what was watched.
  status_ = WithMessage(s, absl::StrCat(what_, ": ", s.message()));
  return status_;
}

}  // namespace shardcache
