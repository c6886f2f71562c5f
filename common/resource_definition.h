// A ResourceDefinition (core.shardcache.io/v1 resourcedefinitions, the CRD analogue): the one
// parse and validation of its spec, used by the store that accepts it (cache_server's
// ResourceRegistry) and by the clients that follow it (DynamicInformerFactory).
//
//   {"metadata": {"name": "widgets.example.com"},
//    "spec": {"group": "example.com", "names": {"plural": "widgets"}, "scope": "Namespaced",
//             "versions": [{"name": "v1"}, {"name": "v2", "served": false}],
//             "subresources": {"status": {}}}}
//
// The spec is read into types::v1::ResourceDefinitionSpec (common/struct_codec.h; unknown
// fields are ignored, as Kubernetes keeps fields it does not know in a CRD), then checked: group
// a DNS-1123 subdomain that is not a built-in group, names.plural a DNS-1123 label, the object's
// name plural.group, scope Cluster or Namespaced (and unchanged on update), at least one version,
// each a distinct DNS-1123 label. Errors are INVALID_ARGUMENT naming the field.
//
// Thread-safe: pure functions.
#ifndef SHARDCACHE_COMMON_RESOURCE_DEFINITION_H_
#define SHARDCACHE_COMMON_RESOURCE_DEFINITION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shardcache/types/v1/types.pb.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

// What a valid ResourceDefinition defines.
struct ResourceDefinition {
  types::v1::ResourceDefinitionSpec spec;
  std::string group;
  std::string plural;
  bool namespaced = false;
  bool status_subresource = false;
  // The versions marked served (the default), in the definition's order.
  std::vector<std::string> served_versions;

  // One GroupVersionResource per served version.
  std::vector<v1::GroupVersionResource> ServedResources() const;
};

// Parses and validates `definition`. `previous` is the stored definition when this is an update
// (scope is immutable); null otherwise.
absl::StatusOr<ResourceDefinition> ParseResourceDefinition(const v1::Object& definition,
                                                           const v1::Object* previous = nullptr);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_RESOURCE_DEFINITION_H_
