// cache_server: the shardcache object store, in the cache role (the global cache, any resource)
// or the shard role (a shard's own store: built-in resources and those a ResourceDefinition
// defines). Serves shardcache.v1.Store, gRPC reflection and grpc.health.v1.Health over gRPC, and
// /metrics, /healthz, /readyz over HTTP. SIGTERM (or SIGINT) drains and exits 0.

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <optional>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cache_server/authorizer.h"
#include "cache_server/etcd_client.h"
#include "cache_server/etcd_layout.h"
#include "cache_server/kube_api_server.h"
#include "cache_server/object_store.h"
#include "cache_server/rocksdb_storage.h"
#include "cache_server/store_metrics.h"
#include "cache_server/store_service.h"
#include "cache_server/watch_cache.h"
#include "common/callback_queue_ticker.h"
#include "common/flags.h"
#include "common/http_server.h"
#include "common/port_file.h"
#include "common/server_main.h"
#include "common/signals.h"
#include "common/status_macros.h"
#include "common/tls.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

ABSL_FLAG(std::string, role, "cache",
          "cache: the global cache, which accepts any resource; shard: a shard's own store, which "
          "serves only built-in resources and those that a ResourceDefinition defines");
ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "gRPC address, host:port (port 0: any free port)");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8070",
          "HTTP address for /metrics, /healthz and /readyz, host:port (port 0: any free port)");
ABSL_FLAG(std::string, port_file, "",
          "if set, once serving, write the bound ports here as lines grpc_port=N and http_port=M");
ABSL_FLAG(int64_t, max_object_bytes, 1536 * 1024,
          "objects larger than this many bytes (serialized) are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, history_events, 10000,
          "events kept in the watch history window; a watch or continued list from an older "
          "revision fails with OUT_OF_RANGE (too old resource version)");
ABSL_FLAG(std::string, storage, "rocksdb",
          "where the store keeps its data: rocksdb (in --data-dir, this process alone) or etcd "
          "(on an etcd cluster, --etcd-endpoints, shared by every cache_server replica with the "
          "same --etcd-prefix)");
ABSL_FLAG(std::string, data_dir, "shardcache-data",
          "the directory where the store keeps its data (RocksDB); created when absent");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "--storage=etcd: the etcd members' client addresses, host:port,host:port,...");
ABSL_FLAG(std::string, etcd_prefix, "/shardcache",
          "--storage=etcd: the key prefix under which the store lies (several stores can share "
          "one etcd cluster under different prefixes)");
ABSL_FLAG(std::string, etcd_cacert, "",
          "--storage=etcd: the CA certificate that signed the etcd members' (empty: plaintext)");
ABSL_FLAG(std::string, etcd_cert, "",
          "--storage=etcd: this replica's client certificate for etcd (with --etcd-key)");
ABSL_FLAG(std::string, etcd_key, "", "--storage=etcd: the key of --etcd-cert");
ABSL_FLAG(absl::Duration, etcd_request_timeout, absl::Seconds(5),
          "--storage=etcd: the deadline of each request to etcd; a write that etcd has not "
          "answered by then fails with UNAVAILABLE");
ABSL_FLAG(absl::Duration, consistent_read_timeout, absl::Seconds(3),
          "--storage=etcd: how long a Get or a List waits for this replica to catch up with "
          "etcd's current revision before it fails with UNAVAILABLE rather than answer stale "
          "data; /readyz is false while the replica cannot");
ABSL_FLAG(bool, sync, true,
          "acknowledge a write only once it is synced to disk (group commit shares syncs among "
          "concurrent writers); --sync=false: a pure cache whose last writes before a machine "
          "crash may be lost (a process crash loses nothing)");
ABSL_FLAG(int64_t, min_free_disk_bytes, 64 << 20,
          "creates and updates are refused with RESOURCE_EXHAUSTED (reason NO_SPACE) while the "
          "disk of --data-dir has less free space than this, so that a commit never meets a full "
          "disk; reads, watches and deletes go on, and writes resume once space is freed (0: no "
          "reserve)");
