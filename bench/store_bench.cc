// store_bench: a load tool for cache_server's Store API.
//
//   --mode=write: closed-loop writers (unary Create, or creates pipelined on Write streams), one
//     run per --clients value; reports writes/s and latency percentiles.
//   --mode=watch: --watchers concurrent Watch streams under a paced write load; checks that every
//     watcher received every event and reports delivery rate and latency, and the server's
//     threads and memory before the watchers, with them idle, and at the end of the load.
//   --mode=get, --mode=list: fills the server with --objects objects, then closed-loop readers
//     (one per --clients value) get single objects, or list them all; reports reads/s and latency.
//   --mode=fsync: no server; how many syncs a second the disk allows (4 KiB written, then
//     fdatasync or fsync, in a loop), in --fsync-dir (default: the build tree).
//   --mode=startup: fills a server with --objects objects, stops it with SIGTERM, restarts it on
//     the same data directory and reports how long start-up took, the server's own "loaded ..."
//     log line, its memory after start-up, and the data directory's size.
//   --mode=replication: starts a cache, shard "a"'s store and one shard_replicator, replicates
//     the objects of one ClusterCachedResource, and writes --objects objects into the shard
//     store, then updates and deletes them all; reports end-to-end throughput and per-object
//     replication lag (local write answered -> event on a cache watch), checks that every copy
//     arrived, and reports the replicator's CPU and memory (see bench/replication_load.h).
//   --mode=ccrs: the same three processes; defines --ccr-resources resources with
//     --objects-per-resource objects each in every logical cluster, creates --ccrs
//     ClusterCachedResources, waits until every one is Ready and every copy is in the cache, then
//     deletes them all; reports the replicator's threads and memory idle, with the objects, with
//     every CCR converged and after the deletes (see bench/ccr_scale.h).
//
// --targets=cache_server,etcd (modes write, watch, get and list): the tool also starts etcd
//   (Debian's etcd-server) and drives the same load, through the same client code (bench/target.h),
//   against both, --rounds times in interleaved rounds, and prints each round's figures and then
//   each figure's mean per server side by side with their ratio. cache_etcd and cache_etcd<N>
//   (e.g. cache_etcd2) are cache_server replicas (one, or N) with --storage=etcd on a one-member
//   etcd of their own: the load's channels, and so its clients and watchers, are spread evenly
//   over the replicas.
//
// The tool starts its own cache_server on loopback ports (the one in the build tree unless
// --server names another), with its data in a fresh temporary directory per server (removed when
// the server stops, unless --keep-data), or loads --target. Every call has a deadline, so it
// always ends. Its results go to stdout as Markdown, headed by the exact command line.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "bench/ccr_scale.h"
#include "bench/cpu_limit.h"
#include "bench/h2_client.h"
#include "bench/read_load.h"
#include "bench/replication_load.h"
#include "bench/sync_load.h"
#include "bench/target.h"
#include "bench/watch_load.h"
#include "bench/write_load.h"
#include "common/callback_queue_ticker.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "common/testing/etcd_cluster.h"
#include "common/testing/server_process.h"
#include "common/tls.h"
#include "shardcache/v1/store.grpc.pb.h"

ABSL_FLAG(std::string, mode, "write",
          "write: write throughput and latency; watch: fan-out; get, list: read throughput and "
          "latency; fsync: the disk's syncs per "
          "second; startup: restart time with --objects objects; replication: shard_replicator's "
          "throughput and lag; ccrs: shard_replicator's threads and memory with --ccrs CCRs");
ABSL_FLAG(std::string, target, "",
          "host:port of a running server to load; empty: start a cache_server on loopback");
ABSL_FLAG(std::string, server, "", "the cache_server binary to start (default: the build tree's)");
ABSL_FLAG(std::string, server_args, "",
          "extra flags for the started server, separated by spaces (or commas before \"--\"), "
          "e.g. --server-args=\"--sync=false --history-events=1000\"");
ABSL_FLAG(std::string, tls_certs, "",
          "a directory made by scripts/make-certs.sh: the cache_servers started serve gRPC over "
          "TLS with client certificates and the authorization policy, and the load connects as "
          "its admin (cache_server targets only, not etcd)");
ABSL_FLAG(bool, keep_data, false,
          "keep each started server's data directory instead of removing it when the server stops");
ABSL_FLAG(int, server_pid, -1, "with --target: the server's pid, for its /proc readings");
ABSL_FLAG(bool, fresh_server, true,
          "--mode=write without --target: start a new server for each --clients value");
ABSL_FLAG(int, channels, 0,
          "gRPC channels (connections) to spread the clients over; 0: min(clients, 8) for write, "
          "16 for watch");
ABSL_FLAG(
    absl::Duration, duration, absl::ZeroDuration(),
    "how long each run's load lasts (0: 10s for write and for each fsync row, 20s for watch)");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(10), "deadline of each unary call");
// --mode=write
ABSL_FLAG(std::string, api, "unary", "--mode=write: unary (Create calls) or stream (Write stream)");
ABSL_FLAG(std::vector<std::string>, clients, std::vector<std::string>({"1", "16", "64", "256"}),
          "--mode=write: concurrent clients, one run per value");
ABSL_FLAG(int, window, 64, "--api=stream: writes in flight per stream");
ABSL_FLAG(int64_t, ops, 0, "--mode=write: if positive, end a run after this many writes");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1),
          "--mode=write: writes in this first interval are not measured");
// --mode=watch
ABSL_FLAG(int, watchers, 1000, "--mode=watch: concurrent Watch streams");
ABSL_FLAG(std::string, write_rate, "200/s", "--mode=watch: creates per second, e.g. 200/s");
ABSL_FLAG(absl::Duration, setup_timeout, absl::Seconds(60),
          "--mode=watch: how long the watchers may take to receive their initial bookmark; "
          "--mode=replication: bound on each setup step (replicator ready and leading, CCR Ready); "
          "--mode=ccrs: on the replicator's /readyz and leading");
ABSL_FLAG(absl::Duration, idle, absl::Seconds(2),
          "--mode=watch: how long the watchers stay idle before the idle reading");
ABSL_FLAG(absl::Duration, drain_timeout, absl::ZeroDuration(),
          "--mode=watch and replication: after the last write is answered, how long the watchers "
          "(the copies) may take to arrive (0: 30s for watch, 5m for replication)");
ABSL_FLAG(int, max_outstanding_writes, 1000, "--mode=watch: unanswered creates at most");
ABSL_FLAG(int, resources, 1,
          "--mode=watch: bench resources (etcd: key prefixes) the watchers and the creates are "
          "spread over: watcher i watches resource i % N, create k goes to resource k % N");
ABSL_FLAG(bool, watch_batch, true,
          "--mode=watch: cache_server's watchers ask for batches (WatchRequest.batch_events: "
          "several events in one message when more than one waits, as etcd sends them); "
          "--watch-batch=false: one event per message, as a grpcurl user receives them");
ABSL_FLAG(std::string, watch_client, "grpc",
          "--mode=watch: how the watchers read their streams: grpc (gRPC C++ callback reactors) "
          "or http2 (the same calls over plain HTTP/2 with nghttp2, which reads many messages "
          "at a time and costs the client a fraction of the CPU; not with --tls-certs)");
// --mode=fsync
ABSL_FLAG(std::string, fsync_dir, "",
          "--mode=fsync: directory for the test file (default: the build tree, which is on the "
          "same filesystem as the servers' data directories here)");
ABSL_FLAG(int64_t, fsync_block_bytes, 4096, "--mode=fsync: bytes written before each sync");
// --mode=startup
ABSL_FLAG(int64_t, objects, 0,
          "--mode=startup: objects to fill the server with (0: 1000000); --mode=replication: "
          "objects written in each pass (0: 10000)");
ABSL_FLAG(int64_t, object_bytes, 1024,
          "--mode=startup, replication and ccrs: size of each object as sent (serialized), padded "
          "with random text");
ABSL_FLAG(int, fill_streams, 4,
          "--mode=startup and replication: Write streams that write the objects");
ABSL_FLAG(int, fill_window, 256,
          "--mode=startup, replication and ccrs: writes in flight per stream");
ABSL_FLAG(absl::Duration, fill_timeout, absl::Minutes(30),
          "--mode=startup, replication and ccrs: how long the writes (of each pass; ccrs: of "
          "each stream) may take at most");
ABSL_FLAG(absl::Duration, start_timeout, absl::Minutes(5),
          "--mode=startup, replication and ccrs: how long each process may take to start (write "
          "its port file)");
ABSL_FLAG(int, restarts, 1, "--mode=startup: how many times to stop and restart the server");
// --mode=replication
ABSL_FLAG(std::string, replicator, "",
          "--mode=replication and ccrs: the shard_replicator binary (default: the build tree's)");
ABSL_FLAG(std::string, replicator_args, "",
          "--mode=replication and ccrs: extra flags for shard_replicator, separated by spaces "
          "(after the tool's own, so they win), e.g. --replicator-args=\"--workers=8\"; "
          "--server-args go to both stores");
// --mode=ccrs
ABSL_FLAG(int, ccrs, 50,
          "--mode=ccrs: ClusterCachedResources to create, at most one per (cluster, resource) "
          "pair, in ceil(ccrs / ccr-resources) logical clusters");
ABSL_FLAG(int, ccr_resources, 20,
          "--mode=ccrs: ResourceDefinitions to define in the shard store and spread the CCRs over");
ABSL_FLAG(int, objects_per_resource, 20,
          "--mode=ccrs: objects of each resource in each logical cluster (--object-bytes each)");
ABSL_FLAG(absl::Duration, converge_timeout, absl::Minutes(10),
          "--mode=ccrs: bound on the wait for every CCR Ready and every copy in the cache, and on "
          "the wait for every CCR and copy gone after the deletes");
ABSL_FLAG(absl::Duration, settle, absl::Seconds(15),
          "--mode=ccrs: how long the replicator is left alone before the idle reading, the one "
          "with the objects and the one after the deletes (longer than the 10 s after which the "
          "replicator releases an informer that nobody holds)");
// Side by side with etcd
ABSL_FLAG(std::vector<std::string>, targets, std::vector<std::string>({"cache_server"}),
          "--mode=write, watch, get and list: the servers to start and load: cache_server (with "
          "--server-args), etcd, cache_etcd (a cache_server with --storage=etcd on a one-member "
          "etcd of its own) and cache_etcd<N> (N such replicas on one etcd, the load spread over "
          "them); with more than one, every run is repeated --rounds times, interleaved, and each "
          "figure is printed per server with the ratio of each to the last");
ABSL_FLAG(double, server_cores, 0,
          "with --targets: put each cache_server process (cache_server, and each replica of "
          "cache_etcd<N>) into a cgroup of its own limited to this many cores (0: no limit; "
          "needs root), so that on one machine each replica stands for a server of that size "
          "and fan-out with N replicas can be compared with one");
ABSL_FLAG(int, rounds, 2, "with --targets or --mode=get/list: rounds of each run per server");
ABSL_FLAG(std::string, etcd, "/usr/bin/etcd",
          "the etcd binary for --targets=...,etcd (Debian: apt-get install etcd-server)");
ABSL_FLAG(std::string, etcd_args, "",
          "extra flags for the started etcd, separated by spaces, e.g. "
          "--etcd-args=\"--quota-backend-bytes=8589934592\"");

namespace shardcache::bench {
namespace {

// One server of --targets: cache_server (etcd_replicas 0: with --server-args alone; N: N
// replicas with --storage=etcd on a one-member etcd of their own), or etcd.
struct TargetSpec {
  Target::Kind kind = Target::Kind::kCacheServer;
  int etcd_replicas = 0;

