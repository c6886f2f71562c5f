#include "bench/cpu_limit.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace shardcache::bench {
namespace {

constexpr int64_t kPeriodUs = 100000;

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write \"", text, "\" to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuLimit>> CpuLimit::Create(const std::string& name, double cores) {
  if (!(cores > 0) || cores > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("a CPU limit of ", cores, " cores"));
  }
  const int64_t quota_us = std::max<int64_t>(1000, std::llround(cores * kPeriodUs));
  const std::string leaf = absl::StrCat("shardcache-bench-", getpid(), "-", name);
  // cgroup v2 (the unified tree, mounted on /sys/fs/cgroup or beside v1 on .../unified) when its
  // cpu controller is enabled for children; else v1's cpu hierarchy.
  for (const std::string root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    std::ifstream controllers(root + "/cgroup.subtree_control");
    std::string line;
    std::getline(controllers, line);
    if (!controllers || (" " + line + " ").find(" cpu ") == std::string::npos) continue;
    std::string path = root + "/" + leaf;
    if (mkdir(path.c_str(), 0755) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot make the cgroup ", path, ": ", std::strerror(errno)));
    }
    auto limit = std::unique_ptr<CpuLimit>(new CpuLimit(path));
    if (absl::Status s = WriteFile(path + "/cpu.max", absl::StrCat(quota_us, " ", kPeriodUs));
        !s.ok()) {
      return s;
    }
    return limit;
  }
  const std::string v1 = "/sys/fs/cgroup/cpu";
  if (!IsDirectory(v1)) {
    return absl::FailedPreconditionError(
        "no cgroup with the cpu controller: neither /sys/fs/cgroup/cgroup.subtree_control "
        "(v2) names cpu nor /sys/fs/cgroup/cpu (v1) exists");
  }
  std::string path = v1 + "/" + leaf;
  if (mkdir(path.c_str(), 0755) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot make the cgroup ", path, ": ",
                                                    std::strerror(errno), " (run as root)"));
  }
  auto limit = std::unique_ptr<CpuLimit>(new CpuLimit(path));
  if (absl::Status s = WriteFile(path + "/cpu.cfs_period_us", absl::StrCat(kPeriodUs)); !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteFile(path + "/cpu.cfs_quota_us", absl::StrCat(quota_us)); !s.ok()) {
    return s;
  }
  return limit;
}

CpuLimit::~CpuLimit() {
  if (rmdir(path_.c_str()) != 0 && errno != ENOENT) {
    std::cerr << "store_bench: cannot remove the cgroup " << path_ << ": " << std::strerror(errno)
              << "\n";
  }
}

absl::Status CpuLimit::Add(pid_t pid) {
  return WriteFile(path_ + "/cgroup.procs", absl::StrCat(pid));
}

}  // namespace shardcache::bench
