// The main of a shardcache server (cache_server, shard_replicator): what happens before any thread
// is created, and one way to refuse to start.
//
//   int main(int argc, char** argv) {
//     return shardcache::ServerMain(argc, argv, "cache_server", "usage: ...", [] {
//       ...  // checks that need more than one flag: return shardcache::Refuse(...) on error
//       return Run();
//     });
//   }
//
// The --log-level flag is defined here, for every server.
//
// For main's thread only, before any other thread starts. Not thread-safe.
#ifndef SHARDCACHE_COMMON_SERVER_MAIN_H_
#define SHARDCACHE_COMMON_SERVER_MAIN_H_

#include <functional>

#include "absl/status/status.h"

namespace shardcache {

// Tunes glibc's malloc for a long-running server with many threads (two arenas, fixed mmap and trim
// thresholds; not when MALLOC_ARENA_MAX or GLIBC_TUNABLES is set), blocks SIGTERM and SIGINT (see
// signals.h), turns off Abseil's mutex deadlock detection (Debian's Abseil has it on, which puts
// every lock acquisition through a global graph: too costly for a server; the tests keep it on),
// sets the --help text (flags listed by source file, without build-tree paths) and the --version
// text (common/flags.h's VersionText), checks the flags (CheckCommandLine; an error is returned,
// nothing parsed) and parses them in either spelling. --help and --version print and exit, as
// Abseil does.
absl::Status InitServerMain(int argc, char** argv, const char* usage);

// Says on stderr why the server refuses to start ("<program>: refusing to start: <why>", the
// program named by the last ServerMain) and returns main's exit code for it, 2.
int Refuse(const absl::Status& why);

// InitServerMain, then logging (common/logging.h) at --log-level, then `run`, whose result is
// main's. A bad flag or log level is refused (Refuse) before `run`.
int ServerMain(int argc, char** argv, const char* program, const char* usage,
               const std::function<int()>& run);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_SERVER_MAIN_H_