  bool operator==(const TargetSpec& o) const {
    return kind == o.kind && etcd_replicas == o.etcd_replicas;
  }
  // As --targets names it.
  std::string Name() const {
    if (kind == Target::Kind::kEtcd) return "etcd";
    if (etcd_replicas == 0) return "cache_server";
    return etcd_replicas == 1 ? "cache_etcd" : absl::StrCat("cache_etcd", etcd_replicas);
  }
};

struct Options {
  enum class Mode { kWrite, kWatch, kGet, kList, kFsync, kStartup, kReplication, kCcrs };
  Mode mode = Mode::kWrite;
  // host:port to load; empty: start `server` on loopback.
  std::string target;
  // The cache_server binary to start, and extra flags for it.
  std::string server;
  std::vector<std::string> server_args;
  // Keep a started server's data directory when it stops (default: remove it).
  bool keep_data = false;
  // The server's pid (-1: unknown); only set by flag with a target.
  pid_t server_pid = -1;
  // Write mode: a new server per client count.
  bool fresh_server = true;
  // Channels to spread the clients over; 0: automatic.
  int channels = 0;
  // Client counts, one run each (write mode).
  std::vector<int> clients;
  // The write load's shape; `clients` and `run_id` are set per run.
  WriteLoadOptions write;
  // The watch load's shape; `run_id` is set per run.
  WatchLoadOptions watch;
  // The watchers read through an H2Client (--watch-client=http2) rather than gRPC.
  bool watch_http2 = false;
  // Fsync mode: the directory, block size and duration of each measurement; the sync call and
  // the write pattern are set per row.
  SyncLoadOptions sync;
  // Startup mode.
  struct Startup {
    // Objects to fill the server with, and the size of each (as sent).
    int64_t objects = 1000000;
    int64_t object_bytes = 1024;
    // Write streams and writes in flight per stream during the fill.
    int fill_streams = 4;
    int fill_window = 256;
    // Bounds on the fill and on each start.
    absl::Duration fill_timeout = absl::Minutes(30);
    absl::Duration start_timeout = absl::Minutes(5);
    // How many stop-and-restart cycles to measure.
    int restarts = 1;
  };
  Startup startup;
  // Replication mode: binaries, flags, sizes and bounds (run_id is set per run).
  ReplicationLoadOptions replication;
  // CCR mode: processes, counts and bounds (run_id is set per run).
  CcrScaleOptions ccrs;
  // Get and list modes: the reads' shape (operation, clients and keys are set per run), and how
  // many objects to fill each server with first.
  ReadLoadOptions read;
  int64_t read_objects = 1000;
  // The servers to start and load side by side (write, watch, get and list modes), the rounds of
  // each run per server, and the etcd binary and its extra flags.
  std::vector<TargetSpec> targets = {TargetSpec{}};
  int rounds = 2;
  double server_cores = 0;  // 0: cache_server processes are not limited
  std::string etcd;
  std::vector<std::string> etcd_args;

  // True when the run goes through RunSideBySide: more servers than cache_server alone, or a
  // read mode.
  bool SideBySide() const {
    return mode == Mode::kGet || mode == Mode::kList || targets.size() != 1 ||
           targets[0].kind != Target::Kind::kCacheServer || targets[0].etcd_replicas != 0;
  }
};

// Splits --server-args into flags: at spaces, and at commas that start another flag (the older
// comma-separated spelling, --server-args=--a=1,--b=2).
std::vector<std::string> SplitServerArgs(const std::string& text) {
  std::vector<std::string> args;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty())) {
    size_t start = 0;
    while (true) {
      size_t comma = word.find(",--", start);
      args.emplace_back(
          word.substr(start, comma == absl::string_view::npos ? comma : comma - start));
      if (comma == absl::string_view::npos) break;
      start = comma + 1;
    }
  }
  return args;
}

absl::StatusOr<Options> OptionsFromFlags() {
  Options o;
  std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "write") {
    o.mode = Options::Mode::kWrite;
  } else if (mode == "watch") {
    o.mode = Options::Mode::kWatch;
  } else if (mode == "fsync") {
    o.mode = Options::Mode::kFsync;
  } else if (mode == "startup") {
    o.mode = Options::Mode::kStartup;
  } else if (mode == "replication") {
    o.mode = Options::Mode::kReplication;
  } else if (mode == "ccrs") {
    o.mode = Options::Mode::kCcrs;
  } else if (mode == "get") {
    o.mode = Options::Mode::kGet;
  } else if (mode == "list") {
    o.mode = Options::Mode::kList;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode: \"", mode,
                     "\" (want write, watch, get, list, fsync, startup, replication or ccrs)"));
  }
  o.target = absl::GetFlag(FLAGS_target);
  o.server = absl::GetFlag(FLAGS_server);
  if (o.server.empty()) o.server = testing::BinaryPath("cache_server/cache_server");
  o.server_args = SplitServerArgs(absl::GetFlag(FLAGS_server_args));
  if (std::string certs = absl::GetFlag(FLAGS_tls_certs); !certs.empty()) {
    o.server_args.insert(o.server_args.end(), {"--tls-cert-file=" + certs + "/server.crt",
                                               "--tls-key-file=" + certs + "/server.key",
                                               "--client-ca-file=" + certs + "/ca.crt"});
    TlsFiles admin{certs + "/admin.crt", certs + "/admin.key", certs + "/ca.crt"};
    RETURN_IF_ERROR(CheckTlsFiles(admin, "--tls-certs", "--tls-certs", "--tls-certs"));
    SetChannelCredentials(MakeChannelCredentials(admin));
  }
  o.keep_data = absl::GetFlag(FLAGS_keep_data);
  o.server_pid = absl::GetFlag(FLAGS_server_pid);
  o.fresh_server = absl::GetFlag(FLAGS_fresh_server);
  o.channels = absl::GetFlag(FLAGS_channels);
  if (o.channels < 0) return absl::InvalidArgumentError("--channels: must not be negative");
  absl::Duration duration = absl::GetFlag(FLAGS_duration);
  if (duration < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--duration: must not be negative");
  }
  absl::Duration rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  if (rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--rpc-timeout: must be positive");
  }

  std::string api = absl::GetFlag(FLAGS_api);
  if (api == "unary") {
    o.write.api = WriteLoadOptions::Api::kUnary;
  } else if (api == "stream") {
    o.write.api = WriteLoadOptions::Api::kStream;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--api: \"", api, "\" (want unary or stream)"));
  }
  for (const std::string& c : absl::GetFlag(FLAGS_clients)) {
    int n = 0;
    if (!absl::SimpleAtoi(c, &n) || n < 1 || n > 4096) {
      return absl::InvalidArgumentError(
          absl::StrCat("--clients: \"", c, "\" is not a count from 1 to 4096"));
    }
    o.clients.push_back(n);
  }
  if (o.clients.empty()) return absl::InvalidArgumentError("--clients: give at least one count");
  o.write.window = absl::GetFlag(FLAGS_window);
  if (o.write.window < 1) return absl::InvalidArgumentError("--window: must be at least 1");
  o.write.ops = absl::GetFlag(FLAGS_ops);
  o.write.warmup = absl::GetFlag(FLAGS_warmup);
  if (o.write.warmup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--warmup: must not be negative");
  }
  o.write.duration = duration == absl::ZeroDuration() ? absl::Seconds(10) : duration;
  o.write.rpc_timeout = rpc_timeout;

  o.watch.watchers = absl::GetFlag(FLAGS_watchers);
  if (o.watch.watchers < 1 || o.watch.watchers > 100000) {
    return absl::InvalidArgumentError("--watchers: must be from 1 to 100000");
  }
  // GetFlag returns a copy: keep it alive while `rate` views it.
  const std::string rate_flag = absl::GetFlag(FLAGS_write_rate);
  absl::string_view rate = rate_flag;
  absl::ConsumeSuffix(&rate, "/s");
  if (!absl::SimpleAtod(rate, &o.watch.write_rate) || !(o.watch.write_rate > 0) ||
      o.watch.write_rate > 100000) {
    return absl::InvalidArgumentError("--write-rate: want a rate such as 200/s (at most 100000)");
  }
  o.watch.duration = duration == absl::ZeroDuration() ? absl::Seconds(20) : duration;
  o.watch.setup_timeout = absl::GetFlag(FLAGS_setup_timeout);
  o.watch.idle = absl::GetFlag(FLAGS_idle);
  absl::Duration drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  if (drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain-timeout: must not be negative");
  }
  o.watch.drain_timeout = drain_timeout == absl::ZeroDuration() ? absl::Seconds(30) : drain_timeout;
  o.watch.rpc_timeout = rpc_timeout;
  o.watch.max_outstanding_writes = absl::GetFlag(FLAGS_max_outstanding_writes);
  o.watch.batch_events = absl::GetFlag(FLAGS_watch_batch);
  if (std::string client = absl::GetFlag(FLAGS_watch_client); client == "http2") {
    o.watch_http2 = true;
    if (!absl::GetFlag(FLAGS_tls_certs).empty()) {
      return absl::InvalidArgumentError(
          "--watch-client=http2 speaks plain HTTP/2 only: use --watch-client=grpc with "
          "--tls-certs");
    }
  } else if (client != "grpc") {
    return absl::InvalidArgumentError(
        absl::StrCat("--watch-client: \"", client, "\" (want grpc or http2)"));
  }
  o.watch.resources = absl::GetFlag(FLAGS_resources);
  if (o.watch.resources < 1 || o.watch.resources > o.watch.watchers) {
    return absl::InvalidArgumentError("--resources: must be from 1 to --watchers");
  }
  if (o.watch.max_outstanding_writes < 1) {
    return absl::InvalidArgumentError("--max-outstanding-writes: must be at least 1");
  }

  o.sync.dir = absl::GetFlag(FLAGS_fsync_dir);
  if (o.sync.dir.empty()) o.sync.dir = std::filesystem::path(testing::BinaryPath("")).parent_path();
  o.sync.block_bytes = absl::GetFlag(FLAGS_fsync_block_bytes);
  if (o.sync.block_bytes < 1 || o.sync.block_bytes > (16 << 20)) {
    return absl::InvalidArgumentError("--fsync-block-bytes: must be from 1 to 16777216");
  }
  o.sync.duration = duration == absl::ZeroDuration() ? absl::Seconds(10) : duration;

  int64_t objects = absl::GetFlag(FLAGS_objects);
  o.startup.objects = objects == 0 ? 1000000 : objects;
  if (o.startup.objects < 1 || o.startup.objects > 100000000) {
    return absl::InvalidArgumentError("--objects: must be from 1 to 100000000");
  }
  o.startup.object_bytes = absl::GetFlag(FLAGS_object_bytes);
  if (o.startup.object_bytes < 0 || o.startup.object_bytes > (1 << 20)) {
    return absl::InvalidArgumentError("--object-bytes: must be from 0 to 1048576");
  }
  o.startup.fill_streams = absl::GetFlag(FLAGS_fill_streams);
  o.startup.fill_window = absl::GetFlag(FLAGS_fill_window);
  if (o.startup.fill_streams < 1 || o.startup.fill_window < 1) {
    return absl::InvalidArgumentError("--fill-streams, --fill-window: must be at least 1");
  }
  o.startup.fill_timeout = absl::GetFlag(FLAGS_fill_timeout);
  o.startup.start_timeout = absl::GetFlag(FLAGS_start_timeout);
  if (o.startup.fill_timeout <= absl::ZeroDuration() ||
      o.startup.start_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--fill-timeout, --start-timeout: must be positive");
  }
  o.startup.restarts = absl::GetFlag(FLAGS_restarts);
  if (o.startup.restarts < 1 || o.startup.restarts > 100) {
    return absl::InvalidArgumentError("--restarts: must be from 1 to 100");
  }
  if (!o.target.empty() &&
      (o.mode == Options::Mode::kStartup || o.mode == Options::Mode::kReplication ||
       o.mode == Options::Mode::kCcrs)) {
    return absl::InvalidArgumentError(
        "--mode=startup, replication and ccrs start their own servers: no --target");
  }

  ReplicationLoadOptions& r = o.replication;
  r.cache_server = o.server;
  r.replicator = absl::GetFlag(FLAGS_replicator);
  if (r.replicator.empty()) r.replicator = testing::BinaryPath("shard_replicator/shard_replicator");
  r.server_args = o.server_args;
  r.replicator_args = SplitServerArgs(absl::GetFlag(FLAGS_replicator_args));
  r.objects = objects == 0 ? 10000 : o.startup.objects;
  r.object_bytes = o.startup.object_bytes;
  r.streams = o.startup.fill_streams;
  r.window = o.startup.fill_window;
  r.start_timeout = o.startup.start_timeout;
  r.setup_timeout = o.watch.setup_timeout;
  r.write_timeout = o.startup.fill_timeout;
  r.drain_timeout = drain_timeout == absl::ZeroDuration() ? absl::Minutes(5) : drain_timeout;
  r.rpc_timeout = rpc_timeout;

  CcrScaleOptions& c = o.ccrs;
  c.processes.cache_server = r.cache_server;
  c.processes.replicator = r.replicator;
  c.processes.server_args = r.server_args;
  c.processes.replicator_args = r.replicator_args;
  c.processes.start_timeout = r.start_timeout;
  c.processes.setup_timeout = r.setup_timeout;
  c.ccrs = absl::GetFlag(FLAGS_ccrs);
  c.resources = absl::GetFlag(FLAGS_ccr_resources);
  c.objects_per_resource = absl::GetFlag(FLAGS_objects_per_resource);
  if (c.ccrs < 1 || c.ccrs > 100000 || c.resources < 1 || c.resources > 10000) {
    return absl::InvalidArgumentError(
        "--ccrs: must be from 1 to 100000; --ccr-resources: from 1 to 10000");
  }
  if (c.objects_per_resource < 0 || c.objects_per_resource > 1000000) {
    return absl::InvalidArgumentError("--objects-per-resource: must be from 0 to 1000000");
  }
  c.object_bytes = r.object_bytes;
  c.window = r.window;
  c.write_timeout = r.write_timeout;
  c.converge_timeout = absl::GetFlag(FLAGS_converge_timeout);
  c.delete_timeout = c.converge_timeout;
  c.settle = absl::GetFlag(FLAGS_settle);
  if (c.converge_timeout <= absl::ZeroDuration() || c.settle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--converge-timeout: must be positive; --settle: must not be negative");
  }
  c.rpc_timeout = rpc_timeout;

  o.read.operation = o.mode == Options::Mode::kList ? ReadLoadOptions::Operation::kList
                                                    : ReadLoadOptions::Operation::kGet;
  o.read.warmup = o.write.warmup;
  o.read.duration = o.write.duration;
  o.read.rpc_timeout = rpc_timeout;
  o.read_objects = objects == 0 ? 1000 : o.startup.objects;
  o.targets.clear();
  for (const std::string& t : absl::GetFlag(FLAGS_targets)) {
    TargetSpec spec;
    int replicas = 0;
    if (t == "cache_server") {
      spec.kind = Target::Kind::kCacheServer;
    } else if (t == "etcd") {
      spec.kind = Target::Kind::kEtcd;
    } else if (t == "cache_etcd" || (absl::StartsWith(t, "cache_etcd") &&
                                     absl::SimpleAtoi(t.substr(strlen("cache_etcd")), &replicas) &&
                                     replicas >= 1 && replicas <= 16)) {
      spec.kind = Target::Kind::kCacheServer;
      spec.etcd_replicas = std::max(replicas, 1);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--targets: \"", t,
          "\" (want cache_server, etcd, cache_etcd or cache_etcd<N> with N from 1 to 16)"));
    }
    if (std::find(o.targets.begin(), o.targets.end(), spec) == o.targets.end()) {
      o.targets.push_back(spec);
    }
  }
  if (o.targets.empty()) return absl::InvalidArgumentError("--targets: name at least one server");
  o.rounds = absl::GetFlag(FLAGS_rounds);
  o.server_cores = absl::GetFlag(FLAGS_server_cores);
  if (o.server_cores < 0 || o.server_cores > 1024) {
    return absl::InvalidArgumentError("--server-cores: must be from 0 (no limit) to 1024");
  }
  if (o.server_cores > 0 && !o.SideBySide()) {
    return absl::InvalidArgumentError("--server-cores: only with --targets");
  }
  if (o.rounds < 1 || o.rounds > 100) {
    return absl::InvalidArgumentError("--rounds: must be from 1 to 100");
  }
  o.etcd = absl::GetFlag(FLAGS_etcd);
  o.etcd_args = SplitServerArgs(absl::GetFlag(FLAGS_etcd_args));
  if (o.SideBySide()) {
    if (o.mode != Options::Mode::kWrite && o.mode != Options::Mode::kWatch &&
        o.mode != Options::Mode::kGet && o.mode != Options::Mode::kList) {
      return absl::InvalidArgumentError("--targets: only with --mode=write, watch, get or list");
    }
    if (!o.target.empty()) {
      return absl::InvalidArgumentError(
          "--targets and --mode=get/list start their own servers: no --target");
    }
    for (const TargetSpec& t : o.targets) {
      if (t.etcd_replicas > 1 && o.watch_http2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--targets=", t.Name(),
            ": the watchers' HTTP/2 client (--watch-client=http2) "
            "connects to one server; use --watch-client=grpc to spread them over replicas"));
      }
    }
    if (o.mode == Options::Mode::kWrite && o.write.api != WriteLoadOptions::Api::kUnary) {
      return absl::InvalidArgumentError(
          "--targets: the write load side by side is unary creates (--api=unary): etcd has no "
          "Write stream");
    }
  }
  return o;
}

