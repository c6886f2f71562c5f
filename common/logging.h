// Process-wide logging set-up: spdlog to stderr, one event a line, with a level and a timestamp.
//
// Call InitLogging once from main before any thread starts; after that spdlog's default logger is
// safe to use from any thread.
#ifndef SHARDCACHE_COMMON_LOGGING_H_
#define SHARDCACHE_COMMON_LOGGING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardcache {

// Sets the default logger's name (shown on each line) and level ("trace", "debug", "info",
// "warn", "error", "critical", "off"). Returns InvalidArgument for an unknown level.
absl::Status InitLogging(absl::string_view process_name, absl::string_view level);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_LOGGING_H_
