// KubeApiServer: see kube_api_server.h.
#include "cache_server/kube_api_server.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cache_server/kube_json.h"
#include "cache_server/kube_path.h"
#include "cache_server/kube_render_cache.h"
#include "cache_server/list_token.h"
#include "common/grpc_status.h"
#include "common/http_server.h"
#include "common/label_selector.h"
#include "common/resources.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace shardcache {

// A fieldSelector: the view supports metadata.name and metadata.namespace, with =, == and !=.
struct KubeFieldSelector {
  struct Term {
    bool name;  // else namespace
    bool equals;
    std::string value;
  };
  std::vector<Term> terms;

  bool Matches(const v1::ObjectMeta& m) const {
    for (const Term& t : terms) {
      const std::string& field = t.name ? m.name() : m.namespace_();
      if ((field == t.value) != t.equals) return false;
    }
    return true;
  }
};

// The parameters of a list or watch, checked.
struct KubeReadParams {
  std::string label_selector;
  KubeFieldSelector fields;
  int64_t limit = 0;
  std::string continue_token;
  // -1: none given.
  int64_t resource_version = -1;
  std::string match;  // "", "NotOlderThan", "Exact"
  bool watch = false;
  bool bookmarks = false;
  std::optional<bool> send_initial_events;
  int64_t timeout_seconds = 0;
  bool table = false;
};

namespace {

constexpr char kJson[] = "application/json";
// A watch's media type, as kube-apiserver's: the parameter also keeps httplib from compressing
// the stream, which would hold events back in the compressor until it filled a block.
constexpr char kWatchJson[] = "application/json;stream=watch";

absl::StatusOr<KubeFieldSelector> ParseFieldSelector(absl::string_view text) {
  KubeFieldSelector selector;
  for (absl::string_view term : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    term = absl::StripAsciiWhitespace(term);
    size_t op = term.find_first_of("!=");
    if (op == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("fieldSelector: Invalid value: \"", term,
                                                     "\": expected field=value or field!=value"));
    }
    absl::string_view field = absl::StripAsciiWhitespace(term.substr(0, op));
    absl::string_view rest = term.substr(op);
    KubeFieldSelector::Term t;
    if (absl::ConsumePrefix(&rest, "!=")) {
      t.equals = false;
    } else if (absl::ConsumePrefix(&rest, "==") || absl::ConsumePrefix(&rest, "=")) {
      t.equals = true;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("fieldSelector: Invalid value: \"", term, "\": unknown operator"));
    }
    if (field == "metadata.name") {
      t.name = true;
    } else if (field == "metadata.namespace") {
      t.name = false;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("fieldSelector: field label not supported: \"", field,
                       "\" (the view supports metadata.name and metadata.namespace)"));
    }
    t.value = std::string(absl::StripAsciiWhitespace(rest));
    selector.terms.push_back(std::move(t));
  }
  return selector;
}

// The query's parameters (ParseQuery).
using Query = std::map<std::string, std::string>;

std::string Param(const Query& q, const char* name) {
  auto it = q.find(name);
  return it == q.end() ? std::string() : it->second;
}

absl::StatusOr<bool> ParseBool(const Query& q, const char* name) {
  if (!q.count(name)) return false;
  std::string v = Param(q, name);
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0" || v.empty()) return false;
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": Invalid value: \"", v, "\": must be true or false"));
}

