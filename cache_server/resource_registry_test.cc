#include "cache_server/resource_registry.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include "common/testing/status_matchers.h"

namespace shardcache {
namespace {

using ::shardcache::testing::IsOk;
using ::shardcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::GroupVersionResource Gvr(const std::string& g, const std::string& v, const std::string& r) {
  v1::GroupVersionResource gvr;
  gvr.set_group(g);
  gvr.set_version(v);
  gvr.set_resource(r);
  return gvr;
}

v1::Object Def(const std::string& json) {
  v1::Object o;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &o).ok()) << json;
  return o;
}

constexpr char kGood[] =
    R"({"metadata":{"name":"widgets.example.com"},"spec":{"group":"example.com",)"
    R"("names":{"plural":"widgets"},"scope":"Namespaced",)"
    R"("versions":[{"name":"v1"},{"name":"v2","served":false}],"subresources":{"status":{}}}})";

TEST(ResourceRegistryTest, BuiltIns_ServedInBothRoles) {
  for (Role role : {Role::kCache, Role::kShard}) {
    ResourceRegistry r(role);
    auto ccr = r.Resolve(Gvr("cache.shardcache.io", "v1alpha1", "clustercachedresources"));
    ASSERT_THAT(ccr, IsOk());
    EXPECT_TRUE(ccr->status_subresource);
    EXPECT_EQ(ccr->scope, ResourceInfo::Scope::kCluster);
    auto lease = r.Resolve(Gvr("coordination.shardcache.io", "v1", "leases"));
    ASSERT_THAT(lease, IsOk());
    EXPECT_EQ(lease->scope, ResourceInfo::Scope::kNamespaced);
    EXPECT_THAT(r.Resolve(Gvr("core.shardcache.io", "v2", "resourcedefinitions")),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("version v2 is not served")));
  }
}

TEST(ResourceRegistryTest, CacheRole_ServesAnyWellFormedResource) {
  ResourceRegistry r(Role::kCache);
  EXPECT_THAT(r.Resolve(Gvr("example.com", "v1", "widgets")), IsOk());
  EXPECT_THAT(r.Resolve(Gvr("example.com", "v1", "Widgets")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resource.resource")));
}

TEST(ResourceRegistryTest, ShardRole_ServesOnlyDefinedVersions) {
  ResourceRegistry r(Role::kShard);
  EXPECT_THAT(r.Resolve(Gvr("example.com", "v1", "widgets")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no ResourceDefinition")));
  auto info = ResourceRegistry::ParseDefinition(Def(kGood), nullptr);
  ASSERT_THAT(info, IsOk());
  EXPECT_THAT(info->versions, ElementsAre("v1"));
  r.ApplyDefinition(*info);
  EXPECT_THAT(r.Resolve(Gvr("example.com", "v1", "widgets")), IsOk());
  EXPECT_THAT(r.Resolve(Gvr("example.com", "v2", "widgets")),
              StatusIs(absl::StatusCode::kNotFound));
  r.RemoveDefinition("example.com/widgets");
  EXPECT_THAT(r.Resolve(Gvr("example.com", "v1", "widgets")),
              StatusIs(absl::StatusCode::kNotFound));
}

struct BadDefinition {
  std::string name;
  std::string json;
  std::string path;
};

class ParseDefinitionTest : public ::testing::TestWithParam<BadDefinition> {};

TEST_P(ParseDefinitionTest, Rejected_NamesTheField) {
  EXPECT_THAT(ResourceRegistry::ParseDefinition(Def(GetParam().json), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().path)));
}

INSTANTIATE_TEST_SUITE_P(
    Bad, ParseDefinitionTest,
    ::testing::Values(
        BadDefinition{
            "NoGroup",
            R"({"metadata":{"name":"w.x"},"spec":{"names":{"plural":"w"},"scope":"Cluster","versions":[{"name":"v1"}]}})",
            "spec.group"},
        BadDefinition{
            "WrongName",
            R"({"metadata":{"name":"other.example.com"},"spec":{"group":"example.com","names":{"plural":"widgets"},"scope":"Cluster","versions":[{"name":"v1"}]}})",
            "metadata.name"},
        BadDefinition{
            "BadScope",
            R"({"metadata":{"name":"widgets.example.com"},"spec":{"group":"example.com","names":{"plural":"widgets"},"scope":"Global","versions":[{"name":"v1"}]}})",
            "spec.scope"},
        BadDefinition{
            "NoVersions",
            R"({"metadata":{"name":"widgets.example.com"},"spec":{"group":"example.com","names":{"plural":"widgets"},"scope":"Cluster","versions":[]}})",
            "spec.versions"},
        BadDefinition{
            "DuplicateVersion",
            R"({"metadata":{"name":"widgets.example.com"},"spec":{"group":"example.com","names":{"plural":"widgets"},"scope":"Cluster","versions":[{"name":"v1"},{"name":"v1"}]}})",
            "spec.versions[1].name"},
        BadDefinition{
            "ReservedGroup",
            R"({"metadata":{"name":"leases.coordination.shardcache.io"},"spec":{"group":"coordination.shardcache.io","names":{"plural":"leases"},"scope":"Cluster","versions":[{"name":"v1"}]}})",
            "spec.group"},
        BadDefinition{
            "WithCluster",
            R"({"metadata":{"name":"widgets.example.com","cluster":"root"},"spec":{"group":"example.com","names":{"plural":"widgets"},"scope":"Cluster","versions":[{"name":"v1"}]}})",
            "metadata.cluster"}),
    [](const ::testing::TestParamInfo<BadDefinition>& info) { return info.param.name; });

TEST(ResourceRegistryTest, ParseDefinition_ScopeIsImmutable) {
  v1::Object before = Def(kGood);
  v1::Object after = before;
  (*after.mutable_spec()->mutable_fields())["scope"].set_string_value("Cluster");
  EXPECT_THAT(ResourceRegistry::ParseDefinition(after, &before),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("immutable")));
}

}  // namespace
}  // namespace shardcache