ABSL_FLAG(absl::Duration, history_age, absl::Hours(1),
          "events older than this leave the watch history window (0: no age limit)");
ABSL_FLAG(int64_t, watch_queue_events, 0,
          "live events that may wait for one watcher, on top of --watch-queue-bytes (0: no bound "
          "in events); a watcher whose queue is full is parked and caught up from the history");
ABSL_FLAG(int64_t, watch_queue_bytes, 1 << 20,
          "bytes of live events that may wait for one watcher; a watcher whose queue is full is "
          "parked and caught up from the history window once it has drained half of it (ended "
          "with OUT_OF_RANGE if the window has moved past it); nobody waits for it");
ABSL_FLAG(absl::Duration, watch_stall_timeout, absl::Seconds(20),
          "how long a watcher whose queue is full may leave a message unread before it is ended "
          "with RESOURCE_EXHAUSTED; a watcher that reads, however slowly, is parked instead (as "
          "--keepalive-timeout, long enough for a client busy for a few seconds to keep its "
          "watches)");
ABSL_FLAG(int32_t, watch_dispatchers, 2,
          "threads that fan events out to watchers (each serves a share of the watchers)");
ABSL_FLAG(bool, watch_cork_writes, true,
          "each fan-out thread corks (TCP_CORK) the connections it writes watch events to until "
          "its pass over the watchers ends, so that one event to many streams of a connection "
          "leaves in a few TCP segments; --watch-cork-writes=false sends each message at once");
ABSL_FLAG(absl::Duration, bookmark_interval, absl::Seconds(5),
          "how often an idle watcher that asked for periodic bookmarks "
          "(WatchRequest.allow_bookmarks) receives a BOOKMARK event");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(10),
          "on SIGTERM, how long in-flight calls may take to finish");
ABSL_FLAG(absl::Duration, keepalive_time, absl::Seconds(10),
          "how often the server pings a client connection (HTTP/2 PING) to find out whether it "
          "is still alive, even while no call is open");
// 20 s, as etcd's and gRPC's own default: gRPC also makes it the socket's TCP_USER_TIMEOUT, so a
// shorter one ends every watch of a client whose machine is busy for a few seconds.
ABSL_FLAG(absl::Duration, keepalive_timeout, absl::Seconds(20),
          "a connection whose ping is not answered within this time (or whose sent data is not "
          "acknowledged within it) is closed, and its calls (watches included) end");
ABSL_FLAG(absl::Duration, keepalive_min_client_interval, absl::Seconds(5),
          "the shortest interval between a client's keepalive pings that the server accepts "
          "(clients that ping more often are told to go away); at most the clients' "
          "--keepalive-time");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate (chain) that gRPC serves; with --tls-key-file, gRPC is served over TLS "
          "only. Reloaded when the file changes (see --tls-reload-interval)");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls-cert-file");
ABSL_FLAG(std::string, client_ca_file, "",
          "PEM CA bundle: clients' certificates are requested and verified against it (mutual "
          "TLS); the identity is the certificate's CN (user) and O values (groups). Requires "
          "--tls-cert-file. Turns on --authorization-mode=Policy unless told otherwise");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(10),
          "how often the certificate, key and CA files are read again; a change is served to "
          "the connections made after that, without a restart and without closing open ones "
          "(at least 1s)");
ABSL_FLAG(std::string, authorization_mode, "",
          "Policy: the fixed policy (admins everything, readers get/list/watch, replicators of a "
          "shard only their shard's part; see docs/security.md), which needs "
          "--client-ca-file; AlwaysAllow: every caller may call everything. Default: Policy "
          "with --client-ca-file, else AlwaysAllow");
ABSL_FLAG(std::string, shard, "",
          "role shard: the name of the shard this store belongs to, whose replicators the "
          "Policy authorization lets write their lease and CCR status (required with it)");
