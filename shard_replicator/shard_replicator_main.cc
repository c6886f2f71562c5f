// shard_replicator: replicates what a shard's ClusterCachedResources select from the shard's
// store into the cache server, while it holds the shard's lease. See replicator.h.
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/callback_queue_ticker.h"
#include "common/client/leader_elector.h"
#include "common/flags.h"
#include "common/http_server.h"
#include "common/logging.h"
#include "common/port_file.h"
#include "common/server_main.h"
#include "common/signals.h"
#include "common/tls.h"
#include "shard_replicator/replicator.h"

ABSL_FLAG(std::string, shard, "", "this shard's name (required); copies in the cache carry it");
ABSL_FLAG(std::string, shard_store, "",
          "host:port of the shard's store, or of each of its replicas, comma-separated (required)");
ABSL_FLAG(std::string, cache, "",
          "host:port of the cache server, or of each of its replicas (--storage=etcd), "
          "comma-separated: the replicator moves to another when one fails (required)");
ABSL_FLAG(std::string, identity, "",
          "this replica's identity in the lease (default: host name plus a random suffix)");
ABSL_FLAG(std::string, lease_cluster, "root", "the logical cluster of the lease object");
ABSL_FLAG(std::string, lease_namespace, "shardcache-system", "the namespace of the lease object");
ABSL_FLAG(
    std::string, lease_name, "shard-replicator",
    "the name of the lease object (leases, coordination.shardcache.io/v1) in the shard store");
ABSL_FLAG(absl::Duration, lease_duration, absl::Seconds(15),
          "how long a standby waits after the last renewal it saw before taking the lease");
ABSL_FLAG(absl::Duration, renew_deadline, absl::Seconds(10),
          "how long the leader keeps leading without a successful renewal (< --lease-duration)");
ABSL_FLAG(absl::Duration, retry_period, absl::Seconds(2),
          "the interval between attempts to acquire or renew the lease");
ABSL_FLAG(int32_t, workers, 4,
          "how many keys of each controller (the CCRs', each CCR's replication) are reconciled "
          "at once, at most");
ABSL_FLAG(int32_t, worker_threads, 8,
          "the threads that reconcile for every controller and run every informer (its lists, "
          "watch events and handlers), however many CCRs there are");
ABSL_FLAG(absl::Duration, memory_trim_interval, absl::Seconds(30),
          "how often the heap memory that the replicator has freed is returned to the system "
          "(0: never)");
ABSL_FLAG(absl::Duration, resync_period, absl::Minutes(5),
          "how often every replicated object is reconciled again even without a change (0: never)");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8080",
          "HTTP address for /metrics, /healthz and /readyz, host:port (port 0: any free port)");
ABSL_FLAG(std::string, port_file, "",
          "if set, once serving, write the bound HTTP port here as "
          "a line http_port=N");
ABSL_FLAG(absl::Duration, keepalive_time, absl::Seconds(10),
          "how often the connections to the shard store and the cache are pinged (HTTP/2 PING), "
          "so that a connection whose peer vanished without a reset is found and replaced; the "
          "servers' --keepalive-min-client-interval must not exceed it");
ABSL_FLAG(absl::Duration, keepalive_timeout, absl::Seconds(5),
          "a connection whose keepalive ping is not answered within this time is closed");
ABSL_FLAG(absl::Duration, watch_idle_timeout, absl::Seconds(15),
          "a watch that receives neither an event nor a bookmark for this long is taken for dead "
          "and opened again (a few times the stores' --bookmark-interval; 0: never)");
ABSL_FLAG(std::string, cache_ca_file, "",
          "PEM CA bundle that the cache server's certificate must chain to; with it (or "
          "--cache-cert-file) the cache is reached over TLS (its name verified against --cache's "
          "host)");
ABSL_FLAG(std::string, cache_cert_file, "",
          "PEM client certificate (chain) presented to the cache server (mutual TLS); for "
          "authorization its CN is shardcache:replicator:<shard> and an O is "
          "shardcache:replicators");
ABSL_FLAG(std::string, cache_key_file, "", "PEM private key of --cache-cert-file");
ABSL_FLAG(
    std::string, shard_store_ca_file, "",
    "PEM CA bundle that the shard store's certificate must chain to (TLS, as --cache-ca-file)");
