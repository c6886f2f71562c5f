// Tests of CallbackList and Subscription, above all the one rule: a cancel from inside the
// callback returns at once; a cancel from another thread while the callback runs waits for it to
// return; no call starts after a cancel has returned. Also the calls' order and threads, callbacks
// added during a notify, the one-shot Close, and concurrent use (run under ThreadSanitizer).
#include "common/callback_list.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::ThisThreadId;
using ::shardcache::testing::ThreadAsleep;

// Runs `f` on a thread of its own and says whether it returned within the default wait. A call
// stuck for good is left behind (detached): the test binary ends with it.
bool ReturnsOnItsOwnThread(std::function<void()> f) {
  auto returned = std::make_shared<absl::Notification>();
  std::thread t([f = std::move(f), returned] {
    f();
    returned->Notify();
  });
  if (returned->WaitForNotificationWithTimeout(testing::kDefaultWait)) {
    t.join();
    return true;
  }
  t.detach();
  return false;
}

TEST(CallbackListTest, Notify_CallsEveryCallbackInOrder_OnTheNotifyingThread) {
  CallbackList<std::string, int> list;
  std::vector<std::string> calls;
  std::vector<std::thread::id> threads;
  Subscription a = list.Add([&](const std::string& s, const int& n) {
    calls.push_back("a " + s + std::to_string(n));
    threads.push_back(std::this_thread::get_id());
  });
  Subscription b = list.Add([&](const std::string& s, const int& n) {
    calls.push_back("b " + s + std::to_string(n));
    threads.push_back(std::this_thread::get_id());
  });
  list.Notify("x", 1);
  list.Notify("y", 2);
  EXPECT_EQ(calls, (std::vector<std::string>{"a x1", "b x1", "a y2", "b y2"}));
  for (std::thread::id t : threads) EXPECT_EQ(t, std::this_thread::get_id());
}

TEST(CallbackListTest, Cancelled_IsNeverCalledAgain_AndDestroyingTheSubscriptionCancels) {
  CallbackList<> list;
  int a = 0, b = 0;
  Subscription sa = list.Add([&] { ++a; });
  {
    Subscription sb = list.Add([&] { ++b; });
    list.Notify();
  }
  sa.Cancel();
  sa.Cancel();  // idempotent
  list.Notify();
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 1);
}

TEST(CallbackListTest, MovingOntoASubscription_CancelsTheOneItHeld) {
  CallbackList<> list;
  int first = 0, second = 0;
  Subscription s = list.Add([&] { ++first; });
  s = list.Add([&] { ++second; });
  list.Notify();
  Subscription moved = std::move(s);
  s.Cancel();  // the moved-from one is empty: it cancels nothing
  list.Notify();
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 2);
}

TEST(CallbackListTest, Release_KeepsTheCallback_UntilRemove) {
  CallbackList<> list;
  int calls = 0;
  Subscription::Id id = list.Add([&] { ++calls; }).Release();
  ASSERT_NE(id, 0u);
  list.Notify();
  list.Remove(id);
  list.Remove(id);  // unknown now: nothing to do
  list.Remove(0);
  list.Notify();
  EXPECT_EQ(calls, 1);
}

TEST(CallbackListTest, NotifyOne_CallsOnlyThatCallback_WhileRegistered) {
  CallbackList<int> list;
  std::vector<int> a, b;
  Subscription sa = list.Add([&](const int& n) { a.push_back(n); });
  Subscription sb = list.Add([&](const int& n) { b.push_back(n); });
  EXPECT_TRUE(list.NotifyOne(sb.id(), 7));
  Subscription::Id id = sb.id();
  sb.Cancel();
  EXPECT_FALSE(list.NotifyOne(id, 8));
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(b, std::vector<int>{7});
}

// The self-cancel rule, first half: from inside the callback, Cancel returns at once (waiting
// for the call in progress would wait for itself), and no later call follows.
TEST(CallbackListTest, CancelFromInsideTheCallback_ReturnsAtOnce_AndNoOtherCallFollows) {
  CallbackList<> list;
  Subscription s;
  int calls = 0;
  s = list.Add([&] {
    ++calls;
    s.Cancel();
  });
  EXPECT_TRUE(ReturnsOnItsOwnThread([&] { list.Notify(); })) << "Cancel waited for itself";
  list.Notify();
  EXPECT_EQ(calls, 1);
}

// The same from a callback that a Close runs, and from one that removes itself by id.
TEST(CallbackListTest, CancelFromInsideTheCallback_DuringCloseOrById_ReturnsAtOnce) {
  CallbackList<> closing;
  Subscription s;
  s = closing.Add([&] { s.Cancel(); });
  EXPECT_TRUE(ReturnsOnItsOwnThread([&] { closing.Close(); }));

  CallbackList<> by_id;
  Subscription::Id id = 0;
  id = by_id.Add([&] { by_id.Remove(id); }).Release();
  EXPECT_TRUE(ReturnsOnItsOwnThread([&] { by_id.Notify(); }));
}