ABSL_FLAG(std::string, replicator_lease, "root/shardcache-system/shard-replicator",
          "role shard: cluster/namespace/name of the lease the shard's replicators elect their "
          "leader with (their --lease-cluster, --lease-namespace, --lease-name); the Policy "
          "authorization lets them write only this lease");
ABSL_FLAG(std::string, kube_api_listen, "",
          "host:port of the read-only Kubernetes API view (kubectl, client-go informers; kcp's "
          "/services/cache/shards/*/clusters/* paths; see docs/kubectl.md); empty: off. With "
          "--tls-cert-file it serves HTTPS, with --client-ca-file it asks for client "
          "certificates, and the authorization policy applies as on the gRPC port");
ABSL_FLAG(bool, http_tls, false,
          "serve /metrics, /healthz and /readyz over HTTPS with --tls-cert-file and "
          "--tls-key-file (reloaded like gRPC's); no client certificate is asked for");

namespace shardcache {
namespace {

struct Config {
  ObjectStore::Options store;
  WatchCache::Options watch;
  StoreService::Options service;
  std::string listen;
  std::string http_listen;
  std::string kube_api_listen;
  std::string port_file;
  std::string storage;
  std::string data_dir;
  EtcdClient::Options etcd;
  bool sync = true;
  int64_t min_free_disk_bytes = 0;
  absl::Duration drain_timeout;
  absl::Duration keepalive_time;
  absl::Duration keepalive_timeout;
  absl::Duration keepalive_min_client_interval;
  TlsFiles tls;
  bool http_tls = false;
  // Set when authorization is on (--authorization-mode=Policy).
  std::optional<Authorizer::Options> authorization;
};

absl::StatusOr<Config> ConfigFromFlags() {
  Config c;
  std::string role = absl::GetFlag(FLAGS_role);
  if (role == "cache") {
    c.store.role = Role::kCache;
  } else if (role == "shard") {
    c.store.role = Role::kShard;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--role: \"", role, "\" is not a role (want cache or shard)"));
  }
  c.store.max_object_bytes = absl::GetFlag(FLAGS_max_object_bytes);
  if (c.store.max_object_bytes < 1024 || c.store.max_object_bytes > (64 << 20)) {
    return absl::InvalidArgumentError("--max-object-bytes: must be between 1024 and 67108864");
  }
  c.data_dir = absl::GetFlag(FLAGS_data_dir);
  if (c.data_dir.empty()) return absl::InvalidArgumentError("--data-dir: must not be empty");
  c.storage = absl::GetFlag(FLAGS_storage);
  const std::string endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
  if (c.storage == "etcd") {
    if (endpoints.empty()) {
      return absl::InvalidArgumentError(
          "--etcd-endpoints: required with --storage=etcd (host:port of each etcd member)");
    }
    c.etcd.endpoints = absl::StrSplit(endpoints, ',');
    c.etcd.ca_file = absl::GetFlag(FLAGS_etcd_cacert);
    c.etcd.cert_file = absl::GetFlag(FLAGS_etcd_cert);
    c.etcd.key_file = absl::GetFlag(FLAGS_etcd_key);
    if (c.etcd.cert_file.empty() != c.etcd.key_file.empty()) {
      return absl::InvalidArgumentError("--etcd-cert and --etcd-key: give both or neither");
    }
    if (!c.etcd.cert_file.empty() && c.etcd.ca_file.empty()) {
      return absl::InvalidArgumentError("--etcd-cert: requires --etcd-cacert (TLS to etcd)");
    }
    c.etcd.request_timeout = absl::GetFlag(FLAGS_etcd_request_timeout);
    if (c.etcd.request_timeout < absl::Milliseconds(10)) {
      return absl::InvalidArgumentError("--etcd-request-timeout: must be at least 10ms");
    }
    c.store.etcd_prefix = absl::GetFlag(FLAGS_etcd_prefix);
    if (absl::Status prefix = ValidateEtcdPrefix(c.store.etcd_prefix); !prefix.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--etcd-prefix: ", prefix.message()));
    }
    c.store.consistent_read_timeout = absl::GetFlag(FLAGS_consistent_read_timeout);
    if (c.store.consistent_read_timeout < absl::Milliseconds(10)) {
      return absl::InvalidArgumentError("--consistent-read-timeout: must be at least 10ms");
    }
  } else if (c.storage == "rocksdb") {
    if (!endpoints.empty()) {
      return absl::InvalidArgumentError(
          "--etcd-endpoints: only with --storage=etcd (the store is in --data-dir otherwise)");
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--storage: \"", c.storage, "\" is not a storage (want rocksdb or etcd)"));
  }
  c.sync = absl::GetFlag(FLAGS_sync);
  c.min_free_disk_bytes = absl::GetFlag(FLAGS_min_free_disk_bytes);
  if (c.min_free_disk_bytes < 0) {
    return absl::InvalidArgumentError("--min-free-disk-bytes: must not be negative");
  }
  c.store.history_age = absl::GetFlag(FLAGS_history_age);
  if (c.store.history_age < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--history-age: must not be negative");
  }
  c.store.history_events = absl::GetFlag(FLAGS_history_events);
  if (c.store.history_events < 1) {
    return absl::InvalidArgumentError("--history-events: must be at least 1");
  }
  // Parked watchers catch up over the whole window with the encodings the others received.
  c.watch.kept_forms = static_cast<size_t>(c.store.history_events);
  int64_t queue = absl::GetFlag(FLAGS_watch_queue_events);
  if (queue < 0) return absl::InvalidArgumentError("--watch-queue-events: must not be negative");
  c.service.watch_queue_events = static_cast<size_t>(queue);
  int64_t queue_bytes = absl::GetFlag(FLAGS_watch_queue_bytes);
  if (queue_bytes < 1024) {
    return absl::InvalidArgumentError("--watch-queue-bytes: must be at least 1024");
  }
  c.watch.watcher_queue_bytes = static_cast<size_t>(queue_bytes);
  c.watch.stall_timeout = absl::GetFlag(FLAGS_watch_stall_timeout);
  if (c.watch.stall_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--watch-stall-timeout: must be positive");
  }
  c.watch.dispatchers = absl::GetFlag(FLAGS_watch_dispatchers);
  if (c.watch.dispatchers < 1 || c.watch.dispatchers > 64) {
    return absl::InvalidArgumentError("--watch-dispatchers: must be between 1 and 64");
  }
  c.watch.cork_writes = absl::GetFlag(FLAGS_watch_cork_writes);
  c.watch.bookmark_interval = absl::GetFlag(FLAGS_bookmark_interval);
  if (c.watch.bookmark_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--bookmark-interval: must be positive");
  }
  c.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  if (c.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain-timeout: must not be negative");
  }
  c.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  c.keepalive_timeout = absl::GetFlag(FLAGS_keepalive_timeout);
  c.keepalive_min_client_interval = absl::GetFlag(FLAGS_keepalive_min_client_interval);
  for (auto [flag, value] :
       {std::pair<const char*, absl::Duration>{"--keepalive-time", c.keepalive_time},
        {"--keepalive-timeout", c.keepalive_timeout},
        {"--keepalive-min-client-interval", c.keepalive_min_client_interval}}) {
    if (value < absl::Milliseconds(1) || value > absl::Hours(24)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": must be between 1ms and 24h"));
    }
  }
  c.listen = absl::GetFlag(FLAGS_listen);
  auto hp = SplitHostPort("--listen", c.listen);
  if (!hp.ok()) return hp.status();
  c.http_listen = absl::GetFlag(FLAGS_http_listen);
  hp = SplitHostPort("--http-listen", c.http_listen);
  if (!hp.ok()) return hp.status();
  c.kube_api_listen = absl::GetFlag(FLAGS_kube_api_listen);
  if (!c.kube_api_listen.empty()) {
    hp = SplitHostPort("--kube-api-listen", c.kube_api_listen);
    if (!hp.ok()) return hp.status();
  }
  c.port_file = absl::GetFlag(FLAGS_port_file);
  c.tls = TlsFiles{absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file),
                   absl::GetFlag(FLAGS_client_ca_file), absl::GetFlag(FLAGS_tls_reload_interval)};
  if (!c.tls.ca_file.empty() && c.tls.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--client-ca-file: requires --tls-cert-file and --tls-key-file");
  }
  if (c.tls.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--tls-reload-interval: must be at least 1s");
  }
  RETURN_IF_ERROR(CheckTlsFiles(c.tls, "--tls-cert-file", "--tls-key-file", "--client-ca-file"));
  c.http_tls = absl::GetFlag(FLAGS_http_tls);
  if (c.http_tls && c.tls.cert_file.empty()) {
    return absl::InvalidArgumentError("--http-tls: requires --tls-cert-file and --tls-key-file");
  }
  std::string mode = absl::GetFlag(FLAGS_authorization_mode);
  if (mode.empty()) mode = c.tls.ca_file.empty() ? "AlwaysAllow" : "Policy";
  if (mode == "Policy") {
    if (c.tls.ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--authorization-mode=Policy: requires --client-ca-file (identities come from client "
          "certificates)");
    }
    Authorizer::Options a;
    a.role = c.store.role;
    a.shard = absl::GetFlag(FLAGS_shard);
    if (c.store.role == Role::kShard && a.shard.empty()) {
      return absl::InvalidArgumentError(
          "--shard: required with --role=shard and --authorization-mode=Policy (the shard whose "
          "replicators may write their lease and CCR status here)");
    }
    std::vector<std::string> lease = absl::StrSplit(absl::GetFlag(FLAGS_replicator_lease), '/');
    if (lease.size() != 3 || lease[0].empty() || lease[1].empty() || lease[2].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--replicator-lease: \"",
                                                     absl::GetFlag(FLAGS_replicator_lease),
                                                     "\" is not cluster/namespace/name"));
    }
    a.lease_cluster = lease[0];
    a.lease_namespace = lease[1];
    a.lease_name = lease[2];
    c.authorization = a;
  } else if (mode != "AlwaysAllow") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--authorization-mode: \"", mode, "\" is not a mode (want Policy or AlwaysAllow)"));
  }
  return c;
}

