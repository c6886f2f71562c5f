#include "common/client/write_stream.h"

#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"

namespace shardcache {

// The client side of one Write call (gRPC's callback API). Writes are queued under mu_ and sent
// one at a time (gRPC allows one write in flight); one read is always outstanding until the
// server ends the stream, and each answer is delivered before the next read starts, so answers
// reach their callbacks in order and one at a time.
//
// Sends start writes from outside gRPC's reactions, so the reactor holds the call open
// (AddHold) until it will start no more operations from outside: after WritesDone, or once the
// stream has failed. OnDone is the last reaction; the owner waits for it before destroying us.
class WriteStream::Reactor final
    : public grpc::ClientBidiReactor<v1::WriteRequest, v1::WriteResponse> {
 public:
  Reactor(std::shared_ptr<v1::Store::StubInterface> stub, Options options)
      : stub_(std::move(stub)), options_(options) {}

  void Start() {
    if (options_.stream_timeout != absl::InfiniteDuration()) {
      context_.set_deadline(absl::ToChronoTime(absl::Now() + options_.stream_timeout));
    }
    stub_->async()->Write(&context_, this);
    AddHold();
    StartRead(&response_);
    StartCall();
  }

  absl::Status Enqueue(v1::WriteRequest request, AnswerCallback on_answer, bool wait,
                       absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (wait) mu_.AwaitWithDeadline(absl::Condition(this, &Reactor::CanAcceptLocked), deadline);
    if (!broken_.ok()) return broken_;
    if (closing_) return absl::FailedPreconditionError("WriteStream: Send after Close");
    if (inflight_.size() >= static_cast<size_t>(options_.window)) {
      std::string why =
          absl::StrCat("WriteStream: ", inflight_.size(), " writes outstanding fill the window");
      return wait ? absl::DeadlineExceededError(why) : absl::ResourceExhaustedError(why);
    }
    int64_t id = next_id_++;
    request.set_id(id);
    inflight_.push_back(Pending{id, std::move(on_answer)});
    unsent_.push_back(std::move(request));
    MaybeWriteLocked();
    return absl::OkStatus();
  }

  // Half-closes (once) and waits for OnDone.
  absl::Status Close(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock l(&mu_);
      if (close_result_.has_value()) return *close_result_;
      closing_ = true;
      MaybeWriteLocked();
    }
    absl::Status result;
    if (done_.WaitForNotificationWithTimeout(timeout)) {
      absl::MutexLock l(&mu_);
      result = broken_;
    } else {
      int unanswered = outstanding();
      Cancel();
      done_.WaitForNotification();  // prompt: the cancelled read ends the call
      result = absl::DeadlineExceededError(
          absl::StrCat("WriteStream: Close timed out after ", absl::FormatDuration(timeout),
                       " with ", unanswered, " writes unanswered; the stream was cancelled"));
    }
    absl::MutexLock l(&mu_);
    if (!close_result_.has_value()) close_result_ = result;
    return *close_result_;
  }

