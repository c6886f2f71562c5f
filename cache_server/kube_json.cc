// Kubernetes JSON of the view: see kube_json.h.
#include "cache_server/kube_json.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/resources.h"

namespace shardcache {
namespace {

void AppendStruct(const google::protobuf::Struct& s, std::string* out) {
  std::string json;
  // A Struct always prints: its values are JSON values by construction.
  [[maybe_unused]] auto status = google::protobuf::util::MessageToJsonString(s, &json);
  out->append(json.empty() ? "{}" : json);
}

void AppendTime(const google::protobuf::Timestamp& t, std::string* out) {
  out->push_back('"');
  out->append(absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(t.seconds()),
                               absl::UTCTimeZone()));
  out->push_back('"');
}

void AppendStringMap(const std::map<std::string, std::string>& m, std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : m) {
    if (!first) out->push_back(',');
    first = false;
    AppendJsonString(k, out);
    out->push_back(':');
    AppendJsonString(v, out);
  }
  out->push_back('}');
}

void AppendField(absl::string_view name, std::string* out) {
  out->push_back('"');
  out->append(name.data(), name.size());
  out->append("\":");
}

void AppendMetadata(const v1::ObjectMeta& m, std::string* out) {
  out->push_back('{');
  AppendField("name", out);
  AppendJsonString(m.name(), out);
  if (!m.namespace_().empty()) {
    out->push_back(',');
    AppendField("namespace", out);
    AppendJsonString(m.namespace_(), out);
  }
  if (!m.uid().empty()) {
    out->push_back(',');
    AppendField("uid", out);
    AppendJsonString(m.uid(), out);
  }
  out->push_back(',');
  AppendField("resourceVersion", out);
  AppendJsonString(m.resource_version(), out);
  if (m.generation() != 0) {
    out->push_back(',');
    AppendField("generation", out);
    absl::StrAppend(out, m.generation());
  }
  if (m.has_creation_timestamp()) {
    out->push_back(',');
    AppendField("creationTimestamp", out);
    AppendTime(m.creation_timestamp(), out);
  }
  if (m.has_deletion_timestamp()) {
    out->push_back(',');
    AppendField("deletionTimestamp", out);
    AppendTime(m.deletion_timestamp(), out);
  }
  if (!m.labels().empty()) {
    out->push_back(',');
    AppendField("labels", out);
    AppendStringMap(std::map<std::string, std::string>(m.labels().begin(), m.labels().end()), out);
  }
  std::map<std::string, std::string> annotations(m.annotations().begin(), m.annotations().end());
  if (!m.cluster().empty()) annotations[kKcpClusterAnnotation] = m.cluster();
  if (!m.shard().empty()) annotations[kKcpShardAnnotation] = m.shard();
  if (!annotations.empty()) {
    out->push_back(',');
    AppendField("annotations", out);
    AppendStringMap(annotations, out);
  }
  if (!m.finalizers().empty()) {
    out->push_back(',');
    AppendField("finalizers", out);
    out->push_back('[');
    for (int i = 0; i < m.finalizers_size(); ++i) {
      if (i > 0) out->push_back(',');
      AppendJsonString(m.finalizers(i), out);
    }
    out->push_back(']');
  }
  out->push_back('}');
}

void AppendTypeMeta(absl::string_view kind, absl::string_view api_version, std::string* out) {
  AppendField("kind", out);
  AppendJsonString(kind, out);
  out->push_back(',');
  AppendField("apiVersion", out);
  AppendJsonString(api_version, out);
}

// The list metadata: resourceVersion and, when more remains, continue.
void AppendListMeta(absl::string_view resource_version, absl::string_view continue_token,
                    std::string* out) {
  AppendField("metadata", out);
  out->push_back('{');
  AppendField("resourceVersion", out);
  AppendJsonString(resource_version, out);
  if (!continue_token.empty()) {
    out->push_back(',');
    AppendField("continue", out);
    AppendJsonString(continue_token, out);
  }
  out->push_back('}');
}

}  // namespace