int Run(Config config, const std::string& role_name) {
  absl::Time load_start = absl::Now();
  std::unique_ptr<RocksDbStorage> storage;
  std::unique_ptr<EtcdClient> etcd;
  absl::StatusOr<PersistedState> state;
  std::string location;
  if (config.storage == "etcd") {
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(config.etcd);
    if (!client.ok()) {
      return Refuse(absl::InvalidArgumentError(
          absl::StrCat("--etcd-endpoints: ", client.status().message())));
    }
    etcd = *std::move(client);
    state = LoadEtcdState(etcd.get(), config.store.etcd_prefix);
    if (!state.ok()) {
      return Refuse(
          absl::Status(state.status().code(),
                       absl::StrCat("cannot load the store from etcd (",
                                    absl::StrJoin(config.etcd.endpoints, ","), ", prefix ",
                                    config.store.etcd_prefix, "): ", state.status().message())));
    }
    config.store.etcd = etcd.get();
    // Reads wait for the replica's watch, which needs gRPC's callback threads.
    config.service.read_threads = 8;
    location = absl::StrCat("etcd ", absl::StrJoin(config.etcd.endpoints, ","), " prefix ",
                            config.store.etcd_prefix);
  } else {
    RocksDbStorage::Options storage_options;
    storage_options.data_dir = config.data_dir;
    storage_options.sync = config.sync;
    storage_options.min_free_bytes = config.min_free_disk_bytes;
    auto opened = RocksDbStorage::Open(std::move(storage_options));
    if (!opened.ok()) return Refuse(opened.status());
    storage = *std::move(opened);
    state = storage->Load();
    if (!state.ok()) return Refuse(state.status());
    config.store.storage = storage.get();
    location = config.data_dir;
  }
  spdlog::info("loaded store {}: {} objects and {} history events at revision {} from {} in {}",
               state->store_id, state->objects.size(), state->history.size(), state->revision,
               location, absl::FormatDuration(absl::Now() - load_start));

  auto registry = std::make_shared<prometheus::Registry>();
  RegisterBuildInfo(*registry);
  StoreMetrics metrics(registry);
  WatchCache watch_cache(config.watch, &metrics);
  ObjectStore store(config.store, &watch_cache, &metrics, *std::move(state));
  std::unique_ptr<Authorizer> authorizer;
  if (config.authorization.has_value()) {
    authorizer = std::make_unique<Authorizer>(
        *config.authorization,
        [&store](const v1::GetRequest& req) { return store.Get(req, /*consistent=*/false); },
        *registry);
    config.service.authorizer = authorizer.get();
  }
  if (config.tls.server_enabled()) InstallGrpcLogRouting(*registry);
  StoreService service(config.service, &store, &watch_cache, &metrics);
  // The store's identity as an info metric (value 1), as Prometheus exporters expose build info.
  prometheus::BuildGauge()
      .Name("shardcache_store_info")
      .Help(
          "Always 1; its labels name the store: store_id (made when its data was created, kept "
          "across restarts) and role.")
      .Register(*registry)
      .Add({{"store_id", store.store_id()}, {"role", role_name}})
      .Set(1);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(config.listen, MakeServerCredentials(config.tls), &grpc_port);
  // A second server must not share a port this one serves.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Keepalive: ping every connection, so that one whose peer vanished without a reset (a
  // partition, a paused or crashed machine) is closed and its watches end; and accept clients'
  // own keepalive pings, even while they have no call open.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(config.keepalive_time)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(config.keepalive_timeout)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      static_cast<int>(absl::ToInt64Milliseconds(config.keepalive_min_client_interval)));
  // Let objects up to twice the limit through, so that they get the store's clear error.
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(2 * config.store.max_object_bytes + (1 << 20), INT32_MAX)));
  service.AddTo(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    return Refuse(absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", config.listen, " (address in use?)")));
  }
  std::atomic<bool> ready{true};
  // Ready while serving and, on etcd, while this replica is in step with etcd's quorum.
  HttpServer http(registry, [&ready, &store]() {
    if (!ready.load()) return absl::UnavailableError("shutting down");
    return store.CheckCaughtUp();
  });
  if (config.http_tls) {
    absl::StatusOr<std::shared_ptr<ReloadingKeyPair>> keys = ReloadingKeyPair::Load(config.tls);
    if (!keys.ok()) {
      server->Shutdown();
      return Refuse(keys.status());
    }
    http.ServeTls(*std::move(keys));
  }
  absl::StatusOr<int> http_port = http.Start(config.http_listen);
  if (!http_port.ok()) {
    server->Shutdown();
    return Refuse(http_port.status());
  }
  // The Kubernetes view reads the store directly, and its watches are watchers of the same
  // fan-out as the Store service's.
  std::unique_ptr<KubeApiServer> kube_api;
  int kube_api_port = 0;
  if (!config.kube_api_listen.empty()) {
    KubeApiServer::Options kube_api_options;
    kube_api_options.write_timeout = config.watch.stall_timeout + absl::Seconds(10);
    kube_api = std::make_unique<KubeApiServer>(kube_api_options, &store, &watch_cache, &metrics,
                                               authorizer.get(), registry.get());
    if (config.tls.server_enabled()) {
      absl::StatusOr<std::shared_ptr<ReloadingKeyPair>> keys = ReloadingKeyPair::Load(config.tls);
      if (!keys.ok()) {
        http.Stop();
        server->Shutdown();
        return Refuse(keys.status());
      }
      kube_api->ServeTls(*std::move(keys), config.tls.ca_file);
    }
    absl::StatusOr<int> port = kube_api->Start(config.kube_api_listen);
    if (!port.ok()) {
      http.Stop();
      server->Shutdown();
      return Refuse(port.status());
    }
    kube_api_port = *port;
  }
  if (!config.port_file.empty()) {
    std::vector<std::pair<std::string, int>> ports = {{"grpc_port", grpc_port},
                                                      {"http_port", *http_port}};
    if (kube_api != nullptr) ports.emplace_back("kube_api_port", kube_api_port);
    absl::Status written = WritePortFile(config.port_file, ports);
    if (!written.ok()) {
      server->Shutdown();
      return Refuse(written);
    }
  }
  // Watch calls are taken from here on (they wait in the server until then): the refusals above
  // leave no acceptor thread behind the server.
  service.AcceptWatches();
  // Without it, a request that comes after a quiet second may wait up to 100 ms for one of gRPC's
  // callback threads (see the header).
  CallbackQueueTicker ticker;
  server->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info(
      "serving role={} store_id={} grpc={} (port {}) http={} (port {}) storage={} sync={} "
      "min_free_disk_bytes={} max_object_bytes={} history_events={} history_age={} "
      "keepalive_time={} "
      "keepalive_timeout={} tls={} client_certificates={} authorization={} http_tls={} "
      "kube_api={} (port {})",
      role_name, store.store_id(), config.listen, grpc_port, config.http_listen, *http_port,
      location, config.sync, config.min_free_disk_bytes, config.store.max_object_bytes,
      config.store.history_events, absl::FormatDuration(config.store.history_age),
      absl::FormatDuration(config.keepalive_time), absl::FormatDuration(config.keepalive_timeout),
      config.tls.server_enabled(), !config.tls.ca_file.empty(),
      config.authorization.has_value() ? "Policy" : "AlwaysAllow", config.http_tls,
      config.kube_api_listen.empty() ? "off" : config.kube_api_listen, kube_api_port);

  int sig = WaitForTerminationSignal();
  spdlog::info("received signal {}: draining (up to {})", sig,
               absl::FormatDuration(config.drain_timeout));
  ready = false;
  server->GetHealthCheckService()->SetServingStatus(false);
  absl::Time drain_deadline = absl::Now() + config.drain_timeout;
  // The view's watches are the Store service's calls: end them and stop the view first.
  if (kube_api != nullptr) kube_api->Stop();
  service.Shutdown();
  size_t left = watch_cache.Shutdown(config.drain_timeout);
  if (left > 0) spdlog::warn("{} watch streams did not end in time", left);
  if (!service.AwaitIdle(drain_deadline - absl::Now())) {
    spdlog::warn("store calls still in flight at the end of the drain timeout");
  }
  // Every store call has been answered: shut down at once. A graceful shutdown would also wait
  // for each idle client connection to acknowledge the GOAWAY, which a client with no call in
  // flight may take seconds to do (gRPC C++ clients poll idle connections every 5 s).
  server->Shutdown(absl::ToChronoTime(absl::Now()));
  service.StopWatches();
  http.Stop();
  int64_t revision = store.revision();
  spdlog::info("stopped at revision {}", revision);
  return 0;
}

}  // namespace
}  // namespace shardcache

int main(int argc, char** argv) {
  return shardcache::ServerMain(
      argc, argv, "cache_server",
      "the shardcache object store.\n\n"
      "  cache_server --role=cache --listen=127.0.0.1:7070 --http-listen=127.0.0.1:8070\n"
      "  cache_server --role=shard --listen=127.0.0.1:7071 --http-listen=127.0.0.1:8071\n\n"
      "Flags may be spelt with dashes or underscores (--http-listen, --http_listen).",
      [] {
        absl::StatusOr<shardcache::Config> config = shardcache::ConfigFromFlags();
        if (!config.ok()) return shardcache::Refuse(config.status());
        return shardcache::Run(*config, absl::GetFlag(FLAGS_role));
      });
}
