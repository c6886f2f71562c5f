#include "common/flags.h"

#include <prometheus/gauge.h>

#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

#ifndef SHARDCACHE_VERSION
#define SHARDCACHE_VERSION "unknown"
#endif
#ifndef SHARDCACHE_COMMIT
#define SHARDCACHE_COMMIT "unknown"
#endif

namespace shardcache {
namespace {

// "--name-with-dashes", as the flag is documented.
std::string Display(absl::string_view name) {
  return absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}));
}

// Flags that Abseil's parser handles itself: their values name files or other flags, or they are
// its usage flags (--help, --version, ...), which are not in the flag registry.
bool HandledByParser(absl::string_view name) {
  for (absl::string_view special :
       {"flagfile", "fromenv", "tryfromenv", "undefok", "help", "helpfull", "helpshort",
        "helppackage", "version", "only_check_args", "helpon", "helpmatch"}) {
    if (name == special) return true;
  }
  return false;
}

// Those of them that take a value.
bool TakesValue(absl::string_view name) {
  return name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok" ||
         name == "helpon" || name == "helpmatch";
}

}  // namespace

char** NormalizeFlagNames(int argc, char** argv) {
  static auto* storage = new std::vector<std::string>();
  static auto* pointers = new std::vector<char*>();
  storage->reserve(argc);
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") flags_done = true;
    if (!flags_done && i > 0 && arg.size() > 2 && arg[0] == '-' && arg[1] == '-') {
      size_t end = arg.find('=');
      if (end == std::string::npos) end = arg.size();
      for (size_t j = 2; j < end; ++j) {
        if (arg[j] == '-') arg[j] = '_';
      }
    }
    storage->push_back(std::move(arg));
  }
  for (auto& s : *storage) pointers->push_back(s.data());
  pointers->push_back(nullptr);
  return pointers->data();
}

absl::Status CheckCommandLine(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      if (i + 1 < argc) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", argv[i + 1],
                                                       "\" (this program takes flags only)"));
      }
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", arg, "\" (this program takes flags only)"));
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    absl::string_view name = arg;
    absl::string_view value;
    bool has_value = false;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    if (HandledByParser(name)) {
      if (!has_value && TakesValue(name)) ++i;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;  // --nosync
    }
    if (flag == nullptr || flag->IsRetired()) {
      return absl::InvalidArgumentError(absl::StrCat(Display(name), ": unknown flag"));
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) continue;  // --sync
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat(Display(name), ": missing value"));
      }
      value = argv[++i];
    }
    // A copy of the flag's parsing, on the flag itself: absl::ParseCommandLine sets it again.
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Display(name), ": invalid value \"", value, "\": ", error));
    }
  }
  return absl::OkStatus();
}

const char* BuildVersion() { return SHARDCACHE_VERSION; }
const char* BuildCommit() { return SHARDCACHE_COMMIT; }

std::string VersionText(const std::string& program) {
  return absl::StrCat(program, " ", BuildVersion(), " (commit ", BuildCommit(), ")");
}

void RegisterBuildInfo(prometheus::Registry& registry) {
  prometheus::BuildGauge()
      .Name("shardcache_build_info")
      .Help("1, labelled with the version and the git commit this binary was built from")
      .Register(registry)
      .Add({{"version", BuildVersion()}, {"commit", BuildCommit()}})
      .Set(1);
}

}  // namespace shardcache
