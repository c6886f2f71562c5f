#include "bench/h2_client.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cache_server/testing/in_process_server.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::bench {
namespace {

constexpr char kWatch[] = "/shardcache.v1.Store/Watch";
constexpr char kWrite[] = "/shardcache.v1.Store/Write";

// Records what a call receives.
class RecordingCall : public H2Client::Call {
 public:
  void OnHeaders() override {
    absl::MutexLock l(&mu_);
    headers_ = true;
  }
  bool OnMessage(const uint8_t* data, size_t size) override {
    absl::MutexLock l(&mu_);
    messages_.emplace_back(reinterpret_cast<const char*>(data), size);
    return !stop_after_.has_value() || messages_.size() < *stop_after_;
  }
  void OnClosed(const grpc::Status& status) override {
    absl::MutexLock l(&mu_);
    EXPECT_FALSE(status_.has_value()) << "OnClosed twice";
    status_ = status;
  }

  // OnMessage answers false from the n-th message on.
  void StopAfter(size_t n) {
    absl::MutexLock l(&mu_);
    stop_after_ = n;
  }
  // Waits (up to 10 s) until `n` messages have come; returns them.
  std::vector<std::string> WaitForMessages(size_t n) {
    absl::MutexLock l(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return messages_.size() >= n || status_.has_value();
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return messages_;
  }
  // Waits (up to 10 s) for the end.
  std::optional<grpc::Status> WaitForClose() {
    absl::MutexLock l(&mu_);
    auto closed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return status_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&closed), absl::Seconds(10));
    return status_;
  }
  bool headers() {
    absl::MutexLock l(&mu_);
    return headers_;
  }
  bool closed() {
    absl::MutexLock l(&mu_);
    return status_.has_value();
  }

 private:
  absl::Mutex mu_;
  bool headers_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> messages_ ABSL_GUARDED_BY(mu_);
  std::optional<size_t> stop_after_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);
};

v1::GroupVersionResource ConfigMaps() {
  v1::GroupVersionResource r;
  r.set_version("v1");
  r.set_resource("configmaps");
  return r;
}

v1::WatchEvent Parse(const std::string& bytes) {
  v1::WatchEvent event;
  EXPECT_TRUE(event.ParseFromString(bytes));
  return event;
}

void Create(testing::InProcessServer* server, const std::string& name,
            const std::string& payload = "") {
  grpc::ClientContext ctx;
  v1::CreateRequest create;
  *create.mutable_resource() = ConfigMaps();
  create.mutable_object()->mutable_metadata()->set_name(name);
  create.mutable_object()->mutable_metadata()->set_namespace_("default");
  if (!payload.empty()) {
    (*create.mutable_object()->mutable_metadata()->mutable_annotations())["payload"] = payload;
  }
  v1::Object created;
  ASSERT_TRUE(server->stub()->Create(&ctx, create, &created).ok());
}

