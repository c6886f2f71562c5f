// Unit tests of WriteStreamReactor: a real gRPC server in this process (InProcessServer) and a
// real client channel; the store's commits are held back (GatedStorage) to see the stream while
// writes are in flight.
#include "cache_server/write_stream_reactor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache_server/testing/in_process_server.h"
#include "cache_server/testing/raw_write_stream.h"
#include "common/testing/objects.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Context;
using ::shardcache::testing::Eventually;
using ::shardcache::testing::Gvr;
using ::shardcache::testing::InProcessServer;
using ::shardcache::testing::RawWriteStream;
using ::testing::HasSubstr;

v1::GroupVersionResource Widgets() { return Gvr("example.com", "v1", "widgets"); }

v1::WriteRequest CreateWrite(int64_t id, const std::string& name) {
  v1::WriteRequest w;
  w.set_id(id);
  *w.mutable_create()->mutable_resource() = Widgets();
  v1::ObjectMeta* m = w.mutable_create()->mutable_object()->mutable_metadata();
  m->set_namespace_("ns");
  m->set_name(name);
  return w;
}

// A write whose spec nests deeper than a request may be parsed (request_parser.h), but whose
// id can be read: it is answered INVALID_ARGUMENT in its turn.
v1::WriteRequest UnparsableWrite(int64_t id, const std::string& name) {
  v1::WriteRequest w = CreateWrite(id, name);
  google::protobuf::Struct* s = w.mutable_create()->mutable_object()->mutable_spec();
  for (int i = 0; i < 100; ++i) s = (*s->mutable_fields())["a"].mutable_struct_value();
  return w;
}

bool Exists(InProcessServer& server, const std::string& name) {
  v1::GetRequest get;
  *get.mutable_resource() = Widgets();
  get.set_namespace_("ns");
  get.set_name(name);
  return server.store().Get(get).ok();
}

// Writes applied in memory by the store (durable or not).
double Applied(InProcessServer& server) { return server.metrics().writes.Value(); }

class WriteStreamReactorTest : public ::testing::Test {
 protected:
  InProcessServer server_{InProcessServer::Options()};
};

TEST_F(WriteStreamReactorTest, AnswersEveryWriteInOrder_AFailedWriteDoesNotEndTheStream) {
  auto ctx = Context();
  auto stream = server_.stub()->Write(ctx.get());
  // Pipelined: every write is sent before any answer is read.
  ASSERT_TRUE(stream->Write(CreateWrite(1, "w1")));
  ASSERT_TRUE(stream->Write(CreateWrite(2, "w1")));      // ALREADY_EXISTS
  ASSERT_TRUE(stream->Write(UnparsableWrite(3, "w3")));  // INVALID_ARGUMENT
  ASSERT_TRUE(stream->Write(CreateWrite(4, "Bad_Name")));
  for (int64_t id = 5; id <= 40; ++id) {
    ASSERT_TRUE(stream->Write(CreateWrite(id, absl::StrCat("w", id))));
  }
  ASSERT_TRUE(stream->WritesDone());
  std::vector<v1::WriteResponse> answers;
  v1::WriteResponse answer;
  while (stream->Read(&answer)) answers.push_back(answer);
  grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  ASSERT_EQ(answers.size(), 40u);
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(answers[i].id(), i + 1);
  EXPECT_EQ(answers[0].code(), 0) << answers[0].message();
  EXPECT_EQ(answers[0].object().metadata().name(), "w1");
  EXPECT_EQ(answers[1].code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(answers[2].code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(answers[2].message(), HasSubstr("nested too deeply to be parsed"));
  EXPECT_EQ(answers[3].code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(answers[3].message(), HasSubstr("metadata.name"));
  for (int64_t i = 4; i < 40; ++i) {
    EXPECT_EQ(answers[i].code(), 0) << answers[i].message();
    // Applied in the order sent: each write has the next revision.
    EXPECT_EQ(answers[i].object().metadata().resource_version(), absl::StrCat(i - 1));
  }
  EXPECT_FALSE(Exists(server_, "w3"));
  EXPECT_TRUE(Exists(server_, "w40"));
}

TEST_F(WriteStreamReactorTest, AWriteWithoutAReadableId_EndsTheStreamAfterTheAnswersBeforeIt) {
  RawWriteStream stream(server_.channel());
  ASSERT_TRUE(stream.started());
  std::string cut = CreateWrite(3, "w3").SerializeAsString();
  cut.pop_back();
  // Held in the store, so that the unreadable write comes while the ones before it wait.
  server_.storage().Close();
  ASSERT_TRUE(stream.Write(CreateWrite(1, "w1").SerializeAsString()));
  ASSERT_TRUE(stream.Write(CreateWrite(2, "w2").SerializeAsString()));
  ASSERT_TRUE(Eventually([&] { return Applied(server_) == 2; }, "both writes are in the store"));
  (void)stream.Write(cut);
  (void)stream.Write(CreateWrite(4, "w4").SerializeAsString());  // may fail: the stream may end
  server_.storage().Open();
  std::optional<v1::WriteResponse> first = stream.Read();
  std::optional<v1::WriteResponse> second = stream.Read();
  std::optional<v1::WriteResponse> extra = stream.Read();
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_EQ(first->id(), 1);
  EXPECT_EQ(first->code(), 0) << first->message();
  EXPECT_EQ(second->id(), 2);
  EXPECT_EQ(second->code(), 0) << second->message();
  EXPECT_FALSE(extra.has_value()) << "an answer after the unreadable write: " << extra->id();
  grpc::Status finished = stream.Finish();
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << finished.error_message();
  EXPECT_THAT(finished.error_message(), HasSubstr("id cannot be read"));
  EXPECT_FALSE(Exists(server_, "w4"));
}

TEST_F(WriteStreamReactorTest, Drain_AnswersTheWritesTakenThenEndsUnavailable) {
  auto ctx = Context();
  auto stream = server_.stub()->Write(ctx.get());
  server_.storage().Close();
  for (int64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(stream->Write(CreateWrite(id, absl::StrCat("w", id))));
  }
  ASSERT_TRUE(Eventually([&] { return Applied(server_) == 3; }, "the writes are in the store"));
  // The server starts shutting down while the three writes wait for the disk.
  server_.service().Shutdown();
  (void)stream->Write(CreateWrite(4, "w4"));  // read or not: never applied
  server_.storage().Open();
  std::vector<v1::WriteResponse> answers;
  v1::WriteResponse answer;
  while (stream->Read(&answer)) answers.push_back(answer);
  grpc::Status finished = stream->Finish();
  ASSERT_GE(answers.size(), 3u);
  ASSERT_LE(answers.size(), 4u);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(answers[i].id(), i + 1);
    EXPECT_EQ(answers[i].code(), 0) << answers[i].message();
  }
  if (answers.size() == 4) {
    EXPECT_EQ(answers[3].id(), 4);
    EXPECT_EQ(answers[3].code(), grpc::StatusCode::UNAVAILABLE);
  }
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::UNAVAILABLE) << finished.error_message();
  EXPECT_THAT(finished.error_message(), HasSubstr("server shutting down"));
  EXPECT_EQ(Applied(server_), 3);
}

TEST_F(WriteStreamReactorTest, Drain_StreamOpenedAfterwardsEndsAtOnceUnavailable) {
  server_.service().Shutdown();
  auto ctx = Context();
  auto stream = server_.stub()->Write(ctx.get());
  (void)stream->Write(CreateWrite(1, "w1"));
  v1::WriteResponse answer;
  EXPECT_FALSE(stream->Read(&answer)) << "answered: " << answer.id();
  grpc::Status finished = stream->Finish();
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::UNAVAILABLE) << finished.error_message();
  EXPECT_EQ(Applied(server_), 0);
}