std::string KindForResource(absl::string_view plural) {
  if (plural == kCcrResource) return "ClusterCachedResource";
  if (plural == kDefinitionResource) return "ResourceDefinition";
  std::string singular(plural);
  auto ends = [&](absl::string_view suffix) { return absl::EndsWith(singular, suffix); };
  if (ends("ies") && singular.size() > 3) {
    singular.replace(singular.size() - 3, 3, "y");
  } else if (ends("sses") || ends("xes") || ends("ches") || ends("shes") || ends("zzes") ||
             ends("uses")) {
    singular.resize(singular.size() - 2);
  } else if (ends("s") && !ends("ss") && singular.size() > 1) {
    singular.pop_back();
  }
  if (!singular.empty()) singular[0] = absl::ascii_toupper(singular[0]);
  return singular;
}

std::string ApiVersion(absl::string_view group, absl::string_view version) {
  return group.empty() ? std::string(version) : absl::StrCat(group, "/", version);
}

void AppendJsonString(absl::string_view text, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default:
        if (u < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[u >> 4]);
          out->push_back(kHex[u & 0xf]);
        } else {
          out->push_back(c);  // UTF-8 passes as is: proto strings are valid UTF-8
        }
    }
  }
  out->push_back('"');
}

std::string ObjectJson(const v1::Object& object, const KubeResource& r) {
  std::string out;
  out.reserve(256 + static_cast<size_t>(object.ByteSizeLong()) * 2);
  out.push_back('{');
  AppendField("apiVersion", &out);
  AppendJsonString(ApiVersion(r.group, r.version), &out);
  out.push_back(',');
  AppendField("kind", &out);
  AppendJsonString(r.kind, &out);
  out.push_back(',');
  AppendField("metadata", &out);
  AppendMetadata(object.metadata(), &out);
  if (object.has_spec()) {
    out.push_back(',');
    AppendField("spec", &out);
    AppendStruct(object.spec(), &out);
  }
  if (object.has_status()) {
    out.push_back(',');
    AppendField("status", &out);
    AppendStruct(object.status(), &out);
  }
  out.push_back('}');
  return out;
}

std::string PartialObjectMetadataJson(const v1::Object& object) {
  std::string out = "{";
  AppendTypeMeta("PartialObjectMetadata", "meta.k8s.io/v1", &out);
  out.push_back(',');
  AppendField("metadata", &out);
  AppendMetadata(object.metadata(), &out);
  out.push_back('}');
  return out;
}

std::string ListJson(const KubeResource& r, const std::vector<std::string>& items,
                     absl::string_view resource_version, absl::string_view continue_token) {
  size_t size = 128;
  for (const std::string& item : items) size += item.size() + 1;
  std::string out;
  out.reserve(size);
  out.push_back('{');
  AppendTypeMeta(absl::StrCat(r.kind, "List"), ApiVersion(r.group, r.version), &out);
  out.push_back(',');
  AppendListMeta(resource_version, continue_token, &out);
  out.push_back(',');
  AppendField("items", &out);
  out.push_back('[');
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.append(items[i]);
  }
  out.append("]}");
  return out;
}

