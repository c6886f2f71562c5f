// Helpers for tests of a binary (cache_server, shard_replicator) that must refuse to start: run it
// to its exit and check that it said why on stderr.
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

// What a run of a binary that should refuse to start did.
struct RunResult {
  std::string program;   // the binary's name, e.g. "cache_server"
  int wait_status = -1;  // as from waitpid; -1: it did not exit by itself
  std::string stderr_text;
  std::string stdout_text;
  bool wrote_port_file = false;
};

// Runs `binary` (a path relative to the build tree, as for BinaryPath) with `leading_args`,
// --port-file=<a new file> and `args` until it exits, for at most `timeout`. One that starts
// instead (writes its port file) gets one second to change its mind and is then killed.
RunResult RunToExit(const std::string& binary, const std::vector<std::string>& leading_args,
                    const std::vector<std::string>& args, absl::Duration timeout);

// Runs cache_server with `args` (after --listen=127.0.0.1:0 --http-listen=127.0.0.1:0
// --port-file=..., which they may override) until it exits, for at most `timeout`. A server
// that starts instead gets one second to change its mind and is then killed.
RunResult RunCacheServer(const std::vector<std::string>& args,
                         absl::Duration timeout = absl::Seconds(15));

// The exit code of a run that exited by itself, else -1.
int ExitCode(const RunResult& r);

// Checks that a run refused to start: exit code `exit_code` (any non-zero one when -1), no port
// file, and a stderr line that starts "<program>: refusing to start:" and mentions each of
// `mentions`.
void ExpectRefused(const RunResult& r, const std::vector<std::string>& mentions,
                   int exit_code = -1);
inline void ExpectRefused(const RunResult& r, const std::string& mention, int exit_code = -1) {
  ExpectRefused(r, std::vector<std::string>{mention}, exit_code);
}

}  // namespace shardcache::testing

#endif  // SHARDCACHE_INTEGRATION_TESTS_REFUSE_TO_START_H_
