#include "common/backoff.h"

#include <gtest/gtest.h>

namespace shardcache {
namespace {

Backoff Make(FakeClock* clock, double jitter = 0) {
  Backoff::Options o;
  o.jitter = jitter;
  auto b = Backoff::Create(o, clock);
  EXPECT_TRUE(b.ok());
  return *std::move(b);
}

TEST(BackoffTest, Next_DoublesFrom800msAndCapsAt30s) {
  FakeClock clock;
  Backoff b = Make(&clock);
  EXPECT_EQ(b.Next(), absl::Milliseconds(800));
  EXPECT_EQ(b.Next(), absl::Milliseconds(1600));
  EXPECT_EQ(b.Next(), absl::Milliseconds(3200));
  for (int i = 0; i < 10; ++i) b.Next();
  EXPECT_EQ(b.Next(), absl::Seconds(30));
}

TEST(BackoffTest, Jitter_StaysWithinBounds) {
  FakeClock clock;
  Backoff b = Make(&clock, 1.0);
  for (int i = 0; i < 100; ++i) {
    b.Reset();
    absl::Duration d = b.Next();
    EXPECT_GE(d, absl::Milliseconds(800));
    EXPECT_LE(d, absl::Milliseconds(1600));
  }
}

TEST(BackoffTest, Succeeded_ResetsOnlyAfterHealthyPeriod) {
  FakeClock clock;
  Backoff b = Make(&clock);
  b.Next();
  b.Next();
  b.Succeeded();
  clock.Advance(absl::Seconds(30));
  EXPECT_EQ(b.Next(), absl::Milliseconds(3200));  // not healthy long enough
  b.Succeeded();
  clock.Advance(absl::Minutes(2));
  EXPECT_EQ(b.Next(), absl::Milliseconds(800));
}

TEST(BackoffTest, Create_RejectsBadOptions) {
  FakeClock clock;
  Backoff::Options o;
  o.initial = absl::ZeroDuration();
  EXPECT_EQ(Backoff::Create(o, &clock).status().code(), absl::StatusCode::kInvalidArgument);
  o = Backoff::Options();
  o.max = absl::Milliseconds(1);
  EXPECT_EQ(Backoff::Create(o, &clock).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardcache
