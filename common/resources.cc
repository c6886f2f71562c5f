#include "common/resources.h"

#include "absl/strings/str_cat.h"

namespace shardcache {

v1::GroupVersionResource MakeGvr(absl::string_view group, absl::string_view version,
                                 absl::string_view resource) {
  v1::GroupVersionResource gvr;
  gvr.set_group(std::string(group));
  gvr.set_version(std::string(version));
  gvr.set_resource(std::string(resource));
  return gvr;
}

v1::GroupVersionResource DefinitionResource() {
  return MakeGvr(kDefinitionGroup, kDefinitionVersion, kDefinitionResource);
}

v1::GroupVersionResource LeaseResource() {
  return MakeGvr(kLeaseGroup, kLeaseVersion, kLeaseResource);
}

v1::GroupVersionResource CcrResource() { return MakeGvr(kCcrGroup, kCcrVersion, kCcrResource); }

bool IsBuiltInGroup(absl::string_view group) {
  return group == kDefinitionGroup || group == kLeaseGroup || group == kCcrGroup;
}

std::string GvrKey(const v1::GroupVersionResource& gvr) {
  return absl::StrCat(gvr.group(), "/", gvr.version(), "/", gvr.resource());
}

std::string GroupResource(const v1::GroupVersionResource& gvr) {
  return absl::StrCat(gvr.group(), "/", gvr.resource());
}

std::string GvrString(const v1::GroupVersionResource& gvr) {
  if (gvr.group().empty()) return absl::StrCat(gvr.resource(), "/", gvr.version());
  return absl::StrCat(gvr.resource(), ".", gvr.group(), "/", gvr.version());
}

}  // namespace shardcache
