// The Kubernetes view's JSON (kube_api_server.h): objects, lists, Tables, watch events, Status
// and discovery documents, as kube-apiserver writes them, so that kubectl and client-go decode
// them unchanged.
//
// An object is written as a Kubernetes object of its resource: apiVersion "group/version" (or
// "version" for the core group), kind (KindForResource), metadata with Kubernetes' names and types
// (generation a number, timestamps RFC 3339 to the second), the object's shard and logical cluster
// as the annotations kcp's cache server uses (kcp.io/shard, kcp.io/cluster), then spec and status.
//
// Thread-safety: pure functions; any thread.
#ifndef SHARDCACHE_CACHE_SERVER_KUBE_JSON_H_
#define SHARDCACHE_CACHE_SERVER_KUBE_JSON_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

// The annotations that carry an object's logical cluster and shard, as kcp names them.
inline constexpr char kKcpClusterAnnotation[] = "kcp.io/cluster";
inline constexpr char kKcpShardAnnotation[] = "kcp.io/shard";

// A resource as the view describes it.
struct KubeResource {
  std::string group;
  std::string version;
  std::string resource;  // the plural
  std::string kind;
  bool namespaced = true;
};

// The kind of a resource named by its plural, as Kubernetes names kinds: the singular with its
// first letter upper-cased ("widgets" -> "Widget", "policies" -> "Policy", "leases" -> "Lease",
// "clustercachedresources" -> "ClusterCachedResource"; the built-in resources keep their
// camel case).
std::string KindForResource(absl::string_view plural);

// "group/version", or "version" for the core group.
std::string ApiVersion(absl::string_view group, absl::string_view version);

// Appends `text` as a JSON string (quoted, escaped).
void AppendJsonString(absl::string_view text, std::string* out);

// The object as a Kubernetes object of `r`.
std::string ObjectJson(const v1::Object& object, const KubeResource& r);
// Its metadata alone, as a meta.k8s.io/v1 PartialObjectMetadata (a Table row's object).
std::string PartialObjectMetadataJson(const v1::Object& object);

// A list of `r` ("<Kind>List"): `items` are ObjectJson strings.
std::string ListJson(const KubeResource& r, const std::vector<std::string>& items,
                     absl::string_view resource_version, absl::string_view continue_token);

// A meta.k8s.io/v1 Table of `objects` (columns Name, Age, and Shard and Cluster at priority 1,
// which `kubectl get -o wide` shows), ages as of `now`. `with_columns` false leaves out the
// column definitions (a watch sends them with its first event only, as kube-apiserver does).
std::string TableJson(const std::vector<const v1::Object*>& objects, bool with_columns,
                      absl::string_view resource_version, absl::string_view continue_token,
                      absl::Time now);

// A watch event line: {"type":..., "object":...} and a newline.
std::string WatchEventJson(absl::string_view type, absl::string_view object_json);
// A bookmark's object: kind, apiVersion and metadata.resourceVersion (and the annotation
// k8s.io/initial-events-end when `initial_events_end`).
std::string BookmarkObjectJson(const KubeResource& r, absl::string_view resource_version,
                               bool initial_events_end);

// An HTTP status code and Kubernetes reason for an error.
struct KubeError {
  int code;
  std::string reason;
};
// How the view answers an error of the store: INVALID_ARGUMENT 400 BadRequest, NOT_FOUND 404
// NotFound, OUT_OF_RANGE 410 Expired (a resourceVersion older than the history window),
// PERMISSION_DENIED 403 Forbidden, UNAUTHENTICATED 401 Unauthorized, RESOURCE_EXHAUSTED 429
// TooManyRequests, DEADLINE_EXCEEDED 504 Timeout, UNAVAILABLE 503 ServiceUnavailable, else 500
// InternalError.
KubeError KubeErrorFor(const absl::Status& status);
// A meta.k8s.io/v1 Status of a failure.
std::string StatusJson(int code, absl::string_view reason, absl::string_view message);
inline std::string StatusJson(const absl::Status& status) {
  KubeError e = KubeErrorFor(status);
  return StatusJson(e.code, e.reason, status.message());
}

// Discovery documents: /version, /api (APIVersions: v1 when the core group has resources, else
// none, since kubectl refuses a group version without resources), /apis (APIGroupList) and one
// group version's APIResourceList. `groups` holds, per group, its versions (the first
// preferred).
std::string VersionJson(absl::string_view git_version);
std::string ApiVersionsJson(bool core_v1);
std::string ApiGroupListJson(
    const std::vector<std::pair<std::string, std::vector<std::string>>>& groups);
std::string ApiResourceListJson(absl::string_view group, absl::string_view version,
                                const std::vector<KubeResource>& resources);

// How kubectl prints an age (apimachinery's duration.HumanDuration): "45s", "3m20s", "5h10m",
// "3d", "2y40d".
std::string HumanDuration(absl::Duration d);

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_KUBE_JSON_H_
