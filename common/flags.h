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

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_FLAGS_H_
