// Process-level tests of watcher isolation: watchers that read slowly, or not at all, or whose
// whole client process is stopped, never hold the writers back. A watcher whose queue fills is
// parked and caught up from the history window, with no gap and no duplicate; one that the window
// has moved past ends with OUT_OF_RANGE (a client-go reflector then lists again); one that reads
// nothing at all ends with RESOURCE_EXHAUSTED after the stall timeout.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/channels.h"
#include "common/testing/server_process.h"
#include "common/testing/wait.h"
#include "common/testing/watch_load.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

using ::testing::HasSubstr;

// Whether `rvs` is exactly first, first+1, first+2, ... (no gap, no duplicate, in order).
::testing::AssertionResult Contiguous(const std::vector<int64_t>& rvs, int64_t first) {
  for (size_t i = 0; i < rvs.size(); ++i) {
    if (rvs[i] != first + static_cast<int64_t>(i)) {
      return ::testing::AssertionFailure()
             << "event " << i << " has resourceVersion " << rvs[i] << ", expected "
             << first + static_cast<int64_t>(i) << (i > 0 ? " (after " : "")
             << (i > 0 ? absl::StrCat(rvs[i - 1], ")") : "");
    }
  }
  return ::testing::AssertionSuccess();
}

class WatchIsolationTest : public StoreFixture {
 protected:
  const v1::GroupVersionResource widgets_ = Gvr("example.com", "v1", "widgets");

  // Creates `n` objects of 1 KiB named prefix0.. over one Write stream with at most `window`
  // unanswered; returns the resourceVersions of those acknowledged (a failed write fails the
  // test).
  std::vector<int64_t> Write(const std::string& prefix, int n, int window) {
    WriteCreatesResult r = WriteCreates(stub_.get(), widgets_, prefix, n, 1024, window);
    EXPECT_EQ(r.failed, 0) << r.first_error;
    EXPECT_TRUE(Ok(r.status));
    return r.rvs;
  }

  double Metric(const std::string& name) { return testing::Metric(server_->http_port(), name); }
};

