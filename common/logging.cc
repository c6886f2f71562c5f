#include "common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace shardcache {

absl::Status InitLogging(absl::string_view process_name, absl::string_view level) {
  spdlog::level::level_enum lvl = spdlog::level::from_str(std::string(level));
  // from_str maps anything unknown to "off"; only accept "off" when it was asked for.
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-level: unknown level \"", level,
                     "\" (want trace, debug, info, warn, error, critical or off)"));
  }
  auto logger = spdlog::stderr_logger_mt(std::string(process_name));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %^%l%$ %n: %v", spdlog::pattern_time_type::utc);
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace shardcache
