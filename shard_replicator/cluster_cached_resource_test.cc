#include "shard_replicator/cluster_cached_resource.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include "common/testing/status_matchers.h"

namespace shardcache {
namespace {

using ::shardcache::testing::StatusIs;
using ::testing::HasSubstr;

v1::Object Json(const std::string& json) {
  v1::Object o;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &o).ok()) << json;
  return o;
}

std::string Field(const google::protobuf::Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? "" : it->second.string_value();
}

const google::protobuf::Struct& ConditionAt(const google::protobuf::Struct& status, int i) {
  return status.fields().at("conditions").list_value().values(i).struct_value();
}

TEST(ParseCcrSpecTest, ValidSpecWithSelector) {
  absl::StatusOr<CcrSpec> spec =
      ParseCcrSpec(Json(R"({"spec": {"group": "example.io", "version": "v1", "resource": "widgets",
               "labelSelector": {"matchLabels": {"tier": "gold"},
                                 "matchExpressions": [{"key": "env", "operator": "In",
                                                       "values": ["prod"]}]}}})"),
                   nullptr);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(GvrKey(spec->resource), "example.io/v1/widgets");
  EXPECT_EQ(spec->selector_string, "env in (prod),tier=gold");
  google::protobuf::Map<std::string, std::string> labels;
  labels["tier"] = "gold";
  labels["env"] = "prod";
  EXPECT_TRUE(spec->selector.Matches(labels));
  labels["tier"] = "silver";
  EXPECT_FALSE(spec->selector.Matches(labels));
}

TEST(ParseCcrSpecTest, CoreGroupAndNoSelectorSelectEverything) {
  absl::StatusOr<CcrSpec> spec =
      ParseCcrSpec(Json(R"({"spec": {"version": "v1", "resource": "configmaps"}})"), nullptr);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->selector_string, "");
  EXPECT_TRUE(spec->selector.Empty());
}

TEST(ParseCcrSpecTest, InvalidSpecsNameTheFieldAndReason) {
  struct Case {
    std::string json;
    std::string reason;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"spec": {"group": "example.io", "version": "v1"}})", "InvalidSpec",
            "spec.resource"},
           {R"({"spec": {"group": "example.io", "resource": "widgets"}})", "InvalidSpec",
            "spec.version"},
           {R"({"spec": {"group": "Bad_Group", "version": "v1", "resource": "widgets"}})",
            "InvalidSpec", "spec.group"},
           {R"({"spec": {"group": 3, "version": "v1", "resource": "widgets"}})", "InvalidSpec",
            "spec.group"},
           {R"({"spec": {"version": "v1", "resource": "widgets", "labelSelector": "a=b"}})",
            "InvalidLabelSelector", "spec.labelSelector"},
           {R"({"spec": {"version": "v1", "resource": "widgets",
                         "labelSelector": {"matchLabel": {"a": "b"}}}})",
            "InvalidLabelSelector", "spec.labelSelector"},
       }) {
    CcrInvalid invalid;
    absl::StatusOr<CcrSpec> spec = ParseCcrSpec(Json(c.json), &invalid);
    EXPECT_THAT(spec.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.json;
    EXPECT_EQ(invalid.reason, c.reason) << c.json;
    EXPECT_THAT(invalid.message, HasSubstr(c.message));
  }
}

