#include "shard_replicator/cluster_cached_resource.h"

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/validation.h"

namespace shardcache {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using google::protobuf::util::MessageDifferencer;

// A string field of the spec: "" when absent; INVALID_ARGUMENT when not a string.
absl::StatusOr<std::string> StringField(const Struct& spec, const std::string& name) {
  auto it = spec.fields().find(name);
  if (it == spec.fields().end() || it->second.kind_case() == Value::kNullValue) return "";
  if (it->second.kind_case() != Value::kStringValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.", name, ": Invalid value: must be a string"));
  }
  return it->second.string_value();
}

Value StringValue(const std::string& s) {
  Value v;
  v.set_string_value(s);
  return v;
}

Value NumberValue(int64_t n) {
  Value v;
  v.set_number_value(static_cast<double>(n));
  return v;
}

std::string FormatTransitionTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d%ET%H:%M:%SZ", t, absl::UTCTimeZone());
}

// The condition of type `type` in a status's conditions, or null.
const Struct* FindCondition(const Struct& status, const std::string& type) {
  auto it = status.fields().find("conditions");
  if (it == status.fields().end() || !it->second.has_list_value()) return nullptr;
  for (const Value& c : it->second.list_value().values()) {
    if (!c.has_struct_value()) continue;
    auto t = c.struct_value().fields().find("type");
    if (t != c.struct_value().fields().end() && t->second.string_value() == type) {
      return &c.struct_value();
    }
  }
  return nullptr;
}

Value Condition(const std::string& type, bool status, const std::string& reason,
                const std::string& message, int64_t generation, const Struct& previous,
                absl::Time now) {
  std::string status_text = status ? "True" : "False";
  std::string transition = FormatTransitionTime(now);
  if (const Struct* old = FindCondition(previous, type)) {
    auto s = old->fields().find("status");
    auto t = old->fields().find("lastTransitionTime");
    if (s != old->fields().end() && s->second.string_value() == status_text &&
        t != old->fields().end() && t->second.has_string_value()) {
      transition = t->second.string_value();
    }
  }
  Value v;
  auto& f = *v.mutable_struct_value()->mutable_fields();
  f["type"] = StringValue(type);
  f["status"] = StringValue(status_text);
  f["reason"] = StringValue(reason);
  f["message"] = StringValue(message);
  f["lastTransitionTime"] = StringValue(transition);
  f["observedGeneration"] = NumberValue(generation);
  return v;
}

}  // namespace

v1::GroupVersionResource CcrResource() {
  v1::GroupVersionResource gvr;
  gvr.set_group("cache.shardcache.io");
  gvr.set_version("v1alpha1");
  gvr.set_resource("clustercachedresources");
  return gvr;
}

std::string GvrKey(const v1::GroupVersionResource& gvr) {
  return absl::StrCat(gvr.group(), "/", gvr.version(), "/", gvr.resource());
}

std::string GroupResourceKey(const v1::GroupVersionResource& gvr) {
  return absl::StrCat(gvr.group(), "/", gvr.resource());
}

absl::StatusOr<CcrSpec> ParseCcrSpec(const v1::Object& ccr, CcrInvalid* invalid) {
  auto fail = [invalid](const char* reason, const absl::Status& s) {
    if (invalid != nullptr) *invalid = CcrInvalid{reason, std::string(s.message())};
    return s;
  };
  const Struct& spec = ccr.spec();
  CcrSpec out;
  for (const char* field : {"group", "version", "resource"}) {
    absl::StatusOr<std::string> value = StringField(spec, field);
    if (!value.ok()) return fail("InvalidSpec", value.status());
    if (std::string(field) == "group") out.resource.set_group(*value);
    if (std::string(field) == "version") out.resource.set_version(*value);
    if (std::string(field) == "resource") out.resource.set_resource(*value);
  }
  absl::Status gvr = ValidateGroupVersionResource("spec", out.resource);
  if (!gvr.ok()) return fail("InvalidSpec", gvr);
  auto sel = spec.fields().find("labelSelector");
  if (sel != spec.fields().end() && sel->second.kind_case() != Value::kNullValue) {
    if (!sel->second.has_struct_value()) {
      return fail("InvalidLabelSelector",
                  absl::InvalidArgumentError(
                      "spec.labelSelector: Invalid value: must be an object with matchLabels "
                      "and/or matchExpressions"));
    }
    absl::StatusOr<LabelSelector> selector = LabelSelector::FromStruct(sel->second.struct_value());
    if (!selector.ok()) {
      return fail("InvalidLabelSelector", absl::InvalidArgumentError(absl::StrCat(
                                              "spec.labelSelector.", selector.status().message())));
    }
    out.selector = *std::move(selector);
    out.selector_string = out.selector.ToString();
  }
  return out;
}

