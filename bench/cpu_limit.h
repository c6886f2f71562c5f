// CpuLimit: a cap on the CPU that a set of processes may use together, as a cgroup of its own
// (cgroup v2's cpu.max, or cgroup v1's cpu.cfs_quota_us), so that on one shared machine a
// process can stand for a server with a machine of its own of that size. store_bench puts each
// cache_server replica into one (--server-cores) to show how fan-out scales with replicas when
// each replica, not the machine, is the limit.
//
// Needs root (or a delegated cgroup tree). The group is removed when the CpuLimit is destroyed;
// its processes must have exited by then (a group that still holds a process stays, and is
// named on stderr).
//
// Thread-compatible: one thread at a time.
#ifndef SHARDCACHE_BENCH_CPU_LIMIT_H_
#define SHARDCACHE_BENCH_CPU_LIMIT_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardcache::bench {

class CpuLimit {
 public:
  // A new group named `name` (unique per process: the pid is added) whose processes may use
  // `cores` cores together (e.g. 0.5), with a period of 100 ms.
  static absl::StatusOr<std::unique_ptr<CpuLimit>> Create(const std::string& name, double cores);
  ~CpuLimit();
  CpuLimit(const CpuLimit&) = delete;
  CpuLimit& operator=(const CpuLimit&) = delete;

  // Moves process `pid` (every thread of it) into the group; threads it starts later stay there.
  absl::Status Add(pid_t pid);
  // The group's folder, for the reports.
  const std::string& path() const { return path_; }

 private:
  explicit CpuLimit(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_CPU_LIMIT_H_
