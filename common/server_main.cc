#include "common/server_main.h"

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/signals.h"

ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off");

namespace shardcache {
namespace {

// The program that Refuse names.
const char* refusing_program = "shardcache";

// A source file's name as --help shows it: "cache_server/cache_server_main.cc", whatever the
// build tree's path ("../../cache_server/...", "/tmp/build/src/cache_server/...").
std::string NormalizeFilename(absl::string_view file) {
  size_t absl_at = file.rfind("absl/");
  if (absl_at != absl::string_view::npos && (absl_at == 0 || file[absl_at - 1] == '/')) {
    return std::string(file.substr(absl_at));
  }
  size_t last = file.rfind('/');
  if (last == absl::string_view::npos || last == 0) return std::string(file);
  size_t before = file.rfind('/', last - 1);
  return std::string(before == absl::string_view::npos ? file : file.substr(before + 1));
}

// --help lists the flags of shardcache's own files (Abseil's own are in --helpfull).
bool OwnFlags(absl::string_view file) {
  return !absl::StartsWith(NormalizeFilename(file), "absl/");
}

}  // namespace

namespace {

// glibc's malloc gives each thread that meets contention an arena of its own (up to eight per
// core) and keeps what is freed in the arena it came from. gRPC's threads allocate and free the
// watch path's messages on different threads, so free memory piled up in many arenas, and the
// high-water mark of the heap grew with the load. Two arenas, and fixed thresholds above which
// memory is mapped on its own and the heap's free top is given back, lowered cache_server's peak
// memory under a watch load by about a fifth, at the same throughput (docs/BENCHMARKS.md). The
// environment decides when it says anything (MALLOC_ARENA_MAX, GLIBC_TUNABLES).
void TuneMalloc() {
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr || std::getenv("GLIBC_TUNABLES") != nullptr) {
    return;
  }
  constexpr int kArenas = 2;
  constexpr int kThresholdBytes = 128 << 10;
  mallopt(M_ARENA_MAX, kArenas);
  mallopt(M_MMAP_THRESHOLD, kThresholdBytes);
  mallopt(M_TRIM_THRESHOLD, kThresholdBytes);
}

}  // namespace

absl::Status InitServerMain(int argc, char** argv, const char* usage) {
  TuneMalloc();
  BlockTerminationSignals();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(usage);
  std::string program = argc > 0 ? argv[0] : "shardcache";
  program = program.substr(program.rfind('/') + 1);  // npos + 1 == 0: all of it
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = OwnFlags;
  config.contains_help_flags = OwnFlags;
  config.normalize_filename = NormalizeFilename;
  config.version_string = [program]() { return VersionText(program) + "\n"; };
  absl::SetFlagsUsageConfig(config);
  char** normalized = NormalizeFlagNames(argc, argv);
  absl::Status checked = CheckCommandLine(argc, normalized);
  if (!checked.ok()) return checked;
  absl::ParseCommandLine(argc, normalized);
  return absl::OkStatus();
}

int Refuse(const absl::Status& why) {
  std::fprintf(stderr, "%s: refusing to start: %s\n", refusing_program,
               std::string(why.message()).c_str());
  return 2;
}

int ServerMain(int argc, char** argv, const char* program, const char* usage,
               const std::function<int()>& run) {
  refusing_program = program;
  absl::Status flags = InitServerMain(argc, argv, usage);
  if (!flags.ok()) return Refuse(flags);
  absl::Status logging = InitLogging(program, absl::GetFlag(FLAGS_log_level));
  if (!logging.ok()) return Refuse(logging);
  return run();
}

}  // namespace shardcache