v1::Object ProjectCopy(const v1::Object& origin, const std::string& shard) {
  const v1::ObjectMeta& om = origin.metadata();
  v1::Object copy;
  v1::ObjectMeta& m = *copy.mutable_metadata();
  m.set_shard(shard);
  m.set_cluster(om.cluster());
  m.set_namespace_(om.namespace_());
  m.set_name(om.name());
  m.set_uid(om.uid());
  if (om.has_creation_timestamp()) *m.mutable_creation_timestamp() = om.creation_timestamp();
  m.set_generation(om.generation());
  *m.mutable_labels() = om.labels();
  *m.mutable_annotations() = om.annotations();
  (*m.mutable_annotations())[kOriginalResourceVersionAnnotation] = om.resource_version();
  (*m.mutable_annotations())[kOriginalUidAnnotation] = om.uid();
  if (origin.has_spec() && !origin.spec().fields().empty()) *copy.mutable_spec() = origin.spec();
  if (origin.has_status() && !origin.status().fields().empty()) {
    *copy.mutable_status() = origin.status();
  }
  return copy;
}

bool CopyUpToDate(const v1::Object& desired, const v1::Object& copy) {
  v1::Object a = desired;
  v1::Object b = copy;
  a.mutable_metadata()->clear_resource_version();
  b.mutable_metadata()->clear_resource_version();
  for (v1::Object* o : {&a, &b}) {
    if (o->has_spec() && o->spec().fields().empty()) o->clear_spec();
    if (o->has_status() && o->status().fields().empty()) o->clear_status();
  }
  return MessageDifferencer::Equals(a, b);
}

int64_t ResourceVersionNumber(const v1::Object& object) {
  int64_t rv = 0;
  if (!absl::SimpleAtoi(object.metadata().resource_version(), &rv)) return 0;
  return rv;
}

const char* PhaseName(CcrState::Phase phase) {
  switch (phase) {
    case CcrState::Phase::kInitializing:
      return "Initializing";
    case CcrState::Phase::kReady:
      return "Ready";
    case CcrState::Phase::kDeleting:
      return "Deleting";
    case CcrState::Phase::kDeleted:
      return "Deleted";
  }
  return "Initializing";
}

Struct CcrStatusStruct(const CcrState& state, const Struct& previous, absl::Time now) {
  Struct status = previous;
  auto& f = *status.mutable_fields();
  f["phase"] = StringValue(PhaseName(state.phase));
  f["observedGeneration"] = NumberValue(state.generation);
  Value conditions;
  auto* list = conditions.mutable_list_value();
  *list->add_values() = Condition("ResourceValid", state.valid, state.valid_reason,
                                  state.valid_message, state.generation, previous, now);
  *list->add_values() = Condition("ReplicationStarted", state.started, state.started_reason,
                                  state.started_message, state.generation, previous, now);
  *list->add_values() = Condition("Synced", state.synced, state.synced_reason, state.synced_message,
                                  state.generation, previous, now);
  f["conditions"] = std::move(conditions);
  f["epoch"] = NumberValue(state.epoch);
  Value counts;
  auto& c = *counts.mutable_struct_value()->mutable_fields();
  c["local"] = NumberValue(state.local_count);
  c["cache"] = NumberValue(state.cache_count);
  f["resourceCounts"] = std::move(counts);
  return status;
}

Struct WithUpdateTime(Struct status, absl::Time now) {
  (*status.mutable_fields())["lastUpdateTime"] = StringValue(FormatTransitionTime(now));
  return status;
}

bool StatusEquals(const Struct& a, const Struct& b) { return MessageDifferencer::Equals(a, b); }

}  // namespace shardcache
