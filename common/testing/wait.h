// Waiting in tests: polling a condition with a bound, and client contexts with a deadline, so
// that no test waits forever on a server.
//
// Thread-safe: free functions.
#ifndef SHARDCACHE_COMMON_TESTING_WAIT_H_
#define SHARDCACHE_COMMON_TESTING_WAIT_H_

#include <grpcpp/client_context.h>

#include <functional>
#include <memory>

#include "absl/time/time.h"

namespace shardcache::testing {

// Polls `cond` every 10 ms until it holds (true) or `timeout` passes (false).
bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout = absl::Seconds(20));

// A client context whose deadline is `timeout` from now.
std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10));

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_WAIT_H_
