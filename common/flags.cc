#include "common/flags.h"

#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "common/signals.h"

namespace shardcache {

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

void InitServerMain(int argc, char** argv, const char* usage) {
  BlockTerminationSignals();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, NormalizeFlagNames(argc, argv));
}

}  // namespace shardcache