std::unique_ptr<H2Client> Connect(const testing::InProcessServer& server, int connections = 2) {
  absl::StatusOr<std::unique_ptr<H2Client>> client =
      H2Client::Connect(server.target(), connections, 2);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

std::string WatchRequestBytes() {
  v1::WatchRequest request;
  *request.mutable_resource() = ConfigMaps();
  return request.SerializeAsString();
}

TEST(H2ClientTest, ReadsAServerStreamAndEndsItOnCancel) {
  testing::InProcessServer server({});
  // Declared before the client: they outlive its loop threads.
  RecordingCall call;
  std::unique_ptr<H2Client> client = Connect(server);
  ASSERT_NE(client, nullptr);
  uint64_t id = client->Start(1, kWatch, WatchRequestBytes(), /*half_close=*/true, &call);
  // The initial-events-end bookmark of an empty resource.
  std::vector<std::string> got = call.WaitForMessages(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(Parse(got[0]).type(), v1::WatchEvent::BOOKMARK);
  EXPECT_TRUE(call.headers());
  for (int i = 0; i < 3; ++i) Create(&server, absl::StrCat("cm-", i));
  got = call.WaitForMessages(4);
  ASSERT_EQ(got.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    v1::WatchEvent event = Parse(got[1 + i]);
    EXPECT_EQ(event.type(), v1::WatchEvent::ADDED);
    EXPECT_EQ(event.object().metadata().name(), absl::StrCat("cm-", i));
  }
  client->Cancel(id);
  std::optional<grpc::Status> status = call.WaitForClose();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::CANCELLED);
  // A second Cancel of a call that is over does nothing.
  client->Cancel(id);
}

TEST(H2ClientTest, GivesTheServersStatusAsGrpcDoes) {
  testing::InProcessServer server({});
  // Declared before the client: they outlive its loop threads.
  RecordingCall call;
  std::unique_ptr<H2Client> client = Connect(server);
  ASSERT_NE(client, nullptr);
  // No resource: INVALID_ARGUMENT, as a trailers-only response.
  v1::WatchRequest bad;
  client->Start(0, kWatch, bad.SerializeAsString(), /*half_close=*/true, &call);
  std::optional<grpc::Status> status = call.WaitForClose();
  ASSERT_TRUE(status.has_value());

  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader = server.stub()->Watch(&ctx, bad);
  v1::WatchEvent ignored;
  while (reader->Read(&ignored)) {
  }
  grpc::Status want = reader->Finish();
  ASSERT_FALSE(want.ok());
  EXPECT_EQ(status->error_code(), want.error_code());
  EXPECT_EQ(status->error_message(), want.error_message());
  EXPECT_TRUE(call.WaitForMessages(0).empty());
}

TEST(H2ClientTest, ReassemblesMessagesSplitOverFrames) {
  testing::InProcessServer server({});
  // Larger than an HTTP/2 DATA frame (16 KiB by default): it comes in many.
  std::string payload(200 << 10, 'x');
  for (size_t i = 0; i < payload.size(); i += 7) payload[i] = static_cast<char>('a' + i % 26);
  Create(&server, "big", payload);
  Create(&server, "small");
  // Declared before the client: they outlive its loop threads.
  RecordingCall call;
  std::unique_ptr<H2Client> client = Connect(server, 1);
  ASSERT_NE(client, nullptr);
  client->Start(0, kWatch, WatchRequestBytes(), /*half_close=*/true, &call);
  // The current state (two ADDED, in name order), then the bookmark.
  std::vector<std::string> got = call.WaitForMessages(3);
  ASSERT_EQ(got.size(), 3u);
  v1::WatchEvent big = Parse(got[0]);
  EXPECT_EQ(big.object().metadata().name(), "big");
  EXPECT_EQ(big.object().metadata().annotations().at("payload"), payload);
  EXPECT_EQ(Parse(got[1]).object().metadata().name(), "small");
  EXPECT_EQ(Parse(got[2]).type(), v1::WatchEvent::BOOKMARK);
}

TEST(H2ClientTest, KeepsABidirectionalStreamOpenUnlessAskedToHalfClose) {
  testing::InProcessServer server({});
  // Declared before the client: they outlive its loop threads.
  RecordingCall open;
  RecordingCall closed;
  std::unique_ptr<H2Client> client = Connect(server);
  ASSERT_NE(client, nullptr);
  auto write = [](const std::string& name) {
    v1::WriteRequest request;
    request.set_id(7);
    v1::CreateRequest* create = request.mutable_create();
    *create->mutable_resource() = ConfigMaps();
    create->mutable_object()->mutable_metadata()->set_name(name);
    create->mutable_object()->mutable_metadata()->set_namespace_("default");
    return request.SerializeAsString();
  };
  uint64_t id = client->Start(0, kWrite, write("a"), /*half_close=*/false, &open);
  std::vector<std::string> got = open.WaitForMessages(1);
  ASSERT_EQ(got.size(), 1u);
  v1::WriteResponse answer;
  ASSERT_TRUE(answer.ParseFromString(got[0]));
  EXPECT_EQ(answer.id(), 7);
  EXPECT_EQ(answer.code(), 0) << answer.message();
  // Still open: the server ends a Write stream only after the client has half-closed it.
  EXPECT_FALSE(open.closed());
  client->Cancel(id);
  std::optional<grpc::Status> status = open.WaitForClose();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::CANCELLED);

  client->Start(1, kWrite, write("b"), /*half_close=*/true, &closed);
  status = closed.WaitForClose();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  EXPECT_EQ(closed.WaitForMessages(1).size(), 1u);
}

TEST(H2ClientTest, AFalseOnMessageCancelsTheCall) {
  testing::InProcessServer server({});
  for (int i = 0; i < 5; ++i) Create(&server, absl::StrCat("cm-", i));
  // Declared before the client: they outlive its loop threads.
  RecordingCall call;
  std::unique_ptr<H2Client> client = Connect(server);
  ASSERT_NE(client, nullptr);
  call.StopAfter(2);
  client->Start(0, kWatch, WatchRequestBytes(), /*half_close=*/true, &call);
  std::optional<grpc::Status> status = call.WaitForClose();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(call.WaitForMessages(2).size(), 2u);
}

TEST(H2ClientTest, EndsOpenCallsWhenTheServerGoes) {
  auto server = std::make_unique<testing::InProcessServer>(testing::InProcessServer::Options{});
  // Declared before the client: they outlive its loop threads.
  RecordingCall call;
  RecordingCall late;
  std::unique_ptr<H2Client> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  client->Start(0, kWatch, WatchRequestBytes(), /*half_close=*/true, &call);
  ASSERT_EQ(call.WaitForMessages(1).size(), 1u);
  server.reset();
  std::optional<grpc::Status> status = call.WaitForClose();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAVAILABLE) << status->error_message();
  // A call started on the broken connection ends at once.
  client->Start(0, kWatch, WatchRequestBytes(), /*half_close=*/true, &late);
  status = late.WaitForClose();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAVAILABLE) << status->error_message();
  EXPECT_NE(status->error_message().find("lost"), std::string::npos) << status->error_message();
}

TEST(H2ClientTest, RefusesWhatItCannotConnectTo) {
  absl::StatusOr<std::unique_ptr<H2Client>> client = H2Client::Connect("127.0.0.1:1", 1, 1);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable) << client.status();
  EXPECT_FALSE(H2Client::Connect("no-port", 1, 1).ok());
  EXPECT_FALSE(H2Client::Connect("127.0.0.1:1", 0, 1).ok());
}

}  // namespace
}  // namespace shardcache::bench
