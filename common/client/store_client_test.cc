// StoreClient against a real cache_server (cache role) on loopback ports it picks itself.
#include "common/client/store_client.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/testing/objects.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::BinaryPath;
using ::shardcache::testing::HttpGet;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::ServerProcess;
using ::shardcache::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

v1::GroupVersionResource Widgets() { return testing::Gvr("example.com", "v1", "widgets"); }

v1::Object Widget(const std::string& name, const std::string& spec_json = "{}") {
  v1::Object obj;
  std::string json = absl::StrCat(R"({"metadata":{"cluster":"root","name":")", name,
                                  R"(","labels":{"app":"demo"}},"spec":)", spec_json, "}");
  auto status = google::protobuf::util::JsonStringToMessage(json, &obj);
  EXPECT_TRUE(status.ok()) << status.ToString() << ": " << json;
  return obj;
}

v1::CreateRequest CreateReq(const v1::Object& obj) {
  v1::CreateRequest req;
  *req.mutable_resource() = Widgets();
  *req.mutable_object() = obj;
  return req;
}

v1::UpdateRequest UpdateReq(const v1::Object& obj) {
  v1::UpdateRequest req;
  *req.mutable_resource() = Widgets();
  *req.mutable_object() = obj;
  return req;
}

v1::GetRequest GetReq(const std::string& name) {
  v1::GetRequest req;
  *req.mutable_resource() = Widgets();
  req.set_cluster("root");
  req.set_name(name);
  return req;
}

v1::DeleteRequest DeleteReq(const std::string& name) {
  v1::DeleteRequest req;
  *req.mutable_resource() = Widgets();
  req.set_cluster("root");
  req.set_name(name);
  return req;
}

v1::ClaimEpochRequest ClaimReq(const std::string& shard, int64_t epoch) {
  v1::ClaimEpochRequest req;
  req.mutable_fence()->set_shard(shard);
  req.mutable_fence()->set_epoch(epoch);
  return req;
}

int64_t Revision(const v1::Object& obj) {
  int64_t rv = 0;
  EXPECT_TRUE(absl::SimpleAtoi(obj.metadata().resource_version(), &rv))
      << obj.metadata().resource_version();
  return rv;
}

// The value of shardcache_grpc_requests_total{method, code} in the server's /metrics (0 when the
// series does not exist yet).
double RequestCount(int http_port, const std::string& method, const std::string& code) {
  double count = ::shardcache::testing::Metric(
      http_port, "shardcache_grpc_requests_total",
      {absl::StrCat("method=\"", method, "\""), absl::StrCat("code=\"", code, "\"")});
  return count < 0 ? 0 : count;
}

// Counts the calls started on the channels it makes, by method ("/shardcache.v1.Store/Get"):
// each attempt of a retried call is a call of its own.
class CallCounter : public std::enable_shared_from_this<CallCounter> {
 public:
  // A channel to `address` whose calls are counted; it keeps the counter alive.
  std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
    factories.push_back(std::make_unique<Factory>(shared_from_this()));
    return grpc::experimental::CreateCustomChannelWithInterceptors(
        address, grpc::InsecureChannelCredentials(), grpc::ChannelArguments(),
        std::move(factories));
  }

  int calls(const std::string& method) const {
    absl::MutexLock l(&mu_);
    auto it = calls_.find(method);
    return it == calls_.end() ? 0 : it->second;
  }

 private:
  class Factory : public grpc::experimental::ClientInterceptorFactoryInterface {
   public:
    explicit Factory(std::shared_ptr<CallCounter> counter) : counter_(std::move(counter)) {}
    grpc::experimental::Interceptor* CreateClientInterceptor(
        grpc::experimental::ClientRpcInfo* info) override {
      absl::MutexLock l(&counter_->mu_);
      ++counter_->calls_[info->method()];
      return nullptr;  // counted; nothing to intercept
    }

   private:
    const std::shared_ptr<CallCounter> counter_;
  };

  mutable absl::Mutex mu_;
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
};

