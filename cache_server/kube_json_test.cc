#include "cache_server/kube_json.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

namespace shardcache {
namespace {

// Parses `json` into a Struct, failing the test if it is not a JSON object.
google::protobuf::Struct Parse(const std::string& json) {
  google::protobuf::Struct s;
  auto status = google::protobuf::util::JsonStringToMessage(json, &s);
  EXPECT_TRUE(status.ok()) << status << ": " << json;
  return s;
}

v1::Object Widget() {
  v1::Object o;
  auto* m = o.mutable_metadata();
  m->set_shard("a");
  m->set_cluster("root:org");
  m->set_namespace_("default");
  m->set_name("w1");
  m->set_uid("u-1");
  m->set_resource_version("42");
  m->set_generation(3);
  m->mutable_creation_timestamp()->set_seconds(1700000000);
  (*m->mutable_labels())["app"] = "web";
  (*m->mutable_annotations())["note"] = "say \"hi\"\n";
  m->add_finalizers("example.com/keep");
  (*o.mutable_spec()->mutable_fields())["size"].set_number_value(3);
  (*o.mutable_status()->mutable_fields())["phase"].set_string_value("Ready");
  return o;
}

KubeResource Widgets() { return {"example.com", "v1", "widgets", "Widget", true}; }

TEST(KubeJsonTest, KindForResource) {
  EXPECT_EQ(KindForResource("widgets"), "Widget");
  EXPECT_EQ(KindForResource("policies"), "Policy");
  EXPECT_EQ(KindForResource("leases"), "Lease");
  EXPECT_EQ(KindForResource("classes"), "Class");
  EXPECT_EQ(KindForResource("boxes"), "Box");
  EXPECT_EQ(KindForResource("statuses"), "Status");
  EXPECT_EQ(KindForResource("clustercachedresources"), "ClusterCachedResource");
  EXPECT_EQ(KindForResource("resourcedefinitions"), "ResourceDefinition");
  EXPECT_EQ(KindForResource("data"), "Data");
}

TEST(KubeJsonTest, ObjectAsKubernetesWritesIt) {
  google::protobuf::Struct s = Parse(ObjectJson(Widget(), Widgets()));
  EXPECT_EQ(s.fields().at("apiVersion").string_value(), "example.com/v1");
  EXPECT_EQ(s.fields().at("kind").string_value(), "Widget");
  const auto& m = s.fields().at("metadata").struct_value().fields();
  EXPECT_EQ(m.at("name").string_value(), "w1");
  EXPECT_EQ(m.at("namespace").string_value(), "default");
  EXPECT_EQ(m.at("uid").string_value(), "u-1");
  EXPECT_EQ(m.at("resourceVersion").string_value(), "42");
  EXPECT_EQ(m.at("generation").number_value(), 3);  // a number, as Kubernetes writes it
  EXPECT_EQ(m.at("creationTimestamp").string_value(), "2023-11-14T22:13:20Z");
  EXPECT_EQ(m.at("labels").struct_value().fields().at("app").string_value(), "web");
  const auto& a = m.at("annotations").struct_value().fields();
  EXPECT_EQ(a.at("note").string_value(), "say \"hi\"\n");
  EXPECT_EQ(a.at("kcp.io/cluster").string_value(), "root:org");
  EXPECT_EQ(a.at("kcp.io/shard").string_value(), "a");
  EXPECT_EQ(m.at("finalizers").list_value().values(0).string_value(), "example.com/keep");
  EXPECT_EQ(m.count("shard"), 0u);
  EXPECT_EQ(m.count("deletionTimestamp"), 0u);
  EXPECT_EQ(s.fields().at("spec").struct_value().fields().at("size").number_value(), 3);
  EXPECT_EQ(s.fields().at("status").struct_value().fields().at("phase").string_value(), "Ready");
}

TEST(KubeJsonTest, CoreGroupApiVersion) {
  EXPECT_EQ(ApiVersion("", "v1"), "v1");
  EXPECT_EQ(ApiVersion("example.com", "v2"), "example.com/v2");
}

TEST(KubeJsonTest, ListCarriesRevisionAndContinue) {
  KubeResource r = Widgets();
  google::protobuf::Struct s =
      Parse(ListJson(r, {ObjectJson(Widget(), r), ObjectJson(Widget(), r)}, "42", "tok"));
  EXPECT_EQ(s.fields().at("kind").string_value(), "WidgetList");
  EXPECT_EQ(s.fields().at("metadata").struct_value().fields().at("resourceVersion").string_value(),
            "42");
  EXPECT_EQ(s.fields().at("metadata").struct_value().fields().at("continue").string_value(), "tok");
  EXPECT_EQ(s.fields().at("items").list_value().values_size(), 2);
  s = Parse(ListJson(r, {}, "7", ""));
  EXPECT_EQ(s.fields().at("metadata").struct_value().fields().count("continue"), 0u);
  EXPECT_EQ(s.fields().at("items").list_value().values_size(), 0);
}

TEST(KubeJsonTest, TableRowsAndColumns) {
  v1::Object w = Widget();
  absl::Time now = absl::FromUnixSeconds(1700000000 + 125);
  google::protobuf::Struct s = Parse(TableJson({&w}, true, "42", "", now));
  EXPECT_EQ(s.fields().at("kind").string_value(), "Table");
  EXPECT_EQ(s.fields().at("apiVersion").string_value(), "meta.k8s.io/v1");
  EXPECT_EQ(s.fields().at("columnDefinitions").list_value().values_size(), 4);
  const auto& row = s.fields().at("rows").list_value().values(0).struct_value().fields();
  EXPECT_EQ(row.at("cells").list_value().values(0).string_value(), "w1");
  EXPECT_EQ(row.at("cells").list_value().values(1).string_value(), "2m5s");
  EXPECT_EQ(row.at("object").struct_value().fields().at("kind").string_value(),
            "PartialObjectMetadata");
  s = Parse(TableJson({&w}, false, "42", "", now));
  EXPECT_EQ(s.fields().count("columnDefinitions"), 0u);
}

TEST(KubeJsonTest, WatchEventsAndBookmarks) {
  std::string line = WatchEventJson("BOOKMARK", BookmarkObjectJson(Widgets(), "9", true));
  ASSERT_EQ(line.back(), '\n');
  google::protobuf::Struct s = Parse(line.substr(0, line.size() - 1));
  EXPECT_EQ(s.fields().at("type").string_value(), "BOOKMARK");
  const auto& m = s.fields().at("object").struct_value().fields().at("metadata").struct_value();
  EXPECT_EQ(m.fields().at("resourceVersion").string_value(), "9");
  EXPECT_EQ(m.fields()
                .at("annotations")
                .struct_value()
                .fields()
                .at("k8s.io/initial-events-end")
                .string_value(),
            "true");
}

TEST(KubeJsonTest, StatusOfAnExpiredRevision) {
  google::protobuf::Struct s = Parse(StatusJson(absl::OutOfRangeError("too old resource version")));
  EXPECT_EQ(s.fields().at("kind").string_value(), "Status");
  EXPECT_EQ(s.fields().at("status").string_value(), "Failure");
  EXPECT_EQ(s.fields().at("reason").string_value(), "Expired");
  EXPECT_EQ(s.fields().at("code").number_value(), 410);
  EXPECT_EQ(KubeErrorFor(absl::InvalidArgumentError("x")).code, 400);
  EXPECT_EQ(KubeErrorFor(absl::NotFoundError("x")).reason, "NotFound");
}

TEST(KubeJsonTest, Discovery) {
  google::protobuf::Struct s =
      Parse(ApiGroupListJson({{"example.com", {"v1", "v2"}}, {"", {"v1"}}}));
  const auto& groups = s.fields().at("groups").list_value();
  ASSERT_EQ(groups.values_size(), 1);  // the core group is /api's
  const auto& g = groups.values(0).struct_value().fields();
  EXPECT_EQ(g.at("name").string_value(), "example.com");
  EXPECT_EQ(g.at("versions").list_value().values_size(), 2);
  EXPECT_EQ(g.at("preferredVersion").struct_value().fields().at("version").string_value(), "v1");
  s = Parse(ApiResourceListJson("example.com", "v1", {Widgets()}));
  EXPECT_EQ(s.fields().at("groupVersion").string_value(), "example.com/v1");
  const auto& r = s.fields().at("resources").list_value().values(0).struct_value().fields();
  EXPECT_EQ(r.at("name").string_value(), "widgets");
  EXPECT_EQ(r.at("kind").string_value(), "Widget");
  EXPECT_TRUE(r.at("namespaced").bool_value());
  EXPECT_EQ(r.at("verbs").list_value().values_size(), 3);
  Parse(VersionJson("v1.32.0-shardcache"));
  s = Parse(ApiVersionsJson(true));
  EXPECT_EQ(s.fields().at("versions").list_value().values(0).string_value(), "v1");
  s = Parse(ApiVersionsJson(false));
  EXPECT_EQ(s.fields().at("versions").list_value().values_size(), 0);
}

TEST(KubeJsonTest, HumanDurationAsKubectlPrintsAges) {
  EXPECT_EQ(HumanDuration(absl::Seconds(-5)), "<invalid>");
  EXPECT_EQ(HumanDuration(absl::Seconds(45)), "45s");
  EXPECT_EQ(HumanDuration(absl::Seconds(119)), "119s");
  EXPECT_EQ(HumanDuration(absl::Seconds(200)), "3m20s");
  EXPECT_EQ(HumanDuration(absl::Minutes(5)), "5m");
  EXPECT_EQ(HumanDuration(absl::Minutes(90)), "90m");
  EXPECT_EQ(HumanDuration(absl::Minutes(310)), "5h10m");
  EXPECT_EQ(HumanDuration(absl::Hours(30)), "30h");
  EXPECT_EQ(HumanDuration(absl::Hours(75)), "3d3h");
  EXPECT_EQ(HumanDuration(absl::Hours(24 * 30)), "30d");
  EXPECT_EQ(HumanDuration(absl::Hours(24 * (365 * 2 + 40))), "2y40d");
  EXPECT_EQ(HumanDuration(absl::Hours(24 * 365 * 9)), "9y");
}

}  // namespace
}  // namespace shardcache
