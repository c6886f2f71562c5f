#include "bench/ccr_scale.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/testing/server_process.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::bench {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(500);

std::string ClusterName(int index) { return absl::StrCat("bench-", index); }

std::string CcrName(int resource) {
  return absl::StrCat("ccr-", BenchResource(resource).resource());
}

double SecondsSince(int64_t start_ns) { return static_cast<double>(NowNanos() - start_ns) / 1e9; }

// Writes made over one Write stream.
struct StreamWrites {
  int64_t ok = 0;
  int64_t failed = 0;
  std::string first_error;  // of a failed write, or of the stream
  double seconds = 0;       // first write sent to last answer
};

// Sends `count` writes, make(i) for i in [0, count), over one Write stream with at most `window`
// unanswered, and waits for every answer (or the stream's deadline, `timeout`).
StreamWrites WriteOverStream(v1::Store::Stub* stub, int64_t count,
                             const std::function<v1::WriteRequest(int64_t)>& make, int window,
                             absl::Duration timeout) {
  StreamWrites w;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  std::unique_ptr<grpc::ClientReaderWriter<v1::WriteRequest, v1::WriteResponse>> stream =
      stub->Write(&ctx);
  absl::Mutex mu;
  int64_t answered = 0;
  bool reader_done = false;
  int64_t start_ns = NowNanos();
  std::thread reader([&] {
    v1::WriteResponse r;
    while (stream->Read(&r)) {
      absl::MutexLock l(&mu);
      ++answered;
      if (r.code() == 0) {
        ++w.ok;
      } else if (++w.failed == 1) {
        w.first_error = absl::StrCat("code ", r.code(), ": ", r.message());
      }
    }
    absl::MutexLock l(&mu);
    reader_done = true;
  });
  for (int64_t i = 0; i < count; ++i) {
    {
      absl::MutexLock l(&mu);
      auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return reader_done || i - answered < window;
      };
      mu.Await(absl::Condition(&room));
      if (reader_done) break;
    }
    v1::WriteRequest req = make(i);
    req.set_id(i);
    if (!stream->Write(req)) break;
  }
  stream->WritesDone();
  reader.join();
  grpc::Status s = stream->Finish();
  w.seconds = SecondsSince(start_ns);
  if (w.ok + w.failed < count && w.first_error.empty()) {
    w.first_error = absl::StrCat("the Write stream ended after ", w.ok + w.failed, " of ", count,
                                 " answers: code ", s.error_code(), ": ", s.error_message());
  }
  return w;
}

// Calls `each` for every object of `gvr` (of `shard` in the cache; "" in the shard store), every
// cluster, page by page; "" on success, else why not.
std::string ListEach(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                     const std::string& shard, absl::Duration timeout,
                     const std::function<void(const v1::Object&)>& each) {
  v1::ListRequest req;
  *req.mutable_resource() = gvr;
  req.set_shard(shard);
  req.set_limit(1000);
  do {
    v1::ListResponse page;
    grpc::Status s = stub->List(DeadlineContext(timeout).get(), req, &page);
    if (!s.ok()) {
      return absl::StrCat("list ", gvr.resource(), " in the ",
                          shard.empty() ? "shard store" : "cache", ": ", s.error_message());
    }
    for (const v1::Object& o : page.items()) each(o);
    req.set_continue_token(page.continue_token());
  } while (!req.continue_token().empty());
  return "";
}

class Run {
 public:
  Run(const CcrScaleOptions& options, CcrScaleResult* result)
      : options_(options), result_(result) {}

