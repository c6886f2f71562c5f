// CacheWriter: a leadership term's writes to the cache server, pipelined over one Store.Write
// stream and fenced with the term's epoch.
//
//   CacheWriter writer(channel, stub, {.shard = "a", .epoch = 7, .on_fenced = resign});
//   writer.Write(request, [](const absl::Status& s, const v1::WriteResponse& answer) { ... });
//   writer.WhenAvailable([] { ... });   // e.g. requeue the writes that failed UNAVAILABLE
//   ...
//   writer.Stop();   // the term ends: nothing is sent after this returns
//
// Guarantees:
// - Every write carries Fence{shard, epoch}; the caller's fence, if any, is replaced.
// - When Write returns OK, `done` is called exactly once: with the cache's answer, or with the
//   stream's error when it broke (UNAVAILABLE; the write may or may not have been applied) or
//   CANCELLED when Stop cancelled it. When Write fails, `done` is never called.
// - One stream at a time: the writer never opens a stream while another one can still take
//   writes, and only Stop cancels a stream. Writes leave in the order Write was called; at most
//   Options::window are outstanding (Write waits for room).
// - Availability: the writer is "unavailable" from the moment a write fails because the cache
//   cannot be reached (no connection within Options::connect_timeout, or a stream that broke)
//   until a new stream is open on a connected channel. Meanwhile Write fails at once with
//   UNAVAILABLE (it does not wait), and the writer's own thread waits for the channel to connect
//   and opens the new stream as soon as it does. Each transition is logged once (a warning when
//   writes stop, an info line with the outage's length when they resume) and shown by
//   ReplicatorMetrics::cache_writable. WhenAvailable callbacks run when writes resume.
// - After Stop() returns, no write is sent, Stopped() is true, every Write fails with CANCELLED,
//   and WhenAvailable callbacks not yet run are dropped. Callers tell "the term ended" from
//   Stopped(), not from a status code.
// - An answer that IsFenced (common/error_info.h: a newer leader claimed a higher epoch for the
//   shard) calls Options::on_fenced once per writer, and counts in ReplicatorMetrics::fenced.
//
// Threads: every method may be called from any thread, concurrently (Write blocks while the
// window is full, or up to connect_timeout while the first stream connects). `done`, on_fenced
// and WhenAvailable callbacks run on gRPC's threads or the writer's own thread, never under the
// writer's lock: they must not block, and may call Stopped, Available and WhenAvailable, but not
// Write or Stop.
#ifndef SHARDCACHE_SHARD_REPLICATOR_CACHE_WRITER_H_
#define SHARDCACHE_SHARD_REPLICATOR_CACHE_WRITER_H_

#include <grpcpp/channel.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/client/write_stream.h"
#include "shard_replicator/replicator_metrics.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {

// What the replicator's controllers use of a term's cache writer: the seam that lets them be
// tested with a fake (shard_replicator/testing/fake_cache_writer.h). CacheWriter is the real one;
// every implementation keeps CacheWriter's guarantees (see above): `done` called exactly once
// when Write returns OK, never under a lock, Stopped() the only sign that the term ended.
class CacheWriterInterface {
 public:
  using Done = std::function<void(const absl::Status&, const v1::WriteResponse&)>;

  virtual ~CacheWriterInterface() = default;
  virtual absl::Status Write(v1::WriteRequest request, Done done) = 0;
  virtual void WhenAvailable(std::function<void()> fn) = 0;
  virtual bool Available() const = 0;
  virtual absl::Time UnavailableSince() const = 0;
  virtual bool Stopped() const = 0;
};

class CacheWriter : public CacheWriterInterface {
 public:
  struct Options {
    std::string shard;
    int64_t epoch = 0;
    // Writes outstanding at once on the stream.
    int window = 256;
    // How long a Write waits for the channel to connect when the writer needs a new stream and
    // is not known to be unavailable; after that the writer is unavailable.
    absl::Duration connect_timeout = absl::Seconds(1);
    // Called (once) when the cache rejects a write as fenced. Must not block.
    std::function<void(const absl::Status&)> on_fenced;
    // Not owned; may be null.
    ReplicatorMetrics* metrics = nullptr;
  };

  CacheWriter(std::shared_ptr<grpc::Channel> channel,
              std::shared_ptr<v1::Store::StubInterface> stub, Options options);
  // Stops (see Stop).
  ~CacheWriter() override;
  CacheWriter(const CacheWriter&) = delete;
  CacheWriter& operator=(const CacheWriter&) = delete;

  // Sends `request` (see the guarantees above). Errors: CANCELLED after Stop; UNAVAILABLE while
  // the cache cannot be reached (WhenAvailable says when to try again).
  absl::Status Write(v1::WriteRequest request, Done done) override ABSL_LOCKS_EXCLUDED(mu_);

  // Calls `fn` once writes can flow: at once, on the caller's thread, when the writer is
  // available now; else on the writer's thread right after it has opened a new stream. Dropped
  // (never called) if the writer stops first.
  void WhenAvailable(std::function<void()> fn) override ABSL_LOCKS_EXCLUDED(mu_);

  // False from a write that failed because the cache could not be reached until writes resume.
  bool Available() const override ABSL_LOCKS_EXCLUDED(mu_);
  // When the writer last became unavailable (InfinitePast while available).
  absl::Time UnavailableSince() const override ABSL_LOCKS_EXCLUDED(mu_);

  // Stops sending: outstanding writes are answered CANCELLED (they may or may not have been
  // applied). Idempotent. Returns once no write can be sent any more.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // True once Stop has begun: the term is ending.
  bool Stopped() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool StreamHealthyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the writer unavailable (logs and counts the transition once).
  void MarkUnavailableLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Answered(int64_t generation, const Done& done, const v1::WriteResponse& answer)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The writer's thread: opens every stream after the first failure or break (see the file
  // comment), and runs the WhenAvailable callbacks.
  void Connector() ABSL_LOCKS_EXCLUDED(mu_);
  bool ConnectorHasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || need_stream_ || !available_;
  }
  bool WriteCanProceedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || !available_ || StreamHealthyLocked();
  }

  // Constant after construction.
  const std::shared_ptr<grpc::Channel> channel_;
  const std::shared_ptr<v1::Store::StubInterface> stub_;
  const Options options_;
  std::atomic<bool> fenced_reported_{false};
  std::thread connector_;

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // The stream writes go to; only the connector thread replaces it (the first one too).
  std::unique_ptr<WriteStream> stream_ ABSL_GUARDED_BY(mu_);
  // Raised with every new stream: answers from an older stream do not mark the writer
  // unavailable.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // A Write needs a stream (none yet, or the last one broke).
  bool need_stream_ ABSL_GUARDED_BY(mu_) = false;
  bool available_ ABSL_GUARDED_BY(mu_) = true;
  absl::Time unavailable_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t failed_while_unavailable_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::function<void()>> when_available_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_SHARD_REPLICATOR_CACHE_WRITER_H_
