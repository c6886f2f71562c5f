// Helpers shared by store_bench's loads: the clock, latency summaries, readings of a process's
// /proc status and of the disk (flushes, space, filesystem), channels, the object that every
// benchmark write carries, and the processes of the replicator's benchmarks (a cache, shard "a"'s
// store and one shard_replicator between them).
//
// Thread-safety: every function is thread-safe (none keeps state). A ReplicatorProcesses is
// thread-compatible, as the ServerProcesses it holds.
#ifndef SHARDCACHE_BENCH_BENCH_UTIL_H_
#define SHARDCACHE_BENCH_BENCH_UTIL_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/testing/server_process.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::bench {

// Nanoseconds on the steady clock. Only differences taken in one process mean anything.
int64_t NowNanos();

// Order statistics of a set of latencies, in milliseconds.
struct LatencySummary {
  int64_t count = 0;
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
};

// Summarizes `samples_ns` (nanoseconds; negative values allowed). Reorders the vector.
LatencySummary Summarize(std::vector<int64_t>* samples_ns);

// What /proc/<pid>/status and /proc/<pid>/stat say about a process at one moment.
struct ProcStats {
  bool ok = false;  // false: the process could not be read (gone, or no pid known)
  int64_t threads = 0;
  int64_t rss_kb = 0;      // VmRSS
  int64_t hwm_kb = 0;      // VmHWM, the peak RSS so far
  double cpu_seconds = 0;  // user + system time so far
};

// Reads the stats of process `pid`; pid 0 means this process. A pid < 0 gives !ok.
ProcStats ReadProcStats(pid_t pid);

// CPU seconds (user + system) used so far by each thread of process `pid` (0: this process),
// by thread id; empty if the process cannot be read.
std::map<pid_t, double> ReadThreadCpu(pid_t pid);

// The thread that used the most CPU between two ReadThreadCpu readings taken `seconds` apart:
// its average in cores, and its name (/proc/<pid>/task/<tid>/comm, read now), followed by "#k"
// when k threads of that name were created before it (thread ids rise; wrap-around aside).
struct BusiestThread {
  double cores = 0;
  std::string name;
};
BusiestThread FindBusiestThread(pid_t pid, const std::map<pid_t, double>& before,
                                const std::map<pid_t, double>& after, double seconds);

// How many threads of process `pid` (0: this process) bear each name
// (/proc/<pid>/task/<tid>/comm: at most 15 bytes; a thread that was never named bears the
// process's own name, cut to 15 bytes); empty if the process cannot be read.
std::map<std::string, int64_t> ReadThreadNames(pid_t pid);

// CPU cores that a process used on average between two readings taken `seconds` apart.
double CoresUsed(const ProcStats& before, const ProcStats& after, double seconds);

// A channel to `target` that shares no connection with channels of other `index`es, over the
// credentials of SetChannelCredentials (plaintext unless set).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index);
// The credentials MakeChannel uses from now on (null: plaintext). Call before the load starts.
void SetChannelCredentials(std::shared_ptr<grpc::ChannelCredentials> credentials);

// Bench resource `index` (group bench.shardcache.io, version v1): resource "widgets" for index 0
// (every load but --mode=watch --resources=N uses only it), "widgets<index>" for the others. The
// cache role serves any resource, so none needs a ResourceDefinition.
v1::GroupVersionResource BenchResource(int index = 0);

// The name MakeCreateRequest gives the object of `run`, `client` and `seq`:
// "w-<run>-<client>-<seq>".
std::string BenchObjectName(const std::string& run, int client, int64_t seq);

// A Create request for a small (about 300 bytes) object named after `run`, `client` and `seq`,
// whose spec carries `run`, `seq` and `sent_ns` (the sender's NowNanos()) so that a watcher can
// tell its latency, in bench resource `resource`.
v1::CreateRequest MakeCreateRequest(const std::string& run, int client, int64_t seq,
                                    int64_t sent_ns, int resource = 0);

// Adds a spec field "padding" of random text to `request` so that its object serializes to about
// `object_bytes` bytes (within a few bytes; never less than it was). Random text, so that the
// store's compression cannot shrink it away.
void PadObject(v1::CreateRequest* request, int64_t object_bytes);

// The fields MakeCreateRequest put in an object's spec; false if they are not all there.
bool ParseBenchSpec(const v1::Object& object, std::string* run, int64_t* seq, int64_t* sent_ns);

// Cache flushes (REQ_PREFLUSH requests, which fsync and fdatasync cause) that the block device
// holding `path` has completed since boot, from /proc/diskstats (Linux 5.5 and later). The count
// is for the whole device: other processes' syncs are in it too.
struct DiskFlushes {
  bool ok = false;     // false: the device was not found (tmpfs, overlay) or has no flush count
  std::string device;  // e.g. "vda"
  int64_t flushes = 0;
};
DiskFlushes ReadDiskFlushes(const std::string& path);