// The self-cancel rule, second half: from another thread, while the callback runs, Cancel waits
// until it has returned.
TEST(CallbackListTest, CancelFromAnotherThread_WhileTheCallbackRuns_WaitsForItToReturn) {
  CallbackList<> list;
  absl::Notification entered, release;
  std::atomic<bool> returned{false};
  Subscription s = list.Add([&] {
    entered.Notify();
    release.WaitForNotification();
    returned = true;
  });
  std::thread notifier([&] { list.Notify(); });
  entered.WaitForNotification();
  // The callback is let go once this thread is blocked inside Cancel (or has returned from it:
  // then `returned` is still false and the check below fails).
  const pid_t self = ThisThreadId();
  std::atomic<bool> cancelled{false};
  std::thread releaser([&] {
    EXPECT_TRUE(Eventually([&] { return cancelled.load() || ThreadAsleep(self); },
                           "Cancel returns or blocks"));
    release.Notify();
  });
  s.Cancel();
  cancelled = true;
  EXPECT_TRUE(returned.load()) << "Cancel returned while the callback still ran";
  notifier.join();
  releaser.join();
}

// A Cancel inside one callback, of another callback running on another thread, waits for it.
TEST(CallbackListTest, CancelInsideACallback_OfAnotherOneRunningElsewhere_WaitsForIt) {
  CallbackList<int> list;
  absl::Notification entered, release;
  std::atomic<bool> returned{false};
  Subscription other = list.Add([&](const int& n) {
    if (n != 1) return;
    entered.Notify();
    release.WaitForNotification();
    returned = true;
  });
  std::atomic<bool> saw_returned{false};
  Subscription canceller = list.Add([&](const int& n) {
    if (n != 2) return;
    other.Cancel();
    saw_returned = returned.load();
  });
  std::thread first([&] { list.NotifyOne(other.id(), 1); });
  entered.WaitForNotification();
  const pid_t self = ThisThreadId();
  std::atomic<bool> done{false};
  std::thread releaser([&] {
    EXPECT_TRUE(Eventually([&] { return done.load() || ThreadAsleep(self); },
                           "the inner Cancel returns or blocks"));
    release.Notify();
  });
  list.NotifyOne(canceller.id(), 2);
  done = true;
  EXPECT_TRUE(saw_returned.load()) << "the inner Cancel returned while the other call ran";
  first.join();
  releaser.join();
}

// No call starts after Cancel has returned, while another thread notifies without pause. The
// callback writes a plain variable that this thread reads after Cancel: ThreadSanitizer reports
// a race if Cancel returned without the call's end being ordered before it.
TEST(CallbackListTest, NoCallStartsAfterCancelReturns_UnderConcurrentNotify) {
  for (int round = 0; round < 50; ++round) {
    CallbackList<> list;
    std::atomic<bool> cancel_returned{false};
    std::atomic<bool> late_call{false};
    int64_t calls = 0;  // written only by the callback
    std::atomic<bool> stop{false};
    absl::Notification called_once;
    Subscription s = list.Add([&] {
      if (cancel_returned.load()) late_call = true;
      ++calls;
      if (!called_once.HasBeenNotified()) called_once.Notify();
    });
    std::thread notifier([&] {
      while (!stop.load()) list.Notify();
    });
    ASSERT_TRUE(called_once.WaitForNotificationWithTimeout(testing::kDefaultWait));
    s.Cancel();
    cancel_returned = true;
    int64_t seen = calls;  // no call runs now, nor ever again
    stop = true;
    notifier.join();
    EXPECT_FALSE(late_call.load())
        << "a call started after Cancel returned (round " << round << ")";
    EXPECT_EQ(calls, seen);
  }
}

// A callback added during a Notify is not called by it, but by the next one.
TEST(CallbackListTest, AddedDuringNotify_IsCalledFromTheNextNotifyOn) {
  CallbackList<int> list;
  std::vector<std::string> calls;
  std::vector<Subscription> added;
  Subscription s = list.Add([&](const int& n) {
    calls.push_back("first " + std::to_string(n));
    if (n == 1) {
      added.push_back(
          list.Add([&](const int& m) { calls.push_back("added " + std::to_string(m)); }));
    }
  });
  list.Notify(1);
  list.Notify(2);
  EXPECT_EQ(calls, (std::vector<std::string>{"first 1", "first 2", "added 2"}));
}

