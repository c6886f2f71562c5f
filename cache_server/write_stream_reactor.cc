#include "cache_server/write_stream_reactor.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "cache_server/request_parser.h"

namespace shardcache {
namespace {

v1::WriteResponse Refusal(int64_t id, grpc::StatusCode code, const std::string& message) {
  v1::WriteResponse answer;
  answer.set_id(id);
  answer.set_code(static_cast<int>(code));
  answer.set_message(message);
  return answer;
}

}  // namespace

WriteStreamReactor::WriteStreamReactor(Owner* owner, StoreMetrics* metrics,
                                       std::optional<PeerIdentity> who)
    : owner_(owner), metrics_(metrics), who_(std::move(who)) {
  bool added = owner_->AddStream(this);
  Next next;
  {
    absl::MutexLock l(&mu_);
    if (!added) {
      draining_ = true;
      end_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down");
    }
    next = NextLocked();
  }
  Act(std::move(next));
}

void WriteStreamReactor::Drain() {
  Next next;
  {
    absl::MutexLock l(&mu_);
    draining_ = true;
    if (!end_status_.has_value()) {
      end_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down");
    }
    next = NextLocked();
  }
  Act(std::move(next));
}

void WriteStreamReactor::OnReadDone(bool ok) {
  if (!ok) {  // the client has sent its last write (or the stream is over)
    Next next;
    {
      absl::MutexLock l(&mu_);
      reading_ = false;
      reads_done_ = true;
      next = NextLocked();
    }
    Act(std::move(next));
    return;
  }
  // in_ is ours until the next read starts, which NextLocked does not allow before the end of
  // this reaction (applying_).
  v1::WriteRequest req;
  absl::Status parsed = ParseRequest(in_, &req);
  std::optional<int64_t> id = parsed.ok() ? std::optional<int64_t>(req.id()) : WriteRequestId(in_);
  Slot* slot = nullptr;
  std::optional<v1::WriteResponse> refused;
  bool unparsable = false;
  {
    absl::MutexLock l(&mu_);
    reading_ = false;
    if (finished_) return;  // read after the stream was ended: nothing more is answered
    unparsable = !parsed.ok() && !draining_;
    if (draining_) {
      slots_.emplace_back();
      slot = &slots_.back();  // deque: stays valid while later slots are added
      refused = Refusal(id.value_or(0), grpc::StatusCode::UNAVAILABLE,
                        "server shutting down: the write was not applied");
    } else if (!parsed.ok() && id.has_value()) {
      slots_.emplace_back();
      slot = &slots_.back();
      refused = Refusal(*id, grpc::StatusCode::INVALID_ARGUMENT, std::string(parsed.message()));
    } else if (!parsed.ok()) {
      // Without its id the write cannot be answered: answer those before it, then end.
      end_status_ = grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat(parsed.message(),
                       " (the write's id cannot be read, so the stream ends after the answers "
                       "to the writes before it)"));
    } else {
      slots_.emplace_back();
      slot = &slots_.back();
      ++in_store_;
    }
    applying_ = true;
  }
  if (unparsable) metrics_->ObserveRequest("Write", "INVALID_ARGUMENT", -1);
  if (refused.has_value()) {
    Answer(slot, *refused, /*from_store=*/false);
  } else if (slot != nullptr) {
    owner_->Apply(&req, who_, [this, slot](v1::WriteResponse answer) {
      Answer(slot, answer, /*from_store=*/true);
    });
  }
  Next next;
  {
    absl::MutexLock l(&mu_);
    applying_ = false;
    next = NextLocked();
  }
  Act(std::move(next));
}

void WriteStreamReactor::Answer(Slot* slot, const v1::WriteResponse& answer, bool from_store) {
  grpc::ByteBuffer bytes;
  bool own = false;
  (void)grpc::SerializationTraits<v1::WriteResponse>::Serialize(answer, &bytes, &own);
  Next next;
  {
    absl::MutexLock l(&mu_);
    slot->answer = std::move(bytes);
    slot->ready = true;
    // In the same critical section: once in_store_ drops, the stream may finish and be deleted.
    if (from_store) --in_store_;
    next = NextLocked();
  }
  Act(std::move(next));
}

void WriteStreamReactor::OnWriteDone(bool ok) {
  Next next;
  {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;
    next = NextLocked();
  }
  Act(std::move(next));
}

void WriteStreamReactor::OnCancel() {
  Next next;
  {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    next = NextLocked();
  }
  Act(std::move(next));
}

void WriteStreamReactor::OnDone() {
  owner_->RemoveStream(this);
  delete this;
}

WriteStreamReactor::Next WriteStreamReactor::NextLocked() {
  Next next;
  if (finished_) return next;
  if (!writing_ && !cancelled_ && !slots_.empty() && slots_.front().ready) {
    out_ = std::move(slots_.front().answer);
    slots_.pop_front();
    writing_ = true;
    next.write = true;
  }
  if (!reading_ && !applying_ && !reads_done_ && !cancelled_ && !end_status_.has_value()) {
    // Reading pauses at kMaxOutstandingWrites and resumes below half of it.
    size_t limit = read_paused_ ? kMaxOutstandingWrites / 2 : kMaxOutstandingWrites;
    if (slots_.size() < limit) {
      read_paused_ = false;
      reading_ = true;
      read_starting_ = true;
      next.read = true;
    } else {
      read_paused_ = true;
    }
  }
  // Finish only once nothing is being started and no store callback is outstanding.
  if (writing_ || read_starting_ || in_store_ > 0) return next;
  if (cancelled_) {
    finished_ = true;
    next.finish = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled");
  } else if (slots_.empty() && end_status_.has_value()) {
    finished_ = true;
    next.finish = *end_status_;
  } else if (slots_.empty() && reads_done_) {
    finished_ = true;
    next.finish = grpc::Status::OK;
  }
  return next;
}

void WriteStreamReactor::Act(Next next) {
  while (true) {
    if (next.write) StartWrite(&out_);
    // After Finish the reactor may be deleted at any moment: touch nothing.
    if (next.finish.has_value()) {
      Finish(*next.finish);
      return;
    }
    if (!next.read) return;
    StartRead(&in_);
    absl::MutexLock l(&mu_);
    read_starting_ = false;
    next = NextLocked();  // e.g. a Finish that waited for the read to be started
  }
}

}  // namespace shardcache
