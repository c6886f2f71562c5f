#include "cache_server/resource_registry.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

const google::protobuf::Value* Field(const google::protobuf::Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::StatusOr<std::string> RequiredString(const google::protobuf::Struct& s,
                                           const std::string& name, const std::string& path) {
  const google::protobuf::Value* v = Field(s, name);
  if (v == nullptr || (v->has_string_value() && v->string_value().empty())) {
    return Invalid(path, "Required value");
  }
  if (!v->has_string_value()) return Invalid(path, "Invalid value: must be a string");
  return v->string_value();
}

}  // namespace

std::string GroupResource(const v1::GroupVersionResource& gvr) {
  return absl::StrCat(gvr.group(), "/", gvr.resource());
}

std::string GvrString(const v1::GroupVersionResource& gvr) {
  if (gvr.group().empty()) return absl::StrCat(gvr.resource(), "/", gvr.version());
  return absl::StrCat(gvr.resource(), ".", gvr.group(), "/", gvr.version());
}

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
  const v1::ObjectMeta& meta = definition.metadata();
  if (!meta.cluster().empty()) {
    return Invalid("metadata.cluster",
                   "Forbidden: a ResourceDefinition applies to the whole store and has no cluster");
  }
  if (!meta.shard().empty()) {
    return Invalid("metadata.shard", "Forbidden: a ResourceDefinition has no shard");
  }
  const google::protobuf::Struct& spec = definition.spec();
  ASSIGN_OR_RETURN(std::string group, RequiredString(spec, "group", "spec.group"));
  RETURN_IF_ERROR(ValidateDNS1123Subdomain("spec.group", group));
  const google::protobuf::Value* names = Field(spec, "names");
  if (names == nullptr) return Invalid("spec.names", "Required value");
  if (!names->has_struct_value()) return Invalid("spec.names", "Invalid value: must be an object");
  ASSIGN_OR_RETURN(std::string plural,
                   RequiredString(names->struct_value(), "plural", "spec.names.plural"));
  RETURN_IF_ERROR(ValidateDNS1123Label("spec.names.plural", plural));
  ResourceInfo info;
  info.group_resource = absl::StrCat(group, "/", plural);
  if (IsBuiltIn(info.group_resource) || group == kDefinitionGroup || group == kLeaseGroup ||
      group == kCcrGroup) {
    return Invalid("spec.group",
                   absl::StrCat("Forbidden: group ", group, " is reserved for built-in resources"));
  }
  if (meta.name() != absl::StrCat(plural, ".", group)) {
    return Invalid("metadata.name",
                   absl::StrCat("Invalid value: \"", meta.name(),
                                "\": must be spec.names.plural+\".\"+spec.group (\"", plural, ".",
                                group, "\")"));
  }
  ASSIGN_OR_RETURN(std::string scope, RequiredString(spec, "scope", "spec.scope"));
  if (scope == "Cluster") {
    info.scope = ResourceInfo::Scope::kCluster;
  } else if (scope == "Namespaced") {
    info.scope = ResourceInfo::Scope::kNamespaced;
  } else {
    return Invalid("spec.scope", absl::StrCat("Unsupported value: \"", scope,
                                              "\": supported values: \"Cluster\", \"Namespaced\""));
  }
  if (previous != nullptr) {
    const google::protobuf::Value* old_scope = Field(previous->spec(), "scope");
    if (old_scope != nullptr && old_scope->string_value() != scope) {
      return Invalid("spec.scope", "Invalid value: field is immutable");
    }
  }
  const google::protobuf::Value* versions = Field(spec, "versions");
  if (versions == nullptr) return Invalid("spec.versions", "Required value");
  if (!versions->has_list_value() || versions->list_value().values_size() == 0) {
    return Invalid("spec.versions", "Invalid value: must be a non-empty list");
  }
  std::set<std::string> seen;
  for (int i = 0; i < versions->list_value().values_size(); ++i) {
    std::string path = absl::StrCat("spec.versions[", i, "]");
    const google::protobuf::Value& v = versions->list_value().values(i);
    if (!v.has_struct_value()) return Invalid(path, "Invalid value: must be an object");
    ASSIGN_OR_RETURN(std::string name,
                     RequiredString(v.struct_value(), "name", absl::StrCat(path, ".name")));
    RETURN_IF_ERROR(ValidateDNS1123Label(absl::StrCat(path, ".name"), name));
    if (!seen.insert(name).second) {
      return Invalid(absl::StrCat(path, ".name"), absl::StrCat("Duplicate value: \"", name, "\""));
    }
    bool served = true;
    if (const google::protobuf::Value* s = Field(v.struct_value(), "served"); s != nullptr) {
      if (!s->has_bool_value()) {
        return Invalid(absl::StrCat(path, ".served"), "Invalid value: must be a boolean");
      }
      served = s->bool_value();
    }
    if (served) info.versions.push_back(name);
  }
  if (const google::protobuf::Value* sub = Field(spec, "subresources"); sub != nullptr) {
    if (!sub->has_struct_value()) {
      return Invalid("spec.subresources", "Invalid value: must be an object");
    }
    info.status_subresource = Field(sub->struct_value(), "status") != nullptr;
  }
  return info;
}

void ResourceRegistry::ApplyDefinition(const ResourceInfo& info) {
  defined_[info.group_resource] = info;
}

void ResourceRegistry::RemoveDefinition(const std::string& group_resource) {
  defined_.erase(group_resource);
}

}  // namespace shardcache
