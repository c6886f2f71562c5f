#include "shard_replicator/cluster_cached_resource.h"

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/struct_codec.h"
#include "common/validation.h"
#include "shardcache/types/v1/types.pb.h"

namespace shardcache {
namespace {

using google::protobuf::Struct;
using google::protobuf::util::MessageDifferencer;

using types::v1::ClusterCachedResourceStatus;

std::string FormatTransitionTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d%ET%H:%M:%SZ", t, absl::UTCTimeZone());
}

// A stored status, typed; what does not parse is taken as absent (the status is rewritten).
ClusterCachedResourceStatus ReadStatus(const Struct& status) {
  StructCodecOptions lenient;
  lenient.ignore_unknown_fields = true;
  ClusterCachedResourceStatus out;
  if (!StructToMessage(status, "status", &out, lenient).ok()) out.Clear();
  return out;
}

// Sets every field of `fields` in `*into`, keeping the others.
void SetFields(const Struct& fields, Struct* into) {
  for (const auto& [name, value] : fields.fields()) (*into->mutable_fields())[name] = value;
}

types::v1::Condition Condition(const std::string& type, bool status, const std::string& reason,
                               const std::string& message, int64_t generation,
                               const ClusterCachedResourceStatus& previous, absl::Time now) {
  types::v1::Condition c;
  c.set_type(type);
  c.set_status(status ? "True" : "False");
  c.set_reason(reason);
  c.set_message(message);
  c.set_last_transition_time(FormatTransitionTime(now));
  for (const types::v1::Condition& old : previous.conditions()) {
    if (old.type() != type) continue;
    // The first condition of the type decides, as apimachinery's FindStatusCondition.
    if (old.status() == c.status() && old.has_last_transition_time()) {
      c.set_last_transition_time(old.last_transition_time());
    }
    break;
  }
  c.set_observed_generation(generation);
  return c;
}

}  // namespace

absl::StatusOr<CcrSpec> ParseCcrSpec(const v1::Object& ccr, CcrInvalid* invalid) {
  auto fail = [invalid](const char* reason, const absl::Status& s) {
    if (invalid != nullptr) *invalid = CcrInvalid{reason, std::string(s.message())};
    return s;
  };
  // Lenient (a CCR may carry fields this version does not know), but the label selector is
  // strict: a misspelt "matchLabel" must not select everything.
  types::v1::ClusterCachedResourceSpec spec;
  StructCodecOptions options;
  options.ignore_unknown_fields = true;
  options.strict_messages = {types::v1::LabelSelectorSpec::descriptor(),
                             types::v1::LabelSelectorRequirement::descriptor()};
  if (absl::Status s = StructToMessage(ccr.spec(), "spec", &spec, options); !s.ok()) {
    bool in_selector = absl::StartsWith(s.message(), "spec.labelSelector");
    return fail(in_selector ? "InvalidLabelSelector" : "InvalidSpec", s);
  }
  CcrSpec out;
  out.resource.set_group(spec.group());
  out.resource.set_version(spec.version());
  out.resource.set_resource(spec.resource());
  absl::Status gvr = ValidateGroupVersionResource("spec", out.resource);
  if (!gvr.ok()) return fail("InvalidSpec", gvr);
  if (spec.has_label_selector()) {
    absl::StatusOr<LabelSelector> selector =
        LabelSelector::FromSpec(spec.label_selector(), "spec.labelSelector");
    if (!selector.ok()) return fail("InvalidLabelSelector", selector.status());
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
  const ClusterCachedResourceStatus old = ReadStatus(previous);
  ClusterCachedResourceStatus typed;
  typed.set_phase(PhaseName(state.phase));
  typed.set_observed_generation(state.generation);
  *typed.add_conditions() = Condition("ResourceValid", state.valid, state.valid_reason,
                                      state.valid_message, state.generation, old, now);
  *typed.add_conditions() = Condition("ReplicationStarted", state.started, state.started_reason,
                                      state.started_message, state.generation, old, now);
  *typed.add_conditions() = Condition("Synced", state.synced, state.synced_reason,
                                      state.synced_message, state.generation, old, now);
  typed.set_epoch(state.epoch);
  typed.mutable_resource_counts()->set_local(state.local_count);
  typed.mutable_resource_counts()->set_cache(state.cache_count);
  // Over the previous status: its other fields (lastUpdateTime among them) are kept.
  Struct status = previous;
  SetFields(MessageToStruct(typed), &status);
  return status;
}

Struct WithUpdateTime(Struct status, absl::Time now) {
  ClusterCachedResourceStatus stamp;
  stamp.set_last_update_time(FormatTransitionTime(now));
  SetFields(MessageToStruct(stamp), &status);
  return status;
}

bool StatusEquals(const Struct& a, const Struct& b) { return MessageDifferencer::Equals(a, b); }

}  // namespace shardcache
