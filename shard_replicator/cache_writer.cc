#include "shard_replicator/cache_writer.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_info.h"
#include "common/grpc_status.h"

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

// The connector re-checks Stop at least this often while it waits for the channel.
constexpr absl::Duration kConnectorPoll = absl::Milliseconds(100);
// Streams are opened at most this often, so that a cache that accepts connections and then ends
// every stream at once does not make the writer spin.
constexpr absl::Duration kMinStreamInterval = absl::Milliseconds(100);

}  // namespace

CacheWriter::CacheWriter(std::shared_ptr<grpc::Channel> channel,
                         std::shared_ptr<v1::Store::StubInterface> stub, Options options)
    : channel_(std::move(channel)), stub_(std::move(stub)), options_(std::move(options)) {
  if (options_.metrics != nullptr) options_.metrics->cache_unavailable.Set(0);
  connector_ = std::thread([this] { Connector(); });
}

CacheWriter::~CacheWriter() { Stop(); }

bool CacheWriter::StreamHealthyLocked() const { return stream_ != nullptr && !stream_->Broken(); }

absl::Status CacheWriter::Write(v1::WriteRequest request, Done done) {
  v1::Fence* fence = MutableFence(&request);
  if (fence == nullptr) return absl::InvalidArgumentError("a write names no operation");
  fence->set_shard(options_.shard);
  fence->set_epoch(options_.epoch);
  absl::MutexLock l(&mu_);
  absl::Time connect_deadline = absl::InfiniteFuture();
  while (true) {
    if (stopped_) return absl::CancelledError("the leadership term ended");
    if (!available_) {
      ++failed_while_unavailable_;
      if (options_.metrics != nullptr) options_.metrics->WriteFailed("UNAVAILABLE");
      return absl::UnavailableError(
          absl::StrCat("the cache server cannot be reached (since ",
                       absl::FormatTime(unavailable_since_, absl::UTCTimeZone()),
                       "); writes resume when it can"));
    }
    if (!StreamHealthyLocked()) {
      // Only the connector opens streams, so there is one at a time however many writers wait.
      need_stream_ = true;
      if (connect_deadline == absl::InfiniteFuture()) {
        connect_deadline = absl::Now() + options_.connect_timeout;
      }
      if (!mu_.AwaitWithDeadline(absl::Condition(this, &CacheWriter::WriteCanProceedLocked),
                                 connect_deadline)) {
        MarkUnavailableLocked(absl::UnavailableError(
            absl::StrCat("no connection within ", absl::FormatDuration(options_.connect_timeout))));
      }
      continue;
    }
    int64_t generation = generation_;
    absl::Status sent =
        stream_->TrySend(request, [this, generation, done](const v1::WriteResponse& answer) {
          Answered(generation, done, answer);
        });
    if (sent.ok()) return sent;
    if (!absl::IsResourceExhausted(sent)) continue;  // the stream broke: the connector replaces it
    // The window is full: wait for answers (or Stop).
    mu_.AwaitWithTimeout(absl::Condition(&stopped_), absl::Milliseconds(2));
  }
}

void CacheWriter::MarkUnavailableLocked(const absl::Status& why) {
  if (!available_ || stopped_) return;
  available_ = false;
  unavailable_since_ = absl::Now();
  failed_while_unavailable_ = 0;
  if (options_.metrics != nullptr) options_.metrics->cache_unavailable.Set(1);
  spdlog::warn(
      "replication to the cache stops (epoch {}): the cache server cannot be reached: {}; "
      "writes wait and resume as soon as it can",
      options_.epoch, why.ToString());
}