  void Cancel() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock l(&mu_);
      cancelled_by_us_ = true;
    }
    context_.TryCancel();
  }

  absl::Duration send_timeout() const { return options_.send_timeout; }
  void WaitDone() { done_.WaitForNotification(); }
  bool Done() const { return done_.HasBeenNotified(); }

  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return broken_;
  }
  int outstanding() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return static_cast<int>(inflight_.size());
  }

  // Reactions (gRPC's threads).

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!ok) {
      // The call is dead; OnDone will tell why. Stop sending; the queued writes are answered
      // in OnDone.
      if (broken_.ok()) {
        broken_ = absl::UnavailableError("WriteStream: the stream broke (a write was not sent)");
      }
      ReleaseHoldLocked();
      return;
    }
    MaybeWriteLocked();
  }

  void OnReadDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    AnswerCallback callback;
    {
      absl::MutexLock l(&mu_);
      if (!ok) {
        // The server has ended the stream (or the call failed). OnDone follows.
        if (!closing_ && broken_.ok()) {
          broken_ = cancelled_by_us_
                        ? absl::CancelledError("WriteStream: cancelled")
                        : absl::UnavailableError("WriteStream: the server ended the stream");
        }
        ReleaseHoldLocked();
        return;
      }
      if (inflight_.empty() || inflight_.front().id != response_.id()) {
        protocol_error_ = absl::InternalError(absl::StrCat(
            "WriteStream: the server answered write ", response_.id(), " but ",
            inflight_.empty() ? std::string("no write was outstanding")
                              : absl::StrCat("write ", inflight_.front().id, " was next")));
        broken_ = protocol_error_;
        ReleaseHoldLocked();
        context_.TryCancel();
        return;  // no further read: OnDone follows
      }
      callback = std::move(inflight_.front().callback);
      inflight_.pop_front();
    }
    if (callback) callback(response_);
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& grpc_status) override ABSL_LOCKS_EXCLUDED(mu_) {
    std::deque<Pending> unanswered;
    absl::Status why;
    {
      absl::MutexLock l(&mu_);
      absl::Status final_status = FromGrpcStatus(grpc_status);
      if (!protocol_error_.ok()) {
        why = protocol_error_;
      } else if (final_status.ok()) {
        if (!inflight_.empty()) {
          why = absl::InternalError(
              "WriteStream: the server ended the stream without answering "
              "every write");
        } else if (!closing_) {
          why = absl::UnavailableError("WriteStream: the server ended the stream");
        }
      } else if (absl::IsCancelled(final_status) && !cancelled_by_us_) {
        // The server (e.g. shutting down) cancelled the call: retry on a new stream.
        why = absl::UnavailableError(
            absl::StrCat("WriteStream: the server cancelled the stream: ", final_status.message()));
      } else {
        why = absl::Status(final_status.code(),
                           absl::StrCat("WriteStream: the stream broke: ", final_status.message()));
      }
      broken_ = why;
      done_flag_ = true;
      unanswered.swap(inflight_);
      unsent_.clear();
    }
    for (Pending& p : unanswered) {
      if (!p.callback) continue;
      v1::WriteResponse answer;
      answer.set_id(p.id);
      answer.set_code(static_cast<int>(why.code()));
      answer.set_message(absl::StrCat("write ", p.id,
                                      " was not answered before the write stream ended, and may "
                                      "or may not have been applied: ",
                                      why.message()));
      p.callback(answer);
    }
    done_.Notify();  // last: the owner may destroy us as soon as it sees this
  }

 private:
  struct Pending {
    int64_t id;
    AnswerCallback callback;
  };

  bool CanAcceptLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !broken_.ok() || closing_ || done_flag_ ||
           inflight_.size() < static_cast<size_t>(options_.window);
  }

  // Starts the next write, or WritesDone once closing and every write is out.
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || hold_released_) return;
    if (!unsent_.empty()) {
      current_ = std::move(unsent_.front());
      unsent_.pop_front();
      grpc::WriteOptions write_options;
      if (!unsent_.empty()) write_options.set_buffer_hint();  // more follow at once
      writing_ = true;
      StartWrite(&current_, write_options);
      return;
    }
    if (closing_) {
      StartWritesDone();
      ReleaseHoldLocked();
    }
  }

  // After this no operation is started from outside a reaction, so gRPC may end the call.
  void ReleaseHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (hold_released_) return;
    hold_released_ = true;
    RemoveHold();  // never runs OnDone inline (gRPC schedules it)
  }

  // Constant after construction.
  const std::shared_ptr<v1::Store::StubInterface> stub_;  // keeps the channel alive
  const Options options_;

  // Provide their own synchronization.
  grpc::ClientContext context_;
  absl::Notification done_;  // OnDone has delivered every answer

  // Touched only by the reactions, which gRPC runs one read at a time.
  v1::WriteResponse response_;

  mutable absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Writes accepted and not yet answered, in order; the first unanswered is at the front.
  std::deque<Pending> inflight_ ABSL_GUARDED_BY(mu_);
  // Writes accepted and not yet handed to gRPC (a suffix of inflight_).
  std::deque<v1::WriteRequest> unsent_ ABSL_GUARDED_BY(mu_);
  v1::WriteRequest current_ ABSL_GUARDED_BY(mu_);  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_by_us_ ABSL_GUARDED_BY(mu_) = false;
  bool done_flag_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  absl::Status protocol_error_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  std::optional<absl::Status> close_result_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<WriteStream>> WriteStream::Open(
    std::shared_ptr<v1::Store::StubInterface> stub, Options options) {
  if (stub == nullptr) return absl::InvalidArgumentError("WriteStream: stub is null");
  if (stub->async() == nullptr) {
    return absl::InvalidArgumentError("WriteStream: the stub does not offer the callback API");
  }
  if (options.window < 1) return absl::InvalidArgumentError("WriteStream: window must be >= 1");
  if (options.send_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("WriteStream: send_timeout must not be negative");
  }
  if (options.stream_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("WriteStream: stream_timeout must be positive");
  }
  auto reactor = std::make_unique<Reactor>(std::move(stub), options);
  reactor->Start();
  return std::unique_ptr<WriteStream>(new WriteStream(std::move(reactor)));
}

WriteStream::WriteStream(std::unique_ptr<Reactor> reactor) : reactor_(std::move(reactor)) {}

WriteStream::~WriteStream() {
  if (!reactor_->Done()) reactor_->Cancel();
  reactor_->WaitDone();
}

absl::Status WriteStream::Send(v1::WriteRequest request, AnswerCallback on_answer) {
  return Send(std::move(request), std::move(on_answer), absl::Now() + reactor_->send_timeout());
}

absl::Status WriteStream::Send(v1::WriteRequest request, AnswerCallback on_answer,
                               absl::Time deadline) {
  return reactor_->Enqueue(std::move(request), std::move(on_answer), /*wait=*/true, deadline);
}

absl::Status WriteStream::TrySend(v1::WriteRequest request, AnswerCallback on_answer) {
  return reactor_->Enqueue(std::move(request), std::move(on_answer), /*wait=*/false,
                           absl::InfinitePast());
}

absl::Status WriteStream::Close(absl::Duration timeout) { return reactor_->Close(timeout); }

void WriteStream::Cancel() { reactor_->Cancel(); }

bool WriteStream::Broken() const { return !reactor_->status().ok(); }

absl::Status WriteStream::status() const { return reactor_->status(); }

int WriteStream::outstanding() const { return reactor_->outstanding(); }

}  // namespace shardcache
