// The start of a shardcache server's main (cache_server, shard_replicator), before any thread is
// created.
//
//   int main(int argc, char** argv) {
//     absl::Status flags = shardcache::InitServerMain(argc, argv, "usage: ...");
//     if (!flags.ok()) return Refuse(flags);  // "<program>: refusing to start: <why>", exit 2
//     ...
//
// For main's thread only, before any other thread starts. Not thread-safe.
#ifndef SHARDCACHE_COMMON_SERVER_MAIN_H_
#define SHARDCACHE_COMMON_SERVER_MAIN_H_

#include "absl/status/status.h"

namespace shardcache {

// Blocks SIGTERM and SIGINT (see signals.h), turns off Abseil's mutex deadlock detection
// (Debian's Abseil has it on, which puts every lock acquisition through a global graph: too
// costly for a server; the tests keep it on), sets the --help text (flags listed by source file,
// without build-tree paths) and the --version text (common/flags.h's VersionText), checks the
// flags (CheckCommandLine; an error is returned, nothing parsed) and parses them in either
// spelling. --help and --version print and exit, as Abseil does.
absl::Status InitServerMain(int argc, char** argv, const char* usage);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_SERVER_MAIN_H_
