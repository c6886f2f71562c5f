// Process-level tests of the store identity and of connection liveness, with real stores and a
// real shard_replicator on loopback:
// - every List answer and watch event names its store; the identity survives a restart with the
//   same data and changes when the data directory is replaced;
// - a cache replaced by a store whose revision is past the replicator's (wiped and refilled by
//   another writer before the replicator reconnects) is noticed by its identity, and the copies
//   come back without waiting for the periodic resync;
// - a replicator whose cache stops answering without closing connections (SIGSTOP) notices it
//   (watch liveness and keepalive) and restores the copies once a new cache takes the port;
// - the keepalive and liveness flags are checked at start-up.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/testing/server_process.h"
#include "integration_tests/refuse_to_start.h"
#include "integration_tests/replicator_fixture.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

const v1::GroupVersionResource kGadgets = Gvr("example.com", "v1", "gadgets");

// Lists `gvr` in the store at `stub`: its revision and store id.
v1::ListResponse ListAt(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr) {
  v1::ListRequest req;
  *req.mutable_resource() = gvr;
  v1::ListResponse resp;
  grpc::Status s = RetryingUnavailable([&] { return stub->List(Context().get(), req, &resp); });
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

// Creates `count` gadgets g<first>.. in kCluster of the store at `stub`.
void FillGadgets(v1::Store::Stub* stub, int first, int count) {
  for (int i = first; i < first + count; ++i) {
    v1::CreateRequest req;
    *req.mutable_resource() = kGadgets;
    req.mutable_object()->mutable_metadata()->set_cluster(kCluster);
    req.mutable_object()->mutable_metadata()->set_name(absl::StrCat("g", i));
    v1::Object out;
    grpc::Status s = RetryingUnavailable([&] { return stub->Create(Context().get(), req, &out); });
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
}

// The value of a metric of the replica whose labels include every one of `labels`; -1 if none.
double ReplicaMetric(ServerProcess* replica, const std::string& name,
                     const std::vector<std::string>& labels = {}) {
  return Metric(replica->http_port(), name, labels);
}

// The "shardcache-store-id" response header of a call, or "".
std::string Header(const grpc::ClientContext& ctx) {
  auto it = ctx.GetServerInitialMetadata().find("shardcache-store-id");
  if (it == ctx.GetServerInitialMetadata().end()) return "";
  return std::string(it->second.data(), it->second.size());
}

class StoreIdentityTest : public ReplicatorFixture {
 protected:
  void StartAll(const std::vector<std::string>& replicator_flags = {}) {
    StartShardStore("a");
    if (HasFatalFailure()) return;
    StartCache();
    if (HasFatalFailure()) return;
    replica_ = StartReplicator("a", "replica-0", replicator_flags);
    ASSERT_TRUE(WaitForLeading(replica_, 1, absl::Seconds(15)));
  }

  // Replaces the cache's data with that of a new store in which another writer raised the
  // revision `ahead` past the old cache's, then restarts the cache on its port.
  void ReplaceCacheWithOneAhead(int ahead) {
    const int64_t old_revision = Revision(cache());
    const std::string replacement = MakeTempDir("replacement") + "/data";
    {
      ServerProcess other(BinaryPath("cache_server/cache_server"),
                          {"--role=cache", "--data-dir=" + replacement});
      ASSERT_TRUE(other.Start().ok());
      std::unique_ptr<v1::Store::Stub> stub = v1::Store::NewStub(
          grpc::CreateChannel(other.grpc_address(), grpc::InsecureChannelCredentials()));
      FillGadgets(stub.get(), 0, static_cast<int>(old_revision) + ahead);
      ASSERT_GT(Revision(stub.get()), old_revision);
      // It has none of the copies. (Once it replaces the cache, the replicator may write them
      // again at any moment.)
      std::optional<std::map<std::string, v1::Object>> copies =
          ListFrom(stub.get(), WidgetsGvr(), "a", kCluster);
      ASSERT_TRUE(copies.has_value());
      ASSERT_TRUE(copies->empty());
      ASSERT_EQ(other.Stop(), 0);
    }
    ASSERT_EQ(cache_.process->Stop(), 0);
    std::filesystem::remove_all(cache_.process->data_dir());
    std::filesystem::rename(replacement, cache_.process->data_dir());
    RestartStore(&cache_);
  }

  static int64_t Revision(v1::Store::Stub* stub) {
    int64_t rv = 0;
    EXPECT_TRUE(absl::SimpleAtoi(ListAt(stub, kGadgets).resource_version(), &rv));
    return rv;
  }

  ServerProcess* replica_ = nullptr;
};

TEST_F(StoreIdentityTest, ListAndWatchCarryTheIdentity_KeptAcrossRestarts) {
  StartCache();
  ASSERT_FALSE(HasFatalFailure());
  const std::string id = ListAt(cache(), kGadgets).store_id();
  EXPECT_EQ(id.size(), 36u) << id;  // a UUID
  // A watch names it on every message: the initial bookmark, events and periodic bookmarks.
  v1::WatchRequest req;
  *req.mutable_resource() = kGadgets;
  auto ctx = Context();
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader = cache()->Watch(ctx.get(), req);
  v1::WatchEvent event;
  reader->WaitForInitialMetadata();  // the headers come at once, before any event
  EXPECT_EQ(Header(*ctx), id);
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.type(), v1::WatchEvent::BOOKMARK);
  EXPECT_EQ(event.store_id(), id);
  FillGadgets(cache(), 0, 1);
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.type(), v1::WatchEvent::ADDED);
  EXPECT_EQ(event.object().metadata().name(), "g0");
  EXPECT_EQ(event.store_id(), id);
  ctx->TryCancel();
  while (reader->Read(&event)) {
  }
  (void)reader->Finish();
  // So do the headers of Get.
  v1::GetRequest get;
  *get.mutable_resource() = kGadgets;
  get.set_cluster(kCluster);
  get.set_name("g0");
  auto get_ctx = Context();
  v1::Object got;
  ASSERT_TRUE(cache()->Get(get_ctx.get(), get, &got).ok());
  EXPECT_EQ(Header(*get_ctx), id);
  // The metric and the start-up log name it too.
  EXPECT_EQ(Metric(cache_.process->http_port(), "shardcache_store_info",
                   {absl::StrCat("store_id=\"", id, "\""), "role=\"cache\""}),
            1);
  EXPECT_TRUE(absl::StrContains(cache_.process->Log(), absl::StrCat("store_id=", id)));

  // Same data: same identity.
  ASSERT_EQ(cache_.process->Stop(), 0);
  RestartStore(&cache_);
  EXPECT_EQ(ListAt(cache(), kGadgets).store_id(), id);
  // Wiped: a new one.
  ASSERT_EQ(cache_.process->Stop(), 0);
  std::filesystem::remove_all(cache_.process->data_dir());
  RestartStore(&cache_);
  const std::string wiped = ListAt(cache(), kGadgets).store_id();
  EXPECT_EQ(wiped.size(), 36u);
  EXPECT_NE(wiped, id);
}

