#include "common/grpc_status.h"

#include <gtest/gtest.h>

namespace shardcache {
namespace {

TEST(GrpcStatusTest, Ok_RoundTrips) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, EveryCode_KeepsCodeAndMessage) {
  for (int code = 1; code <= 16; ++code) {
    absl::Status s(static_cast<absl::StatusCode>(code), "message " + std::to_string(code));
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), "message " + std::to_string(code));
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
}

TEST(GrpcStatusTest, Payloads_RoundTripAsStatusDetails) {
  absl::Status s = absl::AbortedError("conflict");
  s.SetPayload("type.googleapis.com/example.Detail", absl::Cord("bytes"));
  grpc::Status g = ToGrpcStatus(s);
  google::rpc::Status proto;
  ASSERT_TRUE(proto.ParseFromString(g.error_details()));
  EXPECT_EQ(proto.code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_EQ(proto.message(), "conflict");
  ASSERT_EQ(proto.details_size(), 1);
  EXPECT_EQ(proto.details(0).type_url(), "type.googleapis.com/example.Detail");
  EXPECT_EQ(proto.details(0).value(), "bytes");
  EXPECT_EQ(FromGrpcStatus(g), s);

  v1::WriteResponse answer;
  SetWriteAnswerStatus(s, &answer);
  EXPECT_EQ(WriteAnswerStatus(answer), s);
  SetWriteAnswerStatus(absl::OkStatus(), &answer);
  EXPECT_EQ(answer.code(), 0);
  EXPECT_EQ(answer.details_size(), 0);
  EXPECT_TRUE(WriteAnswerStatus(answer).ok());
}

TEST(GrpcStatusTest, NoPayload_NoDetails) {
  EXPECT_TRUE(ToGrpcStatus(absl::NotFoundError("x")).error_details().empty());
}

}  // namespace
}  // namespace shardcache
