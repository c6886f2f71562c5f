// Tests of ReplicationController with scripted informers (the shard store's objects and the
// cache's copies, as lists and watch streams the test writes): one per branch of its header with
// a fake cache writer (no process; the controller's time is a FakeClock, so its backoff retries
// come due only when the test advances it), and some with a CacheWriter to a real cache_server
// on loopback (what the controller writes is what the cache holds).
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
#include "common/testing/scripted_source.h"
#include "common/testing/server_process.h"
#include "common/testing/wait.h"
#include "shard_replicator/cache_writer.h"
#include "shard_replicator/cluster_cached_resource.h"
#include "shard_replicator/testing/fake_cache_writer.h"

namespace shardcache {
namespace {

using testing::BinaryPath;
using testing::Eventually;
using testing::FakeCacheWriter;
using testing::PushWhenWatching;
using testing::ScriptedListerWatcher;
using testing::ServerProcess;
using testing::WatchEventOf;

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

v1::Object Copy(const v1::Object& local, const std::string& rv) {
  v1::Object copy = ProjectCopy(local, kShard);
  copy.mutable_metadata()->set_resource_version(rv);
  return copy;
}

// The same controller over a fake cache writer: no process.
class ReplicationControllerFakeTest : public ::testing::Test {
 protected:
  void TearDown() override {
    // The writer's answers still due run before the controller is freed, as when a term ends.
    writer_.Stop();
    writer_.Drain();
    controller_.reset();
    if (local_ != nullptr) local_->Stop();
    if (cache_informer_ != nullptr) cache_informer_->Stop();
  }

  // Starts the informers over `local` and `copies`, then the controller. With run_local false,
  // the local informer is not run (it has not listed yet).
  void Start(std::vector<v1::Object> local, std::vector<v1::Object> copies,
             const std::string& selector = "", int workers = 2, bool run_local = true) {
    auto local_lw = std::make_unique<ScriptedListerWatcher>(RealClock::Get());
    local_lw_ = local_lw.get();
    local_lw_->SetListObjects("shard-store", "10", std::move(local));
    local_lw_->SetHeader("shard-store");
    auto cache_lw = std::make_unique<ScriptedListerWatcher>(RealClock::Get());
    cache_lw_ = cache_lw.get();
    cache_lw_->SetListObjects("cache-1", "10", std::move(copies));
    cache_lw_->SetHeader("cache-1");
    SharedInformer::Options options;
    options.name = "local";
    auto l = SharedInformer::Create(std::move(local_lw), options);
    ASSERT_TRUE(l.ok()) << l.status();
    options.name = "cache";
    auto c = SharedInformer::Create(std::move(cache_lw), options);
    ASSERT_TRUE(c.ok()) << c.status();
    local_ = *std::move(l);
    cache_informer_ = *std::move(c);
    if (run_local) {
      ASSERT_TRUE(local_->Run().ok());
    }
    ASSERT_TRUE(cache_informer_->Run().ok());
    if (run_local) {
      ASSERT_TRUE(local_->WaitForSync(absl::Seconds(20)));
    }
    ASSERT_TRUE(cache_informer_->WaitForSync(absl::Seconds(20)));

    ReplicationController::Options o;
    o.shard = kShard;
    o.cluster = kCluster;
    o.ccr_name = "widgets";
    o.spec.resource = Widgets();
    if (!selector.empty()) {
      auto parsed = LabelSelector::Parse(selector);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      o.spec.selector = *parsed;
      o.spec.selector_string = selector;
    }
    o.workers = workers;
    o.clock = &clock_;
    o.writer = &writer_;
    o.on_stopped = [this](const absl::Status& s) {
      absl::MutexLock l(&mu_);
      stopped_with_ = s;
    };
    auto started = ReplicationController::Start(std::move(o), local_, cache_informer_);
    ASSERT_TRUE(started.ok()) << started.status();
    controller_ = *std::move(started);
    if (!run_local) return;
    ASSERT_TRUE(Eventually([&] { return controller_->HasSynced(); }, "the controller syncs"));
  }