ABSL_FLAG(std::string, shard_store_cert_file, "",
          "PEM client certificate (chain) presented to the shard store (mutual TLS)");
ABSL_FLAG(std::string, shard_store_key_file, "", "PEM private key of --shard-store-cert-file");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(10),
          "how often the CA, certificate and key files are read again; a changed file is used "
          "for the connections made after that, without a restart (at least 1s)");
ABSL_FLAG(std::string, http_tls_cert_file, "",
          "PEM certificate (chain): with --http-tls-key-file, /metrics, /healthz and /readyz are "
          "served over HTTPS (reloaded on change, as the other files)");
ABSL_FLAG(std::string, http_tls_key_file, "", "PEM private key of --http-tls-cert-file");

namespace shardcache {
namespace {

// The leader election timings, checked before anything starts (informers, HTTP): the lease
// outlives the renew deadline, which outlives a retry period (with its jitter), as client-go's
// leader election requires.
absl::Status CheckLeaseFlags() {
  absl::Duration lease = absl::GetFlag(FLAGS_lease_duration);
  absl::Duration renew = absl::GetFlag(FLAGS_renew_deadline);
  absl::Duration retry = absl::GetFlag(FLAGS_retry_period);
  for (auto [name, d] : {std::pair{"--lease-duration", lease}, std::pair{"--renew-deadline", renew},
                         std::pair{"--retry-period", retry}}) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": must be positive"));
    }
  }
  if (lease <= renew) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lease-duration (", absl::FormatDuration(lease),
        ") must be greater than --renew-deadline (", absl::FormatDuration(renew), ")"));
  }
  if (renew <= retry * LeaderElector::kJitterFactor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--renew-deadline (", absl::FormatDuration(renew),
        ") must be greater than 1.2 times --retry-period (", absl::FormatDuration(retry), ")"));
  }
  return absl::OkStatus();
}

std::string DefaultIdentity() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "replica");
  }
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  absl::BitGen rng;
  std::string suffix;
  for (int i = 0; i < 5; ++i) suffix.push_back(kChars[absl::Uniform(rng, 0u, 36u)]);
  return absl::StrCat(host, "-", suffix);
}

