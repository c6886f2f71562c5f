// Helpers for tests of a cache_server that must refuse to start: run it to its exit and check
// that it said why on stderr.
//
// Thread-compatible; each call forks its own process.
#ifndef SHARDCACHE_INTEGRATION_TESTS_REFUSE_TO_START_H_
#define SHARDCACHE_INTEGRATION_TESTS_REFUSE_TO_START_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace shardcache::testing {

// "exit code 2", "killed by signal 9", ... (-1: "did not exit by itself").
std::string DescribeWaitStatus(int wait_status);

struct RunResult {
  int wait_status = -1;  // -1: it did not exit by itself
  std::string stderr_text;
  bool wrote_port_file = false;
};

// Runs cache_server with `args` (after --listen=127.0.0.1:0 --http-listen=127.0.0.1:0
// --port-file=..., which they may override) until it exits, for at most `timeout`. A server
// that starts instead gets one second to change its mind and is then killed.
RunResult RunCacheServer(const std::vector<std::string>& args,
                         absl::Duration timeout = absl::Seconds(15));

// Checks that a run refused to start: a non-zero exit, no port file, and a stderr line that
// starts "cache_server: refusing to start:" and mentions each of `mentions`.
void ExpectRefused(const RunResult& r, const std::vector<std::string>& mentions);
inline void ExpectRefused(const RunResult& r, const std::string& mention) {
  ExpectRefused(r, std::vector<std::string>{mention});
}

}  // namespace shardcache::testing

#endif  // SHARDCACHE_INTEGRATION_TESTS_REFUSE_TO_START_H_
