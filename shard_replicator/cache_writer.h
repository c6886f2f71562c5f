// CacheWriter: a leadership term's writes to the cache server, pipelined over one Store.Write
// stream and fenced with the term's epoch.
//
//   CacheWriter writer(channel, stub, {.shard = "a", .epoch = 7, .on_fenced = resign});
//   writer.Write(request, [](const absl::Status& s, const v1::WriteResponse& answer) { ... });
//   ...
//   writer.Stop();   // the term ends: nothing is sent after this returns
//
// Guarantees:
// - Every write carries Fence{shard, epoch}; the caller's fence, if any, is replaced.
// - When Write returns OK, `done` is called exactly once: with the cache's answer, or with the
//   stream's error when it broke (UNAVAILABLE; the write may or may not have been applied) or
//   CANCELLED after Stop. When Write fails, `done` is never called.
// - Writes leave in the order Write was called, over one stream at a time; at most
//   Options::window are outstanding (Write waits for room). A broken stream is replaced by a new
//   one on the next Write, once the channel is connected again.
// - After Stop() returns, no write is sent, and every Write fails with CANCELLED.
// - An answer FAILED_PRECONDITION whose message starts with "fenced" (a newer leader claimed a
//   higher epoch for the shard) calls Options::on_fenced once per writer, and counts in
//   ReplicatorMetrics::fenced.
//
// Threads: Write and Stop may be called from any thread, concurrently (Write blocks while the
// window is full). `done` and on_fenced run on gRPC's threads: they must not block and must not
// call Write or Stop.
#ifndef SHARDCACHE_SHARD_REPLICATOR_CACHE_WRITER_H_
#define SHARDCACHE_SHARD_REPLICATOR_CACHE_WRITER_H_

#include <grpcpp/channel.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/write_stream.h"
#include "shard_replicator/replicator_metrics.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {

class CacheWriter {
 public:
  struct Options {
    std::string shard;
    int64_t epoch = 0;
    // Writes outstanding at once on the stream.
    int window = 256;
    // How long Write waits for the channel to connect when it must open a stream.
    absl::Duration connect_timeout = absl::Seconds(1);
    // Called (once) when the cache rejects a write as fenced. Must not block.
    std::function<void(const absl::Status&)> on_fenced;
    // Not owned; may be null.
    ReplicatorMetrics* metrics = nullptr;
  };

  using Done = std::function<void(const absl::Status&, const v1::WriteResponse&)>;

  CacheWriter(std::shared_ptr<grpc::Channel> channel,
              std::shared_ptr<v1::Store::StubInterface> stub, Options options);
  // Stops (see Stop).
  ~CacheWriter();
  CacheWriter(const CacheWriter&) = delete;
  CacheWriter& operator=(const CacheWriter&) = delete;

  // Sends `request` (see the guarantees above). Errors: CANCELLED after Stop; UNAVAILABLE when
  // the cache cannot be reached to open a stream.
  absl::Status Write(v1::WriteRequest request, Done done) ABSL_LOCKS_EXCLUDED(mu_);

  // Stops sending: outstanding writes are answered CANCELLED (they may or may not have been
  // applied). Idempotent. Returns once no write can be sent any more.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A stream that can take writes, opening one if needed. REQUIRES: mu_ held, !stopped_.
  absl::Status EnsureStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Answered(const Done& done, const v1::WriteResponse& answer);

  // Constant after construction.
  const std::shared_ptr<grpc::Channel> channel_;
  const std::shared_ptr<v1::Store::StubInterface> stub_;
  const Options options_;
  std::atomic<bool> fenced_reported_{false};

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<WriteStream> stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_SHARD_REPLICATOR_CACHE_WRITER_H_
