// Tests of ReplicationController with scripted informers (the shard store's objects and the
// cache's copies, as lists and watch streams the test writes) and a CacheWriter to a real
// cache_server on loopback: what the controller writes is what the cache holds.
#include "shard_replicator/replication_controller.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/client/shared_informer.h"
#include "common/clock.h"
#include "common/testing/objects.h"
#include "common/testing/scripted_lister_watcher.h"
#include "common/testing/server_process.h"
#include "common/testing/wait.h"
#include "shard_replicator/cache_writer.h"
#include "shard_replicator/cluster_cached_resource.h"

namespace shardcache {
namespace {

using testing::BinaryPath;
using testing::Eventually;
using testing::ScriptedListerWatcher;
using testing::ServerProcess;

constexpr char kShard[] = "a";
constexpr char kCluster[] = "root";
constexpr char kNamespace[] = "default";

v1::GroupVersionResource Widgets() { return testing::Gvr("example.com", "v1", "widgets"); }

v1::Object LocalWidget(const std::string& name, const std::string& rv) {
  v1::Object o;
  o.mutable_metadata()->set_cluster(kCluster);
  o.mutable_metadata()->set_namespace_(kNamespace);
  o.mutable_metadata()->set_name(name);
  o.mutable_metadata()->set_uid("uid-" + name);
  o.mutable_metadata()->set_resource_version(rv);
  (*o.mutable_spec()->mutable_fields())["size"].set_number_value(3);
  return o;
}

class ReplicationControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"),
                                             std::vector<std::string>{"--role=cache"});
    absl::Status started = cache_->Start();
    ASSERT_TRUE(started.ok()) << started;
    channel_ = grpc::CreateChannel(cache_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Store::NewStub(channel_);
    CacheWriter::Options w;
    w.shard = kShard;
    w.epoch = 1;
    writer_ = std::make_unique<CacheWriter>(channel_, stub_, std::move(w));

    auto local_lw = std::make_unique<ScriptedListerWatcher>(RealClock::Get());
    local_lw_ = local_lw.get();
    local_lw_->SetListObjects("shard-store", "10", {LocalWidget("w1", "10")});
    local_lw_->SetHeader("shard-store");
    auto cache_lw = std::make_unique<ScriptedListerWatcher>(RealClock::Get());
    cache_lw_ = cache_lw.get();
    cache_lw_->SetListObjects("cache-1", "1", {});
    cache_lw_->SetHeader("cache-1");
    SharedInformer::Options options;
    options.name = "local";
    auto local = SharedInformer::Create(std::move(local_lw), options);
    ASSERT_TRUE(local.ok()) << local.status();
    options.name = "cache";
    auto cache = SharedInformer::Create(std::move(cache_lw), options);
    ASSERT_TRUE(cache.ok()) << cache.status();
    local_ = *std::move(local);
    cache_informer_ = *std::move(cache);
    ASSERT_TRUE(local_->Run().ok());
    ASSERT_TRUE(cache_informer_->Run().ok());
    ASSERT_TRUE(local_->WaitForSync(absl::Seconds(10)));
    ASSERT_TRUE(cache_informer_->WaitForSync(absl::Seconds(10)));
  }

  void TearDown() override {
    controller_.reset();
    writer_.reset();
    if (local_ != nullptr) local_->Stop();
    if (cache_informer_ != nullptr) cache_informer_->Stop();
  }

  void StartController() {
    ReplicationController::Options o;
    o.shard = kShard;
    o.cluster = kCluster;
    o.ccr_name = "widgets";
    o.spec.resource = Widgets();
    o.workers = 1;
    o.writer = writer_.get();
    auto c = ReplicationController::Start(std::move(o), local_, cache_informer_);
    ASSERT_TRUE(c.ok()) << c.status();
    controller_ = *std::move(c);
  }

  // Whether the real cache holds shard a's copy of `name`.
  bool CacheHolds(const std::string& name) {
    v1::GetRequest req;
    *req.mutable_resource() = Widgets();
    req.set_shard(kShard);
    req.set_cluster(kCluster);
    req.set_namespace_(kNamespace);
    req.set_name(name);
    v1::Object out;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    return stub_->Get(&ctx, req, &out).ok();
  }

  void DeleteFromCache(const std::string& name) {
    v1::DeleteRequest req;
    *req.mutable_resource() = Widgets();
    req.set_shard(kShard);
    req.set_cluster(kCluster);
    req.set_namespace_(kNamespace);
    req.set_name(name);
    v1::DeleteResponse out;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status s = stub_->Delete(&ctx, req, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::unique_ptr<ServerProcess> cache_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::Store::StubInterface> stub_;
  std::unique_ptr<CacheWriter> writer_;
  ScriptedListerWatcher* local_lw_ = nullptr;
  ScriptedListerWatcher* cache_lw_ = nullptr;
  std::shared_ptr<SharedInformer> local_;
  std::shared_ptr<SharedInformer> cache_informer_;
  std::unique_ptr<ReplicationController> controller_;
};

// The cache is replaced behind its address (restarted without its data) after it acknowledged a
// copy that its informer had not shown yet: the new store lacks the copy, and its list looks like
// the old one's (empty), so no event says so. The controller must not trust its write to the old
// store: it reconciles every key against the new one and writes the copy again.
TEST_F(ReplicationControllerTest, CopyAcknowledgedByAReplacedCacheIsWrittenAgain) {
  ASSERT_NO_FATAL_FAILURE(StartController());
  // The copy is written and acknowledged; the scripted cache informer never shows it.
  ASSERT_TRUE(Eventually([&] { return CacheHolds("w1") && controller_->Pending() == 0; },
                         absl::Seconds(20), "the copy is written and acknowledged"));

  // Another store now answers: it lacks the copy (the real cache loses it too), and the
  // informer's watch breaks, reconnects, sees the new store's id and lists it (empty).
  ASSERT_NO_FATAL_FAILURE(DeleteFromCache("w1"));
  cache_lw_->SetListObjects("cache-2", "1", {});
  cache_lw_->SetHeader("cache-2");
  int streams = cache_lw_->streams();
  ASSERT_GT(streams, 0);
  cache_lw_->stream(streams - 1)->Break();
  ASSERT_TRUE(Eventually([&] { return cache_informer_->StoreId() == "cache-2"; }, absl::Seconds(20),
                         "the cache informer lists the new store"));

  EXPECT_TRUE(Eventually([&] { return CacheHolds("w1"); }, absl::Seconds(20),
                         "the copy is written to the new store"));
  EXPECT_TRUE(Eventually([&] { return controller_->Pending() == 0; }, absl::Seconds(20),
                         "nothing is pending once it is acknowledged"));
}

}  // namespace
}  // namespace shardcache