TEST_F(WriteStreamReactorTest, ReadingPausesAtMaxOutstandingWrites) {
  constexpr int64_t kMax = WriteStreamReactor::kMaxOutstandingWrites;
  constexpr int64_t kWrites = kMax + 40;
  server_.storage().Close();  // nothing is answered: every write read stays outstanding
  auto ctx = Context(absl::Seconds(60));
  auto stream = server_.stub()->Write(ctx.get());
  std::thread writer([&] {
    for (int64_t id = 1; id <= kWrites; ++id) {
      if (!stream->Write(CreateWrite(id, absl::StrCat("w", id)))) return;
    }
    stream->WritesDone();
  });
  ASSERT_TRUE(Eventually([&] { return Applied(server_) >= kMax; }, "the stream reads its bound",
                         [&] { return absl::StrCat(Applied(server_), " applied"); }));
  writer.join();  // every write is with the transport (small: flow control lets them by)
  // Another stream on the same connection, sent after them, is read and answered (a write
  // refused before the store, so it is answered at once): the server is reading, and the first
  // stream's writes past its bound would have been read by now.
  auto other_ctx = Context();
  auto other = server_.stub()->Write(other_ctx.get());
  ASSERT_TRUE(other->Write(CreateWrite(kWrites + 1, "Not_A_Name")));
  v1::WriteResponse answer;
  ASSERT_TRUE(other->Read(&answer));
  EXPECT_EQ(answer.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Applied(server_), kMax) << "the stream read past kMaxOutstandingWrites";
  // Answered, the stream reads the rest: every write answered in order.
  server_.storage().Open();
  std::vector<v1::WriteResponse> answers;
  while (stream->Read(&answer)) answers.push_back(answer);
  grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  ASSERT_EQ(answers.size(), static_cast<size_t>(kWrites));
  for (int64_t i = 0; i < kWrites; ++i) {
    EXPECT_EQ(answers[i].id(), i + 1);
    EXPECT_EQ(answers[i].code(), 0) << answers[i].message();
  }
  other->WritesDone();
  while (other->Read(&answer)) {
  }
  EXPECT_TRUE(other->Finish().ok());
}

TEST_F(WriteStreamReactorTest, ClientCancelWithWritesInTheStore_StreamEndsOnceTheyComplete) {
  server_.storage().Close();
  {
    auto ctx = Context();
    auto stream = server_.stub()->Write(ctx.get());
    ASSERT_TRUE(stream->Write(CreateWrite(1, "w1")));
    ASSERT_TRUE(Eventually([&] { return Applied(server_) == 1; }, "the write is in the store"));
    ctx->TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The stream cannot end while the store still holds a callback to it.
  EXPECT_FALSE(server_.service().AwaitIdle(absl::ZeroDuration()));
  server_.storage().Open();
  EXPECT_TRUE(server_.service().AwaitIdle(absl::Seconds(20))) << "the stream never ended";
  EXPECT_TRUE(Exists(server_, "w1")) << "a write taken is applied even if its answer is not read";
}

}  // namespace
}  // namespace shardcache
