// slow_watchers_bench: how long a burst of writes takes while watchers read slowly or not at
// all, against the same burst with no watcher, on fresh cache_servers in the same run.
//
//   slow_watchers_bench [--slow=200] [--silent=20] [--readers=2] [--writes=20000]
//                       [--object-bytes=1024] [--in-flight=1000] [--rounds=2]
//                       [--server-args="--watch-stall-timeout=3s"]
//
// Each round starts a cache_server (the build tree's, durable on a fresh data directory) and
// times --writes creates over one Write stream with --in-flight unanswered, with no watcher;
// then a second fresh server with --slow watchers that read slowly (half pause 0.5 s then read
// everything, half read one message every 5 ms), --silent that read nothing, and --readers
// that read everything, each watcher on a connection of its own without BDP probing
// (common/testing/watch_load.h), and times the same burst. It reports both times and their
// ratio, how each kind of watcher ended (all events, OUT_OF_RANGE, RESOURCE_EXHAUSTED), and the
// server's peak RSS and CPU. Every call has a deadline; the tool always ends.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "common/testing/channels.h"
#include "common/testing/server_process.h"
#include "common/testing/watch_load.h"
#include "shardcache/v1/store.grpc.pb.h"

ABSL_FLAG(int, slow, 200, "watchers that read slowly (half pause, half crawl)");
ABSL_FLAG(int, silent, 20, "watchers that read nothing");
ABSL_FLAG(int, readers, 2, "watchers that read everything");
ABSL_FLAG(int, writes, 20000, "creates in the burst");
ABSL_FLAG(int, object_bytes, 1024, "bytes of spec data per object");
ABSL_FLAG(int, in_flight, 1000, "writes unanswered at most on the Write stream");
ABSL_FLAG(int, rounds, 2, "rounds (each: a server without watchers, then one with them)");
ABSL_FLAG(std::string, server_args, "--watch-stall-timeout=3s",
          "extra cache_server flags, space-separated, for both servers");

