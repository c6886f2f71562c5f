// The authorization policy, row by row (authorizer.h), without a server: which identity may make
// which request in the cache role and in a shard's store.
#include "cache_server/authorizer.h"

#include <gtest/gtest.h>

#include <map>

#include "absl/strings/str_cat.h"

namespace shardcache {
namespace {

const PeerIdentity kAdmin{"alice", {"shardcache:admins"}};
const PeerIdentity kReader{"reader", {"shardcache:readers"}};
const PeerIdentity kReplicatorA{"shardcache:replicator:a", {"shardcache:replicators"}};
const PeerIdentity kReplicatorB{"shardcache:replicator:b", {"shardcache:replicators"}};
// The replicator's name without the group, and the group without a replicator's name.
const PeerIdentity kNameOnly{"shardcache:replicator:a", {}};
const PeerIdentity kGroupOnly{"mallory", {"shardcache:replicators"}};

v1::GroupVersionResource Gvr(const std::string& group, const std::string& resource) {
  v1::GroupVersionResource r;
  r.set_group(group);
  r.set_version("v1");
  r.set_resource(resource);
  return r;
}

v1::Object Obj(const std::string& shard, const std::string& cluster, const std::string& ns,
               const std::string& name) {
  v1::Object o;
  o.mutable_metadata()->set_shard(shard);
  o.mutable_metadata()->set_cluster(cluster);
  o.mutable_metadata()->set_namespace_(ns);
  o.mutable_metadata()->set_name(name);
  return o;
}

v1::CreateRequest Create(const v1::GroupVersionResource& gvr, const v1::Object& o) {
  v1::CreateRequest r;
  *r.mutable_resource() = gvr;
  *r.mutable_object() = o;
  return r;
}

v1::UpdateRequest Update(const v1::GroupVersionResource& gvr, const v1::Object& o) {
  v1::UpdateRequest r;
  *r.mutable_resource() = gvr;
  *r.mutable_object() = o;
  return r;
}

class AuthorizerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Authorizer> Make(Role role, const std::string& shard = "") {
    Authorizer::Options o;
    o.role = role;
    o.shard = shard;
    return std::make_unique<Authorizer>(
        o,
        [this](const v1::GetRequest& req) -> absl::StatusOr<ObjectRef> {
          auto it = stored_.find(req.name());
          if (it == stored_.end()) return absl::NotFoundError("not found");
          return std::make_shared<const v1::Object>(it->second);
        },
        registry_);
  }

  prometheus::Registry registry_;
  std::map<std::string, v1::Object> stored_;
};

TEST_F(AuthorizerTest, Cache_ReplicatorWritesOnlyItsShard) {
  auto authz = Make(Role::kCache);
  v1::GroupVersionResource widgets = Gvr("example.com", "widgets");
  EXPECT_TRUE(authz->CheckCreate(kReplicatorA, Create(widgets, Obj("a", "c", "n", "w"))).ok());
  absl::Status denied = authz->CheckCreate(kReplicatorB, Create(widgets, Obj("a", "c", "n", "w")));
  EXPECT_TRUE(absl::IsPermissionDenied(denied)) << denied;
  EXPECT_NE(denied.message().find("user \"shardcache:replicator:b\""), std::string::npos);
  EXPECT_NE(denied.message().find("cannot create resource \"widgets.example.com\""),
            std::string::npos)
      << denied;
  v1::UpdateRequest update = Update(widgets, Obj("a", "c", "n", "w"));
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckUpdate(kReplicatorB, &update)));
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckUpdateStatus(kReplicatorB, update)));
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckUpsert(kReplicatorB, update)));
  EXPECT_TRUE(authz->CheckUpsert(kReplicatorA, update).ok());
  v1::DeleteRequest del;
  *del.mutable_resource() = widgets;
  del.set_shard("a");
  del.set_name("w");
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckDelete(kReplicatorB, del)));
  EXPECT_TRUE(authz->CheckDelete(kReplicatorA, del).ok());
  // Its own object under another shard's fence would raise that shard's epoch.
  v1::CreateRequest fenced = Create(widgets, Obj("b", "c", "n", "w"));
  fenced.mutable_fence()->set_shard("a");
  fenced.mutable_fence()->set_epoch(9);
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckCreate(kReplicatorB, fenced)));
  fenced.mutable_fence()->set_shard("b");
  EXPECT_TRUE(authz->CheckCreate(kReplicatorB, fenced).ok());
  // Reads of anything.
  v1::ListRequest list;
  *list.mutable_resource() = widgets;
  EXPECT_TRUE(authz->CheckList(kReplicatorB, list).ok());
}

TEST_F(AuthorizerTest, Cache_ClaimEpochOnlyForItsShard) {
  auto authz = Make(Role::kCache);
  v1::ClaimEpochRequest claim;
  claim.mutable_fence()->set_shard("a");
  claim.mutable_fence()->set_epoch(3);
  EXPECT_TRUE(authz->CheckClaimEpoch(kReplicatorA, claim).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckClaimEpoch(kReplicatorB, claim)));
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckClaimEpoch(kReader, claim)));
  EXPECT_TRUE(authz->CheckClaimEpoch(kAdmin, claim).ok());
}

