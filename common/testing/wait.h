// Waiting in tests: one way to poll a condition with a bound, and client contexts with a deadline
// that wait for a (re)starting server, so that no test waits forever on a server nor fails
// because a server was not up yet.
//
// A wait is for something that must happen. A check that something does NOT happen is never a
// fixed sleep: wait for an event that proves the effect would have happened by then (a later
// marker write or event that arrives after the one that must not, or a count of attempts), then
// assert the effect's absence once.
//
// Thread-safe: free functions.
#ifndef SHARDCACHE_COMMON_TESTING_WAIT_H_
#define SHARDCACHE_COMMON_TESTING_WAIT_H_

#include <grpcpp/client_context.h>
#include <gtest/gtest.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"

namespace shardcache::testing {

// How long a test waits for what must happen, by default: generous, because the machines that
// run the tests are busy; a wait that succeeds returns as soon as its condition holds.
inline constexpr absl::Duration kDefaultWait = absl::Seconds(20);

// Polls `cond` (first at once, then every 5 ms, backing off to every 50 ms) until it holds or
// `timeout` passes. Success says how long it took. Failure says "not within <timeout>: <what>"
// and, when `describe` is given, what it says about the state last seen:
//
//   ASSERT_TRUE(Eventually([&] { return sink.size() == 3; }, absl::Seconds(10),
//                          "the sink has 3 objects", [&] { return sink.Describe(); }));
::testing::AssertionResult Eventually(const std::function<bool()>& cond, absl::Duration timeout,
                                      const std::string& what,
                                      const std::function<std::string()>& describe = nullptr);
// The same, within kDefaultWait.
::testing::AssertionResult Eventually(const std::function<bool()>& cond, const std::string& what,
                                      const std::function<std::string()>& describe = nullptr);

// Eventually() as a bool, for older callers: true when `cond` held within `timeout`.
bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout = kDefaultWait);

// The calling thread's kernel id (gettid), for ThreadAsleep.
pid_t ThisThreadId();
// True while thread `tid` of this process is asleep in the kernel (state S in
// /proc/self/task/<tid>/stat: blocked on a lock, a join, a condition); false while it runs or
// once it has ended. To know that another thread has got as far as a call that must block:
//   Eventually([&] { return returned || ThreadAsleep(tid); }, ...), then EXPECT_FALSE(returned).
bool ThreadAsleep(pid_t tid);

// How many threads this process has now (entries of /proc/self/task); -1 if it cannot be read.
int ThreadsOfThisProcess();

// A client context whose deadline is `timeout` from now, and that waits for the channel to
// become ready (wait_for_ready) instead of failing at once with UNAVAILABLE while the server is
// (re)starting: an RPC fails only when the server is not up by the deadline.
std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10));

// A client context whose deadline is `timeout` from now and that fails at once (UNAVAILABLE)
// when the server cannot be reached: for tests that expect a server to be gone, and must not
// have their RPC sent later to a server that comes back.
std::unique_ptr<grpc::ClientContext> FailFastContext(absl::Duration timeout = absl::Seconds(10));

// Makes `call` (a whole call, with a fresh context each time) again while it fails UNAVAILABLE,
// at most `attempts` times. A server that stops closes its connections once its calls are
// answered; a client learns of that only by using the connection, so its first call on it after
// a restart can fail UNAVAILABLE. For idempotent calls of tests that restart a server.
grpc::Status RetryingUnavailable(const std::function<grpc::Status()>& call, int attempts = 5);

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_WAIT_H_