// Parameter `name` as a non-negative integer into `*out`, left as is when the query has none.
absl::Status ParseNonNegative(const Query& q, const char* name, int64_t* out) {
  std::string v = Param(q, name);
  if (v.empty()) return absl::OkStatus();
  if (!absl::SimpleAtoi(v, out) || *out < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": Invalid value: \"", v, "\": must be a non-negative integer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KubeReadParams> ParseReadParams(const httplib::Request& req) {
  auto query = ParseQuery(req.target);
  if (!query.ok()) return query.status();
  const Query& q = *query;
  KubeReadParams p;
  p.label_selector = Param(q, "labelSelector");
  if (!p.label_selector.empty()) {
    auto parsed = LabelSelector::Parse(p.label_selector);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labelSelector: Invalid value: \"", p.label_selector, "\": ", parsed.status().message()));
    }
  }
  auto fields = ParseFieldSelector(Param(q, "fieldSelector"));
  if (!fields.ok()) return fields.status();
  p.fields = *std::move(fields);
  RETURN_IF_ERROR(ParseNonNegative(q, "limit", &p.limit));
  p.continue_token = Param(q, "continue");
  RETURN_IF_ERROR(ParseNonNegative(q, "resourceVersion", &p.resource_version));
  p.match = Param(q, "resourceVersionMatch");
  if (!p.match.empty() && p.match != "NotOlderThan" && p.match != "Exact") {
    return absl::InvalidArgumentError(absl::StrCat("resourceVersionMatch: Unsupported value: \"",
                                                   p.match,
                                                   "\": supported values: \"Exact\", "
                                                   "\"NotOlderThan\""));
  }
  if (p.match == "Exact" && p.resource_version == 0) {
    return absl::InvalidArgumentError(
        "resourceVersionMatch: Forbidden: resourceVersionMatch \"Exact\" is forbidden for "
        "resourceVersion \"0\"");
  }
  if (!p.continue_token.empty() && p.resource_version > 0) {
    return absl::InvalidArgumentError(
        "resourceVersion: Forbidden: specifying resource version is not allowed when using "
        "continue");
  }
  auto watch = ParseBool(q, "watch");
  if (!watch.ok()) return watch.status();
  p.watch = *watch;
  auto bookmarks = ParseBool(q, "allowWatchBookmarks");
  if (!bookmarks.ok()) return bookmarks.status();
  p.bookmarks = *bookmarks;
  if (q.count("sendInitialEvents")) {
    auto initial = ParseBool(q, "sendInitialEvents");
    if (!initial.ok()) return initial.status();
    p.send_initial_events = *initial;
    if (*initial && (p.match != "NotOlderThan" || !p.bookmarks)) {
      return absl::InvalidArgumentError(
          "sendInitialEvents: Forbidden: sendInitialEvents requires allowWatchBookmarks=true "
          "and resourceVersionMatch=NotOlderThan");
    }
  }
  // A watch-list (sendInitialEvents=true, what client-go's reflector sends first) may leave the
  // revision out: it then starts from the latest state, as kube-apiserver's does.
  if (!p.match.empty() && p.resource_version < 0 && !p.send_initial_events.value_or(false)) {
    return absl::InvalidArgumentError(
        "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
        "resourceVersion is provided");
  }
  RETURN_IF_ERROR(ParseNonNegative(q, "timeoutSeconds", &p.timeout_seconds));
  p.table = absl::StrContains(req.get_header_value("Accept"), "as=Table");
  return p;
}

// The identity of the client's verified certificate, or nullopt (plain HTTP, no certificate).
std::optional<PeerIdentity> ClientIdentity(const httplib::Request& req) {
  if (req.ssl == nullptr) return std::nullopt;
  SSL* ssl = const_cast<SSL*>(req.ssl);
  if (SSL_get_verify_result(ssl) != X509_V_OK) return std::nullopt;
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return std::nullopt;
  std::string pem;
  if (BIO* bio = BIO_new(BIO_s_mem()); bio != nullptr) {
    if (PEM_write_bio_X509(bio, cert) == 1) {
      char* data = nullptr;
      long size = BIO_get_mem_data(bio, &data);
      if (size > 0) pem.assign(data, static_cast<size_t>(size));
    }
    BIO_free(bio);
  }
  X509_free(cert);
  auto identity = IdentityFromPem(pem);
  if (!identity.ok()) return std::nullopt;
  return *std::move(identity);
}

// The versions of a resource that ClusterCachedResource copies name, by "group/resource".
using VersionsByResource = std::map<std::string, std::vector<std::string>>;

std::string StructString(const google::protobuf::Struct& s, const char* field) {
  auto it = s.fields().find(field);
  if (it == s.fields().end() || !it->second.has_string_value()) return "";
  return it->second.string_value();
}

}  // namespace

