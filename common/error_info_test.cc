#include "common/error_info.h"

#include <gtest/gtest.h>

#include "common/grpc_status.h"

namespace shardcache {
namespace {

TEST(ErrorInfoTest, FencedError_IsFencedAndKeepsItsMessage) {
  absl::Status s = FencedError("fenced: shard \"a\" is at epoch 5", "a", 5, 3);
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_EQ(s.message(), "fenced: shard \"a\" is at epoch 5");
  EXPECT_TRUE(IsFenced(s));
  std::optional<google::rpc::ErrorInfo> info = GetErrorInfo(s);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->reason(), "FENCED");
  EXPECT_EQ(info->domain(), "shardcache.io");
  EXPECT_EQ(info->metadata().at("shard"), "a");
  EXPECT_EQ(info->metadata().at("epoch"), "5");
  EXPECT_EQ(info->metadata().at("requestEpoch"), "3");
}

TEST(ErrorInfoTest, TheMessageAlone_IsNotFenced) {
  // The wording is for people: only the ErrorInfo says fenced.
  EXPECT_FALSE(IsFenced(absl::FailedPreconditionError("fenced: shard \"a\" is at epoch 5")));
  EXPECT_FALSE(IsFenced(absl::OkStatus()));
  google::rpc::ErrorInfo other;
  other.set_reason("FENCED");
  other.set_domain("example.com");
  EXPECT_FALSE(IsFenced(WithErrorInfo(absl::FailedPreconditionError("x"), other)));
}

TEST(ErrorInfoTest, Fenced_SurvivesTheWire) {
  absl::Status s = FencedError("fenced", "a", 2, 1);
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_message(), "fenced");
  EXPECT_TRUE(IsFenced(g));
  EXPECT_FALSE(IsFenced(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "fenced")));

  v1::WriteResponse answer;
  SetWriteAnswerStatus(s, &answer);
  EXPECT_EQ(answer.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(answer.message(), "fenced");
  ASSERT_EQ(answer.details_size(), 1);
  EXPECT_EQ(answer.details(0).type_url(), "type.googleapis.com/google.rpc.ErrorInfo");
  EXPECT_TRUE(IsFenced(WriteAnswerStatus(answer)));

  EXPECT_TRUE(IsFenced(WithMessage(s, "fenced (gave up after 3 attempts)")));
}

}  // namespace
}  // namespace shardcache
