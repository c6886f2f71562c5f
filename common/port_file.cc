#include "common/port_file.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace shardcache {

absl::Status WritePortFile(const std::string& path,
                           const std::vector<std::pair<std::string, int>>& ports) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& [name, port] : ports) out << name << "=" << port << "\n";
    if (!out.good()) return absl::UnavailableError(absl::StrCat("--port-file: cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("--port-file: cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace shardcache
