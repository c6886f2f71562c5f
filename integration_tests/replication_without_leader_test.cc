// Process-level tests of what a new leadership term does with copies that the previous terms left
// for a ClusterCachedResource that changed while no replica led: real shard store, cache and
// replicators. The CCR's own copy in the cache is the record of the resource its copies belong to;
// a new term purges the copies of a resource that no CCR names any more (its spec now names
// another resource, or the CCR is gone without its finalizer), and only then updates or removes
// the record.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/testing/server_process.h"
#include "common/testing/wait.h"
#include "integration_tests/refuse_to_start.h"
#include "integration_tests/replicator_fixture.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

v1::GroupVersionResource GadgetsGvr() { return Gvr("example.com", "v1", "gadgets"); }

class ReplicationWithoutLeaderTest : public ReplicatorFixture {
 protected:
  // Shard "a"'s store (widgets and gadgets defined), the cache, a replica that leads, and CCR
  // "widgets" replicating w1..w3.
  void StartAndReplicateWidgets() {
    StartShardStore("a");
    if (HasFatalFailure()) return;
    ASSERT_TRUE(CreateIn(shard(), DefinitionGvr(),
                         Definition("example.com", "gadgets", "Namespaced", {"v1"}, true))
                    .ok());
    StartCache();
    if (HasFatalFailure()) return;
    ServerProcess* replica = StartReplicator("a", "replica-0");
    ASSERT_TRUE(WaitForLeading(replica, 1, absl::Seconds(15)));
    ASSERT_NO_FATAL_FAILURE(ReplicateWidgets());
    ASSERT_EQ(WidgetCopies(), "default/w1,default/w2,default/w3");
  }

  // Stops every replica (SIGTERM, exit 0): nobody leads from then on.
  void StopReplicators() {
    for (auto& r : replicators_) {
      if (!r->Running()) continue;
      int status = r->Stop(absl::Seconds(15));
      ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << DescribeWaitStatus(status);
    }
  }

  // The keys of shard "a"'s widget copies in the cache, joined with ",".
  std::string WidgetCopies() {
    auto copies = ListFrom(cache(), WidgetsGvr(), "a", kCluster);
    if (!copies.has_value()) return "(the list failed)";
    std::vector<std::string> keys;
    for (const auto& [key, copy] : *copies) keys.push_back(key);
    return absl::StrJoin(keys, ",");
  }

  ::testing::AssertionResult WaitForNoWidgetCopies() {
    std::string last;
    return Eventually(
        [&] {
          last = WidgetCopies();
          return last.empty();
        },
        kConverge, "the cache holds no copy of shard a's widgets", [&] { return last; });
  }
};

// CCR "widgets" is changed to replicate gadgets while no replica leads: the next term purges the
// widgets' copies, replicates the gadgets, and the CCR's copy names gadgets.
TEST_F(ReplicationWithoutLeaderTest, ResourceChangedWhileNobodyLeads_OldCopiesArePurged) {
  ASSERT_NO_FATAL_FAILURE(StartAndReplicateWidgets());
  for (const char* name : {"g1", "g2"}) {
    v1::Object gadget = Widget(name);
    ASSERT_TRUE(CreateIn(shard(), GadgetsGvr(), gadget).ok());
  }
  ASSERT_NO_FATAL_FAILURE(StopReplicators());

  ASSERT_TRUE(Modify(shard(), CcrGvr(), kCluster, "", "widgets", [](v1::Object* ccr) {
                (*ccr->mutable_spec()->mutable_fields())["resource"].set_string_value("gadgets");
              }).ok());
  // Nothing changes in the cache while nobody leads.
  EXPECT_EQ(WidgetCopies(), "default/w1,default/w2,default/w3");

  ServerProcess* next = StartReplicator("a", "replica-1");
  ASSERT_TRUE(WaitForLeading(next, 1, absl::Seconds(15)));
  EXPECT_TRUE(WaitForReady("widgets", 2));
  EXPECT_TRUE(WaitForCacheInSync("a", "", kConverge, GadgetsGvr()));
  EXPECT_TRUE(WaitForNoWidgetCopies());
  EXPECT_TRUE(WaitForCcrCopy("widgets"));
  // The widgets themselves are untouched in the shard.
  auto local = ListFrom(shard(), WidgetsGvr(), "", kCluster);
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(local->size(), 3u);
}

// CCR "widgets" loses its finalizer and is deleted while no replica leads (it is gone at once):
// the next term purges its copies and then removes the CCR's copy.
TEST_F(ReplicationWithoutLeaderTest, CcrDeletedWhileNobodyLeads_CopiesArePurged) {
  ASSERT_NO_FATAL_FAILURE(StartAndReplicateWidgets());
  ASSERT_NO_FATAL_FAILURE(StopReplicators());

  ASSERT_TRUE(Modify(shard(), CcrGvr(), kCluster, "", "widgets", [](v1::Object* ccr) {
                ccr->mutable_metadata()->clear_finalizers();
              }).ok());
  ASSERT_TRUE(DeleteIn(shard(), CcrGvr(), "", kCluster, "", "widgets").ok());
  ASSERT_FALSE(GetCcr("widgets").has_value());
  EXPECT_EQ(WidgetCopies(), "default/w1,default/w2,default/w3");

  ServerProcess* next = StartReplicator("a", "replica-1");
  ASSERT_TRUE(WaitForLeading(next, 1, absl::Seconds(15)));
  EXPECT_TRUE(WaitForNoWidgetCopies());
  std::optional<v1::Object> record;
  EXPECT_TRUE(Eventually(
      [&] {
        record = GetFrom(cache(), CcrGvr(), "a", kCluster, "", "widgets");
        return !record.has_value();
      },
      kConverge, "the CCR's copy is removed from the cache",
      [&] { return record.has_value() ? ToJson(*record) : std::string("gone"); }));
}

}  // namespace
}  // namespace shardcache::testing
