#include "cache_server/uuid.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace shardcache {
namespace {

TEST(UuidTest, IsAVersion4Uuid) {
  for (int i = 0; i < 100; ++i) {
    std::string id = NewUuid();
    EXPECT_THAT(id, ::testing::MatchesRegex(
                        "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"));
  }
}

TEST(UuidTest, NeverRepeats) {
  std::set<std::string> seen;
  for (int i = 0; i < 10000; ++i) EXPECT_TRUE(seen.insert(NewUuid()).second);
}

}  // namespace
}  // namespace shardcache
