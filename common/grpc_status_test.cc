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

}  // namespace
}  // namespace shardcache
