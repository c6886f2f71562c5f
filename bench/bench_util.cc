#include "bench/bench_util.h"

#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/testing/objects.h"

namespace shardcache::bench {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

LatencySummary Summarize(std::vector<int64_t>* samples_ns) {
  LatencySummary s;
  s.count = static_cast<int64_t>(samples_ns->size());
  if (samples_ns->empty()) return s;
  // Nearest-rank percentiles.
  auto rank = [&](double q) {
    size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(samples_ns->size())));
    k = std::clamp<size_t>(k, 1, samples_ns->size()) - 1;
    std::nth_element(samples_ns->begin(), samples_ns->begin() + k, samples_ns->end());
    return static_cast<double>((*samples_ns)[k]) / 1e6;
  };
  s.p50_ms = rank(0.50);
  s.p90_ms = rank(0.90);
  s.p99_ms = rank(0.99);
  s.max_ms = static_cast<double>(*std::max_element(samples_ns->begin(), samples_ns->end())) / 1e6;
  return s;
}

ProcStats ReadProcStats(pid_t pid) {
  ProcStats p;
  if (pid < 0) return p;
  std::string dir = pid == 0 ? "/proc/self" : absl::StrCat("/proc/", pid);
  std::ifstream status(dir + "/status");
  if (!status) return p;
  std::string line;
  int found = 0;
  while (std::getline(status, line)) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    absl::ConsumeSuffix(&value, " kB");
    int64_t* out = kv.first == "Threads" ? &p.threads
                   : kv.first == "VmRSS" ? &p.rss_kb
                   : kv.first == "VmHWM" ? &p.hwm_kb
                                         : nullptr;
    if (out != nullptr && absl::SimpleAtoi(value, out)) ++found;
  }
  // /proc/<pid>/stat: fields 14 and 15 (utime, stime) in clock ticks, after the ")" that ends
  // the command name.
  std::ifstream stat(dir + "/stat");
  std::stringstream ss;
  ss << stat.rdbuf();
  std::string text = ss.str();
  size_t close = text.rfind(')');
  if (close == std::string::npos) return p;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text).substr(close + 2), ' ', absl::SkipEmpty());
  int64_t utime = 0, stime = 0;
  // fields[0] is field 3 (state), so field n is fields[n - 3].
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return p;
  }
  p.cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  p.ok = found == 3;
  return p;
}

namespace {

// utime + stime from a /proc/.../stat file, in seconds; false if it cannot be read.
bool ReadStatCpu(const std::string& path, double* seconds) {
  std::ifstream stat(path);
  std::stringstream ss;
  ss << stat.rdbuf();
  std::string text = ss.str();
  size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) return false;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text).substr(close + 2), ' ', absl::SkipEmpty());
  int64_t utime = 0, stime = 0;
  // fields[0] is field 3 (state), so field n is fields[n - 3].
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return false;
  }
  *seconds = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  return true;
}

std::string ProcDir(pid_t pid) { return pid == 0 ? "/proc/self" : absl::StrCat("/proc/", pid); }

}  // namespace

std::map<pid_t, double> ReadThreadCpu(pid_t pid) {
  std::map<pid_t, double> cpu;
  if (pid < 0) return cpu;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(ProcDir(pid) + "/task", ec)) {
    pid_t tid = 0;
    double seconds = 0;
    if (absl::SimpleAtoi(entry.path().filename().string(), &tid) &&
        ReadStatCpu(entry.path().string() + "/stat", &seconds)) {
      cpu[tid] = seconds;
    }
  }
  return cpu;
}

BusiestThread FindBusiestThread(pid_t pid, const std::map<pid_t, double>& before,
                                const std::map<pid_t, double>& after, double seconds) {
  BusiestThread b;
  if (seconds <= 0) return b;
  pid_t busiest = -1;
  for (const auto& [tid, cpu] : after) {
    auto it = before.find(tid);
    double used = (cpu - (it == before.end() ? 0.0 : it->second)) / seconds;
    if (used > b.cores) {
      b.cores = used;
      busiest = tid;
    }
  }
  if (busiest <= 0) return b;
  auto name_of = [pid](pid_t tid) {
    std::ifstream comm(absl::StrCat(ProcDir(pid), "/task/", tid, "/comm"));
    std::string name;
    std::getline(comm, name);
    return name;
  };
  b.name = name_of(busiest);
  // Threads that share a name are told apart by their order of creation (thread ids rise).
  int rank = 0, same = 0;
  for (const auto& [tid, cpu] : after) {
    if (name_of(tid) != b.name) continue;
    if (tid < busiest) ++rank;
    ++same;
  }
  if (same > 1) absl::StrAppend(&b.name, "#", rank);
  return b;
}

