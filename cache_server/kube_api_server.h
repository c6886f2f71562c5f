// KubeApiServer: a read-only Kubernetes API view of a store (cache_server --kube-api-listen), so
// that kubectl, client-go informers and kcp's cache clients read it with no client code of
// their own, on kcp's cache server paths (kube_path.h).
//
//   GET /version, /api, /apis, /api/v1, /apis/{g}/{v}   discovery: the resources that have
//       objects or that a ClusterCachedResource names, verbs get, list and watch
//   GET .../{resource}                                  list: labelSelector, fieldSelector
//       (metadata.name, metadata.namespace), limit and continue, resourceVersion and
//       resourceVersionMatch (NotOlderThan, Exact); a Table when the client asks for one
//   GET .../{resource}/{name}                           get
//   GET .../{resource}?watch=true                       watch: resourceVersion,
//       allowWatchBookmarks, sendInitialEvents, timeoutSeconds; one JSON event a line, chunked
//   POST, PUT, PATCH, DELETE                            405 MethodNotAllowed
// Errors are Kubernetes Status objects (kube_json.h): 400 for a malformed parameter, 404, 410
// Expired for a resourceVersion older than the history window (for a watch: an ERROR event).
//
// What it guarantees: reads are the Store service's reads (ObjectStore::List and Get, at the
// durable revision); a watch is a watcher of the store's fan-out (KubeWatcher, kube_watcher.h),
// registered as a gRPC Watch is (ObjectStore::StartWatch), so it has the same history, bookmarks
// and treatment of a slow reader (its queue is bounded; when full it is parked and caught up
// from the history, or ended); each event's object is rendered once for all the watches of one
// view (KubeRenderCache); nothing is ever written.
// HTTP/1.1, one thread per connection (at most Options::max_connections; more wait to be
// accepted).
//
// Security, as the gRPC port's: over HTTPS (ServeTls) with the same certificate; with a client
// CA, clients' certificates are requested and verified, and with an Authorizer each request is
// checked as the Store call it stands for (CheckList for a list or get, CheckWatch for a watch;
// discovery needs an identity only). A request without a certificate gets 401 Unauthorized, one
// the policy refuses 403 Forbidden, both as a Status.
//
// Thread-safety: Start and Stop from one thread (main); requests are served on the server's own
// threads.
#ifndef SHARDCACHE_CACHE_SERVER_KUBE_API_SERVER_H_
#define SHARDCACHE_CACHE_SERVER_KUBE_API_SERVER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/authorizer.h"
#include "cache_server/kube_render_cache.h"
#include "cache_server/kube_watcher.h"
#include "cache_server/object_store.h"
#include "cache_server/watch_cache.h"
#include "common/tls.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "shardcache/v1/store.pb.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace shardcache {

struct KubePath;
struct KubeReadParams;
struct KubeResource;
struct KubeWatch;

class KubeApiServer {
 public:
  struct Options {
    // The longest a watch lasts; a watch that asks for no timeoutSeconds (or a longer one) ends
    // after this, and the client watches again, as with kube-apiserver's request timeout.
    absl::Duration max_watch_timeout = absl::Minutes(30);
    // A write to a client that takes longer than this ends its connection. cache_server sets
    // it 10 s above --watch-stall-timeout, so that a watch whose client reads slowly has the
    // grace of a gRPC watch (parked, caught up from the history), and one whose client has
    // stopped is ended as too slow before its write gives up.
    absl::Duration write_timeout = absl::Seconds(30);
    // Connections served at once.
    int max_connections = 4096;
    // Each connection's socket send buffer (SO_SNDBUF; the kernel doubles it): with the
    // watcher's queue (KubeWatcher), what a watch whose client reads slowly holds. Without it
    // the kernel lets the buffer grow to 4 MiB a connection. 0: the kernel's default.
    int send_buffer_bytes = 256 << 10;
    // What /version reports as gitVersion.
    std::string git_version = "v1.32.0-shardcache";
  };

  // `store` serves the reads and registers the watches with `watch_cache` (the store's), whose
  // options bound each watch's queue. Not owned; both must outlive the server.
  // `authorizer` may be null (authorization off).
  // `metrics` (not owned, may be null) counts the view's watchers ended as too slow with the
  // Store service's (shardcache_store_watchers_too_slow_total).
  KubeApiServer(Options options, ObjectStore* store, WatchCache* watch_cache, StoreMetrics* metrics,
                const Authorizer* authorizer, prometheus::Registry* registry);
  ~KubeApiServer();
  KubeApiServer(const KubeApiServer&) = delete;
  KubeApiServer& operator=(const KubeApiServer&) = delete;

  // Binds "host:port" (port 0: any free port) and serves on background threads. Returns the
  // bound port, or UNAVAILABLE naming --kube-api-listen.
  absl::StatusOr<int> Start(const std::string& address);
  // Serves HTTPS with `keys`; with `client_ca_file`, asks for client certificates and verifies
  // them against it. REQUIRES: before Start.
  void ServeTls(std::shared_ptr<ReloadingKeyPair> keys, std::string client_ca_file) {
    tls_ = std::move(keys);
    client_ca_file_ = std::move(client_ca_file);
  }
  // Ends every watch, stops serving and joins every thread. Idempotent.
  void Stop();

 private:
  class ConnectionThreads;

  void Serve(const httplib::Request& req, httplib::Response& res);
  void ServeDiscovery(const KubePath& path, httplib::Response& res);
  void ServeRead(const KubePath& path, const std::optional<PeerIdentity>& who,
                 const httplib::Request& req, httplib::Response& res);
  void ServeWatch(const KubePath& path, const std::optional<PeerIdentity>& who,
                  const KubeResource& r, const KubeReadParams& params, httplib::Response& res);
  // Appends one event of a watch as its client receives it (a line), or nothing when it gets
  // none.
  void RenderWatchEvent(KubeWatch* watch, v1::WatchEvent::Type type, const ObjectRef& object,
                        std::string* out);
  // Every resource the view describes.
  std::vector<KubeResource> Discover() const;
  void Reply(httplib::Response& res, int code, std::string body, const char* verb);

  const Options options_;
  ObjectStore* const store_;
  WatchCache* const watch_cache_;
  StoreMetrics* const metrics_;
  const Authorizer* const authorizer_;
  std::shared_ptr<ReloadingKeyPair> tls_;
  std::string client_ca_file_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Gauge& watches_;
  KubeRenderCache render_cache_;

  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  std::atomic<bool> listen_returned_{false};

  absl::Mutex mu_;
  // The watches in progress, to cancel on Stop.
  std::set<KubeWatcher*> watchers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_KUBE_API_SERVER_H_
