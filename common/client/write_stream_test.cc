// WriteStream against a real cache_server (cache role) on loopback ports it picks itself.
#include "common/client/write_stream.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/client/store_client.h"
#include "common/testing/objects.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"

namespace shardcache {
namespace {

using ::shardcache::testing::BinaryPath;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::ServerProcess;
using ::shardcache::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kOk = 0;
constexpr int kAlreadyExists = static_cast<int>(absl::StatusCode::kAlreadyExists);
constexpr int kAborted = static_cast<int>(absl::StatusCode::kAborted);
constexpr int kFailedPrecondition = static_cast<int>(absl::StatusCode::kFailedPrecondition);
constexpr int kUnavailable = static_cast<int>(absl::StatusCode::kUnavailable);
constexpr int kCancelled = static_cast<int>(absl::StatusCode::kCancelled);

v1::GroupVersionResource Widgets() { return testing::Gvr("example.com", "v1", "widgets"); }

v1::Object Widget(const std::string& name, int n) {
  v1::Object obj;
  std::string json = absl::StrCat(R"({"metadata":{"cluster":"root","name":")", name,
                                  R"("},"spec":{"n":)", n, "}}");
  auto status = google::protobuf::util::JsonStringToMessage(json, &obj);
  EXPECT_TRUE(status.ok()) << status.ToString() << ": " << json;
  return obj;
}

v1::WriteRequest Upsert(const std::string& name, int n) {
  v1::WriteRequest req;
  *req.mutable_upsert()->mutable_resource() = Widgets();
  *req.mutable_upsert()->mutable_object() = Widget(name, n);
  return req;
}

v1::WriteRequest CreateWrite(const std::string& name, int n) {
  v1::WriteRequest req;
  *req.mutable_create()->mutable_resource() = Widgets();
  *req.mutable_create()->mutable_object() = Widget(name, n);
  return req;
}

int64_t Revision(const v1::WriteResponse& answer) {
  int64_t rv = 0;
  EXPECT_TRUE(absl::SimpleAtoi(answer.object().metadata().resource_version(), &rv))
      << answer.ShortDebugString();
  return rv;
}

// Collects answers from any thread; waits are bounded. The callbacks share its state, so that a
// stream that outlives it (a test that stops at a failed ASSERT) can still answer into them.
class Answers {
 public:
  WriteStream::AnswerCallback Callback() {
    return [state = state_](const v1::WriteResponse& answer) {
      absl::MutexLock l(&state->mu);
      state->answers.push_back(answer);
    };
  }
  // Waits until at least `n` answers have arrived.
  bool WaitFor(size_t n, absl::Duration timeout = absl::Seconds(30)) {
    State& s = *state_;
    absl::MutexLock l(&s.mu);
    auto enough = [&s, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return s.answers.size() >= n; };
    return s.mu.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::vector<v1::WriteResponse> Get() {
    absl::MutexLock l(&state_->mu);
    return state_->answers;
  }

 private:
  struct State {
    absl::Mutex mu;
    std::vector<v1::WriteResponse> answers ABSL_GUARDED_BY(mu);
  };
  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

class WriteStreamTest : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> args = {}) {
    args.insert(args.begin(), "--role=cache");
    server_ = std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"), args);
    ASSERT_THAT(server_->Start(), IsOk());
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Store::NewStub(channel_);
  }

  void TearDown() override {
    // An open connection makes the server's SIGTERM drain take seconds longer: close it first.
    stub_.reset();
    channel_.reset();
    if (server_ != nullptr && server_->Running()) {
      EXPECT_EQ(server_->Stop(), 0) << "cache_server did not exit cleanly on SIGTERM";
    }
  }

