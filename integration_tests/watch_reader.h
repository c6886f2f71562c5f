// WatchReader: one Watch stream, read by its own thread into a queue so that a test can wait, with
// a timeout, for its events (one at a time, as summaries, up to the initial-events-end bookmark,
// or up to a bookmark at a revision) and for its final status. A request with batch_events is
// read as the same events one by one. Plus the small helpers that tests
// of watches share to build requests and to compare events.
//
// Thread-compatible: use a reader from one thread (its own reading thread is internal).
#ifndef SHARDCACHE_INTEGRATION_TESTS_WATCH_READER_H_
#define SHARDCACHE_INTEGRATION_TESTS_WATCH_READER_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::testing {

// How long a WatchReader waits for what a test asks of it, unless told otherwise.
inline constexpr absl::Duration kWatchWait = absl::Seconds(10);
// The deadline of a WatchReader's stream: just below ctest's 180 s per test.
inline constexpr absl::Duration kWatchLifetime = absl::Seconds(170);

// A request to watch `gvr` from resourceVersion `rv` ("": from now, with the current state first),
// asking for periodic bookmarks (allow_bookmarks), which NothingMoreUpTo waits for.
v1::WatchRequest WatchReq(const v1::GroupVersionResource& gvr, const std::string& rv = "");
v1::WatchRequest WatchReq(const v1::GroupVersionResource& gvr, int64_t rv);

// "ADDED w1@7": what a test compares events by (type, name, resourceVersion); "BOOKMARK@7".
std::string Summary(const std::string& type, const std::string& name, int64_t rv);
std::string Summary(const v1::WatchEvent& e);

class WatchReader {
 public:
  // Opens the stream, waiting for the server if it is (re)starting (wait_for_ready), for at most
  // `lifetime`.
  WatchReader(v1::Store::Stub* stub, const v1::WatchRequest& request,
              absl::Duration lifetime = kWatchLifetime);
  // Cancels the stream and joins the reading thread.
  ~WatchReader();
  WatchReader(const WatchReader&) = delete;
  WatchReader& operator=(const WatchReader&) = delete;

  // The next event, waiting up to `timeout`; nullopt if the stream ended first or on timeout.
  std::optional<v1::WatchEvent> Next(absl::Duration timeout = kWatchWait);
  // The next event that is not a BOOKMARK.
  std::optional<v1::WatchEvent> NextObjectEvent(absl::Duration timeout = kWatchWait);
  // Summaries of the next `n` events that are not BOOKMARKs (fewer if the stream ends or the
  // time is up).
  std::vector<std::string> Take(size_t n, absl::Duration timeout = kWatchWait);

  // Reads up to and including the initial-events-end BOOKMARK of a watch from now; returns the
  // events before it, and the bookmark in `bookmark` (when given). Fails the test (ADD_FAILURE)
  // when no bookmark comes within `timeout`.
  std::vector<v1::WatchEvent> TakeInitial(v1::WatchEvent* bookmark = nullptr,
                                          absl::Duration timeout = kWatchWait);
  // The same, for a test that only needs the watch registered: true if the bookmark came within
  // `timeout`.
  bool SkipInitial(absl::Duration timeout = kWatchWait);

  // Reads up to the first BOOKMARK at or above `revision`, which says that the watch has seen
  // every event up to it; fails if any other event comes first (a duplicate or an extra event).
  ::testing::AssertionResult NothingMoreUpTo(int64_t revision, absl::Duration timeout = kWatchWait);

  // The stream's final status, waiting up to `timeout` for it; nullopt if still open.
  std::optional<grpc::Status> WaitForEnd(absl::Duration timeout = kWatchWait);

 private:
  void Run();
  // Reads up to the first BOOKMARK, appending the events before it to `before` and storing the
  // bookmark in `bookmark` (when given); false if none came within `timeout`.
  bool ReadInitial(std::vector<v1::WatchEvent>* before, v1::WatchEvent* bookmark,
                   absl::Duration timeout);

  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader_;
  absl::Mutex mu_;
  std::deque<v1::WatchEvent> events_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_INTEGRATION_TESTS_WATCH_READER_H_