// Space that the files under `path` use: allocated on disk (as du counts it) and their sizes.
struct DiskUsage {
  bool ok = false;
  int64_t allocated_bytes = 0;
  int64_t apparent_bytes = 0;
  int64_t files = 0;
};
DiskUsage ReadDiskUsage(const std::string& path);

// The type of the filesystem that holds `path` ("ext4", "xfs", "tmpfs", ... or the magic number
// in hex), and its mount options from /proc/self/mounts where they can be found.
std::string FilesystemDescription(const std::string& path);

// The command line, quoted so that a shell runs it as it was given.
std::string QuotedCommandLine(int argc, char** argv);

// "1.23" for a count of milliseconds; "n/a" for a summary with no samples.
std::string FormatMs(double ms, int64_t count = 1);

// Mebibytes from kibibytes, "n/a" when !ok.
std::string FormatMiB(int64_t kb, bool ok);

// The load average over the last minute, from /proc/loadavg ("n/a" if it cannot be read).
std::string LoadAverage();

// --- Calls, polls and /metrics ---

// A client context whose deadline is `timeout` from now.
std::unique_ptr<grpc::ClientContext> DeadlineContext(absl::Duration timeout);

// Creates the object whose JSON (proto3 JSON mapping of v1.Object) is `json` in `gvr`; "" on
// success, else why not.
std::string CreateFromJson(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                           const std::string& json, absl::Duration timeout);

// Creates a ResourceDefinition in a shard store that defines `gvr`, namespaced, with its one
// version served; "" on success, else why not.
std::string DefineResource(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                           absl::Duration timeout);

// cache.shardcache.io/v1alpha1 clustercachedresources.
v1::GroupVersionResource CcrResource();
// The JSON of a ClusterCachedResource named `name` in logical cluster `cluster` that asks for every
// object of `gvr` in that cluster.
std::string CcrJson(const std::string& cluster, const std::string& name,
                    const v1::GroupVersionResource& gvr);
// A CCR's status.phase ("" when it has none yet).
std::string CcrPhase(const v1::Object& ccr);

// Polls `cond` every `interval` until it holds (true) or `timeout` passes (false).
bool PollUntil(const std::function<bool()>& cond, absl::Duration timeout,
               absl::Duration interval = absl::Milliseconds(50));

// The sum of the series of metric `name` (exactly; any labels) whose labels contain `label`, on
// a /metrics page as testing::HttpGet returns it; -1 if the page failed, 0 if no series matches
// (counters with labels have no series until their first increment).
double ScrapeMetric(const std::string& page, const std::string& name,
                    const std::string& label = "");

// --- The replicator's benchmarks: a cache, shard "a"'s store and one shard_replicator ---

// The shard that the benchmarks replicate.
inline constexpr char kBenchShard[] = "a";

struct ReplicatorProcessOptions {
  // The binaries, extra flags for both stores, and extra flags for the replicator (after its
  // defaults: --shard=a, --shard-store, --cache, --identity=bench-0, --lease-duration=3s
  // --renew-deadline=2s --retry-period=500ms, so they win).
  std::string cache_server;
  std::string replicator;
  std::vector<std::string> server_args;
  std::vector<std::string> replicator_args;
  // Bound on each process's start, and on each wait after it: /readyz, leading.
  absl::Duration start_timeout = absl::Minutes(1);
  absl::Duration setup_timeout = absl::Minutes(1);
};

struct ReplicatorProcesses {
  std::unique_ptr<testing::ServerProcess> cache;  // cache_server --role=cache
  std::unique_ptr<testing::ServerProcess> shard;  // cache_server --role=shard, shard "a"'s store
  std::unique_ptr<testing::ServerProcess> replicator;
  std::unique_ptr<v1::Store::Stub> cache_stub;
  std::unique_ptr<v1::Store::Stub> shard_stub;
  // Seconds from the replicator's start to its /readyz answering 200, and to its
  // shardcache_leader_election_leading gauge reading 1.
  double ready_seconds = 0;
  double leading_seconds = 0;
};

// Starts the two stores on loopback ports they pick themselves (each with --data-dir in a fresh
// temporary directory), then the replicator between them, and waits until the replicator is ready
// and leads. "" on success, else what failed (the processes started so far are in `out`).
std::string StartReplicatorProcesses(const ReplicatorProcessOptions& options,
                                     ReplicatorProcesses* out);

// The replicator's shardcache_leader_election_leading gauge (-1: not on its /metrics page).
double ReplicatorLeading(int http_port);

// The lines of a process's log that say "warn" or "error": how many, and the first `keep` (each
// cut to 300 bytes).
struct LogWarnings {
  int64_t count = 0;
  std::vector<std::string> first;
};
LogWarnings FindLogWarnings(const std::string& log, int keep = 10);

// "--- <what> log (tail) ---" and the last 3000 bytes of the process's log; "" for null.
std::string LogTail(const testing::ServerProcess* process, const std::string& what);

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_BENCH_UTIL_H_
