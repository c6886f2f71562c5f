#include "shard_replicator/cache_writer.h"

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardcache {
namespace {

// The fence of whichever operation `request` carries.
v1::Fence* MutableFence(v1::WriteRequest* request) {
  switch (request->operation_case()) {
    case v1::WriteRequest::kCreate:
      return request->mutable_create()->mutable_fence();
    case v1::WriteRequest::kUpdate:
      return request->mutable_update()->mutable_fence();
    case v1::WriteRequest::kUpdateStatus:
      return request->mutable_update_status()->mutable_fence();
    case v1::WriteRequest::kDelete:
      return request->mutable_delete_()->mutable_fence();
    case v1::WriteRequest::kUpsert:
      return request->mutable_upsert()->mutable_fence();
    case v1::WriteRequest::OPERATION_NOT_SET:
      break;
  }
  return nullptr;
}

}  // namespace

CacheWriter::CacheWriter(std::shared_ptr<grpc::Channel> channel,
                         std::shared_ptr<v1::Store::StubInterface> stub, Options options)
    : channel_(std::move(channel)), stub_(std::move(stub)), options_(std::move(options)) {}

CacheWriter::~CacheWriter() { Stop(); }

absl::Status CacheWriter::Write(v1::WriteRequest request, Done done) {
  v1::Fence* fence = MutableFence(&request);
  if (fence == nullptr) return absl::InvalidArgumentError("a write names no operation");
  fence->set_shard(options_.shard);
  fence->set_epoch(options_.epoch);
  auto on_answer = [this, done = std::move(done)](const v1::WriteResponse& answer) {
    Answered(done, answer);
  };
  absl::MutexLock l(&mu_);
  int broken = 0;
  while (true) {
    if (stopped_) return absl::CancelledError("the leadership term ended");
    absl::Status ready = EnsureStreamLocked();
    if (!ready.ok()) return ready;
    absl::Status sent = stream_->TrySend(request, on_answer);
    if (sent.ok()) return sent;
    if (!absl::IsResourceExhausted(sent)) {
      // The stream broke between the check and the send: open another, a few times at most.
      if (++broken >= 3) return sent;
      continue;
    }
    // The window is full: wait for answers (or Stop).
    mu_.AwaitWithTimeout(absl::Condition(&stopped_), absl::Milliseconds(2));
  }
}

absl::Status CacheWriter::EnsureStreamLocked() {
  if (stream_ != nullptr && !stream_->Broken()) return absl::OkStatus();
  if (stream_ != nullptr) {
    spdlog::warn("cache write stream broke: {}; opening another", stream_->status().ToString());
    stream_.reset();  // its writes were all answered with the stream's error
  }
  // A stream opened on a channel that is not connected breaks at once: wait for the channel,
  // without holding the lock (Stop must not wait for a connection attempt).
  absl::Time deadline = absl::Now() + options_.connect_timeout;
  grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY && absl::Now() < deadline) {
    mu_.Unlock();
    channel_->WaitForStateChange(state, absl::ToChronoTime(deadline));
    mu_.Lock();
    if (stopped_) return absl::CancelledError("the leadership term ended");
    state = channel_->GetState(/*try_to_connect=*/true);
  }
  if (state != GRPC_CHANNEL_READY) {
    return absl::UnavailableError("the cache server cannot be reached");
  }
  WriteStream::Options opts;
  opts.window = options_.window;
  absl::StatusOr<std::unique_ptr<WriteStream>> stream = WriteStream::Open(stub_, opts);
  if (!stream.ok()) return stream.status();
  stream_ = *std::move(stream);
  return absl::OkStatus();
}

void CacheWriter::Answered(const Done& done, const v1::WriteResponse& answer) {
  absl::Status status =
      answer.code() == 0
          ? absl::OkStatus()
          : absl::Status(static_cast<absl::StatusCode>(answer.code()), answer.message());
  if (!status.ok()) {
    if (options_.metrics != nullptr) {
      options_.metrics->WriteFailed(absl::StatusCodeToString(status.code()));
    }
    if (absl::IsFailedPrecondition(status) && absl::StartsWith(status.message(), "fenced")) {
      if (options_.metrics != nullptr) options_.metrics->fenced.Increment();
      if (!fenced_reported_.exchange(true) && options_.on_fenced) options_.on_fenced(status);
    }
  }
  if (done) done(status, answer);
}

void CacheWriter::Stop() {
  std::unique_ptr<WriteStream> stream;
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stream = std::move(stream_);
  }
  if (stream != nullptr) {
    stream->Cancel();  // queued writes are never sent; outstanding ones are answered CANCELLED
    stream.reset();
  }
}

}  // namespace shardcache