std::map<std::string, int64_t> ReadThreadNames(pid_t pid) {
  std::map<std::string, int64_t> names;
  if (pid < 0) return names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(ProcDir(pid) + "/task", ec)) {
    std::ifstream comm(entry.path().string() + "/comm");
    std::string name;
    if (std::getline(comm, name)) ++names[name];
  }
  return names;
}

double CoresUsed(const ProcStats& before, const ProcStats& after, double seconds) {
  if (!before.ok || !after.ok || seconds <= 0) return 0;
  return (after.cpu_seconds - before.cpu_seconds) / seconds;
}

namespace {
std::shared_ptr<grpc::ChannelCredentials>& ChannelCredentials() {
  static auto* credentials = new std::shared_ptr<grpc::ChannelCredentials>();
  return *credentials;
}
}  // namespace

void SetChannelCredentials(std::shared_ptr<grpc::ChannelCredentials> credentials) {
  ChannelCredentials() = std::move(credentials);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index) {
  grpc::ChannelArguments args;
  // Distinct arguments keep gRPC from sharing one connection between the channels.
  args.SetInt("shardcache.bench.channel", index);
  args.SetMaxReceiveMessageSize(16 << 20);
  std::shared_ptr<grpc::ChannelCredentials> credentials = ChannelCredentials();
  return grpc::CreateCustomChannel(
      target, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args);
}

v1::GroupVersionResource BenchResource(int index) {
  v1::GroupVersionResource r;
  r.set_group("bench.shardcache.io");
  r.set_version("v1");
  r.set_resource(index == 0 ? std::string("widgets") : absl::StrCat("widgets", index));
  return r;
}

std::string BenchObjectName(const std::string& run, int client, int64_t seq) {
  return absl::StrCat("w-", run, "-", client, "-", seq);
}

v1::CreateRequest MakeCreateRequest(const std::string& run, int client, int64_t seq,
                                    int64_t sent_ns, int resource) {
  v1::CreateRequest req;
  *req.mutable_resource() = BenchResource(resource);
  v1::ObjectMeta* m = req.mutable_object()->mutable_metadata();
  m->set_cluster("bench");
  m->set_namespace_("default");
  m->set_name(BenchObjectName(run, client, seq));
  (*m->mutable_labels())["app.kubernetes.io/name"] = "store-bench";
  (*m->mutable_labels())["tier"] = "backend";
  (*m->mutable_labels())["client"] = absl::StrCat("c", client);
  auto& spec = *req.mutable_object()->mutable_spec()->mutable_fields();
  spec["run"].set_string_value(run);
  spec["seq"].set_number_value(static_cast<double>(seq));
  spec["sentNanos"].set_number_value(static_cast<double>(sent_ns));
  spec["replicas"].set_number_value(3);
  spec["image"].set_string_value("registry.example.com/bench/widget:1.4.2");
  spec["paused"].set_bool_value(false);
  auto& ports = *spec["ports"].mutable_list_value();
  for (int port : {8080, 8443}) ports.add_values()->set_number_value(port);
  return req;
}

void PadObject(v1::CreateRequest* request, int64_t object_bytes) {
  // Letters and digits: printable in JSON, and about 6 bits of entropy a byte.
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
  thread_local absl::InsecureBitGen gen;
  google::protobuf::Value& padding =
      (*request->mutable_object()->mutable_spec()->mutable_fields())["padding"];
  padding.set_string_value("");
  int64_t base = static_cast<int64_t>(request->object().ByteSizeLong());
  if (base >= object_bytes) return;
  // The length prefixes grow with the text, so shorten it by the few bytes they add.
  int64_t length = object_bytes - base;
  std::string text;
  for (int attempt = 0; attempt < 4; ++attempt) {
    text.resize(static_cast<size_t>(length));
    padding.set_string_value(text);
    int64_t over = static_cast<int64_t>(request->object().ByteSizeLong()) - object_bytes;
    if (over <= 0) break;
    length = std::max<int64_t>(0, length - over);
  }
  for (char& c : text) c = kAlphabet[absl::Uniform<size_t>(gen, 0, sizeof(kAlphabet) - 1)];
  padding.set_string_value(std::move(text));
}

bool ParseBenchSpec(const v1::Object& object, std::string* run, int64_t* seq, int64_t* sent_ns) {
  const auto& spec = object.spec().fields();
  auto r = spec.find("run");
  auto s = spec.find("seq");
  auto t = spec.find("sentNanos");
  if (r == spec.end() || s == spec.end() || t == spec.end()) return false;
  *run = r->second.string_value();
  *seq = static_cast<int64_t>(s->second.number_value());
  *sent_ns = static_cast<int64_t>(t->second.number_value());
  return true;
}