// One thread per connection, at most `max` at once (httplib's own pool has a fixed few threads,
// and each watch holds one for its whole life). The threads share their state with the queue by
// a shared pointer, so that the queue may be destroyed while the last of them returns.
class KubeApiServer::ConnectionThreads : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(int max) : state_(std::make_shared<State>()), max_(max) {}

  void enqueue(std::function<void()> fn) override {
    std::shared_ptr<State> state = state_;
    {
      absl::MutexLock l(&state->mu);
      auto room = [this, &state]()
                      ABSL_SHARED_LOCKS_REQUIRED(state->mu) { return state->running < max_; };
      state->mu.Await(absl::Condition(&room));
      ++state->running;
    }
    std::thread([state, fn = std::move(fn)] {
      fn();
      absl::MutexLock l(&state->mu);
      --state->running;
    }).detach();
  }

  void shutdown() override {
    absl::MutexLock l(&state_->mu);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(state_->mu) { return state_->running == 0; };
    state_->mu.Await(absl::Condition(&idle));
  }

 private:
  struct State {
    absl::Mutex mu;
    int running ABSL_GUARDED_BY(mu) = 0;
  };
  std::shared_ptr<State> state_;
  const int max_;
};

KubeApiServer::KubeApiServer(Options options, ObjectStore* store, WatchCache* watch_cache,
                             StoreMetrics* metrics, const Authorizer* authorizer,
                             prometheus::Registry* registry)
    : options_(std::move(options)),
      store_(store),
      watch_cache_(watch_cache),
      metrics_(metrics),
      authorizer_(authorizer),
      requests_(prometheus::BuildCounter()
                    .Name("shardcache_kube_api_requests_total")
                    .Help("Requests to the Kubernetes view, by verb (discovery, get, list, "
                          "watch, write) and HTTP status code")
                    .Register(*registry)),
      watches_(prometheus::BuildGauge()
                   .Name("shardcache_kube_api_watches")
                   .Help("Watches of the Kubernetes view in progress")
                   .Register(*registry)
                   .Add({})) {}

KubeApiServer::~KubeApiServer() { Stop(); }

absl::StatusOr<int> KubeApiServer::Start(const std::string& address) {
  if (tls_ != nullptr) {
    std::shared_ptr<ReloadingKeyPair> keys = tls_;
    std::string ca = client_ca_file_;
    server_ = std::make_unique<httplib::SSLServer>([keys, ca](SSL_CTX& ctx) {
      keys->Install(&ctx);
      if (ca.empty()) return true;
      // Ask for a certificate and verify it; a client without one still connects, and is told
      // 401 by the view, as the gRPC port tells it UNAUTHENTICATED.
      STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(ca.c_str());
      if (names == nullptr || SSL_CTX_load_verify_locations(&ctx, ca.c_str(), nullptr) != 1) {
        return false;
      }
      SSL_CTX_set_client_CA_list(&ctx, names);
      SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, nullptr);
      return true;
    });
    if (!server_->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kube-api-listen: cannot serve TLS with the certificate and client CA given (",
          ca.empty() ? "no client CA" : ca, ")"));
    }
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  int max_connections = options_.max_connections;
  server_->new_task_queue = [max_connections] { return new ConnectionThreads(max_connections); };
  auto write_timeout = absl::ToChronoSeconds(options_.write_timeout);
  server_->set_write_timeout(write_timeout);
  server_->set_keep_alive_max_count(1000);
  server_->Get(".*",
               [this](const httplib::Request& req, httplib::Response& res) { Serve(req, res); });
  auto refuse = [this](const httplib::Request& req, httplib::Response& res) {
    Reply(res, 405,
          StatusJson(405, "MethodNotAllowed",
                     absl::StrCat(req.method,
                                  " is not supported: the Kubernetes view of shardcache is "
                                  "read-only (get, list and watch); write through the Store "
                                  "service")),
          "write");
  };
  server_->Post(".*", refuse);
  server_->Put(".*", refuse);
  server_->Patch(".*", refuse);
  server_->Delete(".*", refuse);

  return ServeInBackground(server_.get(), "--kube-api-listen", address, &listener_,
                           &listen_returned_, options_.send_buffer_bytes);
}

void KubeApiServer::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    for (KubeWatcher* w : watchers_) w->Cancel(absl::UnavailableError("server shutting down"));
  }
  if (server_) server_->stop();
  if (listener_.joinable()) listener_.join();
}

