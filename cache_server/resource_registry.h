// ResourceRegistry: which resources a store serves, and how (scope, status subresource).
//
// Built-in resources are always served: resourcedefinitions (core.shardcache.io/v1),
// leases (coordination.shardcache.io/v1) and clustercachedresources
// (cache.shardcache.io/v1alpha1). In the cache role every other well-formed resource is served
// too, with no scope rule and no status subresource. In the shard role another resource is
// served only while a ResourceDefinition defines it, and only in the versions it marks served.
//
// Not thread-safe: the ObjectStore owns one and calls it under its own lock.
#ifndef SHARDCACHE_CACHE_SERVER_RESOURCE_REGISTRY_H_
#define SHARDCACHE_CACHE_SERVER_RESOURCE_REGISTRY_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/resources.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

enum class Role { kCache, kShard };

struct ResourceInfo {
  enum class Scope { kAny, kCluster, kNamespaced };
  std::string group_resource;
  Scope scope = Scope::kAny;
  bool status_subresource = false;
  // Versions served; empty means any version (cache role).
  std::vector<std::string> versions;
};

class ResourceRegistry {
 public:
  explicit ResourceRegistry(Role role);

  Role role() const { return role_; }

  // How `gvr` is served. NOT_FOUND with a clear message when it is not served (unknown resource,
  // or its version not served); INVALID_ARGUMENT when the names are malformed.
  absl::StatusOr<ResourceInfo> Resolve(const v1::GroupVersionResource& gvr) const;

  // Validates a ResourceDefinition object (its name and spec) and returns what it defines.
  // `previous` is the stored definition when this is an update (scope is immutable).
  static absl::StatusOr<ResourceInfo> ParseDefinition(const v1::Object& definition,
                                                      const v1::Object* previous);

  // Shard role: `definition` now defines its resource (created or updated).
  void ApplyDefinition(const ResourceInfo& info);
  // Shard role: the definition of `group_resource` is gone.
  void RemoveDefinition(const std::string& group_resource);

  // Whether a built-in resource has this group/resource.
  static bool IsBuiltIn(const std::string& group_resource);

 private:
  Role role_;
  std::map<std::string, ResourceInfo> defined_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_RESOURCE_REGISTRY_H_
