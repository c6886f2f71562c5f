// Watch and write loads against a real Store server, shared by the watcher-isolation tests
// (integration_tests/watch_isolation_test.cc) and the benchmark that measures the same load
// (bench/slow_watchers_bench.cc):
// - PacedWatch: one Watch stream read by a thread of its own at a chosen pace (everything, a
//   pause and then everything, one message every 5 ms, or nothing), on a connection of its own
//   without BDP probing, so that a client that does not read stops the server's writes after
//   about 64 KiB of HTTP/2 window.
// - WriteCreates: creates over one Write stream with a bounded number of writes unanswered.
// - RssKiB: a process's resident memory.
//
// Thread-safety: a PacedWatch's methods may be called from any thread. WriteCreates blocks its
// caller until every write is answered (or the deadline passes).
#ifndef SHARDCACHE_COMMON_TESTING_WATCH_LOAD_H_
#define SHARDCACHE_COMMON_TESTING_WATCH_LOAD_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::testing {

class PacedWatch {
 public:
  enum class Pace {
    kAll,     // reads everything at once
    kPause,   // reads nothing for kPause once told to Begin, then everything
    kCrawl,   // one message every 5 ms until told to Hurry
    kSilent,  // nothing until told to Hurry
  };
  static constexpr absl::Duration kPause = absl::Milliseconds(500);

  // Opens the watch at once; it lives at most `lifetime`.
  PacedWatch(const std::string& target, const v1::WatchRequest& request, Pace pace,
             absl::Duration lifetime = absl::Seconds(170));
  // Cancels the stream and joins the thread.
  ~PacedWatch();
  PacedWatch(const PacedWatch&) = delete;
  PacedWatch& operator=(const PacedWatch&) = delete;

  // The writes begin: a pausing watch starts its pause.
  void Begin();
  // From now on, read everything at once.
  void Hurry();
  // The object events (not bookmarks) received so far, and their resourceVersions.
  size_t received() const;
  std::vector<int64_t> rvs() const;
  // The stream's final status, once it has ended.
  std::optional<grpc::Status> end() const;

 private:
  void Run();

  const Pace pace_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Store::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader_;
  absl::Notification begun_;
  absl::Mutex hurry_mu_;
  absl::Notification hurry_;
  mutable absl::Mutex mu_;
  std::vector<int64_t> rvs_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

struct WriteCreatesResult {
  // The resourceVersions of the acknowledged creates, in the order of the writes.
  std::vector<int64_t> rvs;
  // Writes answered with an error, and the first such answer.
  int failed = 0;
  std::string first_error;
  // The stream's own status.
  grpc::Status status;
};
// Creates `n` objects of `gvr` named prefix0.. (cluster c1, namespace ns1) with `payload_bytes`
// of spec data over one Write stream, with at most `window` writes unanswered.
WriteCreatesResult WriteCreates(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                                const std::string& prefix, int n, size_t payload_bytes, int window,
                                absl::Duration deadline = absl::Seconds(150));

// A process's resident memory in KiB (0 when /proc cannot tell).
int64_t RssKiB(pid_t pid);

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_WATCH_LOAD_H_