std::string NewRunId() {
  return absl::StrFormat("%x",
                         static_cast<uint64_t>(absl::ToUnixMicros(absl::Now())) & 0xffffffffffULL);
}

std::string ErrorList(const std::map<std::string, int64_t>& errors) {
  std::vector<std::string> parts;
  for (const auto& [message, count] : errors) parts.push_back(absl::StrCat(count, "x ", message));
  return absl::StrJoin(parts, "; ");
}

// The value of a --data-dir (or --data_dir) flag in `args`, or "".
std::string DataDirArg(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    for (absl::string_view prefix : {"--data-dir=", "--data_dir="}) {
      if (absl::StartsWith(a, prefix)) return a.substr(prefix.size());
    }
  }
  return "";
}

// The last line of `log` that contains `needle`, from `needle` on; "" if there is none.
std::string LastLogLine(const std::string& log, const std::string& needle) {
  size_t at = log.rfind(needle);
  if (at == std::string::npos) return "";
  size_t end = log.find('\n', at);
  return log.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

// The server under load: one this tool started, or --target.
class Server {
 public:
  explicit Server(const Options& options) : options_(options) {}
  ~Server() { Stop(false); }

  absl::Status Start(absl::Duration timeout = absl::Seconds(30)) {
    if (!options_.target.empty()) return absl::OkStatus();
    if (process_ == nullptr) {
      process_ = std::make_unique<testing::ServerProcess>(options_.server, options_.server_args);
    }
    return process_->Start(timeout);
  }
  // Sends SIGTERM and waits for the process to exit; keeps its data directory for a restart.
  // Returns the waitpid status, or -1 if it had to be killed.
  int Terminate(absl::Duration grace = absl::Seconds(60)) {
    if (process_ == nullptr) return -1;
    return process_->Stop(grace);
  }
  // Stops a started server and removes its data directory (unless --keep-data, or the directory
  // came from --server-args); prints the log's tail to stderr if `show_log`.
  void Stop(bool show_log) {
    if (process_ == nullptr) return;
    if (show_log) {
      std::string log = process_->Log();
      if (log.size() > 4000) log = "..." + log.substr(log.size() - 4000);
      std::cerr << "--- server log (tail) ---\n" << log << "---\n";
    }
    process_->Stop(absl::Seconds(60));
    if (!options_.keep_data && DataDirArg(options_.server_args).empty()) {
      std::error_code ec;
      std::filesystem::remove_all(process_->data_dir(), ec);
    }
    process_.reset();
  }
  std::string address() const {
    return process_ != nullptr ? process_->grpc_address() : options_.target;
  }
  pid_t pid() const {
    if (process_ != nullptr) return process_->Running() ? process_->pid() : -1;
    return options_.server_pid;
  }
  // Where the started server keeps its data; "" with --target.
  std::string data_dir() const {
    if (process_ == nullptr) return "";
    std::string dir = DataDirArg(options_.server_args);
    return dir.empty() ? process_->data_dir() : dir;
  }
  // The started server's stderr so far (every start's, in order); "" with --target.
  std::string Log() const { return process_ != nullptr ? process_->Log() : ""; }

 private:
  const Options& options_;
  std::unique_ptr<testing::ServerProcess> process_;
};

std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& address, int count) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) channels.push_back(MakeChannel(address, i));
  return channels;
}

// The watchers' client for a server at `address`: an H2Client of `connections` connections with
// --watch-client=http2 (its loops on as many threads as there are cores, as gRPC's callback
// threads), else null (gRPC, over the target's channels).
absl::StatusOr<std::shared_ptr<H2Client>> MakeWatchClient(const Options& o,
                                                          const std::string& address,
                                                          int connections) {
  if (!o.watch_http2) return nullptr;
  int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  absl::StatusOr<std::unique_ptr<H2Client>> client =
      H2Client::Connect(address, connections, std::min(threads, connections));
  if (!client.ok()) return client.status();
  return std::shared_ptr<H2Client>(*std::move(client));
}

// How the watchers read, for the reports.
std::string WatchClientDescription(const Options& o, int channels) {
  return o.watch_http2
             ? absl::StrCat("Watchers read over ", channels,
                            " plain HTTP/2 connections with nghttp2 (--watch-client=http2: the "
                            "same calls and bytes as gRPC's, many messages per read)")
             : absl::StrCat("Watchers are gRPC callback reactors over ", channels,
                            " channels (no thread per stream)");
}

std::string ServerDescription(const Options& o) {
  if (o.mode == Options::Mode::kFsync) return "none (--mode=fsync measures the disk alone)";
  if (o.mode == Options::Mode::kReplication || o.mode == Options::Mode::kCcrs) {
    return absl::StrCat(o.server, " --role=cache and --role=shard",
                        o.server_args.empty() ? "" : " ", absl::StrJoin(o.server_args, " "),
                        ", and ", o.replication.replicator,
                        o.replication.replicator_args.empty() ? "" : " ",
                        absl::StrJoin(o.replication.replicator_args, " "),
                        ", on 127.0.0.1, started by the tool, each store with --data-dir in a "
                        "fresh temporary directory (removed when it stops)");
  }
  if (o.SideBySide()) {
    std::vector<std::string> parts;
    for (const TargetSpec& t : o.targets) {
      if (t.kind == Target::Kind::kCacheServer && t.etcd_replicas == 0) {
        parts.push_back(absl::StrCat(o.server, o.server_args.empty() ? "" : " ",
                                     absl::StrJoin(o.server_args, " "),
                                     " (--data-dir in a fresh temporary directory)"));
      } else if (t.kind == Target::Kind::kCacheServer) {
        parts.push_back(absl::StrCat(
            t.Name(), ": ",
            t.etcd_replicas == 1 ? "one replica" : absl::StrCat(t.etcd_replicas, " replicas"),
            " of ", o.server, o.server_args.empty() ? "" : " ", absl::StrJoin(o.server_args, " "),
            " --storage=etcd, on a one-member etcd of their own (as below); the load's channels "
            "alternate between the replicas; the server figures (CPU, RSS) are the first "
            "replica's"));
      } else {
        parts.push_back(
            absl::StrCat(o.etcd,
                         " (one member, its defaults, fsync on; --data-dir in a fresh temporary "
                         "directory, client and peer URLs on 127.0.0.1 ports picked free",
                         o.etcd_args.empty() ? "" : "; ", absl::StrJoin(o.etcd_args, " "), ")"));
      }
    }
    return absl::StrCat(
        absl::StrJoin(parts, ", and "),
        ", on 127.0.0.1, started by the tool, all running for the whole run",
        o.server_cores > 0
            ? absl::StrFormat("; each cache_server process limited to %g cores by a cgroup of "
                              "its own (--server-cores), etcd not limited",
                              o.server_cores)
            : "");
  }
  if (!o.target.empty()) return absl::StrCat("--target=", o.target);
  return absl::StrCat(
      o.server, o.server_args.empty() ? "" : " ", absl::StrJoin(o.server_args, " "),
      " on 127.0.0.1, started by the tool",
      DataDirArg(o.server_args).empty()
          ? absl::StrCat(", with --data-dir in a fresh temporary directory per server (",
                         o.keep_data ? "kept" : "removed when it stops", ")")
          : "");
}

