#include "cache_server/kube_path.h"

#include <gtest/gtest.h>

namespace shardcache {
namespace {

TEST(KubePathTest, KcpPrefixWithWildcards) {
  auto p = ParseKubePath("/services/cache/shards/*/clusters/*/apis/example.com/v1/widgets");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind, KubePath::Kind::kResource);
  EXPECT_EQ(p->shard, "");
  EXPECT_EQ(p->cluster, "");
  EXPECT_EQ(p->group, "example.com");
  EXPECT_EQ(p->version, "v1");
  EXPECT_EQ(p->resource, "widgets");
  EXPECT_EQ(p->namespace_, "");
  EXPECT_EQ(p->name, "");
}

TEST(KubePathTest, KcpPrefixNamesShardClusterNamespaceAndName) {
  auto p = ParseKubePath(
      "/services/cache/shards/a/clusters/root:org/apis/example.com/v1/namespaces/ns/widgets/w1");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->shard, "a");
  EXPECT_EQ(p->cluster, "root:org");
  EXPECT_EQ(p->namespace_, "ns");
  EXPECT_EQ(p->resource, "widgets");
  EXPECT_EQ(p->name, "w1");
}

TEST(KubePathTest, ClusterPrefixAndCoreGroup) {
  auto p = ParseKubePath("/clusters/root/api/v1/namespaces/default/configmaps");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->shard, "");
  EXPECT_EQ(p->cluster, "root");
  EXPECT_EQ(p->group, "");
  EXPECT_EQ(p->version, "v1");
  EXPECT_EQ(p->namespace_, "default");
  EXPECT_EQ(p->resource, "configmaps");
}

TEST(KubePathTest, NamespacesThemselvesAreAResource) {
  auto p = ParseKubePath("/api/v1/namespaces");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->resource, "namespaces");
  EXPECT_EQ(p->name, "");
  p = ParseKubePath("/api/v1/namespaces/default");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->resource, "namespaces");
  EXPECT_EQ(p->name, "default");
}

TEST(KubePathTest, Discovery) {
  EXPECT_EQ(ParseKubePath("/version")->kind, KubePath::Kind::kVersion);
  EXPECT_EQ(ParseKubePath("/services/cache/shards/*/clusters/*/version")->kind,
            KubePath::Kind::kVersion);
  EXPECT_EQ(ParseKubePath("/api")->kind, KubePath::Kind::kCoreVersions);
  EXPECT_EQ(ParseKubePath("/clusters/*/apis")->kind, KubePath::Kind::kGroups);
  auto p = ParseKubePath("/apis/example.com/v1");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, KubePath::Kind::kGroupVersion);
  EXPECT_EQ(p->group, "example.com");
  p = ParseKubePath("/api/v1");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, KubePath::Kind::kGroupVersion);
  EXPECT_EQ(p->group, "");
}

TEST(KubePathTest, PathsNotServed) {
  for (const char* path :
       {"/", "/healthz", "/apis/example.com", "/apis/example.com/v1/widgets/w1/status",
        "/services/cache/shards/a/apis", "/openapi/v2", "/apis/g/v1/namespaces/ns/widgets/w/x"}) {
    auto p = ParseKubePath(path);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << path;
  }
}

TEST(KubeQueryTest, AsGoParsesIt) {
  auto q = ParseQuery(
      "/apis/g/v1/w?fieldSelector=metadata.name=w2&labelSelector=a+in+(x%2Cy)"
      "&watch&limit=5&limit=6&continue=");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->at("fieldSelector"), "metadata.name=w2");  // split at the first '='
  EXPECT_EQ(q->at("labelSelector"), "a in (x,y)");
  EXPECT_EQ(q->at("watch"), "");
  EXPECT_EQ(q->at("limit"), "5");  // the first of a repeated name
  EXPECT_EQ(q->at("continue"), "");
  EXPECT_TRUE(ParseQuery("/apis")->empty());
  EXPECT_EQ(ParseQuery("/a?x=%zz").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseQuery("/a?x=%4").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardcache
