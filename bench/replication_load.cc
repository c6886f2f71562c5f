#include "bench/replication_load.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/write_load.h"
#include "common/testing/server_process.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::bench {
namespace {

constexpr char kCluster[] = "root";
constexpr char kCcrName[] = "bench-widgets";
constexpr char kInitialEventsEnd[] = "k8s.io/initial-events-end";
constexpr char kOriginalRv[] = "cache.shardcache.io/original-resource-version";

// "w-<run>-0-": the start of the name of each of the run's objects (then their index).
std::string NamePrefix(const std::string& run_id) {
  std::string name = BenchObjectName(run_id, 0, 0);
  name.pop_back();
  return name;
}

// Every series of metric `name` on a /metrics page: its labels ("code=\"X\"") -> value.
std::map<std::string, double> MetricSeries(const std::string& page, const std::string& name) {
  std::map<std::string, double> series;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    double value = 0;
    if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, "{") &&
        line.find('}') != absl::string_view::npos &&
        absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
      series[std::string(line.substr(0, line.find('}')))] += value;
    }
  }
  return series;
}

double Delta(double before, double after) { return before < 0 || after < 0 ? -1 : after - before; }

// Every object of the benchmark resource in cluster root (of `shard` in the cache; "" for the
// shard store) whose name starts with `prefix`: name -> the object's resourceVersion (shard
// store) or its original-resource-version annotation (cache).
bool ListVersions(v1::Store::Stub* stub, const std::string& shard, const std::string& prefix,
                  absl::Duration timeout, std::unordered_map<std::string, std::string>* out,
                  std::string* error) {
  v1::ListRequest req;
  *req.mutable_resource() = BenchResource();
  req.set_shard(shard);
  req.set_cluster(kCluster);
  req.set_limit(1000);
  do {
    v1::ListResponse page;
    grpc::Status s = stub->List(DeadlineContext(timeout).get(), req, &page);
    if (!s.ok()) {
      *error =
          absl::StrCat("list ", shard.empty() ? "shard store" : "cache", ": ", s.error_message());
      return false;
    }
    for (const v1::Object& o : page.items()) {
      const v1::ObjectMeta& m = o.metadata();
      if (!absl::StartsWith(m.name(), prefix)) continue;
      if (shard.empty()) {
        (*out)[m.name()] = m.resource_version();
      } else {
        auto it = m.annotations().find(kOriginalRv);
        (*out)[m.name()] = it == m.annotations().end() ? "" : it->second;
      }
    }
    req.set_continue_token(page.continue_token());
  } while (!req.continue_token().empty());
  return true;
}

SyncCheck CheckSync(v1::Store::Stub* shard, v1::Store::Stub* cache, const std::string& prefix,
                    absl::Duration timeout) {
  SyncCheck c;
  std::unordered_map<std::string, std::string> local, copies;
  if (!ListVersions(shard, "", prefix, timeout, &local, &c.error) ||
      !ListVersions(cache, kBenchShard, prefix, timeout, &copies, &c.error)) {
    return c;
  }
  c.ok = true;
  c.local = static_cast<int64_t>(local.size());
  c.copies = static_cast<int64_t>(copies.size());
  for (const auto& [name, rv] : local) {
    auto it = copies.find(name);
    if (it == copies.end()) {
      ++c.missing;
    } else if (it->second == rv) {
      ++c.in_sync;
    } else {
      ++c.stale;
    }
  }
  for (const auto& [name, rv] : copies) c.extra += local.count(name) == 0 ? 1 : 0;
  return c;
}

// The cache watch: one stream, read by its own thread. For the current pass it keeps, per
// object, when the first event of the pass's type arrived.
class CacheWatch {
 public:
  struct PassEvents {
    std::vector<int64_t> receipt_ns;  // by object index; 0: no event of the pass's type
    int64_t duplicates = 0;
    int64_t other = 0;
  };

