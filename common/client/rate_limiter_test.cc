#include "common/client/rate_limiter.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"

namespace shardcache {
namespace {

using ::shardcache::testing::IsOk;
using ::shardcache::testing::StatusIs;

std::unique_ptr<ItemExponentialFailureRateLimiter> Exponential(
    ItemExponentialFailureRateLimiter::Options options = {}) {
  auto limiter = ItemExponentialFailureRateLimiter::Create(options);
  EXPECT_THAT(limiter, IsOk());
  return *std::move(limiter);
}

std::unique_ptr<BucketRateLimiter> Bucket(const Clock* clock, double qps = 10, int burst = 100) {
  BucketRateLimiter::Options options;
  options.qps = qps;
  options.burst = burst;
  auto limiter = BucketRateLimiter::Create(options, clock);
  EXPECT_THAT(limiter, IsOk());
  return *std::move(limiter);
}

TEST(ItemExponentialFailureRateLimiterTest, When_DoublesFrom5msAndCapsAt1000s) {
  auto limiter = Exponential();
  absl::Duration expected = absl::Milliseconds(5);
  for (int i = 0; i < 18; ++i) {  // 5 ms * 2^17 = 655.36 s is the last one under the cap
    EXPECT_EQ(limiter->When("k"), expected) << "failure " << i;
    expected *= 2;
  }
  EXPECT_EQ(limiter->When("k"), absl::Seconds(1000));
  for (int i = 0; i < 2000; ++i) limiter->When("k");  // 5 ms * 2^2000 does not overflow
  EXPECT_EQ(limiter->When("k"), absl::Seconds(1000));
  EXPECT_EQ(limiter->NumRequeues("k"), 2020);
}

TEST(ItemExponentialFailureRateLimiterTest, Forget_ResetsOnlyThatKey) {
  auto limiter = Exponential();
  EXPECT_EQ(limiter->NumRequeues("a"), 0);
  limiter->When("a");
  limiter->When("a");
  limiter->When("b");
  EXPECT_EQ(limiter->NumRequeues("a"), 2);
  EXPECT_EQ(limiter->NumRequeues("b"), 1);
  limiter->Forget("a");
  EXPECT_EQ(limiter->NumRequeues("a"), 0);
  EXPECT_EQ(limiter->When("a"), absl::Milliseconds(5));
  EXPECT_EQ(limiter->When("b"), absl::Milliseconds(10));
}

TEST(ItemExponentialFailureRateLimiterTest, Options_AreApplied) {
  auto limiter = Exponential({absl::Seconds(1), absl::Seconds(3)});
  EXPECT_EQ(limiter->When("k"), absl::Seconds(1));
  EXPECT_EQ(limiter->When("k"), absl::Seconds(2));
  EXPECT_EQ(limiter->When("k"), absl::Seconds(3));
  EXPECT_EQ(limiter->When("k"), absl::Seconds(3));
}

TEST(ItemExponentialFailureRateLimiterTest, Create_RejectsBadOptions) {
  EXPECT_THAT(ItemExponentialFailureRateLimiter::Create({absl::ZeroDuration(), absl::Seconds(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ItemExponentialFailureRateLimiter::Create({absl::Seconds(2), absl::Seconds(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ItemExponentialFailureRateLimiterTest, When_ConcurrentCallersCountEveryFailure) {
  auto limiter = Exponential();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) limiter->When("shared");
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(limiter->NumRequeues("shared"), 4000);
}

TEST(BucketRateLimiterTest, When_BurstIsImmediateThen100msApart) {
  FakeClock clock;
  auto limiter = Bucket(&clock);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(limiter->When(absl::StrCat("k", i)), absl::ZeroDuration()) << i;
  }
  EXPECT_EQ(limiter->When("x"), absl::Milliseconds(100));
  EXPECT_EQ(limiter->When("y"), absl::Milliseconds(200));
  EXPECT_EQ(limiter->When("x"), absl::Milliseconds(300));
}

TEST(BucketRateLimiterTest, When_RefillsWithTimeUpToBurst) {
  FakeClock clock;
  auto limiter = Bucket(&clock);
  for (int i = 0; i < 100; ++i) limiter->When("k");
  clock.Advance(absl::Milliseconds(250));  // 2.5 tokens
  EXPECT_EQ(limiter->When("k"), absl::ZeroDuration());
  EXPECT_EQ(limiter->When("k"), absl::ZeroDuration());
  EXPECT_EQ(limiter->When("k"), absl::Milliseconds(50));  // the half token still to come

  clock.Advance(absl::Hours(1));  // refills to the burst, no further
  for (int i = 0; i < 100; ++i) EXPECT_EQ(limiter->When("k"), absl::ZeroDuration()) << i;
  EXPECT_EQ(limiter->When("k"), absl::Milliseconds(100));
}

TEST(BucketRateLimiterTest, When_ReservationsAreRepaidByTime) {
  FakeClock clock;
  auto limiter = Bucket(&clock, /*qps=*/10, /*burst=*/1);
  EXPECT_EQ(limiter->When("k"), absl::ZeroDuration());
  EXPECT_EQ(limiter->When("k"), absl::Milliseconds(100));
  EXPECT_EQ(limiter->When("k"), absl::Milliseconds(200));
  clock.Advance(absl::Milliseconds(200));  // the two reservations fall due
  EXPECT_EQ(limiter->When("k"), absl::Milliseconds(100));
}

TEST(BucketRateLimiterTest, ForgetAndNumRequeues_IgnoreKeys) {
  FakeClock clock;
  auto limiter = Bucket(&clock, 10, 1);
  limiter->When("k");
  limiter->When("k");
  EXPECT_EQ(limiter->NumRequeues("k"), 0);
  limiter->Forget("k");
  EXPECT_EQ(limiter->When("k"), absl::Milliseconds(200));  // tokens spent stay spent
}

TEST(BucketRateLimiterTest, Create_RejectsBadOptions) {
  FakeClock clock;
  EXPECT_THAT(BucketRateLimiter::Create({0, 10}, &clock),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BucketRateLimiter::Create({-1, 10}, &clock),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BucketRateLimiter::Create({10, 0}, &clock),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BucketRateLimiter::Create({10, 10}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(MaxOfRateLimiterTest, When_IsTheLargestAndEveryLimiterCounts) {
  FakeClock clock;
  std::vector<std::unique_ptr<RateLimiter>> parts;
  parts.push_back(Exponential());
  parts.push_back(Bucket(&clock, /*qps=*/1, /*burst=*/1));
  auto limiter = MaxOfRateLimiter::Create(std::move(parts));
  ASSERT_THAT(limiter, IsOk());
  RateLimiter& max_of = **limiter;
  EXPECT_EQ(max_of.When("k"), absl::Milliseconds(5));  // bucket: 0
  EXPECT_EQ(max_of.When("k"), absl::Seconds(1));       // exponential: 10 ms
  EXPECT_EQ(max_of.NumRequeues("k"), 2);
  max_of.Forget("k");
  EXPECT_EQ(max_of.NumRequeues("k"), 0);
  EXPECT_EQ(max_of.When("k"), absl::Seconds(2));  // the bucket's reservations remain
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(max_of.When("k"), absl::Milliseconds(10));
}

TEST(MaxOfRateLimiterTest, Create_RejectsEmptyOrNull) {
  EXPECT_THAT(MaxOfRateLimiter::Create({}), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<std::unique_ptr<RateLimiter>> parts;
  parts.push_back(nullptr);
  EXPECT_THAT(MaxOfRateLimiter::Create(std::move(parts)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ControllerRateLimiterTest, Default_IsPerKeyBackoffUnderAnOverallBucket) {
  FakeClock clock;
  auto limiter = DefaultControllerRateLimiter(&clock);
  EXPECT_EQ(limiter->When("a"), absl::Milliseconds(5));
  EXPECT_EQ(limiter->When("a"), absl::Milliseconds(10));
  EXPECT_EQ(limiter->When("a"), absl::Milliseconds(20));
  for (int i = 3; i < 100; ++i) limiter->When(absl::StrCat("other", i));  // 100 tokens spent
  EXPECT_EQ(limiter->When("b"), absl::Milliseconds(100));  // the bucket, not b's 5 ms
  EXPECT_EQ(limiter->When("a"), absl::Milliseconds(200));
  limiter->Forget("a");
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(limiter->When("a"), absl::Milliseconds(5));
  EXPECT_EQ(limiter->NumRequeues("a"), 1);
}

TEST(ControllerRateLimiterTest, New_AppliesAndValidatesOptions) {
  FakeClock clock;
  ControllerRateLimiterOptions options;
  options.per_key.base_delay = absl::Seconds(1);
  options.per_key.max_delay = absl::Seconds(2);
  options.overall.burst = 1;
  auto limiter = NewControllerRateLimiter(options, &clock);
  ASSERT_THAT(limiter, IsOk());
  EXPECT_EQ((*limiter)->When("a"), absl::Seconds(1));
  EXPECT_EQ((*limiter)->When("b"), absl::Seconds(1));  // bucket: 100 ms
  EXPECT_EQ((*limiter)->When("a"), absl::Seconds(2));
  EXPECT_EQ((*limiter)->When("a"), absl::Seconds(2));

  options.overall.qps = 0;
  EXPECT_THAT(NewControllerRateLimiter(options, &clock),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(NewControllerRateLimiter(ControllerRateLimiterOptions(), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  options = ControllerRateLimiterOptions();
  options.per_key.max_delay = absl::Milliseconds(1);
  EXPECT_THAT(NewControllerRateLimiter(options, &clock),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace shardcache