  // The whole run; its outcome goes into the result.
  void Go() {
    result_->setup_error = StartReplicatorProcesses(options_.processes, &d_);
    result_->ready_seconds = d_.ready_seconds;
    result_->leading_seconds = d_.leading_seconds;
    if (result_->setup_error.empty()) {
      absl::SleepFor(options_.settle);
      Read("idle", 0);
      result_->failure = Steps();
      result_->shard_end = ReadProcStats(d_.shard->pid());
      result_->cache_end = ReadProcStats(d_.cache->pid());
      result_->replicator_warnings = FindLogWarnings(d_.replicator->Log());
    }
    if (d_.replicator != nullptr && d_.replicator->Running()) {
      result_->replicator_exit = d_.replicator->Stop(absl::Seconds(60));
    }
    if (!result_->Verified()) {
      result_->logs =
          absl::StrCat(LogTail(d_.replicator.get(), "shard_replicator"),
                       LogTail(d_.shard.get(), "shard store"), LogTail(d_.cache.get(), "cache"));
    }
  }

 private:
  // Steps 2 to 4 (see the header); "" when every one succeeded, else what failed.
  std::string Steps() {
    const int resources = options_.resources;
    const int clusters = result_->clusters;
    const int64_t per = options_.objects_per_resource;
    for (int r = 0; r < resources; ++r) {
      std::string error =
          DefineResource(d_.shard_stub.get(), BenchResource(r), options_.rpc_timeout);
      if (!error.empty()) return error;
    }
    // Object k of resource r in cluster c is write (c * resources + r) * per + k.
    StreamWrites objects = WriteOverStream(
        d_.shard_stub.get(), result_->objects,
        [&](int64_t i) {
          int64_t k = i % per;
          int r = static_cast<int>((i / per) % resources);
          int c = static_cast<int>(i / per / resources);
          v1::WriteRequest w;
          *w.mutable_create() = MakeCreateRequest(options_.run_id, r, k, 0, r);
          w.mutable_create()->mutable_object()->mutable_metadata()->set_cluster(ClusterName(c));
          PadObject(w.mutable_create(), options_.object_bytes);
          return w;
        },
        options_.window, options_.write_timeout);
    result_->objects_seconds = objects.seconds;
    if (objects.ok != result_->objects) {
      return absl::StrCat(objects.ok, " of ", result_->objects,
                          " object creates succeeded: ", objects.first_error);
    }
    absl::SleepFor(options_.settle);
    Read("objects, no CCR", objects.seconds + absl::ToDoubleSeconds(options_.settle));

    // CCR i: cluster i / resources, resource i % resources.
    auto ccr_at = [resources](int64_t i) {
      return std::make_pair(ClusterName(static_cast<int>(i / resources)),
                            static_cast<int>(i % resources));
    };
    int64_t create_ns = NowNanos();
    StreamWrites creates = WriteOverStream(
        d_.shard_stub.get(), options_.ccrs,
        [&](int64_t i) {
          auto [cluster, r] = ccr_at(i);
          v1::WriteRequest w;
          *w.mutable_create()->mutable_resource() = CcrResource();
          v1::ObjectMeta* m = w.mutable_create()->mutable_object()->mutable_metadata();
          m->set_cluster(cluster);
          m->set_name(CcrName(r));
          auto& spec = *w.mutable_create()->mutable_object()->mutable_spec()->mutable_fields();
          v1::GroupVersionResource gvr = BenchResource(r);
          spec["group"].set_string_value(gvr.group());
          spec["version"].set_string_value(gvr.version());
          spec["resource"].set_string_value(gvr.resource());
          return w;
        },
        options_.window, options_.write_timeout);
    result_->create_seconds = creates.seconds;
    if (creates.ok != options_.ccrs) {
      return absl::StrCat(creates.ok, " of ", options_.ccrs,
                          " CCR creates succeeded: ", creates.first_error);
    }
    // The copies each (cluster, resource) pair should have.
    std::map<std::pair<std::string, int>, int64_t> expected;
    for (int c = 0; c < clusters; ++c) {
      for (int r = 0; r < resources; ++r) expected[{ClusterName(c), r}] = 0;
    }
    for (int64_t i = 0; i < options_.ccrs; ++i) expected[ccr_at(i)] = per;

    bool converged = PollUntil(
        [&] {
          ProcStats p = ReadProcStats(d_.replicator->pid());
          result_->peak_threads = std::max(result_->peak_threads, p.threads);
          CcrScaleCounts& n = result_->converge_counts;
          n = CountCcrs();
          if (!n.error.empty() || n.ccrs_ready < options_.ccrs) return false;
          if (result_->all_ready_seconds < 0) result_->all_ready_seconds = SecondsSince(create_ns);
          CountCopies(expected, &n);
          return n.error.empty() && n.wrong_pairs == 0 && n.copies == result_->expected_copies &&
                 n.ccr_copies == options_.ccrs;
        },
        options_.converge_timeout, kPollInterval);
    if (!converged) {
      const CcrScaleCounts& n = result_->converge_counts;
      std::string why =
          absl::StrCat("not converged within ", absl::FormatDuration(options_.converge_timeout),
                       ": ", n.ccrs_ready, " of ", options_.ccrs, " CCRs Ready");
      if (!n.not_ready.empty()) absl::StrAppend(&why, " (e.g. ", n.not_ready, ")");
      if (n.cache_listed) {
        absl::StrAppend(&why, "; ", n.copies, " of ", result_->expected_copies,
                        " copies in the cache, ", n.wrong_pairs,
                        " (cluster, resource) pairs not as expected, ", n.ccr_copies, " of ",
                        options_.ccrs, " CCR copies");
      } else {
        absl::StrAppend(&why, "; the cache not listed yet (it is, once every CCR is Ready)");
      }
      if (!n.error.empty()) absl::StrAppend(&why, "; ", n.error);
      return why;
    }
    result_->converged_seconds = SecondsSince(create_ns);
    Read("converged", result_->converged_seconds);

    int64_t delete_ns = NowNanos();
    StreamWrites deletes = WriteOverStream(
        d_.shard_stub.get(), options_.ccrs,
        [&](int64_t i) {
          auto [cluster, r] = ccr_at(i);
          v1::WriteRequest w;
          *w.mutable_delete_()->mutable_resource() = CcrResource();
          w.mutable_delete_()->set_cluster(cluster);
          w.mutable_delete_()->set_name(CcrName(r));
          return w;
        },
        options_.window, options_.write_timeout);
    result_->delete_seconds = deletes.seconds;
    if (deletes.ok != options_.ccrs) {
      return absl::StrCat(deletes.ok, " of ", options_.ccrs,
                          " CCR deletes succeeded: ", deletes.first_error);
    }
    for (auto& [pair, count] : expected) count = 0;
    bool gone = PollUntil(
        [&] {
          CcrScaleCounts& n = result_->delete_counts;
          n = CountCcrs();
          if (!n.error.empty() || n.ccrs > 0) return false;
          CountCopies(expected, &n);
          return n.error.empty() && n.copies == 0 && n.ccr_copies == 0;
        },
        options_.delete_timeout, kPollInterval);
    if (!gone) {
      const CcrScaleCounts& n = result_->delete_counts;
      return absl::StrCat("not cleaned up within ", absl::FormatDuration(options_.delete_timeout),
                          " of the deletes: ", n.ccrs, " CCRs left in the shard store, ", n.copies,
                          " copies and ", n.ccr_copies, " CCR copies in the cache",
                          n.error.empty() ? "" : "; ", n.error);
    }
    result_->gone_seconds = SecondsSince(delete_ns);
    int64_t gone_ns = NowNanos();
    int64_t threads = ReadProcStats(d_.replicator->pid()).threads;
    PollUntil(
        [&] {
          int64_t now = ReadProcStats(d_.replicator->pid()).threads;
          if (now != threads) result_->threads_changed_seconds = SecondsSince(gone_ns);
          threads = now;
          return false;
        },
        options_.settle, kPollInterval);
    Read("after delete", result_->gone_seconds + absl::ToDoubleSeconds(options_.settle));
    return "";
  }