int RunWrite(Options options) {
  bool all_ok = true;
  const char* api = options.write.api == WriteLoadOptions::Api::kStream ? "stream" : "unary";
  std::cout
      << "## Write load (api=" << api
      << (options.write.api == WriteLoadOptions::Api::kStream
              ? absl::StrCat(", window=", options.write.window)
              : "")
      << ")\n\n"
      << "Each write creates a new object of "
      << MakeCreateRequest("0123456789", 0, 0, 0).ByteSizeLong()
      << " bytes (serialized CreateRequest). Warm-up " << absl::FormatDuration(options.write.warmup)
      << ", then " << absl::FormatDuration(options.write.duration) << " measured"
      << (options.write.ops > 0 ? absl::StrCat(" (or ", options.write.ops, " writes)") : "")
      << (options.target.empty() && options.fresh_server ? "; a fresh server for each run" : "")
      << ".\n\n"
      << "| api | clients | channels | writes OK | errors | writes/s | p50 ms | p99 ms | "
         "max ms | disk flushes/s | writes per flush | server CPU (cores) | busiest server "
         "thread (cores) | client CPU (cores) | server threads | server RSS MiB | load avg "
         "(1m) |\n"
      << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
         "\n"
      << std::flush;
  std::unique_ptr<Server> server;
  std::vector<std::string> notes;
  std::string data_fs;  // the filesystem of the (first) server's data directory
  for (int clients : options.clients) {
    if (server == nullptr || (options.target.empty() && options.fresh_server)) {
      if (server != nullptr) server->Stop(false);
      server = std::make_unique<Server>(options);
      if (absl::Status s = server->Start(); !s.ok()) {
        std::cerr << "store_bench: cannot start the server: " << s.message() << "\n";
        return 2;
      }
    }
    WriteLoadOptions w = options.write;
    w.clients = clients;
    w.run_id = NewRunId();
    w.server_pid = server->pid();
    w.disk_path = server->data_dir();
    if (data_fs.empty() && !w.disk_path.empty()) {
      data_fs = absl::StrCat(w.disk_path, ": ", FilesystemDescription(w.disk_path));
    }
    int channels = options.channels > 0 ? options.channels : std::min(clients, 8);
    WriteLoadResult r = RunWriteLoad(w, Channels(server->address(), channels));
    bool flushes_ok = r.flushes_before.ok && r.flushes_after.ok && r.seconds > 0;
    int64_t flushes = r.flushes_after.flushes - r.flushes_before.flushes;
    std::cout
        << absl::StrFormat(
               "| %s | %d | %d | %d | %d | %.0f | %s | %s | %s | %s | %s | %.2f | %s | %.2f | %s "
               "| %s | %s |\n",
               api, clients, channels, r.ok, r.errors,
               r.seconds > 0 ? static_cast<double>(r.ok) / r.seconds : 0.0,
               FormatMs(r.latency.p50_ms, r.latency.count),
               FormatMs(r.latency.p99_ms, r.latency.count),
               FormatMs(r.latency.max_ms, r.latency.count),
               flushes_ok ? absl::StrFormat("%.0f", static_cast<double>(flushes) / r.seconds)
                          : std::string("n/a"),
               flushes_ok && flushes > 0 ? absl::StrFormat("%.1f", static_cast<double>(r.ok) /
                                                                       static_cast<double>(flushes))
                                         : std::string("n/a"),
               r.server_cores,
               r.server_busiest.name.empty()
                   ? std::string("n/a")
                   : absl::StrFormat("%.2f (%s)", r.server_busiest.cores, r.server_busiest.name),
               r.client_cores, r.server_end.ok ? absl::StrCat(r.server_end.threads) : "n/a",
               FormatMiB(r.server_end.rss_kb, r.server_end.ok), LoadAverage())
        << std::flush;
    if (r.errors > 0 || !r.clean_exit || r.ok == 0) {
      all_ok = false;
      notes.push_back(absl::StrCat("clients=", clients, ": ", r.errors, " errors",
                                   r.clean_exit ? "" : ", clients did not end in time",
                                   r.error_samples.empty() ? "" : ": ",
                                   ErrorList(r.error_samples)));
    }
  }
  if (server != nullptr) server->Stop(!all_ok);
  std::cout << "\nDisk flushes: cache flushes completed by the device that holds the server's "
               "data directory ("
            << (data_fs.empty() ? std::string("n/a with --target") : data_fs)
            << "), from /proc/diskstats, during the measured interval. They count every "
               "process's syncs on that device, not only the server's.\n\n";
  for (const std::string& n : notes) std::cout << "- " << n << "\n";
  return all_ok ? 0 : 1;
}

std::string ProcRow(const std::string& phase, const ProcStats& p) {
  return absl::StrFormat("| %s | %s | %s | %s |\n", phase, p.ok ? absl::StrCat(p.threads) : "n/a",
                         FormatMiB(p.rss_kb, p.ok), FormatMiB(p.hwm_kb, p.ok));
}

std::string LatencyCells(const LatencySummary& l) {
  return absl::StrCat(FormatMs(l.p50_ms, l.count), " / ", FormatMs(l.p99_ms, l.count), " / ",
                      FormatMs(l.max_ms, l.count));
}

int RunWatch(Options options) {
  Server server(options);
  if (absl::Status s = server.Start(); !s.ok()) {
    std::cerr << "store_bench: cannot start the server: " << s.message() << "\n";
    return 2;
  }
  WatchLoadOptions w = options.watch;
  w.run_id = NewRunId();
  w.server_pid = server.pid();
  int channels = options.channels > 0 ? options.channels : 16;
  std::string load_before = LoadAverage();
  absl::StatusOr<std::shared_ptr<H2Client>> watch_client =
      MakeWatchClient(options, server.address(), channels);
  if (!watch_client.ok()) {
    std::cerr << "store_bench: cannot connect the watchers: " << watch_client.status().message()
              << "\n";
    return 2;
  }
  WatchLoadResult r = RunWatchLoad(w, Channels(server.address(), channels),
                                   MakeChannel(server.address(), channels), *watch_client);
  std::string load_after = LoadAverage();
  server.Stop(!r.Verified() || r.writes_failed > 0);

  std::cout
      << "## Watch fan-out: " << w.watchers << " watchers, " << absl::StrFormat("%g", w.write_rate)
      << " creates/s for " << absl::FormatDuration(w.duration)
      << (w.resources > 1 ? absl::StrCat(", over ", w.resources, " resources") : "") << "\n\n"
      << WatchClientDescription(options, channels) << "; writes are unary Creates of "
      << MakeCreateRequest("0123456789", 0, 0, 0).ByteSizeLong()
      << "-byte objects on one more channel.\n\n"
      << "| server | threads | VmRSS MiB | VmHWM MiB |\n|---|---:|---:|---:|\n"
      << ProcRow("before the watchers", r.server_before)
      << ProcRow(absl::StrCat(w.watchers, " watchers open, idle"), r.server_idle)
      << ProcRow("end of the write load", r.server_end)
      << absl::StrFormat("| peak during load and drain | %s | %s | |\n",
                         r.server_peak_threads > 0 ? absl::StrCat(r.server_peak_threads) : "n/a",
                         FormatMiB(r.server_peak_rss_kb, r.server_peak_threads > 0))
      << "\n| measure | value |\n|---|---|\n"
      << absl::StrFormat("| watchers with initial bookmark | %d of %d (%.2f s) |\n", r.synced,
                         r.watchers, r.sync_seconds)
      << absl::StrFormat("| creates OK / failed / sent / planned | %d / %d / %d / %d |\n",
                         r.writes_ok, r.writes_failed, r.writes_sent, r.writes_planned)
      << (r.writes_failed > 0
              ? absl::StrFormat("| events of failed creates that watchers received anyway | %d "
                                "(of %d watchers x %d failed creates) |\n",
                                r.failed_writes_seen, r.watchers, r.writes_failed)
              : std::string())
      << absl::StrFormat(
             "| write rate achieved | %.1f /s |\n",
             r.write_seconds > 0 ? static_cast<double>(r.writes_ok) / r.write_seconds : 0.0)
      << absl::StrFormat("| events received / expected | %d / %d |\n", r.events_received,
                         r.events_expected)
      << absl::StrFormat("| watchers that received every event | %d of %d |\n", r.watchers_complete,
                         r.watchers)
      << absl::StrFormat("| watchers more than %s late (some event after its send) | %d of %d |\n",
                         absl::FormatDuration(w.late_after), r.watchers_late, r.watchers)
      << absl::StrFormat(
             "| watch streams ended by the server (not cancelled by the tool) | %d%s |\n",
             r.watchers_ended_early,
             r.early_end_reasons.empty() ? ""
                                         : absl::StrCat(" (", ErrorList(r.early_end_reasons), ")"))
      << absl::StrFormat("| duplicate / out-of-order / unexpected events | %d / %d / %d |\n",
                         r.duplicates, r.out_of_order, r.unexpected)
      << absl::StrFormat("| delivered events/s (first send to last receipt) | %.0f |\n",
                         r.delivery_seconds > 0
                             ? static_cast<double>(r.events_received) / r.delivery_seconds
                             : 0.0)
      << "| drain after the last answer | "
      << (r.watchers_ended_early == 0 ? absl::StrFormat("%.2f s", r.drain_seconds)
                                      : std::string("n/a (watchers were ended)"))
      << " |\n"
      << "| delivery latency, write sent to receipt, p50 / p99 / max ms | "
      << LatencyCells(r.send_to_receipt) << " |\n"
      << "| delivery latency, write answered to receipt, p50 / p99 / max ms | "
      << LatencyCells(r.ack_to_receipt) << " |\n"
      << "| create latency (sent to answered), p50 / p99 / max ms | " << LatencyCells(r.write_ack)
      << " |\n"
      << "| first create after the idle period, sent to answered | "
      << (std::isnan(r.first_write_ack_ms) ? std::string("n/a (not answered OK)")
                                           : absl::StrFormat("%.2f ms", r.first_write_ack_ms))
      << " |\n"
      << absl::StrFormat("| CPU during load and drain, server / client | %.2f / %.2f cores |\n",
                         r.server_cores, r.client_cores)
      << absl::StrFormat("| store_bench CPU per delivered event | %.2f us |\n",
                         r.client_us_per_event)
      << absl::StrFormat("| watch messages received (a batch is one) | %d |\n", r.messages_received)
      << "| busiest server thread, same interval | "
      << (r.server_busiest.name.empty()
              ? std::string("n/a")
              : absl::StrFormat("%.2f cores (%s)", r.server_busiest.cores, r.server_busiest.name))
      << " |\n"
      << absl::StrFormat("| client (store_bench) threads idle / end | %s / %s |\n",
                         r.client_idle.ok ? absl::StrCat(r.client_idle.threads) : "n/a",
                         r.client_end.ok ? absl::StrCat(r.client_end.threads) : "n/a")
      << "| load average (1m) before / after | " << load_before << " / " << load_after << " |\n"
      << "| verified (every watcher got every event once, in order) | "
      << (r.Verified() ? "yes" : "NO") << " |\n";
  if (!r.write_errors.empty())
    std::cout << "\nCreate errors: " << ErrorList(r.write_errors) << "\n";
  return r.Verified() && r.writes_failed == 0 ? 0 : 1;
}

// One server that RunSideBySide started: cache_server, etcd, or cache_server replicas on an
// etcd of their own.
class SideServer {
 public:
  SideServer(const Options& options, TargetSpec spec) : options_(options), spec_(spec) {}
  ~SideServer() { Stop(false); }