// The replicator's cache informers watch "from" a revision that the new cache has already passed
// with changes of another resource: without the identity they would resume, see nothing, and
// believe the copies are still there.
TEST_F(StoreIdentityTest, CacheReplacedByAStoreAhead_CopiesComeBack) {
  ASSERT_NO_FATAL_FAILURE(StartAll());
  ASSERT_NO_FATAL_FAILURE(ReplicateWidgets());
  ASSERT_NO_FATAL_FAILURE(ReplaceCacheWithOneAhead(20));
  const absl::Time restarted = absl::Now();

  EXPECT_TRUE(WaitForCacheInSync());
  std::cout << "copies back " << absl::FormatDuration(absl::Now() - restarted)
            << " after the replaced cache started\n";
  EXPECT_TRUE(WaitForCcrCopy("widgets"));
  EXPECT_TRUE(WaitForReady("widgets", 3));
  EXPECT_GE(ReplicaMetric(replica_, "shardcache_reflector_store_changes_total"), 1);
}

// The cache stops answering but keeps its connections (SIGSTOP): the replicator's watches of the
// cache are taken for dead after --watch-idle-timeout without a bookmark, which is logged and
// counted; once a new cache (same data, same port) replaces the paused one, a copy deleted there
// is restored.
TEST_F(StoreIdentityTest, PausedCache_IsNoticed_AndReplicationResumesOnItsReplacement) {
  ASSERT_NO_FATAL_FAILURE(
      StartAll({"--watch-idle-timeout=3s", "--keepalive-time=1s", "--keepalive-timeout=1s"}));
  ASSERT_NO_FATAL_FAILURE(ReplicateWidgets());
  ASSERT_TRUE(cache_.process->Pause());
  const absl::Time paused = absl::Now();
  ASSERT_TRUE(Eventually(
      [&] {
        return ReplicaMetric(replica_, "shardcache_reflector_watch_idle_restarts_total") >= 1;
      },
      absl::Seconds(30), "the replicator takes a watch of the paused cache for dead"));
  std::cout << "a watch of the paused cache taken for dead after "
            << absl::FormatDuration(absl::Now() - paused) << "\n";
  EXPECT_TRUE(absl::StrContains(replica_->Log(), "taking it for dead"));

  cache_.process->Signal(SIGKILL);
  cache_.process->Wait(absl::Seconds(10));
  RestartStore(&cache_);
  ASSERT_TRUE(DeleteIn(cache(), WidgetsGvr(), "a", kCluster, kNamespace, "w2").ok());
  EXPECT_TRUE(WaitForCacheInSync());
  EXPECT_TRUE(WaitForCcrCopy("widgets"));
}

void ExpectBadFlagRefused(const RunResult& r, const std::string& mention) {
  ExpectRefused(r, mention, /*exit_code=*/2);
}

TEST(LivenessFlagsTest, RefusesBadKeepaliveAndIdleFlags) {
  const std::vector<std::string> good = {"--shard=a", "--shard-store=127.0.0.1:1",
                                         "--cache=127.0.0.1:2"};
  auto with = [&](const std::string& flag) {
    std::vector<std::string> args = good;
    args.push_back(flag);
    return args;
  };
  ExpectBadFlagRefused(RunReplicatorToExit(with("--keepalive-time=0s")), "--keepalive-time");
  ExpectBadFlagRefused(RunReplicatorToExit(with("--keepalive-timeout=-1s")), "--keepalive-timeout");
  ExpectBadFlagRefused(RunReplicatorToExit(with("--watch-idle-timeout=-1s")),
                       "--watch-idle-timeout");
  ExpectRefused(RunCacheServer({"--keepalive-time=0s"}), "--keepalive-time", 2);
  ExpectRefused(RunCacheServer({"--keepalive-min-client-interval=0s"}),
                "--keepalive-min-client-interval", 2);
}

}  // namespace
}  // namespace shardcache::testing