class StoreClientTest : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> args = {}) {
    args.insert(args.begin(), "--role=cache");
    server_ = std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"), args);
    ASSERT_THAT(server_->Start(), IsOk());
    // gRPC's default channel: its reconnect backoff (1 s and up) is what the client's retries
    // must get past after a restart.
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
  }

  void TearDown() override {
    // An open connection makes the server's SIGTERM drain take seconds longer: close it first.
    channel_.reset();
    if (server_ != nullptr && server_->Running()) {
      EXPECT_EQ(server_->Stop(), 0) << "cache_server did not exit cleanly on SIGTERM";
    }
  }

  std::unique_ptr<StoreClient> NewClient(StoreClient::Options options = {}) {
    auto client = StoreClient::Create(channel_, options);
    EXPECT_THAT(client, IsOk());
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Options for the retry tests: quick backoff, enough attempts to outlast a restart.
  static StoreClient::Options RetryOptions() {
    StoreClient::Options options;
    options.timeout = absl::Seconds(30);
    options.max_attempts = 200;
    options.backoff.initial = absl::Milliseconds(50);
    options.backoff.max = absl::Milliseconds(200);
    return options;
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(StoreClientTest, Create_InvalidOptions_Refused) {
  StartServer();
  StoreClient::Options options;
  options.max_attempts = 0;
  EXPECT_THAT(StoreClient::Create(channel_, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_attempts")));
  options = {};
  options.backoff.factor = 0.5;
  EXPECT_THAT(StoreClient::Create(channel_, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("factor")));
  options = {};
  options.timeout = absl::ZeroDuration();
  EXPECT_THAT(StoreClient::Create(channel_, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout")));
  EXPECT_THAT(StoreClient::Create(std::shared_ptr<grpc::ChannelInterface>(), {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StoreClientTest, Crud_TypedCalls_RoundTripWithServerCodes) {
  StartServer();
  auto client = NewClient();
  ASSERT_NE(client, nullptr);

  absl::StatusOr<v1::Object> created = client->Create(CreateReq(Widget("w1", R"({"size":1})")));
  ASSERT_THAT(created, IsOk());
  EXPECT_EQ(created->metadata().name(), "w1");
  EXPECT_FALSE(created->metadata().uid().empty());
  EXPECT_EQ(created->metadata().generation(), 1);
  int64_t rv1 = Revision(*created);

  absl::StatusOr<v1::Object> got = client->Get(GetReq("w1"));
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->metadata().resource_version(), created->metadata().resource_version());
  EXPECT_EQ(got->spec().fields().at("size").number_value(), 1);

  // Create again: the server's code and message, unchanged.
  EXPECT_THAT(client->Create(CreateReq(Widget("w1"))),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("w1")));
  EXPECT_THAT(client->Get(GetReq("nope")), StatusIs(absl::StatusCode::kNotFound));

  v1::Object changed = *got;
  (*changed.mutable_spec()->mutable_fields())["size"].set_number_value(2);
  changed.mutable_metadata()->set_generation(0);  // the cache keeps a writer-supplied one
  absl::StatusOr<v1::Object> updated = client->Update(UpdateReq(changed));
  ASSERT_THAT(updated, IsOk());
  EXPECT_GT(Revision(*updated), rv1);
  EXPECT_EQ(updated->metadata().generation(), 2);

  v1::Object with_status = *updated;
  (*with_status.mutable_status()->mutable_fields())["ready"].set_bool_value(true);
  absl::StatusOr<v1::Object> status_updated = client->UpdateStatus(UpdateReq(with_status));
  ASSERT_THAT(status_updated, IsOk());
  EXPECT_GT(Revision(*status_updated), Revision(*updated));
  EXPECT_TRUE(status_updated->status().fields().at("ready").bool_value());

  // A stale resourceVersion is a conflict.
  EXPECT_THAT(client->Update(UpdateReq(changed)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("resourceVersion")));

  v1::DeleteRequest del = DeleteReq("w1");
  del.mutable_preconditions()->set_resource_version(status_updated->metadata().resource_version());
  absl::StatusOr<v1::DeleteResponse> deleted = client->Delete(del);
  ASSERT_THAT(deleted, IsOk());
  EXPECT_TRUE(deleted->deleted());
  EXPECT_EQ(deleted->object().metadata().name(), "w1");
  EXPECT_THAT(client->Get(GetReq("w1")), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client->Delete(DeleteReq("w1")), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(StoreClientTest, List_OnePage_ReturnsContinueToken) {
  StartServer();
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 10; ++i) {
    ASSERT_THAT(client->Create(CreateReq(Widget(absl::StrCat("w", i)))), IsOk());
  }
  v1::ListRequest req;
  *req.mutable_resource() = Widgets();
  req.set_limit(4);
  absl::StatusOr<v1::ListResponse> page = client->List(req);
  ASSERT_THAT(page, IsOk());
  EXPECT_EQ(page->items_size(), 4);
  EXPECT_FALSE(page->continue_token().empty());
  EXPECT_FALSE(page->resource_version().empty());
}

TEST_F(StoreClientTest, ListAll_FollowsContinueTokens_AllItemsAtOneRevision) {
  StartServer();
  StoreClient::Options options;
  options.list_page_size = 7;
  auto client = NewClient(options);
  ASSERT_NE(client, nullptr);
  int64_t last_rv = 0;
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<v1::Object> created =
        client->Create(CreateReq(Widget(absl::StrCat("w", 100 + i))));
    ASSERT_THAT(created, IsOk());
    last_rv = Revision(*created);
  }
  double lists_before = RequestCount(server_->http_port(), "List", "OK");

  v1::ListRequest req;
  *req.mutable_resource() = Widgets();
  absl::StatusOr<StoreClient::ListResult> all = client->ListAll(req);
  ASSERT_THAT(all, IsOk());
  ASSERT_EQ(all->items.size(), 50u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(all->items[i].metadata().name(), absl::StrCat("w", 100 + i));
  }
  EXPECT_EQ(all->resource_version, absl::StrCat(last_rv));
  // 50 items in pages of 7: 8 List calls.
  EXPECT_EQ(RequestCount(server_->http_port(), "List", "OK") - lists_before, 8);

  // A label selector that matches nothing: one empty page.
  req.set_label_selector("app=other");
  all = client->ListAll(req);
  ASSERT_THAT(all, IsOk());
  EXPECT_TRUE(all->items.empty());
}

TEST_F(StoreClientTest, Get_ServerPaused_FailsWithDeadlineExceededWithinItsDeadline) {
  StartServer();
  StoreClient::Options options;
  options.timeout = absl::Seconds(1);
  auto client = NewClient(options);
  ASSERT_NE(client, nullptr);
  ASSERT_THAT(client->Create(CreateReq(Widget("w1"))), IsOk());

  ASSERT_TRUE(server_->Pause());
  absl::Time start = absl::Now();
  absl::StatusOr<v1::Object> got = client->Get(GetReq("w1"));
  absl::Duration took = absl::Now() - start;
  server_->Signal(SIGCONT);
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(3)) << "the call outlived its 1 s deadline";

  // Resumed, it serves again (a longer deadline: the machine may be busy).
  StoreClient::Options patient;
  patient.timeout = absl::Seconds(20);
  auto resumed = NewClient(patient);
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(resumed->Get(GetReq("w1")), IsOk());
}

TEST_F(StoreClientTest, Get_AttemptTimeout_RetriesWithinTheCallDeadline) {
  StartServer();
  StoreClient::Options options;
  options.timeout = absl::Seconds(20);
  options.attempt_timeout = absl::Milliseconds(300);
  options.max_attempts = 100;
  // A channel that counts the attempts.
  auto counter = std::make_shared<CallCounter>();
  channel_ = counter->Channel(server_->grpc_address());
  auto client = NewClient(options);
  ASSERT_NE(client, nullptr);
  ASSERT_THAT(client->Create(CreateReq(Widget("w1"))), IsOk());

  // Paused: attempts time out and are retried; resumed: the next attempt succeeds.
  ASSERT_TRUE(server_->Pause());
  const int gets_before = counter->calls("/shardcache.v1.Store/Get");
  absl::StatusOr<v1::Object> got;
  std::thread reader([&] { got = client->Get(GetReq("w1")); });
  // Several attempts' worth of a pause: three attempts started, so two timed out.
  EXPECT_TRUE(testing::Eventually(
      [&] { return counter->calls("/shardcache.v1.Store/Get") >= gets_before + 3; },
      "three attempts of the Get",
      [&] { return absl::StrCat(counter->calls("/shardcache.v1.Store/Get") - gets_before); }));
  server_->Signal(SIGCONT);
  reader.join();
  EXPECT_THAT(got, IsOk());
}

TEST_F(StoreClientTest, Get_AcrossServerRestart_RetriesAndSucceeds) {
  StartServer();
  auto client = NewClient(RetryOptions());
  ASSERT_NE(client, nullptr);
  ASSERT_THAT(client->Create(CreateReq(Widget("w1"))), IsOk());
  ASSERT_EQ(server_->Stop(), 0);

  // With one attempt, the stopped server is UNAVAILABLE.
  StoreClient::Options once = RetryOptions();
  once.max_attempts = 1;
  auto single = NewClient(once);
  ASSERT_NE(single, nullptr);
  EXPECT_THAT(single->Get(GetReq("w1")), StatusIs(absl::StatusCode::kUnavailable));

  absl::StatusOr<v1::Object> got;
  absl::Notification done;
  std::thread reader([&] {
    got = client->Get(GetReq("w1"));
    done.Notify();
  });
  // Restart on the same port and data directory while the Get is retrying.
  ASSERT_THAT(server_->Start(), IsOk());
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(40)));
  reader.join();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->metadata().name(), "w1");
}

TEST_F(StoreClientTest, Update_WithResourceVersion_RetriedAcrossRestart) {
  StartServer();
  auto client = NewClient(RetryOptions());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::Object> created = client->Create(CreateReq(Widget("w1", R"({"n":1})")));
  ASSERT_THAT(created, IsOk());
  ASSERT_EQ(server_->Stop(), 0);

  v1::Object changed = *created;  // carries its resourceVersion: safe to retry
  (*changed.mutable_spec()->mutable_fields())["n"].set_number_value(2);
  absl::StatusOr<v1::Object> updated;
  absl::Notification done;
  std::thread writer([&] {
    updated = client->Update(UpdateReq(changed));
    done.Notify();
  });
  ASSERT_THAT(server_->Start(), IsOk());
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(40)));
  writer.join();
  ASSERT_THAT(updated, IsOk());
  EXPECT_EQ(updated->spec().fields().at("n").number_value(), 2);
}

TEST_F(StoreClientTest, Update_WithoutResourceVersion_ServerDown_NotRetried) {
  StartServer();
  StoreClient::Options options = RetryOptions();
  options.max_attempts = 3;
  auto client = NewClient(options);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::Object> created = client->Create(CreateReq(Widget("w1")));
  ASSERT_THAT(created, IsOk());
  ASSERT_EQ(server_->Stop(), 0);

  v1::Object blind = *created;
  blind.mutable_metadata()->clear_resource_version();
  // A single attempt: the message has no "gave up after" note.
  EXPECT_THAT(client->Update(UpdateReq(blind)),
              StatusIs(absl::StatusCode::kUnavailable, Not(HasSubstr("gave up"))));
  EXPECT_THAT(client->Delete(DeleteReq("w1")),
              StatusIs(absl::StatusCode::kUnavailable, Not(HasSubstr("gave up"))));
  // A create is safe to retry: it is, until the attempts run out.
  EXPECT_THAT(client->Create(CreateReq(Widget("w2"))),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("gave up after 3 attempts")));
  // So is a read.
  EXPECT_THAT(client->Get(GetReq("w1")),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("gave up after 3 attempts")));
  // And a claim: claiming the same epoch again succeeds.
  EXPECT_THAT(client->ClaimEpoch(ClaimReq("a", 1)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("gave up after 3 attempts")));
}

