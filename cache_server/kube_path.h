// KubePath: what a request path of the Kubernetes view (kube_api_server.h) names.
//
// Three prefixes, then a Kubernetes API path:
//   /services/cache/shards/{shard|*}/clusters/{cluster|*}   kcp's cache server scheme
//   /clusters/{cluster|*}                                    one logical cluster, every shard
//   (none)                                                   every shard and cluster
// and after it /version, /api, /apis, /api/v1, /apis/{group}/{version}, or a resource:
//   /api/v1/[namespaces/{namespace}/]{resource}[/{name}]
//   /apis/{group}/{version}/[namespaces/{namespace}/]{resource}[/{name}]
// "*" (or nothing) for a shard or a cluster means every one. The path is already percent-decoded
// (cpp-httplib decodes it).
//
// Thread-safety: pure functions; any thread.
#ifndef SHARDCACHE_CACHE_SERVER_KUBE_PATH_H_
#define SHARDCACHE_CACHE_SERVER_KUBE_PATH_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcache {

struct KubePath {
  enum class Kind {
    kVersion,       // /version
    kCoreVersions,  // /api
    kGroups,        // /apis
    kGroupVersion,  // /api/v1, /apis/{group}/{version}
    kResource,      // a resource's collection, or one object when `name` is set
  };
  Kind kind = Kind::kVersion;
  // Empty: every shard, every cluster.
  std::string shard;
  std::string cluster;
  // kGroupVersion and kResource: the group ("" for the core group) and version.
  std::string group;
  std::string version;
  // kResource: the plural, the namespace ("" when the path names none) and the name ("" for the
  // collection).
  std::string resource;
  std::string namespace_;
  std::string name;
};

// Parses `path`. NOT_FOUND (saying what is wrong) for a path the view does not serve.
absl::StatusOr<KubePath> ParseKubePath(absl::string_view path);

// The parameters of a request target's query ("/path?a=1&b=x%3Dy"), as Go's url.ParseQuery reads
// them: split at '&', each at its first '=', then percent-decoded ('+' is a space); the first
// value of a repeated name wins, as url.Values.Get gives it. INVALID_ARGUMENT for a malformed
// percent escape.
absl::StatusOr<std::map<std::string, std::string>> ParseQuery(absl::string_view target);

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_KUBE_PATH_H_