  // The CCRs in the shard store, and how many are Ready.
  CcrScaleCounts CountCcrs() {
    CcrScaleCounts n;
    n.error = ListEach(
        d_.shard_stub.get(), CcrResource(), "", options_.rpc_timeout, [&n](const v1::Object& ccr) {
          ++n.ccrs;
          std::string phase = CcrPhase(ccr);
          if (phase == "Ready") {
            ++n.ccrs_ready;
          } else if (n.not_ready.empty()) {
            n.not_ready = absl::StrCat(ccr.metadata().cluster(), "/", ccr.metadata().name(),
                                       " phase \"", phase, "\"");
          }
        });
    return n;
  }

  // The copies in the cache against `expected` (copies per (cluster, resource) pair), and the
  // CCRs' copies.
  void CountCopies(const std::map<std::pair<std::string, int>, int64_t>& expected,
                   CcrScaleCounts* n) {
    std::map<std::pair<std::string, int>, int64_t> seen;
    for (int r = 0; r < options_.resources && n->error.empty(); ++r) {
      n->error = ListEach(d_.cache_stub.get(), BenchResource(r), kBenchShard, options_.rpc_timeout,
                          [&](const v1::Object& o) {
                            ++n->copies;
                            ++seen[{o.metadata().cluster(), r}];
                          });
    }
    if (!n->error.empty()) return;
    n->cache_listed = true;
    for (const auto& [pair, count] : expected) {
      auto it = seen.find(pair);
      n->wrong_pairs += (it == seen.end() ? 0 : it->second) != count ? 1 : 0;
    }
    for (const auto& [pair, count] : seen) n->wrong_pairs += expected.count(pair) == 0 ? 1 : 0;
    n->error = ListEach(d_.cache_stub.get(), CcrResource(), kBenchShard, options_.rpc_timeout,
                        [n](const v1::Object&) { ++n->ccr_copies; });
  }

