// Process tests of a replicator whose --cache names two cache_server replicas on one etcd cluster
// (--storage=etcd): it replicates through one, and when that one is killed it moves to the other,
// whose resourceVersions are the same, resumes its watches there without listing again, and
// keeps its CCRs Ready.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/etcd_cluster.h"
#include "common/testing/server_process.h"
#include "common/testing/wait.h"
#include "integration_tests/replicator_fixture.h"

namespace shardcache::testing {
namespace {

class CacheReplicasTest : public ReplicatorFixture {
 protected:
  void SetUp() override {
    EtcdCluster::Options options;
    options.members = 3;
    etcd_ = std::make_unique<EtcdCluster>(options);
    absl::Status started = etcd_->Start();
    ASSERT_TRUE(started.ok()) << started;
    for (Store* replica : {&cache_, &other_}) {
      replica->process = std::make_unique<ServerProcess>(
          BinaryPath("cache_server/cache_server"),
          std::vector<std::string>{"--role=cache", "--storage=etcd",
                                   "--etcd-endpoints=" + etcd_->Endpoints(),
                                   "--etcd-prefix=/cache"});
      ASSERT_NO_FATAL_FAILURE(RestartStore(replica));
    }
    ASSERT_NO_FATAL_FAILURE(StartShardStore());
  }

  void TearDown() override {
    ReplicatorFixture::TearDown();
    other_.stub.reset();
    other_.channel.reset();
    other_.process.reset();
  }

  // How many lists the replicator's reflectors have made (its debug log says each).
  static int Lists(ServerProcess* replicator) {
    int lists = 0;
    for (absl::string_view line : absl::StrSplit(replicator->Log(), '\n')) {
      if (absl::StrContains(line, "reflector ") && absl::StrContains(line, ": listed ")) ++lists;
    }
    return lists;
  }

  std::unique_ptr<EtcdCluster> etcd_;
  // The second replica; cache_ (the fixture's) is the first.
  Store other_;
};

TEST_F(CacheReplicasTest, AReplicatorMovesToTheOtherReplicaWhenItsOneDies) {
  const std::string both = cache_.address() + "," + other_.address();
  ServerProcess* replicator = StartReplicator("a", "replica-0", {"--log-level=debug"}, both);
  ASSERT_NO_FATAL_FAILURE(ReplicateWidgets());
  const int lists_before = Lists(replicator);
  ASSERT_GT(lists_before, 0);

  // The replica it uses (the first of the list) dies; the fixture's checks read the other one.
  ASSERT_NO_FATAL_FAILURE(KillStore(&cache_));
  std::swap(cache_, other_);

  // New and changed widgets reach the cache through the other replica, and the CCR stays Ready.
  ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget("w4")).ok());
  ASSERT_TRUE(Modify(shard(), WidgetsGvr(), kCluster, kNamespace, "w1", [](v1::Object* w) {
                (*w->mutable_spec()->mutable_fields())["size"].set_number_value(7);
              }).ok());
  EXPECT_TRUE(WaitForCacheInSync());
  EXPECT_TRUE(WaitForReady("widgets", 4));
  EXPECT_TRUE(WaitForCcrCopy("widgets"));
  // Its watches of the cache resumed on the other replica from their revision: no list again.
  EXPECT_EQ(Lists(replicator), lists_before);
}

}  // namespace
}  // namespace shardcache::testing
