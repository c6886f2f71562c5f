// Flags of a shardcache program: their spelling, one check of a command line, and the program's
// build identity (--version, the shardcache_build_info metric). common/server_main.h puts them
// together at the start of a server's main.
//
// Flag spelling: shardcache's flags are written with dashes (--http-listen), as Kubernetes
// components spell theirs; Abseil names them with underscores. NormalizeFlagNames rewrites each
// "--name-with-dashes[=value]" argument to "--name_with_dashes[=value]" so both spellings work.
//
// Bad flags: Abseil's parser exits 1 with its own message on an unknown flag or a value that does
// not parse. CheckCommandLine finds those first and returns them as an error, so that main
// refuses to start as for every other bad flag ("<program>: refusing to start: <why>", exit
// code 2), before it starts anything.
//
// All functions here are for main's thread, before any other thread starts. Not thread-safe.
#ifndef SHARDCACHE_COMMON_FLAGS_H_
#define SHARDCACHE_COMMON_FLAGS_H_

#include <prometheus/registry.h>

#include <string>

#include "absl/status/status.h"

namespace shardcache {

// Returns an argv to pass to absl::ParseCommandLine (same argc). Its strings live for the life of
// the process.
char** NormalizeFlagNames(int argc, char** argv);

// Checks a (normalized) command line as absl::ParseCommandLine reads it: every argument is a flag
// that exists ("--name=value", "--name value", "--bool", "--nobool"), and every value parses.
// INVALID_ARGUMENT naming the flag (as --name-with-dashes) and why; positional arguments are
// refused too (neither server takes any).
absl::Status CheckCommandLine(int argc, char** argv);

// The product version (CMake's project VERSION) and the git commit the binary was configured
// from ("unknown" outside a git checkout).
const char* BuildVersion();
const char* BuildCommit();

// "<program> <version> (commit <commit>)", what --version prints.
std::string VersionText(const std::string& program);

// Adds the gauge shardcache_build_info{version="...",commit="..."} = 1 to a registry.
void RegisterBuildInfo(prometheus::Registry& registry);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_FLAGS_H_
