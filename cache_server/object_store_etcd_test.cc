// ObjectStore on etcd (object_store_etcd.cc) against a real one-member etcd on loopback, with a
// fake clock: etcd's history is compacted to the revision the replica had seen
// etcd_history_retention before, checked every etcd_compaction_interval, and never further.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "cache_server/etcd_client.h"
#include "cache_server/etcd_layout.h"
#include "cache_server/object_store.h"
#include "common/clock.h"
#include "common/testing/etcd_cluster.h"
#include "common/testing/objects.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::IsOk;

constexpr char kPrefix[] = "/compaction";

class ObjectStoreEtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<testing::EtcdCluster>(testing::EtcdCluster::Options());
    absl::Status started = etcd_->Start();
    ASSERT_TRUE(started.ok()) << started;
    EtcdClient::Options client;
    client.endpoints = {etcd_->endpoint(0)};
    absl::StatusOr<std::unique_ptr<EtcdClient>> created = EtcdClient::Create(client);
    ASSERT_THAT(created.status(), IsOk());
    client_ = *std::move(created);
    absl::StatusOr<PersistedState> state = LoadEtcdState(client_.get(), kPrefix);
    ASSERT_THAT(state.status(), IsOk());
    ObjectStore::Options o;
    o.clock = &clock_;
    o.etcd = client_.get();
    o.etcd_prefix = kPrefix;
    o.etcd_compaction_interval = absl::Minutes(1);
    o.etcd_history_retention = absl::Minutes(5);
    store_ = std::make_unique<ObjectStore>(o, &cache_, &metrics_, *std::move(state));
  }
  void TearDown() override {
    store_.reset();
    client_.reset();
    etcd_.reset();
  }

  // Creates widget `name`; returns its resourceVersion (etcd's revision of the write).
  int64_t Create(const std::string& name) {
    v1::CreateRequest req;
    *req.mutable_resource() = testing::Gvr("example.com", "v1", "widgets");
    v1::ObjectMeta* meta = req.mutable_object()->mutable_metadata();
    meta->set_cluster("root");
    meta->set_namespace_("default");
    meta->set_name(name);
    absl::StatusOr<ObjectRef> created = store_->Create(req);
    EXPECT_THAT(created.status(), IsOk());
    return created.ok() ? std::stoll((*created)->metadata().resource_version()) : 0;
  }

  // etcd's compacted revision: the lowest revision that a Range at an older one is refused for.
  // Found by asking at each revision from `from` up to `to`.
  int64_t CompactedRevision(int64_t from, int64_t to) {
    int64_t compacted = 0;
    for (int64_t r = from; r <= to; ++r) {
      etcdserverpb::RangeRequest get;
      get.set_key(std::string(kPrefix) + "/");
      get.set_range_end(EtcdClient::PrefixEnd(std::string(kPrefix) + "/"));
      get.set_revision(r);
      get.set_count_only(true);
      if (!client_->Range(get).ok()) compacted = r + 1;
    }
    return compacted;
  }

  // Moves the clock by `d`, then lets the committer's idle check (about once a second of real
  // time) see it.
  void AdvanceAndIdle(absl::Duration d) {
    clock_.Advance(d);
    absl::SleepFor(absl::Milliseconds(2500));
  }

  FakeClock clock_;
  StoreMetrics metrics_{std::make_shared<prometheus::Registry>()};
  WatchCache cache_{WatchCache::Options{absl::Seconds(60)}, &metrics_};
  std::unique_ptr<testing::EtcdCluster> etcd_;
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<ObjectStore> store_;
};

TEST_F(ObjectStoreEtcdTest, HistoryIsCompactedToWhatTheReplicaSawTheRetentionAgo) {
  const int64_t first = Create("a");
  AdvanceAndIdle(absl::Seconds(1));  // the first check records `first`
  AdvanceAndIdle(absl::Minutes(2));
  const int64_t second = Create("b");
  AdvanceAndIdle(absl::Minutes(1));  // records `second`, three minutes after `first`
  const int64_t third = Create("c");
  // Nothing is five minutes old yet: no compaction.
  EXPECT_EQ(CompactedRevision(1, third), 0);
  AdvanceAndIdle(absl::Minutes(2) + absl::Seconds(30));  // `first` is now five minutes old
  ASSERT_TRUE(testing::Eventually([&] { return CompactedRevision(1, third) == first; },
                                  absl::Seconds(10), "etcd compacted to the first write"));
  AdvanceAndIdle(absl::Minutes(3));  // and `second` too, but not `third`
  ASSERT_TRUE(testing::Eventually([&] { return CompactedRevision(1, third) == second; },
                                  absl::Seconds(10), "etcd compacted to the second write"));
  // The store answers reads as before.
  EXPECT_EQ(Create("d"), third + 1);
}

}  // namespace
}  // namespace shardcache
