#include "common/resource_definition.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/resources.h"
#include "common/status_macros.h"
#include "common/struct_codec.h"
#include "common/validation.h"

namespace shardcache {
namespace {

absl::StatusOr<types::v1::ResourceDefinitionSpec> ReadSpec(const google::protobuf::Struct& s) {
  StructCodecOptions lenient;
  lenient.ignore_unknown_fields = true;
  types::v1::ResourceDefinitionSpec spec;
  RETURN_IF_ERROR(StructToMessage(s, "spec", &spec, lenient));
  return spec;
}

}  // namespace

std::vector<v1::GroupVersionResource> ResourceDefinition::ServedResources() const {
  std::vector<v1::GroupVersionResource> out;
  for (const std::string& version : served_versions) out.push_back(MakeGvr(group, version, plural));
  return out;
}

absl::StatusOr<ResourceDefinition> ParseResourceDefinition(const v1::Object& definition,
                                                           const v1::Object* previous) {
  const v1::ObjectMeta& meta = definition.metadata();
  if (!meta.cluster().empty()) {
    return FieldForbidden("metadata.cluster",
                          "a ResourceDefinition applies to the whole store and has no cluster");
  }
  if (!meta.shard().empty()) {
    return FieldForbidden("metadata.shard", "a ResourceDefinition has no shard");
  }
  ResourceDefinition out;
  ASSIGN_OR_RETURN(out.spec, ReadSpec(definition.spec()));
  const types::v1::ResourceDefinitionSpec& spec = out.spec;
  out.group = spec.group();
  RETURN_IF_ERROR(ValidateDNS1123Subdomain("spec.group", out.group));
  if (!spec.has_names()) return FieldRequired("spec.names");
  out.plural = spec.names().plural();
  RETURN_IF_ERROR(ValidateDNS1123Label("spec.names.plural", out.plural));
  if (IsBuiltInGroup(out.group)) {
    return FieldForbidden("spec.group",
                          absl::StrCat("group ", out.group, " is reserved for built-in resources"));
  }
  const std::string want_name = absl::StrCat(out.plural, ".", out.group);
  if (meta.name() != want_name) {
    return FieldInvalid(
        "metadata.name", meta.name(),
        absl::StrCat("must be spec.names.plural+\".\"+spec.group (\"", want_name, "\")"));
  }
  const std::string& scope = spec.scope();
  if (scope.empty()) return FieldRequired("spec.scope");
  if (scope != "Cluster" && scope != "Namespaced") {
    return FieldNotSupported("spec.scope", scope, {"Cluster", "Namespaced"});
  }
  out.namespaced = scope == "Namespaced";
  if (previous != nullptr) {
    absl::StatusOr<types::v1::ResourceDefinitionSpec> old = ReadSpec(previous->spec());
    if (old.ok() && old->has_scope() && old->scope() != scope) {
      // As the store has always said it: "spec.scope: Invalid value: field is immutable".
      return FieldInvalidRendered("spec.scope", "field is immutable", "");
    }
  }
  if (spec.versions().empty()) {
    if (definition.spec().fields().count("versions") == 0) return FieldRequired("spec.versions");
    return FieldInvalidRendered("spec.versions", "[]", "must be a non-empty list");
  }
  std::set<std::string> seen;
  for (int i = 0; i < spec.versions_size(); ++i) {
    const types::v1::ResourceDefinitionVersion& v = spec.versions(i);
    const std::string path = ChildPath(IndexPath("spec.versions", static_cast<size_t>(i)), "name");
    RETURN_IF_ERROR(ValidateDNS1123Label(path, v.name()));
    if (!seen.insert(v.name()).second) return FieldDuplicate(path, v.name());
    if (!v.has_served() || v.served()) out.served_versions.push_back(v.name());
  }
  out.status_subresource = spec.has_subresources() && spec.subresources().has_status();
  return out;
}

}  // namespace shardcache
