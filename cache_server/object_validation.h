// Object validation: the rules a request's object, key and filter must meet before the
// ObjectStore takes them, and the normal form it stores objects in.
//
// Every rule gives INVALID_ARGUMENT with the field's path first and the Kubernetes wording
// ("metadata.name: Invalid value: ...", "...: Forbidden: ...", "...: Required value: ..."),
// except the size limit, which gives RESOURCE_EXHAUSTED. A rule looks at its input only: rules
// that depend on the stored object (conflicts, finalizers of an object being deleted) are the
// store's.
//
// Thread-safety: pure functions of their arguments; any thread.
#ifndef SHARDCACHE_CACHE_SERVER_OBJECT_VALIDATION_H_
#define SHARDCACHE_CACHE_SERVER_OBJECT_VALIDATION_H_

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/timestamp.pb.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "cache_server/object_filter.h"
#include "cache_server/resource_registry.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

// JSON nesting allowed in spec and status. gRPC parses requests with protobuf's default
// recursion limit (100 message levels, about 3 per JSON level), so deeper values never reach the
// store; this limit stays below that so that the error is ours and names the field.
inline constexpr int kMaxStructDepth = 24;

// Free-form JSON at `path`, `depth` levels deep: finite numbers, every value of a kind, no
// deeper than kMaxStructDepth.
absl::Status ValidateStruct(const std::string& path, const google::protobuf::Struct& s,
                            int depth = 0);
absl::Status ValidateValue(const std::string& path, const google::protobuf::Value& v, int depth);

// A timestamp that RFC 3339 can write (years 1 to 9999, nanos in [0, 1e9)).
absl::Status ValidateTimestamp(const std::string& path, const google::protobuf::Timestamp& t);

// The parts of an object's key, against the resource's scope: name a DNS-1123 subdomain, shard
// and namespace DNS-1123 labels, cluster a cluster name; a namespace required for a namespaced
// resource and forbidden for a cluster-scoped one. `prefix` is "metadata." for an object, ""
// for a request's own fields.
absl::Status ValidateKey(const ResourceInfo& info, const std::string& prefix,
                         const std::string& shard, const std::string& cluster,
                         const std::string& ns, const std::string& name);

// metadata.shard names the shard a copy in the cache came from. A shard store's objects are its
// own: one with a shard would be a second object beside the one of the same name. In the shard
// role a non-empty `shard` is Forbidden (at `path`).
absl::Status RefuseShardInShardRole(Role role, const std::string& path, const std::string& shard);

// An object as written: its key (ValidateKey), labels, annotations, finalizers, generation (not
// negative), creationTimestamp, spec and status (ValidateStruct).
absl::Status ValidateObject(const ResourceInfo& info, const v1::Object& o);

// RESOURCE_EXHAUSTED when `o` serializes to more than `limit` bytes (--max-object-bytes).
absl::Status CheckSize(const v1::Object& o, int64_t limit);

// Stores an empty spec or status as absent, so that "{}" and no value compare equal.
void Normalize(v1::Object* o);

// A resourceVersion given by a client: a positive decimal integer.
absl::StatusOr<int64_t> ParseRevision(const std::string& path, const std::string& text);

// The filter of a List or Watch request: its shard, cluster and namespace validated (each may be
// empty: any) and its label selector parsed ("label_selector: Invalid value: ..." otherwise).
absl::StatusOr<ObjectFilter> MakeFilter(const std::string& shard, const std::string& cluster,
                                        const std::string& ns, const std::string& selector);

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_OBJECT_VALIDATION_H_