  CacheWatch(v1::Store::Stub* stub, const std::string& run_id, int64_t objects,
             absl::Duration lifetime)
      : prefix_(NamePrefix(run_id)), objects_(objects) {
    v1::WatchRequest req;
    *req.mutable_resource() = BenchResource();
    req.set_shard(kBenchShard);
    req.set_cluster(kCluster);
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + lifetime));
    reader_ = stub->Watch(&ctx_, req);
    thread_ = std::thread([this] { Run(); });
  }
  ~CacheWatch() {
    ctx_.TryCancel();
    thread_.join();
  }

  bool WaitForInitialEvents(absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return synced_ || ended_; };
    mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
    return synced_;
  }

  void BeginPass(v1::WatchEvent::Type type) {
    absl::MutexLock l(&mu_);
    type_ = type;
    pass_ = PassEvents();
    pass_.receipt_ns.assign(static_cast<size_t>(objects_), 0);
    seen_ = 0;
  }

  // Waits until `count` objects have had an event of the pass's type; false on timeout or if
  // the stream ended.
  bool WaitForPass(int64_t count, absl::Time deadline) {
    absl::MutexLock l(&mu_);
    auto done = [this, count]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_ >= count || ended_; };
    mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
    return seen_ >= count;
  }

  PassEvents EndPass() {
    absl::MutexLock l(&mu_);
    type_ = v1::WatchEvent::TYPE_UNSPECIFIED;
    return std::move(pass_);
  }

  // "" while the stream is open (or was cancelled by the destructor).
  std::string Error() {
    absl::MutexLock l(&mu_);
    return error_;
  }
  int64_t foreign() {
    absl::MutexLock l(&mu_);
    return foreign_;
  }

 private:
  void Run() {
    v1::WatchEvent e;
    while (reader_->Read(&e)) Handle(e, NowNanos());
    grpc::Status s = reader_->Finish();
    absl::MutexLock l(&mu_);
    ended_ = true;
    if (s.error_code() != grpc::StatusCode::CANCELLED) {
      error_ =
          absl::StrCat("the cache watch ended: code ", s.error_code(), ": ", s.error_message());
    }
  }

  void Handle(const v1::WatchEvent& e, int64_t now) {
    const v1::ObjectMeta& m = e.object().metadata();
    absl::MutexLock l(&mu_);
    if (e.type() == v1::WatchEvent::BOOKMARK) {
      auto it = m.annotations().find(kInitialEventsEnd);
      if (it != m.annotations().end() && it->second == "true") synced_ = true;
      return;
    }
    absl::string_view name = m.name();
    int64_t index = -1;
    if (m.shard() != kBenchShard || !absl::ConsumePrefix(&name, prefix_) ||
        !absl::SimpleAtoi(name, &index) || index < 0 || index >= objects_) {
      ++foreign_;
      return;
    }
    if (type_ == v1::WatchEvent::TYPE_UNSPECIFIED) return;  // between passes
    if (e.type() != type_) {
      ++pass_.other;
      return;
    }
    int64_t& slot = pass_.receipt_ns[static_cast<size_t>(index)];
    if (slot != 0) {
      ++pass_.duplicates;
      return;
    }
    slot = now;
    ++seen_;
  }

  const std::string prefix_;
  const int64_t objects_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader_;
  std::thread thread_;

  absl::Mutex mu_;
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  int64_t foreign_ ABSL_GUARDED_BY(mu_) = 0;
  v1::WatchEvent::Type type_ ABSL_GUARDED_BY(mu_) = v1::WatchEvent::TYPE_UNSPECIFIED;
  PassEvents pass_ ABSL_GUARDED_BY(mu_);
  int64_t seen_ ABSL_GUARDED_BY(mu_) = 0;
};

// The processes of one run, their clients, and the channels of the local writes.
struct Deployment : ReplicatorProcesses {
  std::vector<std::shared_ptr<grpc::Channel>> write_channels;
};

