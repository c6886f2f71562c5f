#include "cache_server/object_validation.h"

#include <google/protobuf/util/time_util.h>

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/validation.h"

namespace shardcache {

using google::protobuf::util::TimeUtil;

absl::Status ValidateStruct(const std::string& path, const google::protobuf::Struct& s, int depth) {
  if (depth > kMaxStructDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": Invalid value: nested deeper than ", kMaxStructDepth, " levels"));
  }
  for (const auto& [k, v] : s.fields()) {
    RETURN_IF_ERROR(ValidateValue(absl::StrCat(path, ".", k), v, depth + 1));
  }
  return absl::OkStatus();
}

absl::Status ValidateValue(const std::string& path, const google::protobuf::Value& v, int depth) {
  switch (v.kind_case()) {
    case google::protobuf::Value::kNumberValue:
      if (!std::isfinite(v.number_value())) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": Invalid value: numbers must be finite (JSON has no NaN or Inf)"));
      }
      return absl::OkStatus();
    case google::protobuf::Value::kStructValue:
      return ValidateStruct(path, v.struct_value(), depth);
    case google::protobuf::Value::kListValue:
      for (int i = 0; i < v.list_value().values_size(); ++i) {
        RETURN_IF_ERROR(
            ValidateValue(absl::StrCat(path, "[", i, "]"), v.list_value().values(i), depth + 1));
      }
      return absl::OkStatus();
    case google::protobuf::Value::KIND_NOT_SET:
      return absl::InvalidArgumentError(absl::StrCat(path, ": Invalid value: a value has no kind"));
    default:
      return absl::OkStatus();
  }
}

absl::Status ValidateTimestamp(const std::string& path, const google::protobuf::Timestamp& t) {
  if (t.seconds() < TimeUtil::kTimestampMinSeconds ||
      t.seconds() > TimeUtil::kTimestampMaxSeconds || t.nanos() < 0 || t.nanos() > 999999999) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": Invalid value: not a valid timestamp"));
  }
  return absl::OkStatus();
}

absl::Status ValidateKey(const ResourceInfo& info, const std::string& prefix,
                         const std::string& shard, const std::string& cluster,
                         const std::string& ns, const std::string& name) {
  RETURN_IF_ERROR(ValidateDNS1123Subdomain(prefix + "name", name));
  if (!shard.empty()) RETURN_IF_ERROR(ValidateDNS1123Label(prefix + "shard", shard));
  if (!cluster.empty()) RETURN_IF_ERROR(ValidateClusterName(prefix + "cluster", cluster));
  switch (info.scope) {
    case ResourceInfo::Scope::kNamespaced:
      RETURN_IF_ERROR(ValidateDNS1123Label(prefix + "namespace", ns));
      break;
    case ResourceInfo::Scope::kCluster:
      if (!ns.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix,
                         "namespace: Forbidden: the resource is cluster-scoped; "
                         "namespace must be empty"));
      }
      break;
    case ResourceInfo::Scope::kAny:
      if (!ns.empty()) RETURN_IF_ERROR(ValidateDNS1123Label(prefix + "namespace", ns));
      break;
  }
  return absl::OkStatus();
}

absl::Status RefuseShardInShardRole(Role role, const std::string& path, const std::string& shard) {
  if (role != Role::kShard || shard.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(path,
                   ": Forbidden: a shard store's objects have no shard (it names the origin "
                   "of a copy in the cache)"));
}

absl::Status ValidateObject(const ResourceInfo& info, const v1::Object& o) {
  const v1::ObjectMeta& m = o.metadata();
  RETURN_IF_ERROR(ValidateKey(info, "metadata.", m.shard(), m.cluster(), m.namespace_(), m.name()));
  RETURN_IF_ERROR(ValidateLabels("metadata.labels", m.labels()));
  RETURN_IF_ERROR(ValidateAnnotations("metadata.annotations", m.annotations()));
  RETURN_IF_ERROR(ValidateFinalizers("metadata.finalizers", m.finalizers()));
  if (m.generation() < 0) {
    return absl::InvalidArgumentError("metadata.generation: Invalid value: must not be negative");
  }
  if (m.has_creation_timestamp()) {
    RETURN_IF_ERROR(ValidateTimestamp("metadata.creationTimestamp", m.creation_timestamp()));
  }
  RETURN_IF_ERROR(ValidateStruct("spec", o.spec(), 0));
  RETURN_IF_ERROR(ValidateStruct("status", o.status(), 0));
  return absl::OkStatus();
}

void Normalize(v1::Object* o) {
  if (o->has_spec() && o->spec().fields().empty()) o->clear_spec();
  if (o->has_status() && o->status().fields().empty()) o->clear_status();
}

absl::StatusOr<int64_t> ParseRevision(const std::string& path, const std::string& text) {
  int64_t rv = 0;
  if (!absl::SimpleAtoi(text, &rv) || rv <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": Invalid value: \"", text, "\": must be a positive decimal integer"));
  }
  return rv;
}

absl::Status CheckSize(const v1::Object& o, int64_t limit) {
  size_t size = o.ByteSizeLong();
  if (static_cast<int64_t>(size) > limit) {
    return absl::ResourceExhaustedError(absl::StrCat("object is ", size,
                                                     " bytes, more than the limit of ", limit,
                                                     " bytes (--max-object-bytes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ObjectFilter> MakeFilter(const std::string& shard, const std::string& cluster,
                                        const std::string& ns, const std::string& selector) {
  ObjectFilter f;
  if (!shard.empty()) RETURN_IF_ERROR(ValidateDNS1123Label("shard", shard));
  if (!cluster.empty()) RETURN_IF_ERROR(ValidateClusterName("cluster", cluster));
  if (!ns.empty()) RETURN_IF_ERROR(ValidateDNS1123Label("namespace", ns));
  auto parsed = LabelSelector::Parse(selector);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("label_selector: Invalid value: \"", selector,
                                                   "\": ", parsed.status().message()));
  }
  f.shard = shard;
  f.cluster = cluster;
  f.namespace_ = ns;
  f.selector = *std::move(parsed);
  return f;
}

}  // namespace shardcache