std::string TableJson(const std::vector<const v1::Object*>& objects, bool with_columns,
                      absl::string_view resource_version, absl::string_view continue_token,
                      absl::Time now) {
  std::string out = "{";
  AppendTypeMeta("Table", "meta.k8s.io/v1", &out);
  out.push_back(',');
  AppendListMeta(resource_version, continue_token, &out);
  if (with_columns) {
    out.append(
        ",\"columnDefinitions\":["
        "{\"name\":\"Name\",\"type\":\"string\",\"format\":\"name\",\"description\":\"Name must "
        "be unique within a namespace.\",\"priority\":0},"
        "{\"name\":\"Age\",\"type\":\"string\",\"format\":\"\",\"description\":\"The time "
        "since the object was created.\",\"priority\":0},"
        "{\"name\":\"Shard\",\"type\":\"string\",\"format\":\"\",\"description\":\"The shard "
        "the object was replicated from.\",\"priority\":1},"
        "{\"name\":\"Cluster\",\"type\":\"string\",\"format\":\"\",\"description\":\"The "
        "logical cluster of the object.\",\"priority\":1}]");
  }
  out.append(",\"rows\":[");
  for (size_t i = 0; i < objects.size(); ++i) {
    const v1::ObjectMeta& m = objects[i]->metadata();
    if (i > 0) out.push_back(',');
    out.append("{\"cells\":[");
    AppendJsonString(m.name(), &out);
    out.push_back(',');
    std::string age = "<unknown>";
    if (m.has_creation_timestamp()) {
      age = HumanDuration(now - absl::FromUnixSeconds(m.creation_timestamp().seconds()));
    }
    AppendJsonString(age, &out);
    out.push_back(',');
    AppendJsonString(m.shard(), &out);
    out.push_back(',');
    AppendJsonString(m.cluster(), &out);
    out.append("],\"object\":");
    out.append(PartialObjectMetadataJson(*objects[i]));
    out.push_back('}');
  }
  out.append("]}");
  return out;
}

std::string WatchEventJson(absl::string_view type, absl::string_view object_json) {
  std::string out;
  out.reserve(object_json.size() + 32);
  out.append("{\"type\":\"");
  out.append(type.data(), type.size());
  out.append("\",\"object\":");
  out.append(object_json.data(), object_json.size());
  out.append("}\n");
  return out;
}

std::string BookmarkObjectJson(const KubeResource& r, absl::string_view resource_version,
                               bool initial_events_end) {
  std::string out = "{";
  AppendTypeMeta(r.kind, ApiVersion(r.group, r.version), &out);
  out.append(",\"metadata\":{\"resourceVersion\":");
  AppendJsonString(resource_version, &out);
  if (initial_events_end) out.append(",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}");
  out.append("}}");
  return out;
}

KubeError KubeErrorFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return {400, "BadRequest"};
    case absl::StatusCode::kNotFound:
      return {404, "NotFound"};
    case absl::StatusCode::kOutOfRange:
      return {410, "Expired"};
    case absl::StatusCode::kPermissionDenied:
      return {403, "Forbidden"};
    case absl::StatusCode::kUnauthenticated:
      return {401, "Unauthorized"};
    case absl::StatusCode::kResourceExhausted:
      return {429, "TooManyRequests"};
    case absl::StatusCode::kDeadlineExceeded:
      return {504, "Timeout"};
    case absl::StatusCode::kUnavailable:
      return {503, "ServiceUnavailable"};
    default:
      return {500, "InternalError"};
  }
}

std::string StatusJson(int code, absl::string_view reason, absl::string_view message) {
  std::string out = "{";
  AppendTypeMeta("Status", "v1", &out);
  out.append(",\"metadata\":{},\"status\":\"Failure\",\"message\":");
  AppendJsonString(message, &out);
  out.append(",\"reason\":");
  AppendJsonString(reason, &out);
  absl::StrAppend(&out, ",\"code\":", code, "}");
  return out;
}

std::string VersionJson(absl::string_view git_version) {
  std::string out = "{\"major\":\"1\",\"minor\":\"32\",\"gitVersion\":";
  AppendJsonString(git_version, &out);
  out.append(
      ",\"gitCommit\":\"\",\"gitTreeState\":\"\",\"buildDate\":\"\",\"goVersion\":\"\","
      "\"compiler\":\"\",\"platform\":\"linux/amd64\"}");
  return out;
}

std::string ApiVersionsJson(bool core_v1) {
  return absl::StrCat("{\"kind\":\"APIVersions\",\"versions\":[", core_v1 ? "\"v1\"" : "",
                      "],\"serverAddressByClientCIDRs\":[]}");
}