void KubeApiServer::Reply(httplib::Response& res, int code, std::string body, const char* verb) {
  res.status = code;
  res.set_content(std::move(body), kJson);
  requests_.Add({{"verb", verb}, {"code", absl::StrCat(code)}}).Increment();
}

void KubeApiServer::Serve(const httplib::Request& req, httplib::Response& res) {
  std::optional<PeerIdentity> who;
  if (authorizer_ != nullptr) {
    who = ClientIdentity(req);
    if (!who.has_value()) {
      Reply(res, 401,
            StatusJson(401, "Unauthorized",
                       "Unauthorized: a client certificate signed by the server's client CA is "
                       "required"),
            "get");
      return;
    }
  }
  auto path = ParseKubePath(req.path);
  if (!path.ok()) {
    Reply(res, 404, StatusJson(path.status()), "get");
    return;
  }
  if (path->kind == KubePath::Kind::kResource) {
    ServeRead(*path, who, req, res);
  } else {
    ServeDiscovery(*path, res);
  }
}

std::vector<KubeResource> KubeApiServer::Discover() const {
  // The versions that ClusterCachedResources name, by group/resource.
  VersionsByResource versions;
  v1::ListRequest ccrs;
  *ccrs.mutable_resource() = CcrResource();
  if (auto list = store_->List(ccrs); list.ok()) {
    for (const v1::Object& ccr : list->items()) {
      std::string group = StructString(ccr.spec(), "group");
      std::string version = StructString(ccr.spec(), "version");
      std::string resource = StructString(ccr.spec(), "resource");
      if (version.empty() || resource.empty()) continue;
      std::vector<std::string>& v = versions[absl::StrCat(group, "/", resource)];
      if (std::find(v.begin(), v.end(), version) == v.end()) v.push_back(version);
    }
  }
  std::map<std::string, bool> namespaced;  // by group/resource
  for (const ObjectStore::ResourceSummary& s : store_->Resources()) {
    namespaced[s.group_resource] = s.namespaced;
  }
  // A resource that a CCR names but that has no objects yet: namespaced, as most are.
  for (const auto& [group_resource, unused] : versions) namespaced.emplace(group_resource, true);
  namespaced[absl::StrCat(kCcrGroup, "/", kCcrResource)] = false;

  std::vector<KubeResource> out;
  for (const auto& [group_resource, is_namespaced] : namespaced) {
    size_t slash = group_resource.find('/');
    KubeResource r;
    r.group = group_resource.substr(0, slash);
    r.resource = group_resource.substr(slash + 1);
    r.kind = KindForResource(r.resource);
    r.namespaced = is_namespaced;
    std::vector<std::string> vs;
    if (r.group == kCcrGroup) {
      vs = {kCcrVersion};
    } else if (r.group == kDefinitionGroup) {
      vs = {kDefinitionVersion};
    } else if (r.group == kLeaseGroup) {
      vs = {kLeaseVersion};
    } else if (auto it = versions.find(group_resource); it != versions.end()) {
      vs = it->second;
    } else {
      vs = {"v1"};  // objects written without a CCR: their version is not recorded
    }
    for (const std::string& v : vs) {
      r.version = v;
      out.push_back(r);
    }
  }
  return out;
}

void KubeApiServer::ServeDiscovery(const KubePath& path, httplib::Response& res) {
  switch (path.kind) {
    case KubePath::Kind::kVersion:
      Reply(res, 200, VersionJson(options_.git_version), "discovery");
      return;
    case KubePath::Kind::kCoreVersions: {
      std::vector<KubeResource> resources = Discover();
      bool core = std::any_of(resources.begin(), resources.end(),
                              [](const KubeResource& r) { return r.group.empty(); });
      Reply(res, 200, ApiVersionsJson(core), "discovery");
      return;
    }
    case KubePath::Kind::kGroups: {
      std::map<std::string, std::vector<std::string>> by_group;
      for (const KubeResource& r : Discover()) {
        std::vector<std::string>& v = by_group[r.group];
        if (std::find(v.begin(), v.end(), r.version) == v.end()) v.push_back(r.version);
      }
      std::vector<std::pair<std::string, std::vector<std::string>>> groups(by_group.begin(),
                                                                           by_group.end());
      Reply(res, 200, ApiGroupListJson(groups), "discovery");
      return;
    }
    case KubePath::Kind::kGroupVersion: {
      std::vector<KubeResource> resources;
      for (KubeResource& r : Discover()) {
        if (r.group == path.group && r.version == path.version) resources.push_back(std::move(r));
      }
      if (resources.empty()) {
        Reply(res, 404,
              StatusJson(404, "NotFound",
                         absl::StrCat("the server could not find the requested resource (",
                                      ApiVersion(path.group, path.version),
                                      " has no resources in this cache)")),
              "discovery");
        return;
      }
      Reply(res, 200, ApiResourceListJson(path.group, path.version, resources), "discovery");
      return;
    }
    case KubePath::Kind::kResource:
      break;
  }
}