int Run() {
  ShardReplicator::Options options;
  options.shard = absl::GetFlag(FLAGS_shard);
  options.shard_store = absl::GetFlag(FLAGS_shard_store);
  options.cache = absl::GetFlag(FLAGS_cache);
  options.identity = absl::GetFlag(FLAGS_identity);
  if (options.identity.empty()) options.identity = DefaultIdentity();
  options.lease_cluster = absl::GetFlag(FLAGS_lease_cluster);
  options.lease_namespace = absl::GetFlag(FLAGS_lease_namespace);
  options.lease_name = absl::GetFlag(FLAGS_lease_name);
  options.lease_duration = absl::GetFlag(FLAGS_lease_duration);
  options.renew_deadline = absl::GetFlag(FLAGS_renew_deadline);
  options.retry_period = absl::GetFlag(FLAGS_retry_period);
  options.workers = absl::GetFlag(FLAGS_workers);
  options.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  options.memory_trim_interval = absl::GetFlag(FLAGS_memory_trim_interval);
  options.resync_period = absl::GetFlag(FLAGS_resync_period);
  options.keepalive.time = absl::GetFlag(FLAGS_keepalive_time);
  options.keepalive.timeout = absl::GetFlag(FLAGS_keepalive_timeout);
  options.watch_idle_timeout = absl::GetFlag(FLAGS_watch_idle_timeout);
  auto registry = std::make_shared<prometheus::Registry>();
  RegisterBuildInfo(*registry);
  options.registry = registry;
  TlsFiles cache_tls{absl::GetFlag(FLAGS_cache_cert_file), absl::GetFlag(FLAGS_cache_key_file),
                     absl::GetFlag(FLAGS_cache_ca_file), absl::GetFlag(FLAGS_tls_reload_interval)};
  TlsFiles shard_tls{
      absl::GetFlag(FLAGS_shard_store_cert_file), absl::GetFlag(FLAGS_shard_store_key_file),
      absl::GetFlag(FLAGS_shard_store_ca_file), absl::GetFlag(FLAGS_tls_reload_interval)};
  absl::Status tls =
      CheckTlsFiles(cache_tls, "--cache-cert-file", "--cache-key-file", "--cache-ca-file");
  if (tls.ok()) {
    tls = CheckTlsFiles(shard_tls, "--shard-store-cert-file", "--shard-store-key-file",
                        "--shard-store-ca-file");
  }
  TlsFiles http_tls{absl::GetFlag(FLAGS_http_tls_cert_file), absl::GetFlag(FLAGS_http_tls_key_file),
                    "", absl::GetFlag(FLAGS_tls_reload_interval)};
  if (tls.ok()) {
    tls = CheckTlsFiles(http_tls, "--http-tls-cert-file", "--http-tls-key-file", "");
  }
  if (!tls.ok()) return Refuse(tls);
  if (cache_tls.client_enabled() || shard_tls.client_enabled()) {
    InstallGrpcLogRouting(*registry);
  }
  options.cache_credentials = MakeChannelCredentials(cache_tls);
  options.shard_store_credentials = MakeChannelCredentials(shard_tls);
  std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  absl::StatusOr<std::pair<std::string, int>> http_address =
      SplitHostPort("--http-listen", http_listen);
  if (!http_address.ok()) return Refuse(http_address.status());
  for (const char* flag : {"--shard-store", "--cache"}) {
    const std::string& address =
        std::string(flag) == "--cache" ? options.cache : options.shard_store;
    if (address.empty()) continue;  // ShardReplicator::Start names the missing flag
    for (absl::string_view one : absl::StrSplit(address, ',')) {
      absl::StatusOr<std::pair<std::string, int>> parsed = SplitHostPort(flag, std::string(one));
      if (!parsed.ok()) return Refuse(parsed.status());
    }
  }

  absl::StatusOr<std::unique_ptr<ShardReplicator>> replicator = ShardReplicator::Start(options);
  if (!replicator.ok()) return Refuse(replicator.status());
  // The replicator's streams take their callbacks on gRPC's callback threads, which nap after a
  // quiet second (see the header).
  CallbackQueueTicker ticker;
  std::atomic<bool> stopping{false};
  ShardReplicator* raw = replicator->get();
  HttpServer http(registry, [raw, &stopping]() {
    if (stopping.load()) return absl::UnavailableError("shutting down");
    return raw->Ready();
  });
  if (http_tls.server_enabled()) {
    absl::StatusOr<std::shared_ptr<ReloadingKeyPair>> keys = ReloadingKeyPair::Load(http_tls);
    if (!keys.ok()) return Refuse(keys.status());
    http.ServeTls(*std::move(keys));
  }
  absl::StatusOr<int> http_port = http.Start(http_listen);
  if (!http_port.ok()) return Refuse(http_port.status());
  std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    absl::Status written = WritePortFile(port_file, {{"http_port", *http_port}});
    if (!written.ok()) return Refuse(written);
  }
  spdlog::info(
      "serving http={} (port {}) workers={} worker_threads={} resync_period={} shard_store_tls={} "
      "cache_tls={}",
      http_listen, *http_port, options.workers, options.worker_threads,
      absl::FormatDuration(options.resync_period), shard_tls.client_enabled(),
      cache_tls.client_enabled());

  int sig = WaitForTerminationSignal();
  spdlog::info("received signal {}: stopping", sig);
  stopping = true;
  (*replicator)->Stop();
  http.Stop();  // before the replicator goes: a /readyz request in flight may still ask it
  replicator->reset();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace shardcache

int main(int argc, char** argv) {
  return shardcache::ServerMain(
      argc, argv, "shard_replicator",
      "replicates the objects that a shard's ClusterCachedResources select into the cache.\n\n"
      "  shard_replicator --shard=a --shard-store=127.0.0.1:7071 --cache=127.0.0.1:7070\n\n"
      "Flags may be spelt with dashes or underscores (--shard-store, --shard_store).",
      [] {
        absl::Status flags = shardcache::CheckLeaseFlags();
        if (!flags.ok()) return shardcache::Refuse(flags);
        return shardcache::Run();
      });
}