std::string QuotedCommandLine(int argc, char** argv) {
  std::vector<std::string> parts;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    bool plain = !a.empty() && a.find_first_not_of(
                                   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
                                   "VWXYZ0123456789-_=./:,@%+") == std::string::npos;
    if (plain) {
      parts.push_back(a);
    } else {
      parts.push_back(absl::StrCat("'", absl::StrJoin(absl::StrSplit(a, '\''), "'\\''"), "'"));
    }
  }
  return absl::StrJoin(parts, " ");
}

std::string FormatMs(double ms, int64_t count) {
  if (count == 0) return "n/a";
  return absl::StrFormat("%.2f", ms);
}

std::string FormatMiB(int64_t kb, bool ok) {
  if (!ok) return "n/a";
  return absl::StrFormat("%.1f", static_cast<double>(kb) / 1024.0);
}

DiskFlushes ReadDiskFlushes(const std::string& path) {
  DiskFlushes d;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return d;
  unsigned dev_major = major(st.st_dev), dev_minor = minor(st.st_dev);
  std::ifstream in("/proc/diskstats");
  std::string line;
  while (std::getline(in, line)) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    unsigned ma = 0, mi = 0;
    if (f.size() < 3 || !absl::SimpleAtoi(f[0], &ma) || !absl::SimpleAtoi(f[1], &mi) ||
        ma != dev_major || mi != dev_minor) {
      continue;
    }
    // Fields after the name: 4 read, 4 write, 3 in-flight/time, 4 discard, then 2 flush
    // (completed, milliseconds).
    d.device = std::string(f[2]);
    d.ok = f.size() >= 3 + 17 && absl::SimpleAtoi(f[3 + 15], &d.flushes);
    return d;
  }
  return d;
}

DiskUsage ReadDiskUsage(const std::string& path) {
  DiskUsage u;
  std::error_code ec;
  auto it = std::filesystem::recursive_directory_iterator(path, ec);
  if (ec) return u;
  for (const auto& entry : it) {
    struct stat st;
    if (lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    u.allocated_bytes += static_cast<int64_t>(st.st_blocks) * 512;
    u.apparent_bytes += static_cast<int64_t>(st.st_size);
    ++u.files;
  }
  u.ok = true;
  return u;
}

std::string FilesystemDescription(const std::string& path) {
  struct statfs fs;
  if (statfs(path.c_str(), &fs) != 0) return "unknown";
  std::string type;
  switch (static_cast<uint64_t>(fs.f_type)) {
    case 0xEF53:
      type = "ext2/3/4";
      break;
    case 0x58465342:
      type = "xfs";
      break;
    case 0x9123683E:
      type = "btrfs";
      break;
    case 0x01021994:
      type = "tmpfs";
      break;
    case 0x794C7630:
      type = "overlayfs";
      break;
    default:
      type = absl::StrFormat("0x%x", static_cast<uint64_t>(fs.f_type));
  }
  // The mount whose mount point is the longest prefix of the path.
  std::error_code ec;
  std::string real = std::filesystem::weakly_canonical(path, ec).string();
  std::ifstream in("/proc/self/mounts");
  std::string line, best_point, best;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() < 4) continue;
    const std::string& point = f[1];
    bool under =
        real == point || point == "/" ||
        (absl::StartsWith(real, point) && real.size() > point.size() && real[point.size()] == '/');
    if (under && point.size() >= best_point.size()) {
      best_point = point;
      best = absl::StrCat(f[2], " on ", f[0], " mounted at ", point, " (", f[3], ")");
    }
  }
  return best.empty() ? type : best;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one.empty() ? "n/a" : one;
}

std::unique_ptr<grpc::ClientContext> DeadlineContext(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

std::string CreateFromJson(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                           const std::string& json, absl::Duration timeout) {
  v1::CreateRequest req;
  *req.mutable_resource() = gvr;
  if (!google::protobuf::util::JsonStringToMessage(json, req.mutable_object()).ok()) {
    return absl::StrCat("bad JSON: ", json);
  }
  v1::Object out;
  grpc::Status s = stub->Create(DeadlineContext(timeout).get(), req, &out);
  return s.ok() ? "" : absl::StrCat("create ", gvr.resource(), ": ", s.error_message());
}

std::string DefineResource(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                           absl::Duration timeout) {
  return CreateFromJson(
      stub, testing::Gvr("core.shardcache.io", "v1", "resourcedefinitions"),
      absl::StrCat(R"({"metadata":{"name":")", gvr.resource(), ".", gvr.group(),
                   R"("},"spec":{"group":")", gvr.group(), R"(","names":{"plural":")",
                   gvr.resource(), R"("},"scope":"Namespaced","versions":[{"name":")",
                   gvr.version(), R"(","served":true}]}})"),
      timeout);
}

v1::GroupVersionResource CcrResource() {
  return testing::Gvr("cache.shardcache.io", "v1alpha1", "clustercachedresources");
}

