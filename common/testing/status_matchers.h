// GoogleTest matchers for absl::Status and absl::StatusOr (abseil 20220623 ships none).
//
//   EXPECT_THAT(status, IsOk());
//   EXPECT_THAT(status_or, StatusIs(absl::StatusCode::kNotFound));
//   EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("metadata.name")));
#ifndef SHARDCACHE_COMMON_TESTING_STATUS_MATCHERS_H_
#define SHARDCACHE_COMMON_TESTING_STATUS_MATCHERS_H_

#include <gmock/gmock.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardcache::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s;
  return s.ok();
}

MATCHER_P(StatusIs, code, "has code " + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code && ::testing::Matches(message_matcher)(std::string(s.message()));
}

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_STATUS_MATCHERS_H_