TEST_F(AuthorizerTest, ReadersReadAndAdminsDoEverything) {
  auto authz = Make(Role::kCache);
  v1::GroupVersionResource widgets = Gvr("example.com", "widgets");
  v1::GetRequest get;
  *get.mutable_resource() = widgets;
  v1::WatchRequest watch;
  *watch.mutable_resource() = widgets;
  EXPECT_TRUE(authz->CheckGet(kReader, get).ok());
  EXPECT_TRUE(authz->CheckWatch(kReader, watch).ok());
  absl::Status denied = authz->CheckCreate(kReader, Create(widgets, Obj("a", "c", "n", "w")));
  EXPECT_TRUE(absl::IsPermissionDenied(denied));
  EXPECT_NE(denied.message().find("readers may only get, list and watch"), std::string::npos);
  EXPECT_TRUE(authz->CheckCreate(kAdmin, Create(widgets, Obj("a", "c", "n", "w"))).ok());
}

TEST_F(AuthorizerTest, NoRoleMayDoNothingAndNoCertificateIsUnauthenticated) {
  auto authz = Make(Role::kCache);
  v1::GetRequest get;
  *get.mutable_resource() = Gvr("example.com", "widgets");
  for (const PeerIdentity& who : {kNameOnly, kGroupOnly, PeerIdentity{"bob", {}}}) {
    SCOPED_TRACE(who.user);
    EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckGet(who, get)));
  }
  EXPECT_TRUE(absl::IsUnauthenticated(authz->CheckGet(std::nullopt, get)));
}

TEST_F(AuthorizerTest, ShardStore_ReplicatorWritesItsLeaseAndCcrStatusAndFinalizers) {
  auto authz = Make(Role::kShard, "a");
  v1::GroupVersionResource leases = Gvr("coordination.shardcache.io", "leases");
  v1::GroupVersionResource ccrs = Gvr("cache.shardcache.io", "clustercachedresources");
  v1::Object lease = Obj("", "root", "shardcache-system", "shard-replicator");
  EXPECT_TRUE(authz->CheckCreate(kReplicatorA, Create(leases, lease)).ok());
  v1::UpdateRequest renew = Update(leases, lease);
  EXPECT_TRUE(authz->CheckUpdate(kReplicatorA, &renew).ok());
  // Another lease, another resource, or another shard's replicator: no.
  EXPECT_TRUE(absl::IsPermissionDenied(
      authz->CheckCreate(kReplicatorA, Create(leases, Obj("", "root", "default", "app")))));
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckCreate(
      kReplicatorA, Create(Gvr("example.com", "widgets"), Obj("", "c", "n", "w")))));
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckUpdate(kReplicatorB, &renew)));

  v1::Object ccr = Obj("", "root:org", "", "widgets");
  ccr.mutable_metadata()->set_resource_version("7");
  (*ccr.mutable_spec()->mutable_fields())["resource"].set_string_value("widgets");
  stored_["widgets"] = ccr;
  EXPECT_TRUE(authz->CheckUpdateStatus(kReplicatorA, Update(ccrs, ccr)).ok());
  v1::UpdateRequest finalizer = Update(ccrs, ccr);
  finalizer.mutable_object()->mutable_metadata()->add_finalizers("cache.shardcache.io/replicator");
  EXPECT_TRUE(authz->CheckUpdate(kReplicatorA, &finalizer).ok());
  v1::UpdateRequest spec = finalizer;
  (*spec.mutable_object()->mutable_spec()->mutable_fields())["resource"].set_string_value("x");
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckUpdate(kReplicatorA, &spec)));
  // Without a resourceVersion, the update is pinned to the version it was compared with.
  v1::UpdateRequest unpinned = finalizer;
  unpinned.mutable_object()->mutable_metadata()->clear_resource_version();
  EXPECT_TRUE(authz->CheckUpdate(kReplicatorA, &unpinned).ok());
  EXPECT_EQ(unpinned.object().metadata().resource_version(), "7");
  // A CCR that is not there cannot be created by a replicator.
  v1::UpdateRequest absent = Update(ccrs, Obj("", "root:org", "", "gadgets"));
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckUpdate(kReplicatorA, &absent)));
  EXPECT_TRUE(absl::IsPermissionDenied(authz->CheckCreate(kReplicatorA, Create(ccrs, ccr))));
}

TEST_F(AuthorizerTest, DecisionsAreCounted) {
  auto authz = Make(Role::kCache);
  v1::GetRequest get;
  *get.mutable_resource() = Gvr("example.com", "widgets");
  ASSERT_TRUE(authz->CheckGet(kReader, get).ok());
  ASSERT_FALSE(authz->CheckGet(kGroupOnly, get).ok());
  ASSERT_FALSE(authz->CheckGet(std::nullopt, get).ok());
  std::map<std::string, double> seen;
  for (const auto& family : registry_.Collect()) {
    for (const auto& m : family.metric) {
      std::string key = family.name;
      for (const auto& l : m.label) absl::StrAppend(&key, ",", l.name, "=", l.value);
      seen[key] = m.counter.value;
    }
  }
  EXPECT_EQ((seen["shardcache_authorization_decisions_total,decision=allow,verb=get"]), 1);
  EXPECT_EQ((seen["shardcache_authorization_decisions_total,decision=deny,verb=get"]), 1);
  EXPECT_EQ(seen["shardcache_unauthenticated_requests_total"], 1);
}

}  // namespace
}  // namespace shardcache