  absl::Status Start() {
    if (spec_.kind == Target::Kind::kCacheServer && spec_.etcd_replicas == 0) {
      cache_ = std::make_unique<Server>(options_);
      RETURN_IF_ERROR(cache_->Start());
      return Limit(cache_->pid());
    }
    testing::EtcdCluster::Options etcd;
    etcd.binary = options_.etcd;
    etcd.args = options_.etcd_args;
    etcd.keep_data = options_.keep_data;
    etcd_ = std::make_unique<testing::EtcdCluster>(etcd);
    RETURN_IF_ERROR(etcd_->Start());
    for (int i = 0; i < spec_.etcd_replicas; ++i) {
      std::vector<std::string> args = options_.server_args;
      args.push_back("--storage=etcd");
      args.push_back("--etcd-endpoints=" + etcd_->Endpoints());
      replicas_.push_back(std::make_unique<testing::ServerProcess>(options_.server, args));
      absl::Status s = replicas_.back()->Start(absl::Seconds(30));
      if (s.ok()) s = Limit(replicas_.back()->pid());
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("replica ", i + 1, ": ", s.message()));
      }
    }
    return absl::OkStatus();
  }
  void Stop(bool show_log) {
    if (cache_ != nullptr) cache_->Stop(show_log);
    cache_.reset();
    for (size_t i = 0; i < replicas_.size(); ++i) {
      if (show_log) {
        std::string log = replicas_[i]->Log();
        if (log.size() > 4000) log = "..." + log.substr(log.size() - 4000);
        std::cerr << "--- replica " << i + 1 << " log (tail) ---\n" << log << "---\n";
      }
      replicas_[i]->Stop(absl::Seconds(60));
      if (!options_.keep_data) {
        std::error_code ec;
        std::filesystem::remove_all(replicas_[i]->data_dir(), ec);
      }
    }
    replicas_.clear();
    if (etcd_ != nullptr && show_log) {
      std::string log = etcd_->Log(0);
      if (log.size() > 4000) log = "..." + log.substr(log.size() - 4000);
      std::cerr << "--- etcd log (tail) ---\n" << log << "---\n";
    }
    if (etcd_ != nullptr) etcd_->Stop(0);  // its directory is removed unless --keep_data
    etcd_.reset();
    limits_.clear();  // after their processes have exited
  }
  Target::Kind kind() const { return spec_.kind; }
  std::string name() const { return spec_.Name(); }
  // The first replica's address (cache_server on etcd), or the server's.
  std::string address() const { return addresses().empty() ? "" : addresses()[0]; }
  std::vector<std::string> addresses() const {
    if (cache_ != nullptr) return {cache_->address()};
    if (!replicas_.empty()) {
      std::vector<std::string> out;
      for (const auto& r : replicas_) out.push_back(r->grpc_address());
      return out;
    }
    if (etcd_ != nullptr) return {etcd_->endpoint(0)};
    return {};
  }
  // The first replica's pid (cache_server on etcd), or the server's.
  pid_t pid() const {
    if (cache_ != nullptr) return cache_->pid();
    if (!replicas_.empty()) return replicas_[0]->pid();
    return etcd_ != nullptr ? etcd_->pid(0) : -1;
  }
  // Where the writes are made durable: the server's data directory, or etcd's.
  std::string data_dir() const {
    return cache_ != nullptr ? cache_->data_dir() : etcd_ != nullptr ? etcd_->data_dir(0) : "";
  }
  // A target over `channels` fresh channels to this server (to its replicas in turn).
  // cache_server's watches start from its current revision, as etcd's do (see target.h).
  // With a `watch_client`, its watches go through it.
  std::unique_ptr<Target> MakeTarget(int channels,
                                     std::shared_ptr<H2Client> watch_client = nullptr) const {
    const std::vector<std::string> to = addresses();
    std::vector<std::shared_ptr<grpc::Channel>> ch;
    for (int i = 0; i < channels; ++i) ch.push_back(MakeChannel(to[i % to.size()], i));
    return kind() == Target::Kind::kCacheServer
               ? MakeStoreTarget(ch, /*watch_from_now=*/true, options_.watch.batch_events,
                                 std::move(watch_client))
               : MakeEtcdTarget(ch, std::move(watch_client));
  }
  std::unique_ptr<Target> MakeTargetOn(std::shared_ptr<grpc::Channel> channel) const {
    std::vector<std::shared_ptr<grpc::Channel>> ch = {std::move(channel)};
    return kind() == Target::Kind::kCacheServer
               ? MakeStoreTarget(ch, /*watch_from_now=*/true, options_.watch.batch_events)
               : MakeEtcdTarget(ch);
  }

 private:
  const Options& options_;
  const TargetSpec spec_;
  std::unique_ptr<Server> cache_;
  std::vector<std::unique_ptr<testing::ServerProcess>> replicas_;
  std::unique_ptr<testing::EtcdCluster> etcd_;     // one member
  std::vector<std::unique_ptr<CpuLimit>> limits_;  // --server-cores: one per cache_server

  // With --server-cores, puts cache_server process `pid` into a CPU limit of its own.
  absl::Status Limit(pid_t pid) {
    if (options_.server_cores <= 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(
        std::unique_ptr<CpuLimit> limit,
        CpuLimit::Create(absl::StrCat(name(), "-", limits_.size() + 1), options_.server_cores));
    RETURN_IF_ERROR(limit->Add(pid));
    limits_.push_back(std::move(limit));
    return absl::OkStatus();
  }
};

// One figure of a side-by-side run, per round and server.
struct Figure {
  std::string name;
  bool higher_is_better;
};

// The figures of one round on one server, in the order of the mode's Figure list, and whether
// the round was sound (no errors, every check passed), with notes for the reader.
struct RoundResult {
  std::vector<double> values;
  bool ok = true;
  std::string note;
};

std::string FigureCell(double v) {
  if (std::isnan(v)) return "n/a";
  if (v != 0 && std::fabs(v) < 10) return absl::StrFormat("%.2f", v);
  return absl::StrFormat("%.0f", v);
}

// Fills the server behind `target` with `objects` objects named BenchObjectName(run, 0, i);
// returns their keys (empty on failure, with the reason in *error).
std::vector<v1::ObjectMeta> Fill(const Options& options, Target* target, int64_t objects,
                                 std::string* error) {
  WriteLoadOptions w;
  w.api = WriteLoadOptions::Api::kUnary;
  w.clients = std::min(target->slots(), 16);
  w.warmup = absl::ZeroDuration();
  w.duration = options.startup.fill_timeout;
  w.total_writes = objects;
  w.name_by_index = true;
  w.run_id = NewRunId();
  w.rpc_timeout = options.write.rpc_timeout;
  WriteLoadResult r = RunWriteLoad(w, target);
  if (r.ok != objects || r.errors > 0) {
    *error = absl::StrCat(r.ok, " of ", objects, " objects written; ", ErrorList(r.error_samples));
    return {};
  }
  std::vector<v1::ObjectMeta> keys;
  for (int64_t i = 0; i < objects; ++i) {
    keys.push_back(MakeCreateRequest(w.run_id, 0, i, 0).object().metadata());
  }
  return keys;
}

