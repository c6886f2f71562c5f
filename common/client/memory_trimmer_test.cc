#include "common/client/memory_trimmer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/testing/wait.h"
#include "prometheus/registry.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;

constexpr absl::Duration kTimeout = absl::Seconds(20);

std::unique_ptr<WorkerPool> MakePool(const Clock* clock) {
  WorkerPool::Options o;
  o.threads = 2;
  o.clock = clock;
  absl::StatusOr<std::unique_ptr<WorkerPool>> pool = WorkerPool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

double CounterValue(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name == name && !f.metric.empty()) return f.metric[0].counter.value;
  }
  return -1;
}

TEST(MemoryTrimmerTest, TrimsOnceEveryIntervalOnThePoolsClock) {
  FakeClock clock;
  std::unique_ptr<WorkerPool> pool = MakePool(&clock);
  std::atomic<int> calls{0};
  MemoryTrimmer::Options o;
  o.interval = absl::Seconds(30);
  o.trim = [&calls] { calls.fetch_add(1); };
  o.registry = std::make_shared<prometheus::Registry>();
  MemoryTrimmer trimmer(pool.get(), o);
  clock.Advance(absl::Seconds(29));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(calls.load(), 0);
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return calls.load() == 1; }, kTimeout, "the first trim"));
  clock.Advance(absl::Seconds(30));
  ASSERT_TRUE(Eventually([&] { return calls.load() == 2; }, kTimeout, "the second trim"));
  EXPECT_EQ(trimmer.trims(), 2);
  EXPECT_EQ(CounterValue(*o.registry, "shardcache_memory_trims_total"), 2);
}

TEST(MemoryTrimmerTest, StopsWithItsOwner) {
  FakeClock clock;
  std::unique_ptr<WorkerPool> pool = MakePool(&clock);
  std::atomic<int> calls{0};
  MemoryTrimmer::Options o;
  o.interval = absl::Seconds(1);
  o.trim = [&calls] { calls.fetch_add(1); };
  { MemoryTrimmer trimmer(pool.get(), o); }
  clock.Advance(absl::Seconds(5));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(calls.load(), 0);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SHARDCACHE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SHARDCACHE_SANITIZED 1
#endif
#endif

// With glibc's malloc: when most of many small blocks are freed but a few among them live on
// (as objects deleted among others that stay), free() returns nothing to the system; a trim
// returns the free pages between the survivors.
TEST(MemoryTrimmerTest, ReturnsFreedHeapToTheSystem) {
#ifdef SHARDCACHE_SANITIZED
  GTEST_SKIP() << "a sanitizer's allocator is not glibc's";
#endif
  std::vector<char*> blocks;
  blocks.reserve(400000);
  for (int i = 0; i < 400000; ++i) {
    blocks.push_back(new char[200]);
    blocks.back()[0] = static_cast<char>(i);  // touched: resident
  }
  std::vector<char*> survivors;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i % 500 == 0) {
      survivors.push_back(blocks[i]);
    } else {
      delete[] blocks[i];
    }
  }
  blocks.clear();

  FakeClock clock;
  std::unique_ptr<WorkerPool> pool = MakePool(&clock);
  MemoryTrimmer::Options o;
  o.interval = absl::Seconds(1);
  o.registry = std::make_shared<prometheus::Registry>();
  MemoryTrimmer trimmer(pool.get(), o);
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return trimmer.trims() == 1; }, kTimeout, "a trim"));
  // About 80 MiB were freed; most of it goes back.
  EXPECT_GT(CounterValue(*o.registry, "shardcache_memory_trim_released_bytes_total"), 32 << 20);
  for (char* b : survivors) delete[] b;
}

}  // namespace
}  // namespace shardcache