TEST_F(StoreClientTest, ClaimEpoch_EqualOrHigherSucceeds_LowerIsFencedAndNotRetried) {
  StartServer();
  auto client = NewClient(RetryOptions());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::ClaimEpochResponse> claimed = client->ClaimEpoch(ClaimReq("a", 3));
  ASSERT_THAT(claimed, IsOk());
  EXPECT_EQ(claimed->epoch(), 3);
  claimed = client->ClaimEpoch(ClaimReq("a", 3));
  ASSERT_THAT(claimed, IsOk());
  EXPECT_EQ(claimed->epoch(), 3);
  EXPECT_THAT(client->ClaimEpoch(ClaimReq("a", 2)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("shard \"a\" is at epoch 3 and this claim carries epoch 2")));
  EXPECT_THAT(client->ClaimEpoch(ClaimReq("a", 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fence.epoch")));
  // Each answered once: neither error was retried.
  EXPECT_EQ(RequestCount(server_->http_port(), "ClaimEpoch", "OK"), 2);
  EXPECT_EQ(RequestCount(server_->http_port(), "ClaimEpoch", "FAILED_PRECONDITION"), 1);
  EXPECT_EQ(RequestCount(server_->http_port(), "ClaimEpoch", "INVALID_ARGUMENT"), 1);
}

TEST_F(StoreClientTest, ClaimEpoch_RetriedAcrossRestart) {
  StartServer();
  auto client = NewClient(RetryOptions());
  ASSERT_NE(client, nullptr);
  ASSERT_THAT(client->ClaimEpoch(ClaimReq("a", 3)), IsOk());
  ASSERT_EQ(server_->Stop(), 0);

  absl::StatusOr<v1::ClaimEpochResponse> claimed;
  absl::Notification done;
  std::thread claimer([&] {
    claimed = client->ClaimEpoch(ClaimReq("a", 4));
    done.Notify();
  });
  ASSERT_THAT(server_->Start(), IsOk());
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(40)));
  claimer.join();
  ASSERT_THAT(claimed, IsOk());
  EXPECT_EQ(claimed->epoch(), 4);
  EXPECT_THAT(client->ClaimEpoch(ClaimReq("a", 3)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("at epoch 4")));
}

TEST_F(StoreClientTest, Update_Conflict_AbortedIsNotRetried) {
  StartServer();
  auto client = NewClient(RetryOptions());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::Object> created = client->Create(CreateReq(Widget("w1", R"({"n":1})")));
  ASSERT_THAT(created, IsOk());
  v1::Object first = *created;
  (*first.mutable_spec()->mutable_fields())["n"].set_number_value(2);
  ASSERT_THAT(client->Update(UpdateReq(first)), IsOk());

  v1::Object stale = *created;
  (*stale.mutable_spec()->mutable_fields())["n"].set_number_value(3);
  EXPECT_THAT(client->Update(UpdateReq(stale)), StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(RequestCount(server_->http_port(), "Update", "ABORTED"), 1);

  v1::DeleteRequest del = DeleteReq("w1");
  del.mutable_preconditions()->set_resource_version(created->metadata().resource_version());
  EXPECT_THAT(client->Delete(del), StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(RequestCount(server_->http_port(), "Delete", "ABORTED"), 1);

  v1::UpdateRequest bad = UpdateReq(stale);
  bad.mutable_object()->mutable_metadata()->set_name("Not_A_Name");
  EXPECT_THAT(client->Update(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(RequestCount(server_->http_port(), "Update", "INVALID_ARGUMENT"), 1);
}

// Reads events until `pred` holds for one (true) or the stream ends (false).
template <typename Pred>
bool ReadUntil(WatchStream* stream, Pred pred, std::vector<v1::WatchEvent>* seen = nullptr) {
  v1::WatchEvent event;
  while (stream->Next(&event)) {
    if (seen != nullptr) seen->push_back(event);
    if (pred(event)) return true;
  }
  return false;
}

TEST_F(StoreClientTest, Watch_InitialEventsBookmarkThenChanges) {
  StartServer();
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_THAT(client->Create(CreateReq(Widget("w1"))), IsOk());
  ASSERT_THAT(client->Create(CreateReq(Widget("w2"))), IsOk());

  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  std::unique_ptr<WatchStream> watch = client->OpenWatch(req, absl::Seconds(20));
  std::vector<v1::WatchEvent> seen;
  ASSERT_TRUE(ReadUntil(
      watch.get(), [](const v1::WatchEvent& e) { return e.type() == v1::WatchEvent::BOOKMARK; },
      &seen))
      << watch->Finish();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].type(), v1::WatchEvent::ADDED);
  EXPECT_EQ(seen[0].object().metadata().name(), "w1");
  EXPECT_EQ(seen[1].object().metadata().name(), "w2");

  ASSERT_THAT(client->Delete(DeleteReq("w1")), IsOk());
  ASSERT_TRUE(ReadUntil(watch.get(), [](const v1::WatchEvent& e) {
    return e.type() == v1::WatchEvent::DELETED && e.object().metadata().name() == "w1";
  })) << watch->Finish();
  EXPECT_THAT(watch->Finish(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(watch->Finish(), StatusIs(absl::StatusCode::kCancelled));  // idempotent
}

TEST_F(StoreClientTest, Watch_CancelFromAnotherThread_EndsBlockedNext) {
  StartServer();
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  std::unique_ptr<WatchStream> watch = client->OpenWatch(req, absl::Seconds(30));
  watch->Cancel();  // harmless before anything was read, and twice
  watch->Cancel();

  std::unique_ptr<WatchStream> second = client->OpenWatch(req, absl::Seconds(30));
  absl::Notification synced, ended;
  std::thread reader([&] {
    ReadUntil(second.get(), [&](const v1::WatchEvent& e) {
      if (e.type() == v1::WatchEvent::BOOKMARK && !synced.HasBeenNotified()) synced.Notify();
      return false;
    });
    ended.Notify();
  });
  ASSERT_TRUE(synced.WaitForNotificationWithTimeout(absl::Seconds(10)));
  second->Cancel();
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  reader.join();
  EXPECT_THAT(second->Finish(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(watch->Finish(), StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(StoreClientTest, Watch_ClientDestroyed_EndsTheStream) {
  StartServer();
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  std::unique_ptr<WatchStream> watch = client->OpenWatch(req, absl::Seconds(30));
  ASSERT_TRUE(ReadUntil(
      watch.get(), [](const v1::WatchEvent& e) { return e.type() == v1::WatchEvent::BOOKMARK; }));
  absl::Notification ended;
  std::thread reader([&] {
    ReadUntil(watch.get(), [](const v1::WatchEvent&) { return false; });
    ended.Notify();
  });
  client.reset();
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  reader.join();
  EXPECT_THAT(watch->Finish(), StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(StoreClientTest, Watch_TooOldResourceVersion_FinishReturnsOutOfRange) {
  StartServer({"--history-events=3"});
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 10; ++i) {
    ASSERT_THAT(client->Create(CreateReq(Widget(absl::StrCat("w", i)))), IsOk());
  }
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  req.set_resource_version("2");
  std::unique_ptr<WatchStream> watch = client->OpenWatch(req, absl::Seconds(10));
  v1::WatchEvent event;
  EXPECT_FALSE(watch->Next(&event));
  EXPECT_THAT(watch->Finish(), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("too old")));
}

TEST_F(StoreClientTest, Watch_ServerDown_FinishReturnsUnavailable) {
  StartServer();
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_EQ(server_->Stop(), 0);
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  std::unique_ptr<WatchStream> watch = client->OpenWatch(req, absl::Seconds(10));
  v1::WatchEvent event;
  EXPECT_FALSE(watch->Next(&event));
  EXPECT_THAT(watch->Finish(), StatusIs(absl::StatusCode::kUnavailable));
}

// A server that stops answering without closing the connection (SIGSTOP: the kernel keeps TCP
// up) while a watch is open and quiet: the channel's keepalive pings go unanswered, the
// connection is closed, and the watch ends with UNAVAILABLE instead of waiting for ever.
TEST_F(StoreClientTest, Keepalive_PausedServer_EndsTheWatch) {
  // No bookmarks for an hour: nothing but keepalive can notice.
  StartServer({"--bookmark-interval=1h", "--keepalive-min-client-interval=100ms"});
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateStoreChannel(
      server_->grpc_address(), {absl::Milliseconds(300), absl::Milliseconds(300)});
  ASSERT_THAT(channel, IsOk());
  channel_ = *channel;
  std::unique_ptr<StoreClient> client = NewClient();
  v1::WatchRequest req;
  *req.mutable_resource() = Widgets();
  std::unique_ptr<WatchStream> watch = client->OpenWatch(req);
  v1::WatchEvent event;
  ASSERT_TRUE(watch->Next(&event));  // the bookmark that ends the (empty) initial events
  ASSERT_EQ(event.type(), v1::WatchEvent::BOOKMARK);
  EXPECT_FALSE(event.store_id().empty());

  ASSERT_TRUE(server_->Pause());
  absl::Notification ended;
  std::thread reader([&] {
    v1::WatchEvent ignored;
    while (watch->Next(&ignored)) {
    }
    ended.Notify();
  });
  bool detected = ended.WaitForNotificationWithTimeout(absl::Seconds(20));
  if (!detected) watch->Cancel();
  reader.join();
  EXPECT_TRUE(detected) << "the watch on a paused server never ended";
  if (detected) {
    EXPECT_THAT(watch->Finish(), StatusIs(absl::StatusCode::kUnavailable));
  }
  watch.reset();
  server_->Signal(SIGCONT);
}

TEST(StoreChannelArgumentsTest, RejectsTimesOutOfRange) {
  EXPECT_THAT(StoreChannelArguments({absl::ZeroDuration(), absl::Seconds(5)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keepalive.time")));
  EXPECT_THAT(StoreChannelArguments({absl::Seconds(10), absl::Hours(25)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keepalive.timeout")));
  EXPECT_THAT(StoreChannelArguments({}), IsOk());
}

}  // namespace
}  // namespace shardcache