namespace shardcache::bench {
namespace {

using testing::PacedWatch;

struct Run {
  double seconds = 0;
  int acknowledged = 0;
  int failed = 0;
  double server_cores = 0;
  int64_t peak_rss_kib = 0;
  // Watchers by how they ended: got everything (still open), OUT_OF_RANGE, RESOURCE_EXHAUSTED,
  // other.
  int complete = 0, too_old = 0, too_slow = 0, other = 0;
};

absl::StatusOr<Run> RunOnce(bool with_watchers) {
  std::vector<std::string> args = {"--bookmark-interval=1s"};
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_server_args), ' ', absl::SkipEmpty())) {
    args.emplace_back(a);
  }
  testing::ServerProcess server(testing::BinaryPath("cache_server/cache_server"), args);
  if (absl::Status s = server.Start(); !s.ok()) return s;
  auto stub = v1::Store::NewStub(
      grpc::CreateChannel(server.grpc_address(), grpc::InsecureChannelCredentials()));
  const v1::GroupVersionResource gvr = BenchResource();
  testing::WriteCreatesResult start = testing::WriteCreates(stub.get(), gvr, "start", 1, 10, 1);
  if (start.rvs.size() != 1) return absl::UnavailableError("the first create failed");
  v1::WatchRequest request;
  *request.mutable_resource() = gvr;
  request.set_resource_version(absl::StrCat(start.rvs[0]));

  std::vector<std::unique_ptr<PacedWatch>> watchers;
  std::vector<PacedWatch::Pace> paces;
  if (with_watchers) {
    for (int i = 0; i < absl::GetFlag(FLAGS_slow); ++i) {
      paces.push_back(i % 2 == 0 ? PacedWatch::Pace::kPause : PacedWatch::Pace::kCrawl);
    }
    for (int i = 0; i < absl::GetFlag(FLAGS_silent); ++i)
      paces.push_back(PacedWatch::Pace::kSilent);
    for (int i = 0; i < absl::GetFlag(FLAGS_readers); ++i) paces.push_back(PacedWatch::Pace::kAll);
    for (PacedWatch::Pace pace : paces) {
      watchers.push_back(std::make_unique<PacedWatch>(server.grpc_address(), request, pace));
    }
    absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (testing::Metric(server.http_port(), "shardcache_store_watchers") <
               static_cast<double>(watchers.size()) &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  Run run;
  std::atomic<bool> writing{true};
  std::atomic<int64_t> peak{0};
  std::thread sampler([&] {
    while (writing) {
      peak = std::max<int64_t>(peak, testing::RssKiB(server.pid()));
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  for (auto& w : watchers) w->Begin();
  ProcStats before = ReadProcStats(server.pid());
  absl::Time t0 = absl::Now();
  testing::WriteCreatesResult r = testing::WriteCreates(
      stub.get(), gvr, "w", absl::GetFlag(FLAGS_writes), absl::GetFlag(FLAGS_object_bytes),
      absl::GetFlag(FLAGS_in_flight), absl::Seconds(600));
  run.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  ProcStats after = ReadProcStats(server.pid());
  run.server_cores = CoresUsed(before, after, run.seconds);
  run.acknowledged = static_cast<int>(r.rvs.size());
  run.failed = r.failed;

  // Let every watcher end or finish: the slow and silent ones read at once from here.
  absl::Time deadline = absl::Now() + absl::Seconds(90);
  for (auto& w : watchers) {
    while (absl::Now() < deadline && !w->end().has_value() &&
           w->received() < static_cast<size_t>(absl::GetFlag(FLAGS_writes))) {
      if (absl::Now() - t0 > absl::Seconds(run.seconds) + absl::Seconds(10)) w->Hurry();
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  for (auto& w : watchers) w->Hurry();
  for (auto& w : watchers) {
    while (absl::Now() < deadline && !w->end().has_value() &&
           w->received() < static_cast<size_t>(absl::GetFlag(FLAGS_writes))) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    std::optional<grpc::Status> end = w->end();
    if (!end.has_value()) {
      ++run.complete;
    } else if (end->error_code() == grpc::StatusCode::OUT_OF_RANGE) {
      ++run.too_old;
    } else if (end->error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++run.too_slow;
    } else {
      ++run.other;
    }
  }
  writing = false;
  sampler.join();
  run.peak_rss_kib = peak;
  return run;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::printf("# Slow watchers and writers\n\n`%s`\n\n", QuotedCommandLine(argc, argv).c_str());
  std::printf(
      "%d creates of %d bytes, one Write stream, %d in flight; watchers: %d slow (half "
      "pause 0.5 s, half read one message every 5 ms), %d silent, %d reading "
      "everything. Load average at start: %s.\n\n",
      absl::GetFlag(FLAGS_writes), absl::GetFlag(FLAGS_object_bytes),
      absl::GetFlag(FLAGS_in_flight), absl::GetFlag(FLAGS_slow), absl::GetFlag(FLAGS_silent),
      absl::GetFlag(FLAGS_readers), LoadAverage().c_str());
  std::printf(
      "| round | watchers | writes acked | failed | time, s | writes/s | ratio to no "
      "watchers | server cores | peak RSS, MiB | complete | OUT_OF_RANGE | "
      "RESOURCE_EXHAUSTED | other |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int status = 0;
  for (int round = 1; round <= absl::GetFlag(FLAGS_rounds); ++round) {
    double baseline = 0;
    for (bool with : {false, true}) {
      absl::StatusOr<Run> run = RunOnce(with);
      if (!run.ok()) {
        std::fprintf(stderr, "slow_watchers_bench: %s\n", run.status().ToString().c_str());
        return 1;
      }
      if (!with) baseline = run->seconds;
      if (run->failed > 0 || run->acknowledged != absl::GetFlag(FLAGS_writes)) status = 1;
      int total =
          absl::GetFlag(FLAGS_slow) + absl::GetFlag(FLAGS_silent) + absl::GetFlag(FLAGS_readers);
      std::printf("| %d | %d | %d | %d | %.2f | %.0f | %.2f | %.2f | %lld | %d | %d | %d | %d |\n",
                  round, with ? total : 0, run->acknowledged, run->failed, run->seconds,
                  run->acknowledged / run->seconds, run->seconds / baseline, run->server_cores,
                  static_cast<long long>(run->peak_rss_kib / 1024), run->complete, run->too_old,
                  run->too_slow, run->other);
      std::fflush(stdout);
    }
  }
  return status;
}

}  // namespace
}  // namespace shardcache::bench

int main(int argc, char** argv) { return shardcache::bench::Main(argc, argv); }
