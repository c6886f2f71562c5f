#include "cache_server/object_validation.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"

namespace shardcache {
namespace {

using ::shardcache::testing::IsOk;
using ::shardcache::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

v1::Object Obj(const std::string& json) {
  v1::Object o;
  auto s = google::protobuf::util::JsonStringToMessage(json, &o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return o;
}

ResourceInfo Info(ResourceInfo::Scope scope) {
  ResourceInfo info;
  info.group_resource = "example.com/widgets";
  info.scope = scope;
  return info;
}

const ResourceInfo kNamespaced = Info(ResourceInfo::Scope::kNamespaced);
const ResourceInfo kCluster = Info(ResourceInfo::Scope::kCluster);
const ResourceInfo kAny = Info(ResourceInfo::Scope::kAny);

TEST(ObjectValidationTest, AcceptsAValidObject) {
  v1::Object o = Obj(R"({"metadata": {"name": "w1", "namespace": "default", "cluster": "root:org",
      "labels": {"app": "web"}, "annotations": {"a.example.com/b": "anything"},
      "finalizers": ["example.com/f"], "generation": 3,
      "creationTimestamp": "2024-01-02T03:04:05Z"},
      "spec": {"replicas": 3, "list": [1, "two", {"three": null}], "flag": true}})");
  EXPECT_THAT(ValidateObject(kNamespaced, o), IsOk());
}

TEST(ObjectValidationTest, RefusesSpecNestedTooDeep) {
  // spec itself is level 0: kMaxStructDepth + 1 objects nest kMaxStructDepth levels below it.
  std::string json = "1";
  for (int i = 0; i < kMaxStructDepth + 2; ++i) json = "{\"a\": " + json + "}";
  v1::Object o = Obj(R"({"metadata": {"name": "w", "namespace": "n"}, "spec": )" + json + "}");
  EXPECT_THAT(ValidateObject(kNamespaced, o),
              StatusIs(kInvalid, AllOf(StartsWith("spec.a.a."),
                                       HasSubstr("Invalid value: nested deeper than 24 levels"))));
  // One level less passes.
  json = "1";
  for (int i = 0; i < kMaxStructDepth + 1; ++i) json = "{\"a\": " + json + "}";
  o = Obj(R"({"metadata": {"name": "w", "namespace": "n"}, "spec": )" + json + "}");
  EXPECT_THAT(ValidateObject(kNamespaced, o), IsOk());
}

TEST(ObjectValidationTest, RefusesNumbersThatAreNotFinite) {
  google::protobuf::Struct s;
  (*s.mutable_fields())["x"].mutable_list_value()->add_values()->set_number_value(NAN);
  EXPECT_THAT(ValidateStruct("status", s),
              StatusIs(kInvalid,
                       "status.x[0]: Invalid value: numbers must be finite (JSON has "
                       "no NaN or Inf)"));
  (*s.mutable_fields())["x"].set_number_value(INFINITY);
  EXPECT_THAT(ValidateStruct("status", s), StatusIs(kInvalid, StartsWith("status.x: ")));
}

TEST(ObjectValidationTest, RefusesAValueWithoutAKind) {
  google::protobuf::Struct s;
  (*s.mutable_fields())["empty"];
  EXPECT_THAT(ValidateStruct("spec", s),
              StatusIs(kInvalid, "spec.empty: Invalid value: a value has no kind"));
}

TEST(ObjectValidationTest, RefusesAnInvalidTimestamp) {
  google::protobuf::Timestamp t;
  t.set_nanos(-1);
  EXPECT_THAT(
      ValidateTimestamp("metadata.creationTimestamp", t),
      StatusIs(kInvalid, "metadata.creationTimestamp: Invalid value: not a valid timestamp"));
  t.set_nanos(0);
  t.set_seconds(int64_t{1} << 40);  // past year 9999
  EXPECT_THAT(ValidateTimestamp("t", t), StatusIs(kInvalid));
  t.set_seconds(0);
  EXPECT_THAT(ValidateTimestamp("t", t), IsOk());
  v1::Object o = Obj(R"({"metadata": {"name": "w", "namespace": "n"}})");
  o.mutable_metadata()->mutable_creation_timestamp()->set_nanos(1000000000);
  EXPECT_THAT(ValidateObject(kNamespaced, o),
              StatusIs(kInvalid, StartsWith("metadata.creationTimestamp: ")));
}

TEST(ObjectValidationTest, KeyRules) {
  EXPECT_THAT(ValidateKey(kNamespaced, "metadata.", "", "", "ns", "Bad_Name"),
              StatusIs(kInvalid, StartsWith("metadata.name: Invalid value: \"Bad_Name\"")));
  EXPECT_THAT(ValidateKey(kNamespaced, "", "", "", "ns", ""),
              StatusIs(kInvalid, StartsWith("name: Required value")));
  EXPECT_THAT(ValidateKey(kNamespaced, "metadata.", "", "", "", "w"),
              StatusIs(kInvalid, StartsWith("metadata.namespace: Required value")));
  EXPECT_THAT(ValidateKey(kCluster, "metadata.", "", "", "ns", "w"),
              StatusIs(kInvalid,
                       "metadata.namespace: Forbidden: the resource is cluster-scoped; "
                       "namespace must be empty"));
  EXPECT_THAT(ValidateKey(kCluster, "", "", "", "", "w"), IsOk());
  EXPECT_THAT(ValidateKey(kAny, "", "", "", "", "w"), IsOk());
  EXPECT_THAT(ValidateKey(kAny, "", "", "", "NS", "w"),
              StatusIs(kInvalid, StartsWith("namespace: Invalid value")));
  EXPECT_THAT(ValidateKey(kAny, "metadata.", "Shard!", "", "", "w"),
              StatusIs(kInvalid, StartsWith("metadata.shard: Invalid value")));
  EXPECT_THAT(ValidateKey(kAny, "metadata.", "", "root::x", "", "w"),
              StatusIs(kInvalid, StartsWith("metadata.cluster: Invalid value")));
  EXPECT_THAT(ValidateKey(kAny, "metadata.", "a", "root:org", "ns", "w.example"), IsOk());
}

TEST(ObjectValidationTest, ShardRoleRefusesAShard) {
  EXPECT_THAT(RefuseShardInShardRole(Role::kShard, "metadata.shard", "a"),
              StatusIs(kInvalid, StartsWith("metadata.shard: Forbidden: a shard store's objects "
                                            "have no shard")));
  EXPECT_THAT(RefuseShardInShardRole(Role::kShard, "shard", ""), IsOk());
  EXPECT_THAT(RefuseShardInShardRole(Role::kCache, "metadata.shard", "a"), IsOk());
}

TEST(ObjectValidationTest, MetadataRules) {
  EXPECT_THAT(
      ValidateObject(kAny, Obj(R"({"metadata": {"name": "w", "labels": {"bad key!": "v"}}})")),
      StatusIs(kInvalid, StartsWith("metadata.labels: Invalid value: \"bad key!\"")));
  EXPECT_THAT(ValidateObject(kAny, Obj(R"({"metadata": {"name": "w", "annotations": {"": "v"}}})")),
              StatusIs(kInvalid, StartsWith("metadata.annotations")));
  EXPECT_THAT(ValidateObject(kAny, Obj(R"({"metadata": {"name": "w", "finalizers": ["a b"]}})")),
              StatusIs(kInvalid, StartsWith("metadata.finalizers[0]")));
  EXPECT_THAT(ValidateObject(kAny, Obj(R"({"metadata": {"name": "w", "generation": -1}})")),
              StatusIs(kInvalid, "metadata.generation: Invalid value: must not be negative"));
  EXPECT_THAT(ValidateObject(kAny, Obj(R"({"metadata": {"name": "w"}, "status": {"n": 1}})")),
              IsOk());
}

TEST(ObjectValidationTest, SizeLimit) {
  v1::Object o = Obj(R"({"metadata": {"name": "w"}, "spec": {"data": "0123456789"}})");
  const int64_t size = static_cast<int64_t>(o.ByteSizeLong());
  EXPECT_THAT(CheckSize(o, size), IsOk());
  EXPECT_THAT(CheckSize(o, size - 1),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("object is ", size, " bytes, more than the limit of ", size - 1,
                                    " bytes (--max-object-bytes)")));
}

