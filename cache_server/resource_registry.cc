#include "cache_server/resource_registry.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/resource_definition.h"
#include "common/status_macros.h"
#include "common/validation.h"

namespace shardcache {
namespace {

const std::map<std::string, ResourceInfo>& BuiltIns() {
  static const auto* built_ins = new std::map<std::string, ResourceInfo>{
      {absl::StrCat(kDefinitionGroup, "/", kDefinitionResource),
       {absl::StrCat(kDefinitionGroup, "/", kDefinitionResource),
        ResourceInfo::Scope::kCluster,
        false,
        {"v1"}}},
      {absl::StrCat(kLeaseGroup, "/", kLeaseResource),
       {absl::StrCat(kLeaseGroup, "/", kLeaseResource),
        ResourceInfo::Scope::kNamespaced,
        false,
        {"v1"}}},
      {absl::StrCat(kCcrGroup, "/", kCcrResource),
       {absl::StrCat(kCcrGroup, "/", kCcrResource),
        ResourceInfo::Scope::kCluster,
        true,
        {"v1alpha1"}}},
  };
  return *built_ins;
}

}  // namespace

ResourceRegistry::ResourceRegistry(Role role) : role_(role) {}

bool ResourceRegistry::IsBuiltIn(const std::string& group_resource) {
  return BuiltIns().count(group_resource) > 0;
}

absl::StatusOr<ResourceInfo> ResourceRegistry::Resolve(const v1::GroupVersionResource& gvr) const {
  RETURN_IF_ERROR(ValidateGroupVersionResource("resource", gvr));
  std::string gr = GroupResource(gvr);
  const ResourceInfo* info = nullptr;
  if (auto it = BuiltIns().find(gr); it != BuiltIns().end()) {
    info = &it->second;
  } else if (role_ == Role::kCache) {
    ResourceInfo any;
    any.group_resource = gr;
    return any;
  } else if (auto it = defined_.find(gr); it != defined_.end()) {
    info = &it->second;
  } else {
    return absl::NotFoundError(absl::StrCat("the server could not find the requested resource ",
                                            GvrString(gvr), ": no ResourceDefinition defines it"));
  }
  if (std::find(info->versions.begin(), info->versions.end(), gvr.version()) ==
      info->versions.end()) {
    return absl::NotFoundError(absl::StrCat(
        "the server could not find the requested resource ", GvrString(gvr), ": version ",
        gvr.version(), " is not served (served: ", absl::StrJoin(info->versions, ", "), ")"));
  }
  return *info;
}

absl::StatusOr<ResourceInfo> ResourceRegistry::ParseDefinition(const v1::Object& definition,
                                                               const v1::Object* previous) {
  ASSIGN_OR_RETURN(ResourceDefinition parsed, ParseResourceDefinition(definition, previous));
  ResourceInfo info;
  info.group_resource = absl::StrCat(parsed.group, "/", parsed.plural);
  info.scope = parsed.namespaced ? ResourceInfo::Scope::kNamespaced : ResourceInfo::Scope::kCluster;
  info.status_subresource = parsed.status_subresource;
  info.versions = std::move(parsed.served_versions);
  return info;
}

void ResourceRegistry::ApplyDefinition(const ResourceInfo& info) {
  defined_[info.group_resource] = info;
}

void ResourceRegistry::RemoveDefinition(const std::string& group_resource) {
  defined_.erase(group_resource);
}

}  // namespace shardcache