void KubeApiServer::ServeRead(const KubePath& path, const std::optional<PeerIdentity>& who,
                              const httplib::Request& req, httplib::Response& res) {
  KubeResource r;
  r.group = path.group;
  r.version = path.version;
  r.resource = path.resource;
  r.kind = KindForResource(path.resource);
  const char* verb = !path.name.empty() ? "get" : "list";
  auto params = ParseReadParams(req);
  if (!params.ok()) {
    Reply(res, 400, StatusJson(params.status()), verb);
    return;
  }
  if (params->watch) {
    if (!path.name.empty()) {
      params->fields.terms.push_back({true, true, path.name});
    }
    ServeWatch(path, who, r, *params, res);
    return;
  }
  v1::ListRequest list;
  *list.mutable_resource() = MakeGvr(path.group, path.version, path.resource);
  list.set_shard(path.shard);
  list.set_cluster(path.cluster);
  list.set_namespace_(path.namespace_);
  list.set_label_selector(params->label_selector);
  list.set_continue_token(params->continue_token);
  KubeFieldSelector fields = params->fields;
  if (!path.name.empty()) {
    fields.terms.push_back({true, true, path.name});
  } else {
    list.set_limit(params->limit);
  }
  // A namespace the fieldSelector names narrows the list as the path's would.
  for (const KubeFieldSelector::Term& t : fields.terms) {
    if (!t.name && t.equals && list.namespace_().empty()) list.set_namespace_(t.value);
  }
  if (authorizer_ != nullptr) {
    if (absl::Status allowed = authorizer_->CheckList(who, list); !allowed.ok()) {
      Reply(res, KubeErrorFor(allowed).code, StatusJson(allowed), verb);
      return;
    }
  }
  int64_t rv = params->resource_version;
  if (rv > 0) {
    // Kubernetes waits a little for a cache behind the asked revision, then gives up.
    absl::Time deadline = absl::Now() + absl::Seconds(3);
    while (store_->revision() < rv && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(20));
    if (store_->revision() < rv) {
      Reply(res, 504,
            StatusJson(504, "Timeout",
                       absl::StrCat("Too large resource version: ", rv,
                                    ", current: ", store_->revision())),
            verb);
      return;
    }
    if (params->match == "Exact") list.set_continue_token(EncodeContinueToken(rv, ""));
  }
  auto answer = store_->List(list);
  if (!answer.ok()) {
    absl::Status status = answer.status();
    if (status.code() == absl::StatusCode::kOutOfRange) {
      status = absl::OutOfRangeError(absl::StrCat(
          "too old resource version: ", rv > 0 ? absl::StrCat(rv) : "of the continue token",
          " has left the cache's history window; list again without it"));
    }
    Reply(res, KubeErrorFor(status).code, StatusJson(status), verb);
    return;
  }
  std::vector<const v1::Object*> objects;
  for (const v1::Object& o : answer->items()) {
    if (fields.Matches(o.metadata())) objects.push_back(&o);
  }
  if (!path.name.empty()) {
    if (objects.empty()) {
      Reply(res, 404,
            StatusJson(
                404, "NotFound",
                absl::StrCat(path.resource, ".", path.group, " \"", path.name, "\" not found")),
            verb);
      return;
    }
    objects.resize(1);
  }
  if (params->table) {
    Reply(
        res, 200,
        TableJson(objects, true, answer->resource_version(), answer->continue_token(), absl::Now()),
        verb);
    return;
  }
  if (!path.name.empty()) {
    Reply(res, 200, ObjectJson(*objects[0], r), verb);
    return;
  }
  std::vector<std::string> items;
  items.reserve(objects.size());
  for (const v1::Object* o : objects) items.push_back(ObjectJson(*o, r));
  Reply(res, 200, ListJson(r, items, answer->resource_version(), answer->continue_token()), verb);
}