struct Readings {
  ProcStats replicator, shard, cache, self;
  std::map<pid_t, double> replicator_threads;
  double upserts = -1, deletes = -1, write_errors = -1, lag_sum = -1, lag_count = -1;
};

void ReadCounters(const Deployment& d, Readings* r);

// The processes' CPU and memory, and the replicator's counters.
Readings Read(const Deployment& d) {
  Readings r;
  r.replicator = ReadProcStats(d.replicator->pid());
  r.shard = ReadProcStats(d.shard->pid());
  r.cache = ReadProcStats(d.cache->pid());
  r.self = ReadProcStats(0);
  r.replicator_threads = ReadThreadCpu(d.replicator->pid());
  ReadCounters(d, &r);
  return r;
}

// The replicator's counters alone.
void ReadCounters(const Deployment& d, Readings* r) {
  std::string page = testing::HttpGet(d.replicator->http_port(), "/metrics");
  r->upserts = ScrapeMetric(page, "shardcache_replicator_writes_total", "\"upsert\"");
  r->deletes = ScrapeMetric(page, "shardcache_replicator_writes_total", "\"delete\"");
  r->write_errors = ScrapeMetric(page, "shardcache_replicator_write_errors_total");
  r->lag_sum = ScrapeMetric(page, "shardcache_replicator_replication_lag_seconds_sum");
  r->lag_count = ScrapeMetric(page, "shardcache_replicator_replication_lag_seconds_count");
}

