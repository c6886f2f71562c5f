// HttpServer: the operational HTTP endpoint of a shardcache process.
//
//   GET /metrics  Prometheus text format of the given registry.
//   GET /healthz  200 "ok" while the process runs (liveness).
//   GET /readyz   200 "ok" when the readiness check passes, else 503 with the reason.
//
// Over HTTP, or HTTPS with a certificate reloaded when its files change (ServeTls).
//
// Thread-safety: Start and Stop are called from one thread (main). The readiness check is called
// from the server's own threads and must be thread-safe.
#ifndef SHARDCACHE_COMMON_HTTP_SERVER_H_
#define SHARDCACHE_COMMON_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tls.h"
#include "prometheus/registry.h"

namespace httplib {
class Server;
}

namespace shardcache {

class HttpServer {
 public:
  // Returns OK when ready, else a status whose message says why not.
  using ReadinessCheck = std::function<absl::Status()>;

  HttpServer(std::shared_ptr<prometheus::Registry> registry, ReadinessCheck readiness);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds "host:port" (port 0: any free port) and serves on a background thread; returns once
  // that thread serves, so that a Stop() right after it takes effect. Returns the bound port, or
  // UNAVAILABLE with the reason if the address cannot be bound.
  absl::StatusOr<int> Start(const std::string& address);
  // Serves HTTPS with `keys` instead of HTTP (no client certificate is asked for).
  // REQUIRES: before Start.
  void ServeTls(std::shared_ptr<ReloadingKeyPair> keys) { tls_ = std::move(keys); }
  // Stops serving and joins the thread. Idempotent.
  void Stop();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  ReadinessCheck readiness_;
  std::shared_ptr<ReloadingKeyPair> tls_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  // Set by the serving thread when httplib's listen loop has returned.
  std::atomic<bool> listen_returned_{false};
};

// Binds `server` to `host`:`port` (0: any free port) and runs its listen loop on `*thread`,
// which sets `*listen_returned` when the loop ends; returns once the server runs (httplib's
// stop() is lost before that, so a Stop right after start-up would join for ever), with the
// bound port, or UNAVAILABLE naming `flag` and `address` when it cannot bind. Sets
// SO_REUSEADDR without SO_REUSEPORT, so that a second process cannot bind a port served here.
// With `send_buffer_bytes`, its connections' sockets get that SO_SNDBUF (which turns off the
// kernel's growth of the buffer, up to 4 MiB by default, for a client that reads slowly).
absl::StatusOr<int> ServeInBackground(httplib::Server* server, const std::string& flag,
                                      const std::string& address, std::thread* thread,
                                      std::atomic<bool>* listen_returned,
                                      int send_buffer_bytes = 0);

// Splits "host:port" (host may be "[::1]"). Returns InvalidArgument naming `flag` when malformed.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& flag,
                                                          const std::string& address);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_HTTP_SERVER_H_
