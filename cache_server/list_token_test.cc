#include "cache_server/list_token.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/escaping.h"
#include "common/testing/status_matchers.h"

namespace shardcache {
namespace {

using ::shardcache::testing::IsOk;
using ::shardcache::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

auto IsMalformed() {
  return StatusIs(absl::StatusCode::kInvalidArgument,
                  AllOf(HasSubstr("continue_token: Invalid value: malformed"),
                        HasSubstr("pass the token of the previous page as is")));
}

TEST(ListTokenTest, RoundTripsRevisionAndKey) {
  // Keys hold their parts separated by NUL; a key may hold the token's own separator too.
  const std::string keys[] = {"", "a", std::string("shard\0root\0ns\0name", 18), "x\ny\n",
                              std::string(300, 'k')};
  for (int64_t revision : {int64_t{1}, int64_t{42}, int64_t{1} << 62}) {
    for (const std::string& key : keys) {
      std::string token = EncodeContinueToken(revision, key);
      absl::StatusOr<ListPosition> position = DecodeContinueToken(token);
      ASSERT_THAT(position, IsOk());
      EXPECT_EQ(position->revision, revision);
      EXPECT_EQ(position->last_key, key);
    }
  }
}

TEST(ListTokenTest, TokenIsUrlSafe) {
  std::string token = EncodeContinueToken(7, std::string("\xff\xfe\xfd?/+", 6));
  EXPECT_EQ(
      token.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
      std::string::npos)
      << token;
}

TEST(ListTokenTest, RefusesWhatIsNotBase64) {
  EXPECT_THAT(DecodeContinueToken(""), IsMalformed());
  EXPECT_THAT(DecodeContinueToken("not a token!"), IsMalformed());
  EXPECT_THAT(DecodeContinueToken("%%%%"), IsMalformed());
}

TEST(ListTokenTest, RefusesTokensWithoutAPositiveRevision) {
  auto token = [](const std::string& raw) { return absl::WebSafeBase64Escape(raw); };
  EXPECT_THAT(DecodeContinueToken(token("12")), IsMalformed());      // no separator
  EXPECT_THAT(DecodeContinueToken(token("\nkey")), IsMalformed());   // no revision
  EXPECT_THAT(DecodeContinueToken(token("0\nkey")), IsMalformed());  // not positive
  EXPECT_THAT(DecodeContinueToken(token("-3\nkey")), IsMalformed());
  EXPECT_THAT(DecodeContinueToken(token("1x\nkey")), IsMalformed());
  EXPECT_THAT(DecodeContinueToken(token("99999999999999999999\nkey")), IsMalformed());  // > int64
}

TEST(ListTokenTest, RefusesATamperedToken) {
  std::string token = EncodeContinueToken(12345, "some-key");
  ASSERT_THAT(DecodeContinueToken(token), IsOk());
  // A character outside the alphabet.
  std::string bad_char = token;
  bad_char[3] = '*';
  EXPECT_THAT(DecodeContinueToken(bad_char), IsMalformed());
  // The revision's first digit turned into a letter ("1" is encoded in the first character).
  std::string bad_revision = token;
  bad_revision[0] = 'Z';
  EXPECT_THAT(DecodeContinueToken(bad_revision), IsMalformed());
  // Cut in the middle of the revision.
  EXPECT_THAT(DecodeContinueToken(token.substr(0, 4)), IsMalformed());
}

}  // namespace
}  // namespace shardcache