ReplicationPass RunPass(const ReplicationLoadOptions& options, const Deployment& d,
                        CacheWatch* watch, WriteLoadOptions::Operation operation) {
  ReplicationPass pass;
  v1::WatchEvent::Type type = v1::WatchEvent::ADDED;
  pass.name = "create";
  if (operation == WriteLoadOptions::Operation::kUpdate) {
    type = v1::WatchEvent::MODIFIED;
    pass.name = "update";
  } else if (operation == WriteLoadOptions::Operation::kDelete) {
    type = v1::WatchEvent::DELETED;
    pass.name = "delete";
  }
  pass.event = v1::WatchEvent::Type_Name(type);
  const auto n = static_cast<size_t>(options.objects);
  // When each object's local write was answered OK (0: not, or not OK).
  std::vector<std::atomic<int64_t>> answered(n);

  WriteLoadOptions w;
  w.api = WriteLoadOptions::Api::kStream;
  w.clients = options.streams;
  w.window = options.window;
  w.warmup = absl::ZeroDuration();
  w.duration = options.write_timeout;
  w.total_writes = options.objects;
  w.object_bytes = options.object_bytes;
  w.rpc_timeout = options.rpc_timeout;
  w.run_id = options.run_id;
  w.server_pid = d.shard->pid();
  w.operation = operation;
  w.name_by_index = true;
  w.cluster = kCluster;
  w.on_answer = [&answered](int64_t index, int64_t answered_ns, int code) {
    if (code == 0 && index >= 0 && index < static_cast<int64_t>(answered.size())) {
      answered[static_cast<size_t>(index)].store(answered_ns);
    }
  };

  watch->BeginPass(type);
  Readings before = Read(d);
  int64_t start_ns = NowNanos();
  WriteLoadResult r = RunWriteLoad(w, d.write_channels);
  pass.writes_ok = r.ok;
  pass.write_errors = r.errors + (r.clean_exit ? 0 : 1);
  pass.error_samples = r.error_samples;
  pass.write_latency = r.latency;
  int64_t last_answer_ns = start_ns;
  int64_t answered_ok = 0;
  for (const auto& a : answered) {
    int64_t t = a.load();
    if (t == 0) continue;
    ++answered_ok;
    last_answer_ns = std::max(last_answer_ns, t);
  }
  pass.write_seconds = static_cast<double>(last_answer_ns - start_ns) / 1e9;

  watch->WaitForPass(answered_ok, absl::Now() + options.drain_timeout);
  int64_t end_ns = NowNanos();
  Readings after = Read(d);
  CacheWatch::PassEvents events = watch->EndPass();

  std::vector<int64_t> lags;
  lags.reserve(n);
  int64_t last_event_ns = start_ns;
  for (size_t i = 0; i < n; ++i) {
    int64_t ack = answered[i].load(), seen = events.receipt_ns[i];
    if (ack == 0 || seen == 0) continue;
    lags.push_back(seen - ack);
    last_event_ns = std::max(last_event_ns, seen);
  }
  pass.events_seen = static_cast<int64_t>(lags.size());
  pass.complete = pass.events_seen == answered_ok && answered_ok == options.objects;
  pass.duplicates = events.duplicates;
  pass.other_events = events.other;
  pass.lag = Summarize(&lags);
  pass.end_to_end_seconds = static_cast<double>(last_event_ns - start_ns) / 1e9;
  pass.drain_seconds = static_cast<double>(last_event_ns - last_answer_ns) / 1e9;
  for (size_t i = 0; i < n; ++i) {
    pass.drain_events += answered[i].load() != 0 && events.receipt_ns[i] > last_answer_ns ? 1 : 0;
  }

  double seconds = static_cast<double>(end_ns - start_ns) / 1e9;
  pass.replicator_cores = CoresUsed(before.replicator, after.replicator, seconds);
  pass.shard_cores = CoresUsed(before.shard, after.shard, seconds);
  pass.cache_cores = CoresUsed(before.cache, after.cache, seconds);
  pass.bench_cores = CoresUsed(before.self, after.self, seconds);
  pass.replicator_busiest = FindBusiestThread(d.replicator->pid(), before.replicator_threads,
                                              after.replicator_threads, seconds);
  pass.replicator_after = after.replicator;
  // The replicator counts a write when its answer has been handled, which can be after the watch
  // delivered the change: give the counters a moment (at most 5 s) to take in every write.
  PollUntil(
      [&] {
        ReadCounters(d, &after);
        return Delta(before.upserts, after.upserts) + Delta(before.deletes, after.deletes) >=
               static_cast<double>(pass.events_seen);
      },
      absl::Seconds(5));
  pass.replicator_upserts = Delta(before.upserts, after.upserts);
  pass.replicator_deletes = Delta(before.deletes, after.deletes);
  pass.replicator_write_errors = Delta(before.write_errors, after.write_errors);
  double lag_count = Delta(before.lag_count, after.lag_count);
  if (lag_count > 0) {
    pass.replicator_lag_mean_ms = Delta(before.lag_sum, after.lag_sum) / lag_count * 1e3;
  }
  pass.check = CheckSync(d.shard_stub.get(), d.cache_stub.get(), NamePrefix(options.run_id),
                         options.rpc_timeout);
  return pass;
}

// Starts the three processes and prepares the CCR; "" on success, else what failed.
std::string SetUp(const ReplicationLoadOptions& options, Deployment* d,
                  ReplicationLoadResult* result) {
  ReplicatorProcessOptions p;
  p.cache_server = options.cache_server;
  p.replicator = options.replicator;
  p.server_args = options.server_args;
  p.replicator_args = options.replicator_args;
  p.start_timeout = options.start_timeout;
  p.setup_timeout = options.setup_timeout;
  std::string error = StartReplicatorProcesses(p, d);
  result->ready_seconds = d->ready_seconds;
  result->leading_seconds = d->leading_seconds;
  if (!error.empty()) return error;
  for (int i = 0; i < std::min(options.streams, 8); ++i) {
    d->write_channels.push_back(MakeChannel(d->shard->grpc_address(), i + 1));
  }

  v1::GroupVersionResource res = BenchResource();
  error = DefineResource(d->shard_stub.get(), res, options.rpc_timeout);
  if (!error.empty()) return error;
  v1::GroupVersionResource ccr_gvr = CcrResource();
  int64_t ccr_ns = NowNanos();
  error = CreateFromJson(d->shard_stub.get(), ccr_gvr, CcrJson(kCluster, kCcrName, res),
                         options.rpc_timeout);
  if (!error.empty()) return error;
  std::string phase;
  auto ready = [&] {
    v1::GetRequest req;
    *req.mutable_resource() = ccr_gvr;
    req.set_cluster(kCluster);
    req.set_name(kCcrName);
    v1::Object ccr;
    if (!d->shard_stub->Get(DeadlineContext(options.rpc_timeout).get(), req, &ccr).ok())
      return false;
    phase = CcrPhase(ccr);
    return phase == "Ready";
  };
  if (!PollUntil(ready, options.setup_timeout)) {
    return absl::StrCat("the CCR did not become Ready in time (phase \"", phase, "\")");
  }
  result->ccr_ready_seconds = static_cast<double>(NowNanos() - ccr_ns) / 1e9;
  return "";
}

}  // namespace

