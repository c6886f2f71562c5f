// The one home of resource names: the built-in resources' groups, versions and plurals, and the
// helpers that build and print a GroupVersionResource.
//
// Built-in resources, served by every store in both roles:
//   resourcedefinitions     core.shardcache.io/v1          cluster-scoped
//   leases                  coordination.shardcache.io/v1  namespaced
//   clustercachedresources  cache.shardcache.io/v1alpha1   cluster-scoped, status subresource
//
// Thread-safe: constants and pure functions.
#ifndef SHARDCACHE_COMMON_RESOURCES_H_
#define SHARDCACHE_COMMON_RESOURCES_H_

#include <string>

#include "absl/strings/string_view.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

inline constexpr char kDefinitionGroup[] = "core.shardcache.io";
inline constexpr char kDefinitionVersion[] = "v1";
inline constexpr char kDefinitionResource[] = "resourcedefinitions";
inline constexpr char kLeaseGroup[] = "coordination.shardcache.io";
inline constexpr char kLeaseVersion[] = "v1";
inline constexpr char kLeaseResource[] = "leases";
inline constexpr char kCcrGroup[] = "cache.shardcache.io";
inline constexpr char kCcrVersion[] = "v1alpha1";
inline constexpr char kCcrResource[] = "clustercachedresources";

v1::GroupVersionResource MakeGvr(absl::string_view group, absl::string_view version,
                                 absl::string_view resource);
// core.shardcache.io/v1 resourcedefinitions.
v1::GroupVersionResource DefinitionResource();
// coordination.shardcache.io/v1 leases.
v1::GroupVersionResource LeaseResource();
// cache.shardcache.io/v1alpha1 clustercachedresources.
v1::GroupVersionResource CcrResource();
// True for a group that only built-in resources may use.
bool IsBuiltInGroup(absl::string_view group);

// "group/version/resource" (the core group: "/version/resource"): a map key.
std::string GvrKey(const v1::GroupVersionResource& gvr);
// "group/resource": how objects of a resource are grouped, whatever the version.
std::string GroupResource(const v1::GroupVersionResource& gvr);
// "resource.group/version" (or "resource/version" for the core group), for messages.
std::string GvrString(const v1::GroupVersionResource& gvr);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_RESOURCES_H_