std::string CcrJson(const std::string& cluster, const std::string& name,
                    const v1::GroupVersionResource& gvr) {
  return absl::StrCat(R"({"metadata":{"cluster":")", cluster, R"(","name":")", name,
                      R"("},"spec":{"group":")", gvr.group(), R"(","version":")", gvr.version(),
                      R"(","resource":")", gvr.resource(), R"("}})");
}

std::string CcrPhase(const v1::Object& ccr) {
  auto it = ccr.status().fields().find("phase");
  return it == ccr.status().fields().end() ? "" : it->second.string_value();
}

bool PollUntil(const std::function<bool()>& cond, absl::Duration timeout, absl::Duration interval) {
  absl::Time deadline = absl::Now() + timeout;
  while (!cond()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(interval);
  }
  return true;
}

double ScrapeMetric(const std::string& page, const std::string& name, const std::string& label) {
  if (!absl::StartsWith(page, "200\n")) return -1;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::ConsumePrefix(&line, name) || line.empty() || (line[0] != ' ' && line[0] != '{')) {
      continue;
    }
    size_t space = line.rfind(' ');
    double value = 0;
    if (space != absl::string_view::npos && absl::StrContains(line.substr(0, space), label) &&
        absl::SimpleAtod(line.substr(space + 1), &value)) {
      total += value;
    }
  }
  return total;
}

double ReplicatorLeading(int http_port) {
  std::string page = testing::HttpGet(http_port, "/metrics");
  return absl::StrContains(page, "\nshardcache_leader_election_leading")
             ? ScrapeMetric(page, "shardcache_leader_election_leading")
             : -1;
}

std::string StartReplicatorProcesses(const ReplicatorProcessOptions& options,
                                     ReplicatorProcesses* out) {
  auto store_args = [&options](const char* role) {
    std::vector<std::string> args = {absl::StrCat("--role=", role)};
    args.insert(args.end(), options.server_args.begin(), options.server_args.end());
    return args;
  };
  out->cache = std::make_unique<testing::ServerProcess>(options.cache_server, store_args("cache"));
  out->shard = std::make_unique<testing::ServerProcess>(options.cache_server, store_args("shard"));
  for (auto* p : {out->cache.get(), out->shard.get()}) {
    if (absl::Status s = p->Start(options.start_timeout); !s.ok()) {
      return absl::StrCat("cannot start cache_server: ", s.message());
    }
  }
  out->cache_stub = v1::Store::NewStub(MakeChannel(out->cache->grpc_address(), 0));
  out->shard_stub = v1::Store::NewStub(MakeChannel(out->shard->grpc_address(), 0));

  std::vector<std::string> args = {absl::StrCat("--shard=", kBenchShard),
                                   absl::StrCat("--shard-store=", out->shard->grpc_address()),
                                   absl::StrCat("--cache=", out->cache->grpc_address()),
                                   "--identity=bench-0",
                                   "--lease-duration=3s",
                                   "--renew-deadline=2s",
                                   "--retry-period=500ms"};
  args.insert(args.end(), options.replicator_args.begin(), options.replicator_args.end());
  out->replicator = std::make_unique<testing::ServerProcess>(options.replicator, args);
  int64_t start_ns = NowNanos();
  auto since_start = [start_ns] { return static_cast<double>(NowNanos() - start_ns) / 1e9; };
  if (absl::Status s = out->replicator->Start(options.start_timeout); !s.ok()) {
    return absl::StrCat("cannot start shard_replicator: ", s.message());
  }
  int port = out->replicator->http_port();
  if (!PollUntil([port] { return absl::StartsWith(testing::HttpGet(port, "/readyz"), "200\n"); },
                 options.setup_timeout)) {
    return "shard_replicator's /readyz did not answer 200 in time";
  }
  out->ready_seconds = since_start();
  if (!PollUntil([port] { return ReplicatorLeading(port) == 1; }, options.setup_timeout)) {
    return "shard_replicator did not lead in time (shardcache_leader_election_leading)";
  }
  out->leading_seconds = since_start();
  return "";
}

LogWarnings FindLogWarnings(const std::string& log, int keep) {
  LogWarnings w;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (!absl::StrContains(line, "warn") && !absl::StrContains(line, "error")) continue;
    if (++w.count <= keep) w.first.emplace_back(line.substr(0, 300));
  }
  return w;
}

std::string LogTail(const testing::ServerProcess* process, const std::string& what) {
  if (process == nullptr) return "";
  std::string log = process->Log();
  if (log.size() > 3000) log = "..." + log.substr(log.size() - 3000);
  return absl::StrCat("--- ", what, " log (tail) ---\n", log, "---\n");
}

}  // namespace shardcache::bench