void CacheWriter::Answered(int64_t generation, const Done& done, const v1::WriteResponse& answer) {
  absl::Status status = WriteAnswerStatus(answer);
  if (!status.ok()) {
    if (options_.metrics != nullptr) {
      options_.metrics->WriteFailed(absl::StatusCodeToString(status.code()));
    }
    if (IsFenced(status)) {
      if (options_.metrics != nullptr) options_.metrics->fenced.Increment();
      if (!fenced_reported_.exchange(true) && options_.on_fenced) options_.on_fenced(status);
    }
    if (absl::IsUnavailable(status)) {
      absl::MutexLock l(&mu_);
      // A stream that was replaced already says nothing about the one in use.
      if (generation == generation_) MarkUnavailableLocked(status);
    }
  }
  if (done) done(status, answer);
}

void CacheWriter::Connector() {
  absl::Time last_open = absl::InfinitePast();
  mu_.Lock();
  while (true) {
    mu_.Await(absl::Condition(this, &CacheWriter::ConnectorHasWorkLocked));
    if (stopped_) break;
    std::unique_ptr<WriteStream> retired;
    if (!StreamHealthyLocked()) {
      grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
      if (state != GRPC_CHANNEL_READY) {
        // Wait without the lock (Write fails fast or waits on its own deadline; Stop must not
        // wait for a connection attempt).
        mu_.Unlock();
        channel_->WaitForStateChange(state, absl::ToChronoTime(absl::Now() + kConnectorPoll));
        mu_.Lock();
        continue;
      }
      if (absl::Now() < last_open + kMinStreamInterval) {
        mu_.AwaitWithDeadline(absl::Condition(&stopped_), last_open + kMinStreamInterval);
        continue;
      }
      WriteStream::Options opts;
      opts.window = options_.window;
      absl::StatusOr<std::unique_ptr<WriteStream>> opened = WriteStream::Open(stub_, opts);
      if (!opened.ok()) {
        // Only bad options fail here: nothing will get better by retrying fast.
        spdlog::error("opening a write stream to the cache failed: {}", opened.status().ToString());
        MarkUnavailableLocked(opened.status());
        mu_.AwaitWithTimeout(absl::Condition(&stopped_), absl::Seconds(1));
        continue;
      }
      if (stream_ != nullptr) {
        spdlog::info("the cache write stream broke: {}; opened another",
                     stream_->status().ToString());
      }
      retired = std::move(stream_);
      stream_ = *std::move(opened);
      ++generation_;
      last_open = absl::Now();
    }
    need_stream_ = false;
    std::vector<std::function<void()>> resumed;
    if (!available_) {
      available_ = true;
      if (options_.metrics != nullptr) options_.metrics->cache_unavailable.Set(0);
      spdlog::info(
          "replication to the cache resumes (epoch {}): the cache server is reachable again "
          "after {}; {} writes were refused meanwhile",
          options_.epoch, absl::FormatDuration(absl::Now() - unavailable_since_),
          failed_while_unavailable_);
      unavailable_since_ = absl::InfinitePast();
      resumed.swap(when_available_);
    }
    // The old stream's last answers (and the callbacks) run without the lock.
    mu_.Unlock();
    retired.reset();
    for (auto& fn : resumed) fn();
    resumed.clear();
    mu_.Lock();
  }
  mu_.Unlock();
}

void CacheWriter::WhenAvailable(std::function<void()> fn) {
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    if (!available_) {
      when_available_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

bool CacheWriter::Available() const {
  absl::MutexLock l(&mu_);
  return available_;
}

absl::Time CacheWriter::UnavailableSince() const {
  absl::MutexLock l(&mu_);
  return unavailable_since_;
}

bool CacheWriter::Stopped() const {
  absl::MutexLock l(&mu_);
  return stopped_;
}

void CacheWriter::Stop() {
  std::unique_ptr<WriteStream> stream;
  std::vector<std::function<void()>> dropped;
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stream = std::move(stream_);
    dropped.swap(when_available_);
  }
  if (connector_.joinable()) connector_.join();
  if (stream != nullptr) {
    stream->Cancel();  // queued writes are never sent; outstanding ones are answered CANCELLED
    stream.reset();
  }
  dropped.clear();
  if (options_.metrics != nullptr) options_.metrics->cache_unavailable.Set(0);
}

}  // namespace shardcache