std::string ApiGroupListJson(
    const std::vector<std::pair<std::string, std::vector<std::string>>>& groups) {
  std::string out = "{";
  AppendTypeMeta("APIGroupList", "v1", &out);
  out.append(",\"groups\":[");
  bool first_group = true;
  for (const auto& [group, versions] : groups) {
    if (group.empty() || versions.empty()) continue;  // the core group is /api's
    if (!first_group) out.push_back(',');
    first_group = false;
    out.append("{\"name\":");
    AppendJsonString(group, &out);
    out.append(",\"versions\":[");
    for (size_t i = 0; i < versions.size(); ++i) {
      if (i > 0) out.push_back(',');
      out.append("{\"groupVersion\":");
      AppendJsonString(ApiVersion(group, versions[i]), &out);
      out.append(",\"version\":");
      AppendJsonString(versions[i], &out);
      out.push_back('}');
    }
    out.append("],\"preferredVersion\":{\"groupVersion\":");
    AppendJsonString(ApiVersion(group, versions[0]), &out);
    out.append(",\"version\":");
    AppendJsonString(versions[0], &out);
    out.append("}}");
  }
  out.append("]}");
  return out;
}

std::string ApiResourceListJson(absl::string_view group, absl::string_view version,
                                const std::vector<KubeResource>& resources) {
  std::string out = "{";
  AppendTypeMeta("APIResourceList", "v1", &out);
  out.append(",\"groupVersion\":");
  AppendJsonString(ApiVersion(group, version), &out);
  out.append(",\"resources\":[");
  for (size_t i = 0; i < resources.size(); ++i) {
    const KubeResource& r = resources[i];
    if (i > 0) out.push_back(',');
    out.append("{\"name\":");
    AppendJsonString(r.resource, &out);
    std::string singular = absl::AsciiStrToLower(r.kind);
    out.append(",\"singularName\":");
    AppendJsonString(singular, &out);
    out.append(r.namespaced ? ",\"namespaced\":true" : ",\"namespaced\":false");
    out.append(",\"kind\":");
    AppendJsonString(r.kind, &out);
    out.append(",\"verbs\":[\"get\",\"list\",\"watch\"]}");
  }
  out.append("]}");
  return out;
}

std::string HumanDuration(absl::Duration d) {
  int64_t seconds = absl::ToInt64Seconds(d);
  if (seconds < -1) return "<invalid>";
  if (seconds < 0) return "0s";
  if (seconds < 60 * 2) return absl::StrCat(seconds, "s");
  int64_t minutes = seconds / 60;
  if (minutes < 10) {
    int64_t s = seconds % 60;
    return s == 0 ? absl::StrCat(minutes, "m") : absl::StrCat(minutes, "m", s, "s");
  }
  if (minutes < 60 * 3) return absl::StrCat(minutes, "m");
  int64_t hours = minutes / 60;
  if (hours < 8) {
    int64_t m = minutes % 60;
    return m == 0 ? absl::StrCat(hours, "h") : absl::StrCat(hours, "h", m, "m");
  }
  if (hours < 48) return absl::StrCat(hours, "h");
  if (hours < 24 * 8) {
    int64_t h = hours % 24;
    return h == 0 ? absl::StrCat(hours / 24, "d") : absl::StrCat(hours / 24, "d", h, "h");
  }
  if (hours < 24 * 365 * 2) return absl::StrCat(hours / 24, "d");
  if (hours < 24 * 365 * 8) {
    int64_t dy = (hours / 24) % 365;
    return dy == 0 ? absl::StrCat(hours / 24 / 365, "y")
                   : absl::StrCat(hours / 24 / 365, "y", dy, "d");
  }
  return absl::StrCat(hours / 24 / 365, "y");
}

}  // namespace shardcache