bool ReplicationLoadResult::Verified() const {
  if (!setup_error.empty() || !watch_error.empty() || passes.size() != 3 || replicator_exit != 0) {
    return false;
  }
  for (const ReplicationPass& p : passes) {
    if (!p.complete || p.write_errors != 0 || !p.check.ok || p.check.missing != 0 ||
        p.check.stale != 0 || p.check.extra != 0) {
      return false;
    }
  }
  return true;
}

ReplicationLoadResult RunReplicationLoad(const ReplicationLoadOptions& options) {
  ReplicationLoadResult result;
  v1::CreateRequest sample = MakeCreateRequest(options.run_id, 0, options.objects, 0);
  sample.mutable_object()->mutable_metadata()->set_cluster(kCluster);
  PadObject(&sample, options.object_bytes);
  result.object_bytes_sent = static_cast<int64_t>(sample.object().ByteSizeLong());

  Deployment d;
  result.setup_error = SetUp(options, &d, &result);
  std::unique_ptr<CacheWatch> watch;
  if (result.setup_error.empty()) {
    absl::Duration lifetime = options.setup_timeout +
                              3 * (options.write_timeout + options.drain_timeout) +
                              absl::Minutes(5);
    watch =
        std::make_unique<CacheWatch>(d.cache_stub.get(), options.run_id, options.objects, lifetime);
    if (!watch->WaitForInitialEvents(options.setup_timeout)) {
      result.setup_error = absl::StrCat("the cache watch did not send its initial events in time",
                                        watch->Error().empty() ? "" : ": ", watch->Error());
    }
  }
  if (result.setup_error.empty()) {
    result.replicator_idle = ReadProcStats(d.replicator->pid());
    for (auto op : {WriteLoadOptions::Operation::kCreate, WriteLoadOptions::Operation::kUpdate,
                    WriteLoadOptions::Operation::kDelete}) {
      result.passes.push_back(RunPass(options, d, watch.get(), op));
      if (!result.passes.back().complete) break;  // the next pass would measure a backlog
    }
    result.replicator_end = ReadProcStats(d.replicator->pid());
    result.shard_end = ReadProcStats(d.shard->pid());
    result.cache_end = ReadProcStats(d.cache->pid());
    result.replicator_errors_by_code =
        MetricSeries(testing::HttpGet(d.replicator->http_port(), "/metrics"),
                     "shardcache_replicator_write_errors_total");
    LogWarnings warnings = FindLogWarnings(d.replicator->Log());
    result.replicator_warning_count = warnings.count;
    result.replicator_warnings = std::move(warnings.first);
    result.watch_error = watch->Error();
    result.foreign_events = watch->foreign();
  }
  watch.reset();
  if (d.replicator != nullptr && d.replicator->Running()) {
    result.replicator_exit = d.replicator->Stop(absl::Seconds(30));
  }
  if (!result.Verified()) {
    result.logs =
        absl::StrCat(LogTail(d.replicator.get(), "shard_replicator"),
                     LogTail(d.shard.get(), "shard store"), LogTail(d.cache.get(), "cache"));
  }
  return result;
}

}  // namespace shardcache::bench