  std::unique_ptr<WriteStream> Open(WriteStream::Options options = {}) {
    auto stream = WriteStream::Open(stub_, options);
    EXPECT_THAT(stream, IsOk());
    return stream.ok() ? std::move(*stream) : nullptr;
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::Store::StubInterface> stub_;
};

TEST_F(WriteStreamTest, Open_InvalidOptions_Refused) {
  StartServer();
  WriteStream::Options options;
  options.window = 0;
  EXPECT_THAT(WriteStream::Open(stub_, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("window")));
  EXPECT_THAT(WriteStream::Open(nullptr, {}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(WriteStreamTest, Pipeline_1000Writes_AnsweredInOrderWithRisingRevisions) {
  StartServer();
  WriteStream::Options options;
  options.window = 64;
  auto stream = Open(options);
  ASSERT_NE(stream, nullptr);
  Answers answers;
  int max_outstanding = 0;
  for (int i = 0; i < 1000; ++i) {
    v1::WriteRequest req = Upsert(absl::StrCat("w", i % 10), i);
    req.set_id(424242);  // replaced by the stream
    ASSERT_THAT(stream->Send(req, answers.Callback()), IsOk()) << "write " << i;
    max_outstanding = std::max(max_outstanding, stream->outstanding());
  }
  EXPECT_LE(max_outstanding, 64);
  EXPECT_THAT(stream->Close(), IsOk());
  EXPECT_FALSE(stream->Broken());

  std::vector<v1::WriteResponse> got = answers.Get();
  ASSERT_EQ(got.size(), 1000u);
  int64_t last_rv = 0;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(got[i].id(), i + 1);
    EXPECT_EQ(got[i].code(), kOk) << got[i].message();
    EXPECT_EQ(got[i].object().spec().fields().at("n").number_value(), i);
    int64_t rv = Revision(got[i]);
    EXPECT_GT(rv, last_rv) << "write " << i + 1;
    last_rv = rv;
  }
}

TEST_F(WriteStreamTest, FailedWrites_AnsweredWithTheirCodes_StreamGoesOn) {
  StartServer();
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  Answers answers;
  ASSERT_THAT(stream->Send(CreateWrite("a", 1), answers.Callback()), IsOk());
  ASSERT_THAT(stream->Send(CreateWrite("a", 2), answers.Callback()), IsOk());  // exists
  v1::WriteRequest stale = Upsert("a", 3);
  stale.mutable_upsert()->mutable_object()->mutable_metadata()->set_resource_version("1");
  ASSERT_THAT(stream->Send(stale, answers.Callback()), IsOk());  // conflict
  v1::WriteRequest bad = Upsert("Bad_Name", 4);
  ASSERT_THAT(stream->Send(bad, answers.Callback()), IsOk());                 // invalid
  ASSERT_THAT(stream->Send(v1::WriteRequest(), answers.Callback()), IsOk());  // no operation
  ASSERT_THAT(stream->Send(CreateWrite("b", 5), answers.Callback()), IsOk());
  v1::WriteRequest del;
  *del.mutable_delete_()->mutable_resource() = Widgets();
  del.mutable_delete_()->set_cluster("root");
  del.mutable_delete_()->set_name("a");
  ASSERT_THAT(stream->Send(del, answers.Callback()), IsOk());
  EXPECT_THAT(stream->Close(), IsOk());

  std::vector<v1::WriteResponse> got = answers.Get();
  ASSERT_EQ(got.size(), 7u);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(got[i].id(), i + 1);
  EXPECT_EQ(got[0].code(), kOk);
  EXPECT_EQ(got[1].code(), kAlreadyExists) << got[1].message();
  EXPECT_EQ(got[2].code(), kAborted) << got[2].message();
  EXPECT_EQ(got[3].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(got[3].message(), HasSubstr("metadata.name"));
  EXPECT_EQ(got[4].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(got[5].code(), kOk) << got[5].message();
  EXPECT_EQ(got[6].code(), kOk) << got[6].message();
  EXPECT_TRUE(got[6].deleted());
}

TEST_F(WriteStreamTest, FencedWrite_AnsweredFailedPrecondition) {
  StartServer();
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  Answers answers;
  auto fenced = [](const std::string& name, int64_t epoch) {
    v1::WriteRequest req = Upsert(name, static_cast<int>(epoch));
    req.mutable_upsert()->mutable_fence()->set_shard("a");
    req.mutable_upsert()->mutable_fence()->set_epoch(epoch);
    return req;
  };
  ASSERT_THAT(stream->Send(fenced("x", 2), answers.Callback()), IsOk());
  ASSERT_THAT(stream->Send(fenced("y", 1), answers.Callback()), IsOk());  // an older leader
  ASSERT_THAT(stream->Send(fenced("z", 2), answers.Callback()), IsOk());
  EXPECT_THAT(stream->Close(), IsOk());
  std::vector<v1::WriteResponse> got = answers.Get();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].code(), kOk) << got[0].message();
  EXPECT_EQ(got[1].code(), kFailedPrecondition);
  EXPECT_THAT(got[1].message(), HasSubstr("fenced"));
  EXPECT_EQ(got[2].code(), kOk) << got[2].message();
}

TEST_F(WriteStreamTest, ServerKilled_OutstandingAnsweredUnavailableOnce_ThenReopen) {
  StartServer();
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  Answers answers;
  for (int i = 0; i < 20; ++i) {
    ASSERT_THAT(stream->Send(Upsert("w", i), answers.Callback()), IsOk());
  }
  ASSERT_TRUE(answers.WaitFor(20));
  // Paused, the server answers nothing: these stay outstanding until it is killed.
  ASSERT_TRUE(server_->Pause());
  for (int i = 20; i < 50; ++i) {
    ASSERT_THAT(stream->Send(Upsert("w", i), answers.Callback()), IsOk());
  }
  EXPECT_EQ(stream->outstanding(), 30);
  server_->Signal(SIGKILL);
  EXPECT_NE(server_->Wait(absl::Seconds(10)), -1);
  ASSERT_TRUE(answers.WaitFor(50));

  std::vector<v1::WriteResponse> got = answers.Get();
  std::map<int64_t, int> per_id;
  for (const auto& a : got) ++per_id[a.id()];
  for (int64_t id = 1; id <= 50; ++id) EXPECT_EQ(per_id[id], 1) << "write " << id;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(got[i].code(), kOk);
  for (int i = 20; i < 50; ++i) {
    EXPECT_EQ(got[i].id(), i + 1);
    EXPECT_EQ(got[i].code(), kUnavailable) << got[i].message();
    EXPECT_THAT(got[i].message(), HasSubstr("may or may not have been applied"));
  }
  EXPECT_TRUE(stream->Broken());
  EXPECT_THAT(stream->Send(Upsert("w", 99), answers.Callback()),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(stream->Close(absl::Seconds(5)), StatusIs(absl::StatusCode::kUnavailable));
  // Destroyed, the stream has finished with gRPC: no callback of it can run any more.
  stream.reset();
  EXPECT_EQ(answers.Get().size(), 50u) << "an answer came twice, or for a failed Send";

  // The user reconnects: once the channel is connected again, a new stream on it.
  ASSERT_THAT(server_->Start(), IsOk());
  ASSERT_TRUE(channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(20))));
  auto next = Open();
  ASSERT_NE(next, nullptr);
  Answers again;
  ASSERT_THAT(next->Send(Upsert("w", 100), again.Callback()), IsOk());
  EXPECT_THAT(next->Close(), IsOk());
  std::vector<v1::WriteResponse> got_again = again.Get();
  ASSERT_EQ(got_again.size(), 1u);
  EXPECT_EQ(got_again[0].id(), 1);
  EXPECT_EQ(got_again[0].code(), kOk) << got_again[0].message();
}

TEST_F(WriteStreamTest, ServerDrains_OpenStreamBreaksUnavailable) {
  StartServer({"--drain-timeout=1s"});
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  Answers answers;
  ASSERT_THAT(stream->Send(Upsert("w", 1), answers.Callback()), IsOk());
  ASSERT_TRUE(answers.WaitFor(1));
  // SIGTERM: the server drains, then ends the calls still open (this one).
  EXPECT_EQ(server_->Stop(), 0);
  EXPECT_THAT(stream->Close(absl::Seconds(10)), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(stream->Broken());
  EXPECT_THAT(stream->Send(Upsert("w", 2), nullptr), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(WriteStreamTest, WindowFull_TrySendExhausted_SendTimesOut) {
  StartServer();
  WriteStream::Options options;
  options.window = 4;
  auto stream = Open(options);
  ASSERT_NE(stream, nullptr);
  Answers answers;
  ASSERT_TRUE(server_->Pause());
  for (int i = 0; i < 4; ++i) {
    ASSERT_THAT(stream->TrySend(Upsert("w", i), answers.Callback()), IsOk());
  }
  EXPECT_THAT(stream->TrySend(Upsert("w", 4), answers.Callback()),
              StatusIs(absl::StatusCode::kResourceExhausted));
  absl::Time start = absl::Now();
  EXPECT_THAT(stream->Send(Upsert("w", 4), answers.Callback(), start + absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(290));
  server_->Signal(SIGCONT);
  // Room opens as answers come: a blocked Send goes through.
  ASSERT_THAT(stream->Send(Upsert("w", 5), answers.Callback()), IsOk());
  EXPECT_THAT(stream->Close(), IsOk());
  std::vector<v1::WriteResponse> got = answers.Get();
  ASSERT_EQ(got.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(got[i].id(), i + 1);
    EXPECT_EQ(got[i].code(), kOk) << got[i].message();
  }
}

TEST_F(WriteStreamTest, Cancel_OutstandingAnsweredCancelled) {
  StartServer();
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  Answers answers;
  ASSERT_TRUE(server_->Pause());
  for (int i = 0; i < 10; ++i) {
    ASSERT_THAT(stream->Send(Upsert("w", i), answers.Callback()), IsOk());
  }
  stream->Cancel();
  ASSERT_TRUE(answers.WaitFor(10));
  server_->Signal(SIGCONT);
  for (const auto& a : answers.Get()) EXPECT_EQ(a.code(), kCancelled) << a.message();
  EXPECT_TRUE(stream->Broken());
  EXPECT_THAT(stream->Send(Upsert("w", 11), nullptr), StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(WriteStreamTest, Close_ServerPaused_TimesOutAndCancels) {
  StartServer();
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  Answers answers;
  ASSERT_TRUE(server_->Pause());
  ASSERT_THAT(stream->Send(Upsert("w", 1), answers.Callback()), IsOk());
  EXPECT_THAT(stream->Close(absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("1 writes unanswered")));
  server_->Signal(SIGCONT);
  std::vector<v1::WriteResponse> got = answers.Get();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].code(), kCancelled);
  EXPECT_THAT(stream->Close(), StatusIs(absl::StatusCode::kDeadlineExceeded));  // same again
}

TEST_F(WriteStreamTest, Destroyed_WithoutClose_AnswersEveryWrite) {
  StartServer();
  Answers answers;
  {
    auto stream = Open();
    ASSERT_NE(stream, nullptr);
    ASSERT_TRUE(server_->Pause());
    for (int i = 0; i < 5; ++i) {
      ASSERT_THAT(stream->Send(Upsert("w", i), answers.Callback()), IsOk());
    }
  }
  server_->Signal(SIGCONT);
  std::vector<v1::WriteResponse> got = answers.Get();
  ASSERT_EQ(got.size(), 5u);
  for (const auto& a : got) EXPECT_EQ(a.code(), kCancelled);
}

TEST_F(WriteStreamTest, SendAfterClose_FailedPrecondition) {
  StartServer();
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  EXPECT_THAT(stream->Close(), IsOk());
  EXPECT_THAT(stream->Send(Upsert("w", 1), nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(stream->Broken());
}

TEST_F(WriteStreamTest, ServerDown_WritesAnsweredUnavailable) {
  StartServer();
  ASSERT_EQ(server_->Stop(), 0);
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  Answers answers;
  absl::Status sent = stream->Send(Upsert("w", 1), answers.Callback());
  if (sent.ok()) {
    ASSERT_TRUE(answers.WaitFor(1));
    EXPECT_EQ(answers.Get()[0].code(), kUnavailable) << answers.Get()[0].message();
  } else {
    EXPECT_THAT(sent, StatusIs(absl::StatusCode::kUnavailable));
  }
  EXPECT_THAT(stream->Close(absl::Seconds(10)), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(stream->Broken());
}

TEST_F(WriteStreamTest, OpenedFromStoreClient_SharesItsChannel) {
  StartServer();
  auto client = StoreClient::Create(stub_, StoreClient::Options{});
  ASSERT_THAT(client, IsOk());
  auto stream = WriteStream::Open((*client)->stub(), {});
  ASSERT_THAT(stream, IsOk());
  Answers answers;
  ASSERT_THAT((*stream)->Send(Upsert("w", 7), answers.Callback()), IsOk());
  EXPECT_THAT((*stream)->Close(), IsOk());
  v1::GetRequest get;
  *get.mutable_resource() = Widgets();
  get.set_cluster("root");
  get.set_name("w");
  absl::StatusOr<v1::Object> got = (*client)->Get(get);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->spec().fields().at("n").number_value(), 7);
}

}  // namespace
}  // namespace shardcache