// A callback may cancel one that comes later in the same Notify: that one is not called.
TEST(CallbackListTest, CancelledBeforeItsTurn_IsSkipped) {
  CallbackList<> list;
  Subscription later;
  int later_calls = 0;
  Subscription first = list.Add([&] { later.Cancel(); });
  later = list.Add([&] { ++later_calls; });
  list.Notify();
  EXPECT_EQ(later_calls, 0);
}

TEST(CallbackListTest, Close_CallsEachOnce_ThenAddsAreCalledAtOnceWithTheSameArguments) {
  CallbackList<std::string> list;
  std::vector<std::string> calls;
  Subscription a = list.Add([&](const std::string& s) { calls.push_back("a " + s); });
  Subscription cancelled = list.Add([&](const std::string& s) { calls.push_back("x " + s); });
  cancelled.Cancel();
  EXPECT_TRUE(list.Close("stopped"));
  EXPECT_FALSE(list.Close("again"));
  list.Notify("after");  // nothing is registered any more
  EXPECT_EQ(calls, std::vector<std::string>{"a stopped"});

  std::thread::id caller;
  Subscription late = list.Add([&](const std::string& s) {
    calls.push_back("late " + s);
    caller = std::this_thread::get_id();
  });
  EXPECT_EQ(late.id(), 0u) << "a callback added to a closed list is not kept";
  EXPECT_EQ(caller, std::this_thread::get_id());
  EXPECT_EQ(calls, (std::vector<std::string>{"a stopped", "late stopped"}));
}

// Added during a Close (from one of its callbacks, or from another thread): called exactly once,
// at once, by the Add.
TEST(CallbackListTest, AddedDuringClose_IsCalledAtOnceByTheAdd) {
  CallbackList<int> list;
  std::vector<std::string> calls;
  Subscription inner;
  Subscription s = list.Add([&](const int& n) {
    inner = list.Add([&](const int& m) { calls.push_back("inner " + std::to_string(m)); });
    calls.push_back("outer " + std::to_string(n));
  });
  list.Close(3);
  EXPECT_EQ(calls, (std::vector<std::string>{"inner 3", "outer 3"}));
}

// Whoever races a Close with an Add, the callback is called exactly once.
TEST(CallbackListTest, AddRacingClose_IsCalledExactlyOnce) {
  for (int round = 0; round < 200; ++round) {
    CallbackList<> list;
    std::atomic<int> calls{0};
    std::thread adder([&] { list.Add([&] { ++calls; }).Release(); });
    list.Close();
    adder.join();
    EXPECT_EQ(calls.load(), 1) << "round " << round;
  }
}

// A callback may destroy the list (as an informer's last user may drop it when told it stopped):
// the Notify or Close in progress goes on, and the Subscriptions left do nothing.
TEST(CallbackListTest, ACallbackMayDestroyTheList) {
  auto list = std::make_unique<CallbackList<>>();
  int after = 0;
  Subscription first = list->Add([&] { list.reset(); });
  Subscription second = list->Add([&] { ++after; });
  list->Close();
  EXPECT_TRUE(list == nullptr);
  EXPECT_EQ(after, 1);
  second.Cancel();

  auto notified = std::make_unique<CallbackList<>>();
  Subscription third = notified->Add([&] { notified.reset(); });
  notified->Notify();
  EXPECT_TRUE(notified == nullptr);
  third.Cancel();
}

// Many threads add, notify, notify one and cancel at once. Every callback cancelled is silent
// afterwards; the test is mostly for ThreadSanitizer, which checks every call's state.
TEST(CallbackListTest, Concurrency_AddNotifyCancelFromManyThreads) {
  CallbackList<int> list;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> late_calls{0};
  std::vector<std::thread> notifiers;
  for (int i = 0; i < 3; ++i) {
    notifiers.emplace_back([&, i] {
      while (!stop.load()) {
        list.Notify(i);
        list.NotifyOne(1, i);
      }
    });
  }
  std::vector<std::thread> users;
  for (int u = 0; u < 3; ++u) {
    users.emplace_back([&] {
      for (int k = 0; k < 300; ++k) {
        struct State {
          std::atomic<bool> cancelled{false};
          int64_t calls = 0;  // guarded by mu: callbacks of one list may run on several threads
          absl::Mutex mu;
        };
        auto state = std::make_shared<State>();
        Subscription s = list.Add([&late_calls, state](const int&) {
          if (state->cancelled.load()) ++late_calls;
          absl::MutexLock l(&state->mu);
          ++state->calls;
        });
        if (k % 3 == 0) std::this_thread::yield();
        s.Cancel();
        state->cancelled = true;
      }
    });
  }
  for (std::thread& t : users) t.join();
  stop = true;
  for (std::thread& t : notifiers) t.join();
  EXPECT_EQ(late_calls.load(), 0);
}

}  // namespace
}  // namespace shardcache
