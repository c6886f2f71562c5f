// WritePortFile: how a shardcache process started on port 0 tells its starter (tests, scripts)
// which ports it bound: lines "name=port" written to a temporary file and renamed into place, so
// that a reader never sees a partial file.
//
// Thread-safe: a pure function of its arguments (and the file system).
#ifndef SHARDCACHE_COMMON_PORT_FILE_H_
#define SHARDCACHE_COMMON_PORT_FILE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace shardcache {

// Writes one line "name=port" per entry, in order, to `path`. UNAVAILABLE naming --port-file when
// the file cannot be written.
absl::Status WritePortFile(const std::string& path,
                           const std::vector<std::pair<std::string, int>>& ports);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_PORT_FILE_H_