  void Read(const std::string& phase, double seconds) {
    CcrScaleReading r;
    r.phase = phase;
    r.seconds = seconds;
    r.replicator = ReadProcStats(d_.replicator->pid());
    r.thread_names = ReadThreadNames(d_.replicator->pid());
    std::string page = testing::HttpGet(d_.replicator->http_port(), "/metrics");
    r.replication_controllers = ScrapeMetric(page, "shardcache_replicator_replication_controllers");
    constexpr char kInformers[] = "shardcache_informer_factory_informers";
    if (absl::StrContains(page, absl::StrCat("\n", kInformers, "{"))) {
      r.shard_informers = ScrapeMetric(page, kInformers, "factory=\"shard_store\"");
      r.cache_informers = ScrapeMetric(page, kInformers, "factory=\"cache\"");
    }
    result_->readings.push_back(std::move(r));
  }

  const CcrScaleOptions& options_;
  CcrScaleResult* const result_;
  ReplicatorProcesses d_;
};

}  // namespace

bool CcrScaleResult::Verified() const {
  return setup_error.empty() && failure.empty() && readings.size() == 4 && replicator_exit == 0;
}

CcrScaleResult RunCcrScale(const CcrScaleOptions& options) {
  CcrScaleResult result;
  result.clusters = (options.ccrs + options.resources - 1) / options.resources;
  result.objects =
      static_cast<int64_t>(result.clusters) * options.resources * options.objects_per_resource;
  result.expected_copies = static_cast<int64_t>(options.ccrs) * options.objects_per_resource;
  v1::CreateRequest sample = MakeCreateRequest(options.run_id, 0, options.objects_per_resource, 0);
  sample.mutable_object()->mutable_metadata()->set_cluster(ClusterName(result.clusters));
  PadObject(&sample, options.object_bytes);
  result.object_bytes_sent = static_cast<int64_t>(sample.object().ByteSizeLong());
  Run(options, &result).Go();
  return result;
}

}  // namespace shardcache::bench