int RunSideBySide(Options options) {
  const bool is_watch = options.mode == Options::Mode::kWatch;
  const bool is_read = options.mode == Options::Mode::kGet || options.mode == Options::Mode::kList;
  const char* what = options.mode == Options::Mode::kWrite ? "Write load (unary creates)"
                     : is_watch                            ? "Watch fan-out"
                     : options.mode == Options::Mode::kGet ? "Get (one object per call)"
                                                           : "List (every object, one page)";
  std::vector<Figure> figures;
  if (is_watch) {
    figures = {{"write rate achieved /s", true},
               {"delivered events/s", true},
               {"delivery p50 ms (write sent to receipt)", false},
               {"delivery p99 ms", false},
               {"delivery max ms", false},
               {absl::StrCat("watchers more than ", absl::FormatDuration(options.watch.late_after),
                             " late"),
                false},
               {"watchers ended by the server", false},
               {"create p99 ms", false},
               {"first create ms (after the idle period)", false},
               {"server peak RSS MiB", false},
               {"server CPU (cores)", false},
               {"store_bench CPU (cores)", false},
               {"store_bench CPU us per delivered event", false}};
  } else {
    figures = {{is_read ? "reads/s" : "writes/s", true},
               {"p50 ms", false},
               {"p99 ms", false},
               {"max ms", false},
               {"server CPU (cores)", false},
               {"server RSS MiB at the end", false}};
    if (!is_read) figures.push_back({"disk flushes/s (every process's)", false});
  }

  // Start every server, and fill them for the read modes.
  std::vector<std::unique_ptr<SideServer>> servers;
  for (const TargetSpec& spec : options.targets) {
    servers.push_back(std::make_unique<SideServer>(options, spec));
    if (absl::Status s = servers.back()->Start(); !s.ok()) {
      std::cerr << "store_bench: cannot start " << servers.back()->name() << ": " << s.message()
                << "\n";
      return 2;
    }
  }
  std::vector<std::vector<v1::ObjectMeta>> keys(servers.size());
  if (is_read) {
    for (size_t i = 0; i < servers.size(); ++i) {
      std::unique_ptr<Target> t = servers[i]->MakeTarget(8);
      std::string error;
      keys[i] = Fill(options, t.get(), options.read_objects, &error);
      if (keys[i].empty()) {
        std::cerr << "store_bench: cannot fill " << servers[i]->name() << ": " << error << "\n";
        return 2;
      }
    }
  }

  std::cout << "## " << what << ", side by side: "
            << absl::StrJoin(servers, ", ",
                             [](std::string* out, const std::unique_ptr<SideServer>& s) {
                               out->append(s->name());
                             })
            << "\n\n";
  if (is_watch) {
    std::cout
        << options.watch.watchers
        << (options.watch.resources == 1
                ? absl::StrCat(" watchers of the bench resource (etcd: of its key prefix ",
                               EtcdPrefix(), "), ")
                : absl::StrCat(" watchers spread over ", options.watch.resources,
                               " bench resources (watcher i watches resource i % ",
                               options.watch.resources, "; etcd: one key prefix each, such as ",
                               EtcdPrefix(BenchResource(1)),
                               "), the creates round-robin over them; "))
        << absl::StrFormat("%g", options.watch.write_rate) << " creates/s of "
        << MakeCreateRequest("0123456789", 0, 0, 0).object().ByteSizeLong() << "-byte objects for "
        << absl::FormatDuration(options.watch.duration)
        << ", in each round. Each watcher is its own stream (cache_server: Watch; etcd: "
           "one Watch stream with one watch). "
        << WatchClientDescription(options, options.channels > 0 ? options.channels : 16)
        << "; the writer has one more channel. Both watch from the current "
           "revision (cache_server: resourceVersion from a List; etcd: no start revision), "
           "so neither sends initial state. Watchers read each message's wire bytes for the "
           "few fields they check (type, revision, the spec's run, seq and send time), the "
           "same way for both servers, and set no deadline. Delivery latency is from the "
           "write's send to the event's receipt, over every event of every watcher. When "
           "store_bench's own CPU nears the cores it can get, the tool is the bottleneck, "
           "not the server; its CPU per delivered event is what reading costs the client.\n\n";
  } else {
    std::cout
        << "Closed loop: each client keeps one call in flight. "
        << (is_read
                ? absl::StrCat(
                      "Each server was first filled with ", options.read_objects, " objects of ",
                      MakeCreateRequest("0123456789", 0, 0, 0).object().ByteSizeLong(), " bytes. ")
                : absl::StrCat("Each write creates a new object of ",
                               MakeCreateRequest("0123456789", 0, 0, 0).object().ByteSizeLong(),
                               " bytes (etcd: a Put of its serialized bytes). "))
        << "Warm-up " << absl::FormatDuration(options.write.warmup) << ", then "
        << absl::FormatDuration(options.write.duration) << " measured, in each round.\n\n";
  }
  std::cout << "Rounds run in turn (round 1 on each server, then round 2, ...); the other "
               "server is idle meanwhile.\n\n";

  // Per clients value (once for watch): every round on every server, then the summary.
  std::vector<int> client_counts = is_watch ? std::vector<int>{0} : options.clients;
  bool all_ok = true;
  for (int clients : client_counts) {
    if (!is_watch) std::cout << "### " << clients << " clients\n\n";
    std::cout << "| round | server |";
    for (const Figure& f : figures) std::cout << " " << f.name << " |";
    std::cout << " load avg (1m) | notes |\n|---|---|";
    for (size_t i = 0; i < figures.size(); ++i) std::cout << "---:|";
    std::cout << "---:|---|\n" << std::flush;
    // results[server][round]
    std::vector<std::vector<RoundResult>> results(servers.size());
    for (int round = 1; round <= options.rounds; ++round) {
      for (size_t si = 0; si < servers.size(); ++si) {
        SideServer& server = *servers[si];
        RoundResult rr;
        if (is_watch) {
          int channels = options.channels > 0 ? options.channels : 16;
          absl::StatusOr<std::shared_ptr<H2Client>> watch_client =
              MakeWatchClient(options, server.address(), channels);
          if (!watch_client.ok()) {
            std::cerr << "store_bench: cannot connect the watchers to " << server.name() << ": "
                      << watch_client.status().message() << "\n";
            return 2;
          }
          std::unique_ptr<Target> watch_target = server.MakeTarget(channels, *watch_client);
          std::unique_ptr<Target> write_target =
              server.MakeTargetOn(MakeChannel(server.address(), channels));
          WatchLoadOptions w = options.watch;
          w.run_id = NewRunId();
          w.server_pid = server.pid();
          WatchLoadResult r = RunWatchLoad(w, watch_target.get(), write_target.get());
          rr.values = {
              r.write_seconds > 0 ? static_cast<double>(r.writes_ok) / r.write_seconds : NAN,
              r.delivery_seconds > 0 ? static_cast<double>(r.events_received) / r.delivery_seconds
                                     : NAN,
              r.send_to_receipt.count > 0 ? r.send_to_receipt.p50_ms : NAN,
              r.send_to_receipt.count > 0 ? r.send_to_receipt.p99_ms : NAN,
              r.send_to_receipt.count > 0 ? r.send_to_receipt.max_ms : NAN,
              static_cast<double>(r.watchers_late),
              static_cast<double>(r.watchers_ended_early),
              r.write_ack.count > 0 ? r.write_ack.p99_ms : NAN,
              r.first_write_ack_ms,
              r.server_peak_threads > 0 ? static_cast<double>(r.server_peak_rss_kb) / 1024.0 : NAN,
              r.server_cores,
              r.client_cores,
              r.events_received > 0 ? r.client_us_per_event : NAN};
          rr.ok = r.Verified() && r.writes_failed == 0;
          std::vector<std::string> notes;
          notes.push_back(absl::StrFormat("%d/%d watchers in place in %.2f s", r.synced, r.watchers,
                                          r.sync_seconds));
          notes.push_back(absl::StrFormat("events %d/%d", r.events_received, r.events_expected));
          if (r.messages_received > 0) {
            notes.push_back(absl::StrFormat(
                "%.2f events per message",
                static_cast<double>(r.events_received) / static_cast<double>(r.messages_received)));
          }
          if (r.duplicates + r.out_of_order > 0) {
            notes.push_back(
                absl::StrFormat("%d duplicate, %d out of order", r.duplicates, r.out_of_order));
          }
          if (r.writes_sent < r.writes_planned) {
            notes.push_back(absl::StrFormat("%d of %d creates not sent (writer behind at the end)",
                                            r.writes_planned - r.writes_sent, r.writes_planned));
          }
          if (!r.early_end_reasons.empty()) {
            notes.push_back(absl::StrCat("ended by the server: ", ErrorList(r.early_end_reasons)));
          }
          if (!r.write_errors.empty()) {
            notes.push_back(absl::StrCat("create errors: ", ErrorList(r.write_errors)));
          }
          if (!r.server_busiest.name.empty()) {
            notes.push_back(absl::StrFormat("busiest thread %.2f cores (%s)",
                                            r.server_busiest.cores, r.server_busiest.name));
          }
          notes.push_back(rr.ok ? "verified" : "**NOT VERIFIED**");
          rr.note = absl::StrJoin(notes, "; ");
          // Streams that did not end point at the targets: keep them until the process exits.
          if (!r.streams_ended) {
            (void)watch_target.release();
            (void)write_target.release();
          }
        } else {
          int channels = options.channels > 0 ? options.channels : std::min(clients, 8);
          std::unique_ptr<Target> target = server.MakeTarget(channels);
          double ops = NAN;
          LatencySummary lat;
          int64_t errors = 0;
          std::map<std::string, int64_t> error_samples;
          bool clean = true;
          ProcStats end;
          double cores = 0;
          double flushes = NAN;
          if (is_read) {
            ReadLoadOptions ro = options.read;
            ro.clients = clients;
            ro.keys = keys[si];
            ro.min_items = options.read_objects;
            ro.server_pid = server.pid();
            ReadLoadResult r = RunReadLoad(ro, target.get());
            ops = r.seconds > 0 ? static_cast<double>(r.ok) / r.seconds : NAN;
            lat = r.latency;
            errors = r.errors;
            error_samples = r.error_samples;
            clean = r.clean_exit;
            end = r.server_end;
            cores = r.server_cores;
          } else {
            WriteLoadOptions w = options.write;
            w.clients = clients;
            w.run_id = NewRunId();
            w.server_pid = server.pid();
            w.disk_path = server.data_dir();
            WriteLoadResult r = RunWriteLoad(w, target.get());
            if (r.flushes_before.ok && r.flushes_after.ok && r.seconds > 0) {
              flushes = static_cast<double>(r.flushes_after.flushes - r.flushes_before.flushes) /
                        r.seconds;
            }
            ops = r.seconds > 0 ? static_cast<double>(r.ok) / r.seconds : NAN;
            lat = r.latency;
            errors = r.errors;
            error_samples = r.error_samples;
            clean = r.clean_exit;
            end = r.server_end;
            cores = r.server_cores;
          }
          rr.values = {ops,
                       lat.count > 0 ? lat.p50_ms : NAN,
                       lat.count > 0 ? lat.p99_ms : NAN,
                       lat.count > 0 ? lat.max_ms : NAN,
                       cores,
                       end.ok ? static_cast<double>(end.rss_kb) / 1024.0 : NAN};
          if (!is_read) rr.values.push_back(flushes);
          rr.ok = errors == 0 && clean && lat.count > 0;
          rr.note = absl::StrCat(errors, " errors", clean ? "" : ", clients did not end in time",
                                 error_samples.empty() ? "" : ": ", ErrorList(error_samples));
          if (!clean) (void)target.release();
        }
        all_ok = all_ok && rr.ok;
        std::cout << "| " << round << " | " << server.name() << " |";
        for (double v : rr.values) std::cout << " " << FigureCell(v) << " |";
        std::cout << " " << LoadAverage() << " | " << rr.note << " |\n" << std::flush;
        results[si].push_back(std::move(rr));
      }
    }

    // The summary: each figure's mean over the rounds, per server, and the ratio.
    std::cout << "\n| figure (mean of " << options.rounds << " rounds) |";
    for (const auto& s : servers) std::cout << " " << s->name() << " |";
    // The ratio of each server's figure to the last server's (e.g. cache_server / etcd).
    const size_t last = servers.size() - 1;
    for (size_t si = 0; si < last; ++si) {
      std::cout << " " << servers[si]->name() << " / " << servers[last]->name() << " |";
    }
    std::cout << "\n|---|";
    for (size_t i = 0; i < servers.size() + last; ++i) std::cout << "---:|";
    std::cout << "\n";
    for (size_t fi = 0; fi < figures.size(); ++fi) {
      std::cout << "| " << figures[fi].name
                << (figures[fi].higher_is_better ? " (higher " : " (lower ") << "is better) |";
      std::vector<double> means;
      for (size_t si = 0; si < servers.size(); ++si) {
        double sum = 0;
        int n = 0;
        for (const RoundResult& rr : results[si]) {
          if (fi < rr.values.size() && !std::isnan(rr.values[fi])) {
            sum += rr.values[fi];
            ++n;
          }
        }
        means.push_back(n > 0 ? sum / n : NAN);
        std::cout << " " << FigureCell(means.back()) << " |";
      }
      for (size_t si = 0; si < last; ++si) {
        std::cout << " "
                  << (means[last] != 0 && !std::isnan(means[si]) && !std::isnan(means[last])
                          ? absl::StrFormat("%.2f", means[si] / means[last])
                          : std::string("n/a"))
                  << " |";
      }
      std::cout << "\n";
    }
    std::cout << "\n" << std::flush;
  }

  for (auto& s : servers) s->Stop(!all_ok);
  std::cout << "Verified (every round of every server without errors"
            << (is_watch ? ", every watcher got every event once, in order" : "")
            << "): " << (all_ok ? "yes" : "**NO**") << "\n";
  return all_ok ? 0 : 1;
}