  std::string Describe() {
    return absl::StrCat(writer_.WriteCount(), " writes, ", writer_.Held(), " held, pending ",
                        controller_ == nullptr ? -1 : controller_->Pending());
  }
  ::testing::AssertionResult Until(const std::function<bool()>& cond, const std::string& what) {
    return Eventually(cond, absl::Seconds(20), what, [&] { return Describe(); });
  }

  FakeClock clock_;
  FakeCacheWriter writer_{&clock_};
  ScriptedListerWatcher* local_lw_ = nullptr;
  ScriptedListerWatcher* cache_lw_ = nullptr;
  std::shared_ptr<SharedInformer> local_;
  std::shared_ptr<SharedInformer> cache_informer_;
  std::unique_ptr<ReplicationController> controller_;
  absl::Mutex mu_;
  std::optional<absl::Status> stopped_with_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ReplicationControllerFakeTest, UpsertsMissingAndDifferentCopiesOnly) {
  v1::Object differs = Copy(LocalWidget("w2", "10"), "3");
  (*differs.mutable_spec()->mutable_fields())["size"].set_number_value(9);
  ASSERT_NO_FATAL_FAILURE(
      Start({LocalWidget("w1", "10"), LocalWidget("w2", "10"), LocalWidget("w3", "10")},
            {differs, Copy(LocalWidget("w3", "10"), "4")}));
  ASSERT_TRUE(Until([&] { return controller_->Pending() == 0; }, "in sync"));
  // (A key may be written twice: the informer's first list of the cache reports its store, which
  // makes every key reconciled again.)
  EXPECT_GE(writer_.Upserts("w1"), 1) << "missing";
  EXPECT_GE(writer_.Upserts("w2"), 1) << "different";
  EXPECT_EQ(writer_.Upserts("w3"), 0) << "equal: not written";
  for (const v1::WriteRequest& w : writer_.Writes()) {
    ASSERT_TRUE(w.has_upsert());
    EXPECT_EQ(w.upsert().object().metadata().shard(), kShard);
    EXPECT_EQ(GvrKey(w.upsert().resource()), GvrKey(Widgets()));
  }
  v1::Object w2;
  for (const v1::WriteRequest& w : writer_.Writes()) {
    if (w.upsert().object().metadata().name() == "w2") w2 = w.upsert().object();
  }
  EXPECT_EQ(w2.spec().fields().at("size").number_value(), 3);
}

// The cache informer has listed the copies, the local informer not yet: nothing is reconciled
// (a local object not listed yet is not a deleted one) until it has; then only what differs is
// written.
TEST_F(ReplicationControllerFakeTest, NothingIsReconciledBeforeBothInformersHaveListed) {
  v1::Object differs = Copy(LocalWidget("w2", "10"), "4");
  (*differs.mutable_spec()->mutable_fields())["size"].set_number_value(9);
  ASSERT_NO_FATAL_FAILURE(Start({LocalWidget("w1", "10"), LocalWidget("w2", "10")},
                                {Copy(LocalWidget("w1", "10"), "3"), differs}, "", 2,
                                /*run_local=*/false));
  // The keys of both copies are handed out and wait; the check looks again on the clock.
  ASSERT_TRUE(Until([&] { return clock_.Waiters() > 0 || writer_.WriteCount() > 0; },
                    "the keys wait for the local informer"));
  for (int i = 0; i < 10; ++i) clock_.Advance(absl::Milliseconds(20));
  EXPECT_EQ(writer_.WriteCount(), 0) << Describe();

  ASSERT_TRUE(local_->Run().ok());
  ASSERT_TRUE(local_->WaitForSync(absl::Seconds(20)));
  ASSERT_TRUE(Until(
      [&] {
        clock_.Advance(absl::Milliseconds(20));
        return controller_->HasSynced() && controller_->Pending() == 0;
      },
      "in sync"));
  EXPECT_EQ(writer_.Deletes("w1"), 0);
  EXPECT_EQ(writer_.Upserts("w1"), 0) << "equal: not written";
  EXPECT_GE(writer_.Upserts("w2"), 1) << "different";
  EXPECT_EQ(writer_.Deletes("w2"), 0);
}

TEST_F(ReplicationControllerFakeTest, DeletesCopiesThatNothingBacks) {
  v1::Object unmatched = LocalWidget("silver", "10");
  (*unmatched.mutable_metadata()->mutable_labels())["tier"] = "silver";
  v1::Object matched = LocalWidget("gold", "10");
  (*matched.mutable_metadata()->mutable_labels())["tier"] = "gold";
  ASSERT_NO_FATAL_FAILURE(
      Start({matched, unmatched},
            {Copy(LocalWidget("ghost", "10"), "3"), Copy(unmatched, "4"), Copy(matched, "5")},
            "tier=gold"));
  ASSERT_TRUE(Until([&] { return controller_->Pending() == 0; }, "in sync"));
  EXPECT_GE(writer_.Deletes("ghost"), 1) << "no local object";
  EXPECT_GE(writer_.Deletes("silver"), 1) << "not selected";
  EXPECT_EQ(writer_.Deletes("gold"), 0);
  EXPECT_EQ(writer_.Upserts("gold"), 0);
  for (const v1::WriteRequest& w : writer_.Writes()) {
    if (!w.has_delete_()) continue;
    EXPECT_EQ(w.delete_().shard(), kShard);
    EXPECT_EQ(w.delete_().cluster(), kCluster);
    EXPECT_EQ(w.delete_().namespace_(), kNamespace);
  }
}

TEST_F(ReplicationControllerFakeTest, ChangeWhileAWriteIsInFlightIsReconciledAfterItsAnswer) {
  writer_.Hold();
  // One worker: it takes the keys in the order their changes come.
  ASSERT_NO_FATAL_FAILURE(Start({LocalWidget("w1", "10")}, {}, "", /*workers=*/1));
  ASSERT_TRUE(Until([&] { return writer_.Held() == 1; }, "w1's write in flight"));
  v1::Object changed = LocalWidget("w1", "11");
  (*changed.mutable_spec()->mutable_fields())["size"].set_number_value(4);
  ASSERT_TRUE(PushWhenWatching(*local_lw_, WatchEventOf(v1::WatchEvent::MODIFIED, changed)));
  // Another key's change after it: once its write is in flight, the worker has been through
  // w1's change.
  ASSERT_TRUE(
      PushWhenWatching(*local_lw_, WatchEventOf(v1::WatchEvent::ADDED, LocalWidget("w2", "12"))));
  ASSERT_TRUE(Until([&] { return writer_.Held() == 2; }, "w2's write in flight"));
  // A second write of the key waits for the first one's answer.
  EXPECT_EQ(writer_.Upserts("w1"), 1);
  EXPECT_EQ(controller_->Pending(), 2);
  writer_.Release();
  ASSERT_TRUE(Until([&] { return writer_.Upserts("w1") >= 2 && controller_->Pending() == 0; },
                    "the change is written after the answer"));
  v1::Object last_w1;
  for (const v1::WriteRequest& w : writer_.Writes()) {
    if (w.upsert().object().metadata().name() == "w1") last_w1 = w.upsert().object();
  }
  EXPECT_EQ(last_w1.spec().fields().at("size").number_value(), 4);
}

TEST_F(ReplicationControllerFakeTest, UnavailableWritesAreParkedAndFlushedWhenAvailable) {
  writer_.AnswerAll(absl::UnavailableError("the stream broke"));
  ASSERT_NO_FATAL_FAILURE(Start({LocalWidget("w1", "10"), LocalWidget("w2", "10")}, {}));
  ASSERT_TRUE(Until([&] { return writer_.WhenAvailableWaiting() == 1 && !writer_.Available(); },
                    "parked until the cache can be reached"));
  ASSERT_TRUE(Until([&] { return controller_->Pending() == 2; }, "both pending"));
  writer_.AnswerAll(absl::OkStatus());
  // Flushed as soon as the writer can write again: the clock does not move, so no backoff
  // retry can be what writes them.
  int upserts = writer_.Upserts("w1") + writer_.Upserts("w2");
  writer_.SetAvailable();
  ASSERT_TRUE(Until([&] { return controller_->Pending() == 0; }, "flushed"));
  EXPECT_GE(writer_.Upserts("w1") + writer_.Upserts("w2"), upserts + 2);
  EXPECT_GE(writer_.Upserts("w1"), 1);
  EXPECT_GE(writer_.Upserts("w2"), 1);
}

TEST_F(ReplicationControllerFakeTest, OtherErrorsAreRetriedWithBackoff) {
  writer_.AnswerAll(absl::InternalError("disk full"));
  ASSERT_NO_FATAL_FAILURE(Start({LocalWidget("w1", "10")}, {}));
  ASSERT_TRUE(Until([&] { return writer_.Upserts("w1") >= 1; }, "the first attempt"));
  writer_.Drain();
  // The key waits for its backoff: a deadline on the controller's clock, which has not moved.
  ASSERT_TRUE(Until(
      [&] {
        absl::Time next = clock_.NextDeadline();
        return next != absl::InfiniteFuture() && next > clock_.Now();
      },
      "the retry is scheduled"));
  int attempts = writer_.Upserts("w1");
  EXPECT_EQ(writer_.WhenAvailableWaiting(), 0) << "not parked";
  EXPECT_TRUE(writer_.Available());
  EXPECT_EQ(controller_->Pending(), 1);
  writer_.AnswerAll(absl::OkStatus());
  // The retry comes when its backoff has passed on the controller's clock.
  ASSERT_TRUE(Until(
      [&] {
        clock_.Advance(absl::Seconds(1));
        return writer_.Upserts("w1") > attempts && controller_->Pending() == 0;
      },
      "retried"));
}

TEST_F(ReplicationControllerFakeTest, ReplacedCacheMakesEveryKeyPendingAndOldAnswersIgnored) {
  writer_.Hold();
  ASSERT_NO_FATAL_FAILURE(Start({LocalWidget("w1", "10"), LocalWidget("w2", "10")},
                                {Copy(LocalWidget("w2", "10"), "3")}));
  ASSERT_TRUE(Until([&] { return writer_.Held() == 1 && controller_->Pending() == 1; },
                    "w1's write in flight, w2 in sync"));
  // The cache is replaced behind its address: the informer lists another store, which holds
  // nothing.
  cache_lw_->SetListObjects("cache-2", "1", {});
  cache_lw_->SetHeader("cache-2");
  cache_lw_->stream(cache_lw_->streams() - 1)->Break();
  ASSERT_TRUE(Until([&] { return cache_informer_->StoreId() == "cache-2"; }, "the new store"));
  ASSERT_TRUE(Until([&] { return writer_.Upserts("w2") >= 1; }, "w2 written to the new store"));
  // The answer to the write sent before (by the old store) is not taken for a copy in the new
  // one: w1 is written again.
  writer_.Release();
  ASSERT_TRUE(Until([&] { return writer_.Upserts("w1") >= 2 && controller_->Pending() == 0; },
                    "w1 written again"));
}

TEST_F(ReplicationControllerFakeTest, StopsWhenAnInformerStops) {
  ASSERT_NO_FATAL_FAILURE(Start({LocalWidget("w1", "10")}, {}));
  ASSERT_TRUE(Until([&] { return controller_->Pending() == 0; }, "in sync"));
  local_->Stop(absl::NotFoundError("the resource is no longer served"));
  ASSERT_TRUE(Until([&] { return controller_->Stopped(); }, "stopped"));
  EXPECT_TRUE(absl::IsNotFound(controller_->StopReason())) << controller_->StopReason();
  absl::MutexLock l(&mu_);
  ASSERT_TRUE(stopped_with_.has_value());
  EXPECT_TRUE(absl::IsNotFound(*stopped_with_));
}

TEST_F(ReplicationControllerFakeTest, PendingCountsKeysNotKnownInSync) {
  writer_.Hold();
  ASSERT_NO_FATAL_FAILURE(
      Start({LocalWidget("w1", "10"), LocalWidget("w2", "10"), LocalWidget("w3", "10")}, {}));
  ASSERT_TRUE(Until([&] { return writer_.Held() == 3; }, "three writes in flight"));
  EXPECT_EQ(controller_->Pending(), 3);
  EXPECT_EQ(controller_->LocalCount(), 3);
  EXPECT_EQ(controller_->CacheCount(), 0);
  writer_.Release();
  EXPECT_TRUE(Until([&] { return controller_->Pending() == 0; }, "acknowledged"));
}

}  // namespace
}  // namespace shardcache