// One watch of the view: its watcher in the fan-out, and how its events are written.
struct KubeWatch {
  explicit KubeWatch(KubeWatcher::Options options) : watcher(options) {}
  KubeWatcher watcher;
  absl::Time deadline;
  KubeResource resource;
  // apiVersion and kind: which rendering of an object this watch sends (KubeRenderCache).
  std::string view;
  // The render cache's keys of this watch's event lines, by type: "<view> ADDED" and so on.
  std::string line_views[3];
  KubeFieldSelector fields;
  bool bookmarks = false;
  // Whether the bookmark that ends the initial events is sent with its annotation.
  bool initial_events_end = false;
  bool table = false;
  bool columns_sent = false;
};

namespace {

// How long a watch's thread waits for events before it looks whether its client is still there.
constexpr absl::Duration kIdleCheck = absl::Seconds(1);

// The index of an event type in KubeWatch::line_views.
int LineView(v1::WatchEvent::Type type) {
  switch (type) {
    case v1::WatchEvent::MODIFIED:
      return 1;
    case v1::WatchEvent::DELETED:
      return 2;
    default:
      return 0;
  }
}

}  // namespace

void KubeApiServer::ServeWatch(const KubePath& path, const std::optional<PeerIdentity>& who,
                               const KubeResource& r, const KubeReadParams& params,
                               httplib::Response& res) {
  const WatchCache::Options& fan_out = watch_cache_->options();
  KubeWatcher::Options options;
  options.max_queue_bytes = fan_out.watcher_queue_bytes;
  options.stall_timeout = fan_out.stall_timeout;
  options.clock = fan_out.clock;
  options.metrics = metrics_;
  auto watch = std::make_shared<KubeWatch>(options);
  v1::WatchRequest w;
  *w.mutable_resource() = MakeGvr(path.group, path.version, path.resource);
  w.set_shard(path.shard);
  w.set_cluster(path.cluster);
  w.set_namespace_(path.namespace_);
  w.set_label_selector(params.label_selector);
  for (const KubeFieldSelector::Term& t : params.fields.terms) {
    if (!t.name && t.equals && w.namespace_().empty()) w.set_namespace_(t.value);
  }
  // Kubernetes' resourceVersion semantics on the Store service's: no revision (or "0") starts
  // with the current state, as does sendInitialEvents=true; sendInitialEvents=false starts after
  // the revision given, or now.
  int64_t rv = params.resource_version;
  if (params.send_initial_events.has_value() && *params.send_initial_events) {
    watch->initial_events_end = true;
  } else if (params.send_initial_events.has_value()) {
    w.set_resource_version(absl::StrCat(rv > 0 ? rv : store_->revision()));
  } else if (rv > 0) {
    w.set_resource_version(absl::StrCat(rv));
  }
  // Periodic bookmarks only when the client asked (allowWatchBookmarks), as kube-apiserver.
  w.set_allow_bookmarks(params.bookmarks);
  watch->resource = r;
  watch->view = absl::StrCat(ApiVersion(r.group, r.version), " ", r.kind);
  for (v1::WatchEvent::Type type :
       {v1::WatchEvent::ADDED, v1::WatchEvent::MODIFIED, v1::WatchEvent::DELETED}) {
    watch->line_views[LineView(type)] =
        absl::StrCat(watch->view, " ", v1::WatchEvent::Type_Name(type));
  }
  watch->fields = params.fields;
  watch->bookmarks = params.bookmarks;
  watch->table = params.table;
  absl::Duration timeout = options_.max_watch_timeout;
  if (params.timeout_seconds > 0) {
    timeout = std::min(timeout, absl::Seconds(params.timeout_seconds));
  }
  watch->deadline = absl::Now() + timeout;
  if (authorizer_ != nullptr) {
    if (absl::Status allowed = authorizer_->CheckWatch(who, w); !allowed.ok()) {
      Reply(res, KubeErrorFor(allowed).code, StatusJson(allowed), "watch");
      return;
    }
  }
  KubeWatcher* watcher = &watch->watcher;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) {
      Reply(res, 503, StatusJson(503, "ServiceUnavailable", "server shutting down"), "watch");
      return;
    }
    watchers_.insert(watcher);
  }
  requests_.Add({{"verb", "watch"}, {"code", "200"}}).Increment();
  SPDLOG_DEBUG("kube api: watch {} shard=\"{}\" cluster=\"{}\" namespace=\"{}\" from \"{}\"",
               GvrString(w.resource()), w.shard(), w.cluster(), w.namespace_(),
               w.resource_version());
  res.status = 200;
  if (absl::Status started = store_->StartWatch(w, watcher); !started.ok()) {
    // As kube-apiserver: the watch is answered, and its one event says why it cannot go on (410
    // Expired for a revision older than the history window).
    absl::MutexLock l(&mu_);
    watchers_.erase(watcher);
    res.set_content(WatchEventJson("ERROR", StatusJson(started)), kWatchJson);
    return;
  }
  watches_.Increment();
  res.set_chunked_content_provider(
      kWatchJson,
      [this, watch](size_t, httplib::DataSink& sink) {
        absl::Time now = absl::Now();
        if (now >= watch->deadline) {
          // Its time is up: it just ends, and the client watches again.
          sink.done();
          return true;
        }
        KubeWatcher::Taken taken = watch->watcher.Take(std::min(watch->deadline, now + kIdleCheck));
        std::string lines;
        for (const auto& [type, object] : taken.events) {
          RenderWatchEvent(watch.get(), type, object, &lines);
        }
        if (taken.ended.has_value()) {
          // A watch that the server ends tells its client why, as kube-apiserver does.
          const absl::Status& status = *taken.ended;
          if (!status.ok() && status.code() != absl::StatusCode::kCancelled &&
              status.code() != absl::StatusCode::kDeadlineExceeded) {
            SPDLOG_INFO("kube api: watch of {} ended: {}", watch->view, status.ToString());
            lines.append(WatchEventJson("ERROR", StatusJson(status)));
          }
          if (!lines.empty() && !sink.write(lines.data(), lines.size())) return false;
          sink.done();
          return true;
        }
        // Nothing to send (no event for a while, objects its field selector leaves out): still
        // end the watch if the client has gone.
        if (lines.empty()) return sink.is_writable();
        return sink.write(lines.data(), lines.size());
      },
      [this, watch](bool) {
        // The connection is over: the watcher leaves the fan-out before it is freed.
        watch->watcher.Cancel(absl::CancelledError("the client went away"));
        watch_cache_->Unregister(&watch->watcher);
        absl::MutexLock l(&mu_);
        watchers_.erase(&watch->watcher);
        watches_.Decrement();
      });
}