std::string FormatBytes(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

int RunFsync(const Options& options) {
  const SyncLoadOptions& base = options.sync;
  std::cout << "## Disk syncs\n\n"
            << "Directory: " << base.dir << ", on " << FilesystemDescription(base.dir) << ".\n\n"
            << "Each row: one thread writes " << base.block_bytes
            << " bytes with pwrite, then calls the sync, in a loop, for "
            << absl::FormatDuration(base.duration)
            << "; the sync call alone is timed. \"append\" writes each block after the last "
               "(as a write-ahead log does: the file grows, so each sync also commits the "
               "filesystem's journal); \"overwrite\" rewrites one block in place. Device "
               "flushes: cache flushes the disk completed meanwhile (/proc/diskstats, whole "
               "device).\n\n"
            << "| write | sync call | syncs | syncs/s | sync p50 ms | sync p99 ms | sync max ms | "
               "write p50 ms | device flushes/s | flushes per sync | load avg (1m) |\n"
            << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
            << std::flush;
  bool all_ok = true;
  for (bool append : {true, false}) {
    for (SyncLoadOptions::Call call :
         {SyncLoadOptions::Call::kFdatasync, SyncLoadOptions::Call::kFsync}) {
      SyncLoadOptions o = base;
      o.append = append;
      o.call = call;
      const char* call_name = call == SyncLoadOptions::Call::kFsync ? "fsync" : "fdatasync";
      absl::StatusOr<SyncLoadResult> r = RunSyncLoad(o);
      if (!r.ok()) {
        std::cerr << "store_bench: " << call_name << ": " << r.status().message() << "\n";
        all_ok = false;
        continue;
      }
      bool flushes_ok = r->flushes_before.ok && r->flushes_after.ok && r->seconds > 0;
      int64_t flushes = r->flushes_after.flushes - r->flushes_before.flushes;
      std::cout << absl::StrFormat(
                       "| %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s |\n",
                       append ? "append" : "overwrite", call_name, r->syncs,
                       r->seconds > 0 ? static_cast<double>(r->syncs) / r->seconds : 0.0,
                       FormatMs(r->sync_latency.p50_ms, r->sync_latency.count),
                       FormatMs(r->sync_latency.p99_ms, r->sync_latency.count),
                       FormatMs(r->sync_latency.max_ms, r->sync_latency.count),
                       absl::StrFormat("%.3f", r->write_latency.p50_ms),
                       flushes_ok
                           ? absl::StrFormat("%.0f", static_cast<double>(flushes) / r->seconds)
                           : std::string("n/a"),
                       flushes_ok && r->syncs > 0
                           ? absl::StrFormat("%.2f", static_cast<double>(flushes) /
                                                         static_cast<double>(r->syncs))
                           : std::string("n/a"),
                       LoadAverage())
                << std::flush;
    }
  }
  return all_ok ? 0 : 1;
}

// The serialized size of one object as the server stores it; -1 if it cannot be read.
int64_t StoredObjectBytes(const std::string& address, const std::string& run_id,
                          absl::Duration timeout) {
  auto stub = v1::Store::NewStub(MakeChannel(address, 0));
  // The first object of client 0 (MakeCreateRequest's naming).
  v1::CreateRequest like = MakeCreateRequest(run_id, 0, 0, 0);
  v1::GetRequest req;
  *req.mutable_resource() = like.resource();
  req.set_cluster(like.object().metadata().cluster());
  req.set_namespace_(like.object().metadata().namespace_());
  req.set_name(like.object().metadata().name());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::Object object;
  if (!stub->Get(&ctx, req, &object).ok()) return -1;
  return static_cast<int64_t>(object.ByteSizeLong());
}

std::string ExitDescription(int status) {
  if (status == -1) return "did not exit in time: killed";
  if (WIFEXITED(status)) return absl::StrCat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

int RunStartup(const Options& options) {
  const Options::Startup& st = options.startup;
  Server server(options);
  int64_t t0 = NowNanos();
  if (absl::Status s = server.Start(st.start_timeout); !s.ok()) {
    std::cerr << "store_bench: cannot start the server: " << s.message() << "\n";
    return 2;
  }
  double empty_start = static_cast<double>(NowNanos() - t0) / 1e9;
  const std::string data_dir = server.data_dir();

  // Fill it.
  WriteLoadOptions w;
  w.api = WriteLoadOptions::Api::kStream;
  w.clients = st.fill_streams;
  w.window = st.fill_window;
  w.warmup = absl::ZeroDuration();
  w.duration = st.fill_timeout;
  w.total_writes = st.objects;
  w.object_bytes = st.object_bytes;
  w.rpc_timeout = options.write.rpc_timeout;
  w.run_id = NewRunId();
  w.server_pid = server.pid();
  w.disk_path = data_dir;
  v1::CreateRequest sample = MakeCreateRequest(w.run_id, 0, 0, 0);
  PadObject(&sample, st.object_bytes);
  std::string load_before = LoadAverage();
  WriteLoadResult fill = RunWriteLoad(w, Channels(server.address(), std::min(st.fill_streams, 8)));
  ProcStats filled = ReadProcStats(server.pid());
  int64_t stored_bytes = StoredObjectBytes(server.address(), w.run_id, options.write.rpc_timeout);
  bool flushes_ok = fill.flushes_before.ok && fill.flushes_after.ok && fill.seconds > 0;
  int64_t flushes = fill.flushes_after.flushes - fill.flushes_before.flushes;
  bool all_ok = fill.errors == 0 && fill.clean_exit && fill.ok == st.objects;

  std::cout
      << "## Start-up with " << st.objects << " objects\n\n"
      << "Data directory: " << data_dir << ", on " << FilesystemDescription(data_dir) << ".\n\n"
      << "### Fill\n\n"
      << "| measure | value |\n|---|---|\n"
      << absl::StrFormat("| empty server: process start to port file | %.3f s |\n", empty_start)
      << absl::StrFormat(
             "| object size, as sent / as stored (serialized Object) | %d / %s bytes |\n",
             static_cast<int64_t>(sample.object().ByteSizeLong()),
             stored_bytes >= 0 ? absl::StrCat(stored_bytes) : std::string("n/a"))
      << absl::StrFormat("| fill | %d Write streams, window %d |\n", st.fill_streams,
                         st.fill_window)
      << absl::StrFormat("| creates OK / errors / sent | %d / %d / %d |\n", fill.ok, fill.errors,
                         fill.sent)
      << absl::StrFormat("| fill time, writes/s | %.1f s, %.0f /s |\n", fill.seconds,
                         fill.seconds > 0 ? static_cast<double>(fill.ok) / fill.seconds : 0)
      << "| write latency p50 / p99 / max ms | "
      << FormatMs(fill.latency.p50_ms, fill.latency.count) << " / "
      << FormatMs(fill.latency.p99_ms, fill.latency.count) << " / "
      << FormatMs(fill.latency.max_ms, fill.latency.count) << " |\n"
      << "| disk flushes/s, writes per flush | "
      << (flushes_ok
              ? absl::StrFormat(
                    "%.0f, %.1f", static_cast<double>(flushes) / fill.seconds,
                    flushes > 0 ? static_cast<double>(fill.ok) / static_cast<double>(flushes) : 0.0)
              : std::string("n/a"))
      << " |\n"
      << absl::StrFormat("| CPU during the fill, server / client | %.2f / %.2f cores |\n",
                         fill.server_cores, fill.client_cores)
      << "| server after the fill: threads, VmRSS, VmHWM | "
      << (filled.ok ? absl::StrCat(filled.threads, ", ", FormatMiB(filled.rss_kb, true), " MiB, ",
                                   FormatMiB(filled.hwm_kb, true), " MiB")
                    : std::string("n/a"))
      << " |\n"
      << "| load average (1m) before / after | " << load_before << " / " << LoadAverage()
      << " |\n\n"
      << std::flush;
  if (!all_ok) {
    std::cout << "The fill did not complete"
              << (fill.error_samples.empty() ? ""
                                             : absl::StrCat(": ", ErrorList(fill.error_samples)))
              << "\n";
    server.Stop(true);
    return 1;
  }

  std::cout << "### Stop and restart\n\n"
            << "Stop: SIGTERM until the process exits. Start: from fork to the port file's "
               "appearance (polled every 20 ms), as ServerProcess::Start times it. Memory: "
               "/proc/<pid>/status at that moment and 2 s later. The \"loaded\" line is the "
               "server's own log.\n\n"
            << "| restart | stop time | stop | data dir on disk (allocated / apparent, files) | "
               "start time | server log | threads | VmRSS MiB at start / 2 s later | VmHWM MiB | "
               "load avg (1m) |\n"
            << "|---:|---:|---|---|---:|---|---:|---:|---:|---:|\n"
            << std::flush;
  for (int i = 1; i <= st.restarts; ++i) {
    int64_t stop_start = NowNanos();
    int status = server.Terminate();
    double stop_seconds = static_cast<double>(NowNanos() - stop_start) / 1e9;
    bool stopped_ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    DiskUsage usage = ReadDiskUsage(data_dir);
    int64_t start = NowNanos();
    absl::Status started = server.Start(st.start_timeout);
    double start_seconds = static_cast<double>(NowNanos() - start) / 1e9;
    if (!started.ok()) {
      std::cout << "\nRestart " << i << " failed: " << started.message() << "\n";
      server.Stop(true);
      return 1;
    }
    ProcStats at_start = ReadProcStats(server.pid());
    absl::SleepFor(absl::Seconds(2));
    ProcStats later = ReadProcStats(server.pid());
    std::string loaded = LastLogLine(server.Log(), "loaded ");
    int64_t loaded_objects = -1;
    {
      std::vector<absl::string_view> words = absl::StrSplit(loaded, ' ');
      if (words.size() > 1) (void)absl::SimpleAtoi(words[1], &loaded_objects);
    }
    all_ok = all_ok && stopped_ok && loaded_objects == st.objects;
    std::cout
        << absl::StrFormat(
               "| %d | %.3f s | %s | %s / %s, %d | %.3f s | `%s` | %s | %s / %s | %s | %s |\n", i,
               stop_seconds, ExitDescription(status),
               usage.ok ? FormatBytes(usage.allocated_bytes) : "n/a",
               usage.ok ? FormatBytes(usage.apparent_bytes) : "n/a", usage.files, start_seconds,
               loaded.empty() ? "(none)" : loaded,
               at_start.ok ? absl::StrCat(at_start.threads) : "n/a",
               FormatMiB(at_start.rss_kb, at_start.ok), FormatMiB(later.rss_kb, later.ok),
               FormatMiB(later.hwm_kb, later.ok), LoadAverage())
        << std::flush;
  }
  std::cout << "\nVerified (every restart exited 0 on SIGTERM and loaded all " << st.objects
            << " objects): " << (all_ok ? "yes" : "NO") << "\n";
  server.Stop(!all_ok);
  return all_ok ? 0 : 1;
}

std::string ProcCells(const ProcStats& p) {
  return p.ok ? absl::StrCat(p.threads, ", ", FormatMiB(p.rss_kb, true), " MiB, ",
                             FormatMiB(p.hwm_kb, true), " MiB")
              : std::string("n/a");
}

std::string MetricCell(double v) { return v < 0 ? "n/a" : absl::StrFormat("%.0f", v); }

int RunReplication(Options options) {
  ReplicationLoadOptions& o = options.replication;
  o.run_id = NewRunId();
  std::string load_before = LoadAverage();
  ReplicationLoadResult r = RunReplicationLoad(o);
  std::cout << "## Replication: " << o.objects << " objects, " << o.streams
            << " Write streams into the shard store, window " << o.window << "\n\n";
  if (!r.setup_error.empty()) {
    std::cout << "**SETUP FAILED**: " << r.setup_error << "\n";
    std::cerr << r.logs;
    return 2;
  }
  std::cout
      << "Each pass writes every object once into shard \"a\"'s store (create, then update, then "
         "delete); one shard_replicator copies them to the cache. Lag: from an object's local "
         "write answered (OK) to its event on a Watch of the cache (shard \"a\", cluster "
         "\"root\"), matched by name. End-to-end: objects divided by the time from the first "
         "local write sent to the last event. Copies/s after the last answer: the events that "
         "arrived after the last local write was answered, divided by that time (the drain). "
         "CPU: cores averaged from the first write to the last event. The check lists the "
         "cache's copies against the shard store's objects after each pass.\n\n"
      << "| setup | value |\n|---|---|\n"
      << absl::StrFormat("| object size as sent (serialized) | %d bytes |\n", r.object_bytes_sent)
      << absl::StrFormat("| replicator start to /readyz 200 | %.2f s |\n", r.ready_seconds)
      << absl::StrFormat("| replicator start to leading | %.2f s |\n", r.leading_seconds)
      << absl::StrFormat("| CCR created to phase Ready | %.2f s |\n", r.ccr_ready_seconds)
      << "| replicator before the load: threads, VmRSS, VmHWM | " << ProcCells(r.replicator_idle)
      << " |\n\n"
      << "| pass | event | local writes OK / errors | local writes/s | local write p50 / p99 / "
         "max ms | copies seen / written | end-to-end objects/s | first write to last event | "
         "last answer to last event | copies/s after the last answer | lag p50 ms | lag p90 ms | "
         "lag p99 ms | lag max ms | "
         "duplicate / other events | CPU replicator / shard / cache / tool (cores) | busiest "
         "replicator thread (cores) | replicator upserts / deletes / failed writes | "
         "replicator's own lag metric, mean ms | replicator VmRSS after, MiB | load avg (1m) "
         "|\n"
      << "|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|"
         "---:|---:|\n";
  std::vector<std::string> problems;
  for (const ReplicationPass& p : r.passes) {
    std::cout
        << absl::StrFormat(
               "| %s | %s | %d / %d | %.0f | %s / %s / %s | %d / %d | %.0f | %.2f s | %.2f s | %s "
               "| %s "
               "| %s | %s | %s | %d / %d | %.2f / %.2f / %.2f / %.2f | %s | %s / %s / %s | %s | %s "
               "| %s |\n",
               p.name, p.event, p.writes_ok, p.write_errors,
               p.write_seconds > 0 ? static_cast<double>(p.writes_ok) / p.write_seconds : 0.0,
               FormatMs(p.write_latency.p50_ms, p.write_latency.count),
               FormatMs(p.write_latency.p99_ms, p.write_latency.count),
               FormatMs(p.write_latency.max_ms, p.write_latency.count), p.events_seen, p.writes_ok,
               p.end_to_end_seconds > 0 ? static_cast<double>(p.events_seen) / p.end_to_end_seconds
                                        : 0.0,
               p.end_to_end_seconds, p.drain_seconds,
               p.drain_seconds > 0
                   ? absl::StrFormat("%.0f", static_cast<double>(p.drain_events) / p.drain_seconds)
                   : std::string("n/a"),
               FormatMs(p.lag.p50_ms, p.lag.count), FormatMs(p.lag.p90_ms, p.lag.count),
               FormatMs(p.lag.p99_ms, p.lag.count), FormatMs(p.lag.max_ms, p.lag.count),
               p.duplicates, p.other_events, p.replicator_cores, p.shard_cores, p.cache_cores,
               p.bench_cores,
               absl::StrFormat("%.2f (%s)", p.replicator_busiest.cores,
                               p.replicator_busiest.name.empty() ? "a thread that has exited"
                                                                 : p.replicator_busiest.name),
               MetricCell(p.replicator_upserts), MetricCell(p.replicator_deletes),
               MetricCell(p.replicator_write_errors),
               p.replicator_lag_mean_ms < 0 ? std::string("n/a")
                                            : absl::StrFormat("%.1f", p.replicator_lag_mean_ms),
               FormatMiB(p.replicator_after.rss_kb, p.replicator_after.ok), LoadAverage())
        << std::flush;
    if (!p.complete) {
      problems.push_back(
          absl::StrCat("pass ", p.name, ": only ", p.events_seen, " of the ", o.objects,
                       " objects got their ", p.event, " event on the cache watch (", p.writes_ok,
                       " local writes answered OK) within --drain-timeout after the last answer"));
    }
    if (p.write_errors > 0) {
      problems.push_back(absl::StrCat("pass ", p.name, ": ", p.write_errors,
                                      " local writes failed: ", ErrorList(p.error_samples)));
    }
  }
  std::cout << "\n| after pass | objects in the shard store | copies in the cache | in sync "
               "(original-resource-version = local resourceVersion) | missing | stale | extra "
               "|\n|---|---:|---:|---:|---:|---:|---:|\n";
  for (const ReplicationPass& p : r.passes) {
    const SyncCheck& c = p.check;
    if (!c.ok) {
      std::cout << "| " << p.name << " | n/a | n/a | n/a | n/a | n/a | n/a |\n";
      problems.push_back(absl::StrCat("pass ", p.name, ": the check failed: ", c.error));
      continue;
    }
    std::cout << absl::StrFormat("| %s | %d | %d | %d | %d | %d | %d |\n", p.name, c.local,
                                 c.copies, c.in_sync, c.missing, c.stale, c.extra);
    if (c.missing + c.stale + c.extra > 0) {
      problems.push_back(absl::StrCat("pass ", p.name, ": the cache is not in sync: ", c.missing,
                                      " copies missing, ", c.stale, " stale, ", c.extra, " extra"));
    }
  }
  if (!r.watch_error.empty()) problems.push_back(r.watch_error);
  if (r.passes.size() < 3) problems.push_back("passes after an incomplete one were not run");
  if (r.replicator_exit != 0) {
    problems.push_back(
        absl::StrCat("shard_replicator on SIGTERM: ", ExitDescription(r.replicator_exit)));
  }
  std::cout << "\n| process after the load | threads, VmRSS, VmHWM |\n|---|---|\n"
            << "| shard_replicator | " << ProcCells(r.replicator_end) << " |\n"
            << "| shard store | " << ProcCells(r.shard_end) << " |\n"
            << "| cache | " << ProcCells(r.cache_end) << " |\n\n"
            << "Watch events for objects not of this run: " << r.foreign_events
            << ". shard_replicator on SIGTERM: " << ExitDescription(r.replicator_exit)
            << ". Load average (1m) before / after: " << load_before << " / " << LoadAverage()
            << ".\n\n";
  std::cout << "shard_replicator's failed cache writes over the run, by code: ";
  if (r.replicator_errors_by_code.empty()) std::cout << "none";
  for (const auto& [labels, count] : r.replicator_errors_by_code) {
    std::cout << "`" << labels << "` " << count << "; ";
  }
  std::cout << "\n\nshard_replicator's log: " << r.replicator_warning_count
            << " lines with \"warn\" or \"error\""
            << (r.replicator_warnings.empty() ? "." : ", the first:") << "\n\n";
  for (const std::string& line : r.replicator_warnings) std::cout << "    " << line << "\n";
  if (!r.replicator_warnings.empty()) std::cout << "\n";
  bool verified = r.Verified();
  std::cout << "Verified (every object's copy arrived in every pass, the cache matched the shard "
               "store after each, the replicator exited 0): "
            << (verified ? "yes" : "**NO**") << "\n";
  for (const std::string& p : problems) std::cout << "\n**MISMATCH**: " << p << "\n";
  if (!verified) std::cerr << r.logs;
  return verified ? 0 : 1;
}

// "name count, name count, ...": threads by name, the most common first.
std::string ThreadNameCells(const std::map<std::string, int64_t>& names) {
  std::vector<std::pair<int64_t, std::string>> sorted;
  for (const auto& [name, count] : names) sorted.emplace_back(-count, name);
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> parts;
  for (const auto& [count, name] : sorted) parts.push_back(absl::StrCat("`", name, "` ", -count));
  return parts.empty() ? "n/a" : absl::StrJoin(parts, ", ");
}

int RunCcrs(Options options) {
  CcrScaleOptions& o = options.ccrs;
  o.run_id = NewRunId();
  std::string load_before = LoadAverage();
  CcrScaleResult r = RunCcrScale(o);
  std::cout << "## CCRs on one replicator: " << o.ccrs << " CCRs over " << o.resources
            << " resources in " << r.clusters << " logical clusters, " << o.objects_per_resource
            << " objects per (cluster, resource)\n\n";
  if (!r.setup_error.empty()) {
    std::cout << "**SETUP FAILED**: " << r.setup_error << "\n";
    std::cerr << r.logs;
    return 2;
  }
  std::cout
      << "The shard store holds " << r.objects << " objects of " << r.object_bytes_sent
      << " bytes (as sent) in " << r.clusters << " x " << o.resources
      << " (cluster, resource) pairs; CCR i asks for resource i % " << o.resources
      << " in cluster i / " << o.resources << ", so " << r.expected_copies
      << " copies are expected in the cache. Readings of shard_replicator (/proc/PID/status "
         "Threads and VmRSS, /proc/PID/task/*/comm, its "
         "shardcache_replicator_replication_controllers gauge and, where it has them, its "
         "shardcache_informer_factory_informers gauges): idle (leading, nothing "
         "defined, "
      << absl::FormatDuration(o.settle)
      << " after it began to lead); with the definitions and objects, no CCR, "
      << absl::FormatDuration(o.settle)
      << " after the last write; once every CCR is Ready and a listing of the cache shows every "
         "copy (polled every 500 ms); and "
      << absl::FormatDuration(o.settle)
      << " after every CCR and copy is gone. Time: the writes and the pause (objects), the first "
         "CCR create sent to converged, the first delete sent to everything gone. A thread that "
         "was never named bears the process's name, cut to 15 bytes (`shard_replicato`).\n\n"
      << "| setup | value |\n|---|---|\n"
      << absl::StrFormat("| replicator start to /readyz 200 / to leading | %.2f s / %.2f s |\n",
                         r.ready_seconds, r.leading_seconds)
      << absl::StrFormat("| %d objects written (one Write stream, window %d) | %.2f s |\n",
                         r.objects, o.window, r.objects_seconds)
      << absl::StrFormat("| %d CCR creates, first sent to last answered | %.2f s |\n", o.ccrs,
                         r.create_seconds)
      << "| first CCR create to every CCR Ready | "
      << (r.all_ready_seconds < 0 ? std::string("not seen")
                                  : absl::StrFormat("%.2f s", r.all_ready_seconds))
      << " |\n| first CCR create to every copy in the cache | "
      << (r.converged_seconds < 0 ? std::string("not seen")
                                  : absl::StrFormat("%.2f s", r.converged_seconds))
      << " |\n"
      << absl::StrFormat("| replicator's highest thread count seen while converging | %d |\n",
                         r.peak_threads)
      << absl::StrFormat("| %d CCR deletes, first sent to last answered | %.2f s |\n", o.ccrs,
                         r.delete_seconds)
      << "| first delete to no CCR and no copy left | "
      << (r.gone_seconds < 0 ? std::string("not seen") : absl::StrFormat("%.2f s", r.gone_seconds))
      << " |\n| then, the replicator's thread count last changed after | "
      << (r.gone_seconds < 0 ? std::string("n/a")
          : r.threads_changed_seconds < 0
              ? absl::StrCat("no change in ", absl::FormatDuration(o.settle))
              : absl::StrFormat("%.1f s", r.threads_changed_seconds))
      << " |\n\n"
      << "| phase | time | replicator threads | threads - idle | per CCR | VmRSS MiB | VmRSS - "
         "idle MiB | per CCR KiB | VmHWM MiB | CPU s since the previous reading | replication "
         "controllers | informers: shard store / cache | threads by name |\n"
      << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n";
  const ProcStats* idle = r.readings.empty() ? nullptr : &r.readings.front().replicator;
  const ProcStats* previous = nullptr;
  for (const CcrScaleReading& reading : r.readings) {
    const ProcStats& p = reading.replicator;
    bool per_ccr = reading.phase == "converged" || reading.phase == "after delete";
    bool diff = idle != nullptr && idle->ok && p.ok;
    int64_t threads = diff ? p.threads - idle->threads : 0;
    int64_t rss_kb = diff ? p.rss_kb - idle->rss_kb : 0;
    std::cout << absl::StrFormat(
        "| %s | %.2f s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", reading.phase,
        reading.seconds, p.ok ? absl::StrCat(p.threads) : "n/a",
        diff ? absl::StrCat(threads) : "n/a",
        diff && per_ccr ? absl::StrFormat("%.2f", static_cast<double>(threads) / o.ccrs) : "",
        FormatMiB(p.rss_kb, p.ok), diff ? FormatMiB(rss_kb, true) : "n/a",
        diff && per_ccr ? absl::StrFormat("%.1f", static_cast<double>(rss_kb) / o.ccrs) : "",
        FormatMiB(p.hwm_kb, p.ok),
        previous != nullptr && previous->ok && p.ok
            ? absl::StrFormat("%.2f", p.cpu_seconds - previous->cpu_seconds)
            : "",
        MetricCell(reading.replication_controllers),
        reading.shard_informers < 0 && reading.cache_informers < 0
            ? std::string("no gauge")
            : absl::StrCat(MetricCell(reading.shard_informers), " / ",
                           MetricCell(reading.cache_informers)),
        ThreadNameCells(reading.thread_names));
    previous = &p;
  }
  std::cout << "\n| process at the end | threads, VmRSS, VmHWM |\n|---|---|\n"
            << "| shard store | " << ProcCells(r.shard_end) << " |\n"
            << "| cache | " << ProcCells(r.cache_end) << " |\n\n"
            << "shard_replicator on SIGTERM: " << ExitDescription(r.replicator_exit)
            << ". Load average (1m) before / after: " << load_before << " / " << LoadAverage()
            << ".\n\nshard_replicator's log: " << r.replicator_warnings.count
            << " lines with \"warn\" or \"error\""
            << (r.replicator_warnings.first.empty() ? "." : ", the first:") << "\n\n";
  for (const std::string& line : r.replicator_warnings.first) std::cout << "    " << line << "\n";
  if (!r.replicator_warnings.first.empty()) std::cout << "\n";
  bool verified = r.Verified();
  std::cout << "Verified (every CCR Ready and every copy in the cache, then every CCR and copy "
               "gone, each within --converge-timeout; the replicator exited 0): "
            << (verified ? "yes" : "**NO**") << "\n";
  if (!r.failure.empty()) std::cout << "\n**FAILED**: " << r.failure << "\n";
  if (r.replicator_exit != 0) {
    std::cout << "\n**FAILED**: shard_replicator on SIGTERM: " << ExitDescription(r.replicator_exit)
              << "\n";
  }
  if (!verified) std::cerr << r.logs;
  return verified ? 0 : 1;
}

}  // namespace
}  // namespace shardcache::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "load a shardcache Store server.\n\n"
      "  store_bench --mode=write --clients=1,16,64 --duration=10s [--api=stream --window=64]\n"
      "  store_bench --mode=watch --watchers=1000 --write-rate=200/s --duration=20s\n"
      "  store_bench --mode=get --objects=1000 --clients=1,16 --duration=10s\n"
      "  store_bench --mode=watch --targets=cache_server,etcd --watchers=1000 "
      "--write-rate=100/s\n"
      "  store_bench --mode=fsync --duration=10s [--fsync-dir=DIR]\n"
      "  store_bench --mode=startup --objects=1000000 --object-bytes=1024\n"
      "  store_bench --mode=replication --objects=10000 --object-bytes=1024\n"
      "  store_bench --mode=ccrs --ccrs=50 --ccr-resources=20 --objects-per-resource=20\n\n"
      "Without --target it starts a cache_server on 127.0.0.1 itself, with its data in a fresh\n"
      "temporary directory; --server-args=\"--sync=false ...\" passes flags to it.");
  // Debian builds Abseil without NDEBUG, which leaves absl::Mutex's deadlock detection on: every
  // lock then takes a process-wide lock. The load generator should not pay for that.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::string command = shardcache::bench::QuotedCommandLine(argc, argv);
  absl::ParseCommandLine(argc, shardcache::NormalizeFlagNames(argc, argv));
  absl::StatusOr<shardcache::bench::Options> options = shardcache::bench::OptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "store_bench: " << options.status().message() << "\n";
    return 2;
  }
  std::cout << "# store_bench\n\nCommand: `" << command << "`\n\n"
            << "Server: " << shardcache::bench::ServerDescription(*options) << "\n\n"
            << "Machine: " << sysconf(_SC_NPROCESSORS_ONLN) << " CPUs online; load average (1m) "
            << shardcache::bench::LoadAverage() << " at start.\n\n"
            << std::flush;
  // The tool's watchers and writers take their callbacks on gRPC's callback threads, which nap
  // after a quiet second: without the ticks, the first events after a round's idle period could
  // wait up to 100 ms in the tool.
  shardcache::CallbackQueueTicker ticker;
  if (options->SideBySide()) return shardcache::bench::RunSideBySide(*std::move(options));
  switch (options->mode) {
    case shardcache::bench::Options::Mode::kGet:
    case shardcache::bench::Options::Mode::kList:
      return 2;  // side by side, above
    case shardcache::bench::Options::Mode::kWrite:
      return shardcache::bench::RunWrite(*std::move(options));
    case shardcache::bench::Options::Mode::kWatch:
      return shardcache::bench::RunWatch(*std::move(options));
    case shardcache::bench::Options::Mode::kFsync:
      return shardcache::bench::RunFsync(*options);
    case shardcache::bench::Options::Mode::kStartup:
      return shardcache::bench::RunStartup(*options);
    case shardcache::bench::Options::Mode::kReplication:
      return shardcache::bench::RunReplication(*std::move(options));
    case shardcache::bench::Options::Mode::kCcrs:
      return shardcache::bench::RunCcrs(*std::move(options));
  }
  return 2;
}
