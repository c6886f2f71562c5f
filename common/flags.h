// Flag spelling: shardcache's flags are written with dashes (--http-listen), as Kubernetes
// components spell theirs; Abseil names them with underscores. NormalizeFlagNames rewrites each
// "--name-with-dashes[=value]" argument to "--name_with_dashes[=value]" so both spellings work.
//
// Call once from main, before absl::ParseCommandLine. Not thread-safe (it edits argv's strings
// into storage it owns for the life of the process).
#ifndef SHARDCACHE_COMMON_FLAGS_H_
#define SHARDCACHE_COMMON_FLAGS_H_

namespace shardcache {

// Returns an argv to pass to absl::ParseCommandLine (same argc).
char** NormalizeFlagNames(int argc, char** argv);

// The start of a shardcache server's main, before any thread is created: blocks SIGTERM and
// SIGINT (see signals.h), turns off Abseil's mutex deadlock detection (Debian's Abseil has it on,
// which puts every lock acquisition through a global graph: too costly for a server; the tests
// keep it on), sets the --help text, and parses the flags in either spelling.
void InitServerMain(int argc, char** argv, const char* usage);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_FLAGS_H_