// 200 watchers that read slowly (100 that pause 0.5 s, 100 that read one message every 5 ms
// until the writes are done), 20 that read nothing and 2 that read everything, while 20,000
// writes of 1 KiB go through one Write stream with 1,000 in flight: every write is acknowledged;
// the readers get every event in order; the slow ones are parked and, the history window (30,000
// events) holding what they need, caught up: every event, in order, no gap, no duplicate; the
// silent ones end RESOURCE_EXHAUSTED; the server's memory stays bounded. (Falling out of the
// window, OUT_OF_RANGE, is StoppedClientProcess_... below.)
TEST_F(WatchIsolationTest, SlowAndSilentWatchers_HoldNoWriterBack_EachEndsAsItsPaceDeserves) {
  StartServer({"--history-events=30000", "--watch-queue-bytes=131072", "--watch-stall-timeout=3s",
               "--bookmark-interval=1s"});
  const std::vector<int64_t> first = Write("start", 1, 1);
  ASSERT_EQ(first.size(), 1u);
  const int64_t from = first[0];
  constexpr int kWrites = 20000;
  constexpr int kPausers = 100, kCrawlers = 100, kSilent = 20;
  // The state on disk and in memory: 20,000 objects of 1 KiB, their history window, the
  // encodings kept for catching up, and the watchers' bounded queues (128 KiB each, mostly
  // shared bytes).
  constexpr int64_t kRssBoundMiB = 512;

  const v1::WatchRequest request = WatchReq(widgets_, from);
  std::vector<std::unique_ptr<PacedWatch>> pausers, crawlers, silent, readers;
  for (int i = 0; i < kPausers; ++i) {
    pausers.push_back(
        std::make_unique<PacedWatch>(server_->grpc_address(), request, PacedWatch::Pace::kPause));
  }
  for (int i = 0; i < kCrawlers; ++i) {
    crawlers.push_back(
        std::make_unique<PacedWatch>(server_->grpc_address(), request, PacedWatch::Pace::kCrawl));
  }
  for (int i = 0; i < kSilent; ++i) {
    silent.push_back(
        std::make_unique<PacedWatch>(server_->grpc_address(), request, PacedWatch::Pace::kSilent));
  }
  for (int i = 0; i < 2; ++i) {
    readers.push_back(
        std::make_unique<PacedWatch>(server_->grpc_address(), request, PacedWatch::Pace::kAll));
  }
  const int kWatchers = kPausers + kCrawlers + kSilent + 2;
  ASSERT_TRUE(Eventually([&] { return Metric("shardcache_store_watchers") >= kWatchers; },
                         absl::Seconds(60), "every watch is registered"));

  std::atomic<bool> writing{true};
  std::atomic<int64_t> peak_rss_kib{0};
  std::thread sampler([&] {
    while (writing) {
      peak_rss_kib = std::max<int64_t>(peak_rss_kib, RssKiB(server_->pid()));
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  for (auto& p : pausers) p->Begin();
  absl::Time start = absl::Now();
  std::vector<int64_t> rvs = Write("w", kWrites, 1000);
  absl::Duration took = absl::Now() - start;
  ASSERT_EQ(rvs.size(), static_cast<size_t>(kWrites)) << "writes were held back";
  EXPECT_TRUE(Contiguous(rvs, from + 1));
  std::printf("%d writes with %d watchers: %s (%.0f writes/s)\n", kWrites, kWatchers,
              absl::FormatDuration(took).c_str(), kWrites / absl::ToDoubleSeconds(took));

  // The silent ones end by their stall timeout; the readers and pausers get everything.
  EXPECT_TRUE(
      Eventually([&] { return Metric("shardcache_store_watchers_too_slow_total") >= kSilent; },
                 absl::Seconds(60), "every silent watcher is ended as too slow"));
  for (auto* group : {&readers, &pausers}) {
    for (size_t i = 0; i < group->size(); ++i) {
      PacedWatch& w = *(*group)[i];
      ASSERT_TRUE(Eventually([&] { return w.received() >= static_cast<size_t>(kWrites); },
                             absl::Seconds(90), "a reader or pauser gets every event"))
          << (group == &readers ? "reader " : "pauser ") << i << " got " << w.received() << ", "
          << (w.end().has_value() ? w.end()->error_message() : std::string("still open"));
      std::vector<int64_t> got = w.rvs();
      EXPECT_EQ(got.size(), static_cast<size_t>(kWrites));
      EXPECT_TRUE(Contiguous(got, from + 1));
      EXPECT_FALSE(w.end().has_value())
          << "a watcher that kept up was ended: " << w.end()->error_message();
    }
  }
  writing = false;
  sampler.join();

  // The crawlers and the silent ones now read at once: what was queued for them, then their end.
  for (auto* group : {&crawlers, &silent}) {
    for (auto& w : *group) w->Hurry();
  }
  for (size_t i = 0; i < crawlers.size(); ++i) {
    PacedWatch& w = *crawlers[i];
    ASSERT_TRUE(Eventually([&] { return w.received() >= static_cast<size_t>(kWrites); },
                           absl::Seconds(90), "a crawler catches up once it reads"))
        << "crawler " << i << " got " << w.received() << ", "
        << (w.end().has_value() ? w.end()->error_message() : std::string("still open"));
    EXPECT_TRUE(Contiguous(w.rvs(), from + 1)) << "crawler " << i;
    EXPECT_FALSE(w.end().has_value());
  }
  for (size_t i = 0; i < silent.size(); ++i) {
    PacedWatch& w = *silent[i];
    ASSERT_TRUE(
        Eventually([&] { return w.end().has_value(); }, absl::Seconds(60), "a silent watch ends"))
        << "silent " << i;
    EXPECT_EQ(w.end()->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << "silent " << i << ": " << w.end()->error_message();
    EXPECT_THAT(w.end()->error_message(), HasSubstr("too slow"));
    EXPECT_TRUE(Contiguous(w.rvs(), from + 1)) << "silent " << i;
  }
  EXPECT_EQ(Metric("shardcache_store_watchers_too_slow_total"), kSilent);
  EXPECT_EQ(Metric("shardcache_store_watchers_too_old_total"), 0);
  EXPECT_GT(Metric("shardcache_store_watch_catch_up_events_total"), 0);
  std::printf("peak RSS of the server: %lld MiB (bound %lld MiB)\n",
              static_cast<long long>(peak_rss_kib / 1024), static_cast<long long>(kRssBoundMiB));
  EXPECT_LE(peak_rss_kib / 1024, kRssBoundMiB);
}

// A watcher's client process, run as a child of the test, with its output read by a thread.
class WatchClientProcess {
 public:
  WatchClientProcess(const std::string& target, const std::vector<std::string>& args) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      std::vector<std::string> all = {WATCH_CLIENT_PATH, target};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (std::string& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    thread_ = std::thread([this, fd = out[0]] {
      FILE* f = fdopen(fd, "r");
      char line[4096];
      while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
        absl::MutexLock l(&mu_);
        lines_.push_back(std::string(absl::StripTrailingAsciiWhitespace(line)));
      }
      if (f != nullptr) std::fclose(f);
    });
  }
  ~WatchClientProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGCONT);
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (thread_.joinable()) thread_.join();
  }
  pid_t pid() const { return pid_; }
  // The resourceVersions of the events printed so far.
  std::vector<int64_t> rvs() {
    absl::MutexLock l(&mu_);
    std::vector<int64_t> out;
    for (const std::string& line : lines_) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      int64_t rv = 0;
      if (f.size() == 4 && f[0] == "EVENT" && f[1] != "BOOKMARK" && absl::SimpleAtoi(f[3], &rv)) {
        out.push_back(rv);
      }
    }
    return out;
  }
  // The "END CODE MESSAGE" line, once printed.
  std::optional<std::string> end() {
    absl::MutexLock l(&mu_);
    for (const std::string& line : lines_) {
      if (line.rfind("END ", 0) == 0) return line;
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// A watcher whose whole client process is stopped (SIGSTOP) while writes go on: the writes go
// through; resumed (SIGCONT) within the history window, it catches up and misses nothing;
// resumed after the window has moved past it, it gets OUT_OF_RANGE.
TEST_F(WatchIsolationTest,
       StoppedClientProcess_WritesGoOn_ItCatchesUpWithinTheWindow_ElseOutOfRange) {
  StartServer({"--history-events=1000", "--watch-queue-bytes=16384", "--watch-stall-timeout=150s",
               "--bookmark-interval=500ms"});
  const std::vector<int64_t> start = Write("start", 1, 1);
  ASSERT_EQ(start.size(), 1u);
  const int64_t from = start[0];
  WatchClientProcess client(server_->grpc_address(),
                            {"example.com", "v1", "widgets", absl::StrCat(from)});
  ASSERT_GT(client.pid(), 0);
  ASSERT_TRUE(Eventually([&] { return Metric("shardcache_store_watchers") >= 1; },
                         "the client's watch is registered"));
  std::vector<int64_t> first = Write("a", 10, 10);
  ASSERT_TRUE(Eventually([&] { return client.rvs().size() >= 10; }, "the live events arrive"));

  // Stopped: 500 writes (half the window), far more than its queue and HTTP/2 window hold.
  ASSERT_EQ(kill(client.pid(), SIGSTOP), 0);
  std::vector<int64_t> second = Write("b", 500, 100);
  ASSERT_EQ(second.size(), 500u) << "writes were held back by a stopped client";
  EXPECT_TRUE(Eventually([&] { return Metric("shardcache_store_watchers_parked") >= 1; },
                         "the stopped client's watcher is parked"));
  ASSERT_EQ(kill(client.pid(), SIGCONT), 0);
  ASSERT_TRUE(
      Eventually([&] { return client.rvs().size() >= 510; }, absl::Seconds(60), "it catches up"));
  EXPECT_TRUE(Contiguous(client.rvs(), from + 1));
  EXPECT_EQ(client.rvs().size(), 510u);
  EXPECT_TRUE(Eventually([&] { return Metric("shardcache_store_watchers_parked") == 0; },
                         "it is synced again"));

  // Stopped again: 2,000 writes, twice the window.
  ASSERT_EQ(kill(client.pid(), SIGSTOP), 0);
  std::vector<int64_t> third = Write("c", 2000, 100);
  ASSERT_EQ(third.size(), 2000u) << "writes were held back by a stopped client";
  ASSERT_EQ(kill(client.pid(), SIGCONT), 0);
  ASSERT_TRUE(
      Eventually([&] { return client.end().has_value(); }, absl::Seconds(60), "its watch ends"));
  EXPECT_THAT(*client.end(), HasSubstr("END OUT_OF_RANGE too old resource version"));
  std::vector<int64_t> got = client.rvs();
  EXPECT_TRUE(Contiguous(got, from + 1));
  EXPECT_GE(got.size(), 510u);
  EXPECT_LT(got.size(), 2510u);
  EXPECT_EQ(Metric("shardcache_store_watchers_too_slow_total"), 0);
}

}  // namespace
}  // namespace shardcache::testing