TEST(ProjectCopyTest, CarriesIdentityContentAndOriginAnnotations) {
  v1::Object origin = Json(R"({
    "metadata": {"cluster": "root", "namespace": "ns", "name": "w1", "uid": "u-1",
                 "resourceVersion": "42", "generation": 3,
                 "creationTimestamp": "2024-05-01T10:00:00Z",
                 "deletionTimestamp": "2024-05-02T10:00:00Z", "finalizers": ["x.io/hold"],
                 "labels": {"a": "b"}, "annotations": {"note": "n"}},
    "spec": {"size": 3}, "status": {"ok": true}})");
  v1::Object copy = ProjectCopy(origin, "shard-a");
  const v1::ObjectMeta& m = copy.metadata();
  EXPECT_EQ(m.shard(), "shard-a");
  EXPECT_EQ(m.cluster(), "root");
  EXPECT_EQ(m.namespace_(), "ns");
  EXPECT_EQ(m.name(), "w1");
  EXPECT_EQ(m.uid(), "u-1");
  EXPECT_EQ(m.generation(), 3);
  EXPECT_EQ(m.creation_timestamp().seconds(), origin.metadata().creation_timestamp().seconds());
  EXPECT_EQ(m.resource_version(), "") << "the copy's resourceVersion is the cache's";
  EXPECT_FALSE(m.has_deletion_timestamp());
  EXPECT_EQ(m.finalizers_size(), 0);
  EXPECT_EQ(m.labels().at("a"), "b");
  EXPECT_EQ(m.annotations().at("note"), "n");
  EXPECT_EQ(m.annotations().at(kOriginalResourceVersionAnnotation), "42");
  EXPECT_EQ(m.annotations().at(kOriginalUidAnnotation), "u-1");
  EXPECT_EQ(copy.spec().fields().at("size").number_value(), 3);
  EXPECT_TRUE(copy.status().fields().at("ok").bool_value());
}

TEST(CopyUpToDateTest, IgnoresOnlyTheCopysResourceVersion) {
  v1::Object origin = Json(R"({"metadata": {"cluster": "root", "name": "w1", "uid": "u",
                                            "resourceVersion": "5"}, "spec": {"a": 1}})");
  v1::Object desired = ProjectCopy(origin, "a");
  v1::Object copy = desired;
  copy.mutable_metadata()->set_resource_version("99");
  copy.mutable_status();  // empty status equals none
  EXPECT_TRUE(CopyUpToDate(desired, copy));
  v1::Object changed = copy;
  (*changed.mutable_spec()->mutable_fields())["a"].set_number_value(2);
  EXPECT_FALSE(CopyUpToDate(desired, changed));
  v1::Object relabelled = copy;
  (*relabelled.mutable_metadata()->mutable_labels())["x"] = "y";
  EXPECT_FALSE(CopyUpToDate(desired, relabelled));
  v1::Object held = copy;
  held.mutable_metadata()->add_finalizers("x.io/hold");
  EXPECT_FALSE(CopyUpToDate(desired, held));
}

TEST(CcrStatusTest, RendersPhaseConditionsCountsAndGeneration) {
  CcrState state;
  state.phase = CcrState::Phase::kReady;
  state.generation = 4;
  state.valid = true;
  state.valid_reason = "Valid";
  state.started = true;
  state.started_reason = "Started";
  state.local_count = 7;
  state.cache_count = 6;
  absl::Time t0 = absl::FromUnixSeconds(1700000000);
  google::protobuf::Struct status = CcrStatusStruct(state, {}, t0);
  EXPECT_EQ(Field(status, "phase"), "Ready");
  EXPECT_EQ(status.fields().at("observedGeneration").number_value(), 4);
  const auto& counts = status.fields().at("resourceCounts").struct_value().fields();
  EXPECT_EQ(counts.at("local").number_value(), 7);
  EXPECT_EQ(counts.at("cache").number_value(), 6);
  EXPECT_EQ(Field(ConditionAt(status, 0), "type"), "ResourceValid");
  EXPECT_EQ(Field(ConditionAt(status, 0), "status"), "True");
  EXPECT_EQ(Field(ConditionAt(status, 1), "type"), "ReplicationStarted");
  EXPECT_EQ(Field(ConditionAt(status, 1), "reason"), "Started");
  EXPECT_EQ(Field(ConditionAt(status, 1), "lastTransitionTime"), "2023-11-14T22:13:20Z");
  EXPECT_EQ(ConditionAt(status, 1).fields().at("observedGeneration").number_value(), 4);
}