TEST(ObjectValidationTest, NormalizeDropsEmptySpecAndStatus) {
  v1::Object o = Obj(R"({"metadata": {"name": "w"}, "spec": {}, "status": {}})");
  ASSERT_TRUE(o.has_spec());
  Normalize(&o);
  EXPECT_FALSE(o.has_spec());
  EXPECT_FALSE(o.has_status());
  o = Obj(R"({"metadata": {"name": "w"}, "spec": {"a": 1}, "status": {}})");
  Normalize(&o);
  EXPECT_TRUE(o.has_spec());
  EXPECT_FALSE(o.has_status());
}

TEST(ObjectValidationTest, ParseRevision) {
  EXPECT_THAT(ParseRevision("metadata.resourceVersion", "42"), IsOk());
  EXPECT_EQ(*ParseRevision("p", "42"), 42);
  for (const char* bad : {"", "0", "-1", "abc", "1.5", "99999999999999999999"}) {
    EXPECT_THAT(ParseRevision("metadata.resourceVersion", bad),
                StatusIs(kInvalid, absl::StrCat("metadata.resourceVersion: Invalid value: \"", bad,
                                                "\": must be a positive decimal integer")))
        << bad;
  }
}

TEST(ObjectValidationTest, MakeFilter) {
  absl::StatusOr<ObjectFilter> f = MakeFilter("a", "root", "ns", "app=web,tier!=db");
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->shard, "a");
  EXPECT_EQ(f->cluster, "root");
  EXPECT_EQ(f->namespace_, "ns");
  const std::string key = R"("name": "w", "shard": "a", "cluster": "root", "namespace": "ns")";
  EXPECT_TRUE(f->Matches(Obj(R"({"metadata": {)" + key + R"(, "labels": {"app": "web"}}})")));
  EXPECT_FALSE(f->Matches(Obj(R"({"metadata": {)" + key + R"(, "labels": {"app": "db"}}})")));
  EXPECT_THAT(MakeFilter("", "", "", ""), IsOk());
  EXPECT_THAT(MakeFilter("A", "", "", ""), StatusIs(kInvalid, StartsWith("shard: ")));
  EXPECT_THAT(MakeFilter("", "x::y", "", ""), StatusIs(kInvalid, StartsWith("cluster: ")));
  EXPECT_THAT(MakeFilter("", "", "N", ""), StatusIs(kInvalid, StartsWith("namespace: ")));
  EXPECT_THAT(MakeFilter("", "", "", "a in (b"),
              StatusIs(kInvalid, StartsWith("label_selector: Invalid value: \"a in (b\": ")));
}

}  // namespace
}  // namespace shardcache
