// Tests of CancellationToken and CancellationSource: callbacks run once, on the cancelling thread
// or at once when registered late, and RemoveCallback never waits for a callback that is done.
#include "common/cancellation.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace shardcache {
namespace {

TEST(CancellationTest, CallbacksRunOnceOnCancel_RemovedOnesNever) {
  CancellationSource source;
  CancellationToken token = source.Token();
  std::atomic<int> kept{0}, removed{0};
  token.OnCancelled([&] { ++kept; });
  CancellationToken::CallbackId id = token.OnCancelled([&] { ++removed; });
  ASSERT_NE(id, 0u);
  token.RemoveCallback(id);
  EXPECT_FALSE(token.Cancelled());
  source.Cancel();
  source.Cancel();
  EXPECT_TRUE(token.Cancelled());
  EXPECT_EQ(kept.load(), 1);
  EXPECT_EQ(removed.load(), 0);
}

TEST(CancellationTest, RegisteredAfterCancel_RunsAtOnceAndReturnsZero) {
  CancellationSource source;
  CancellationToken token = source.Token();
  source.Cancel();
  int ran = 0;
  EXPECT_EQ(token.OnCancelled([&] { ++ran; }), 0u);
  EXPECT_EQ(ran, 1);
}

// A callback registered after the cancel, on another thread than the one that cancelled: its
// RemoveCallback(0) returns at once (it used to wait for "callback 0" to stop running).
TEST(CancellationTest, RemoveCallbackOfACallbackThatRanAtOnce_ReturnsFromAnyThread) {
  CancellationSource source;
  CancellationToken token = source.Token();
  token.OnCancelled([] {});
  source.Cancel();  // this thread ran the last callback
  absl::Notification removed;
  std::thread other([&] {
    CancellationToken::CallbackId id = token.OnCancelled([] {});
    token.RemoveCallback(id);
    removed.Notify();
  });
  bool returned = removed.WaitForNotificationWithTimeout(absl::Seconds(30));
  EXPECT_TRUE(returned) << "RemoveCallback(0) is still waiting";
  if (returned) {
    other.join();
  } else {
    other.detach();  // stuck for good; the process ends with the test binary
  }
}

}  // namespace
}  // namespace shardcache