TEST(CcrStatusTest, TransitionTimeMovesOnlyWhenAConditionsStatusChanges) {
  CcrState state;
  state.valid = true;
  state.valid_reason = "Valid";
  state.started = false;
  state.started_reason = "WaitingForSync";
  absl::Time t0 = absl::FromUnixSeconds(1700000000);
  google::protobuf::Struct first = CcrStatusStruct(state, {}, t0);
  // The same state later: nothing changes, so nothing is written.
  google::protobuf::Struct again = CcrStatusStruct(state, first, t0 + absl::Minutes(5));
  EXPECT_TRUE(StatusEquals(first, again));
  // A new reason with the same status keeps the time; a new status takes the new time.
  state.started_reason = "ResourceNotServed";
  google::protobuf::Struct reason = CcrStatusStruct(state, first, t0 + absl::Minutes(6));
  EXPECT_FALSE(StatusEquals(first, reason));
  EXPECT_EQ(Field(ConditionAt(reason, 1), "lastTransitionTime"), "2023-11-14T22:13:20Z");
  state.started = true;
  state.started_reason = "Started";
  google::protobuf::Struct started = CcrStatusStruct(state, reason, t0 + absl::Minutes(7));
  EXPECT_EQ(Field(ConditionAt(started, 1), "lastTransitionTime"), "2023-11-14T22:20:20Z");
  EXPECT_EQ(Field(ConditionAt(started, 0), "lastTransitionTime"), "2023-11-14T22:13:20Z");
}

// The status says which term wrote it and whether the cache held the projection then; it is
// stamped with lastUpdateTime only when written, so computing it again later compares equal.
TEST(CcrStatusTest, RecordsEpochSyncedAndUpdateTime) {
  CcrState state;
  state.phase = CcrState::Phase::kReady;
  state.generation = 2;
  state.valid = true;
  state.started = true;
  state.synced = false;
  state.synced_reason = "CacheUnavailable";
  state.synced_message = "3 objects wait";
  state.epoch = 7;
  absl::Time t0 = absl::FromUnixSeconds(1700000000);
  google::protobuf::Struct written = WithUpdateTime(CcrStatusStruct(state, {}, t0), t0);
  EXPECT_EQ(written.fields().at("epoch").number_value(), 7);
  EXPECT_EQ(Field(written, "lastUpdateTime"), "2023-11-14T22:13:20Z");
  EXPECT_EQ(Field(ConditionAt(written, 2), "type"), "Synced");
  EXPECT_EQ(Field(ConditionAt(written, 2), "status"), "False");
  EXPECT_EQ(Field(ConditionAt(written, 2), "reason"), "CacheUnavailable");
  EXPECT_EQ(Field(ConditionAt(written, 2), "message"), "3 objects wait");

  // Computed again later, unchanged: equal to the stored status (lastUpdateTime kept).
  EXPECT_TRUE(StatusEquals(CcrStatusStruct(state, written, t0 + absl::Minutes(1)), written));
  // A new term computes a different status: it is written, with a new lastUpdateTime.
  state.epoch = 8;
  google::protobuf::Struct next = CcrStatusStruct(state, written, t0 + absl::Minutes(2));
  EXPECT_FALSE(StatusEquals(next, written));
  next = WithUpdateTime(next, t0 + absl::Minutes(2));
  EXPECT_EQ(Field(next, "lastUpdateTime"), "2023-11-14T22:15:20Z");
  // Synced turning True moves its transition time.
  state.synced = true;
  state.synced_reason = "InSync";
  google::protobuf::Struct synced = CcrStatusStruct(state, next, t0 + absl::Minutes(3));
  EXPECT_EQ(Field(ConditionAt(synced, 2), "status"), "True");
  EXPECT_EQ(Field(ConditionAt(synced, 2), "lastTransitionTime"), "2023-11-14T22:16:20Z");
}

}  // namespace
}  // namespace shardcache