void KubeApiServer::RenderWatchEvent(KubeWatch* watch, v1::WatchEvent::Type type,
                                     const ObjectRef& object, std::string* out) {
  if (type == v1::WatchEvent::BOOKMARK) {
    if (!watch->bookmarks) return;
    const v1::ObjectMeta& m = object->metadata();
    bool end = m.annotations().contains(kInitialEventsEndAnnotation);
    out->append(WatchEventJson("BOOKMARK", BookmarkObjectJson(watch->resource, m.resource_version(),
                                                              end && watch->initial_events_end)));
    return;
  }
  std::string type_name = v1::WatchEvent::Type_Name(type);
  if (!watch->fields.Matches(object->metadata())) return;
  if (watch->table) {
    // Per watch: a Table's ages change with time.
    bool columns = !watch->columns_sent;
    watch->columns_sent = true;
    out->append(WatchEventJson(
        type_name, TableJson({object.get()}, columns, object->metadata().resource_version(), "",
                             absl::Now())));
    return;
  }
  // The whole event line, rendered once for every watch of this view that gets the event.
  KubeRenderCache::Rendered line = render_cache_.Get(
      watch->line_views[LineView(type)], object,
      [&] { return WatchEventJson(type_name, ObjectJson(*object, watch->resource)); });
  out->append(*line);
}

}  // namespace shardcache
