// EtcdProcess: an etcd server that store_bench starts itself, to load it side by side with
// cache_server. One member, on 127.0.0.1 only, on client and peer ports it picks free, with its
// data in a fresh temporary directory (removed when it stops) and etcd's defaults otherwise:
// fsync on every commit, as cache_server's default.
//
// Thread-compatible: call it from one thread.
#ifndef SHARDCACHE_BENCH_ETCD_PROCESS_H_
#define SHARDCACHE_BENCH_ETCD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace shardcache::bench {

class EtcdProcess {
 public:
  // `binary`: the etcd executable (Debian's etcd-server installs /usr/bin/etcd); `args`: extra
  // flags, after the tool's own.
  EtcdProcess(std::string binary, std::vector<std::string> args);
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Starts etcd and waits until it answers a KV.Range. Fails with a clear message when the binary
  // is missing (apt-get install etcd-server).
  absl::Status Start(absl::Duration timeout = absl::Seconds(60));
  // SIGTERM, then SIGKILL after `grace`; removes the data directory unless `keep_data`.
  void Stop(bool keep_data = false, absl::Duration grace = absl::Seconds(15));

  std::string address() const { return "127.0.0.1:" + std::to_string(client_port_); }
  pid_t pid() const { return pid_; }
  std::string data_dir() const { return dir_.empty() ? "" : dir_ + "/data"; }
  // The command line it was started with.
  std::string CommandLine() const;
  // etcd's output (stdout and stderr) so far.
  std::string Log() const;

 private:
  absl::Status StartOnce(absl::Duration timeout);
  // Reaps the process if it has exited; true if it is still running.
  bool Alive();

  const std::string binary_;
  const std::vector<std::string> args_;
  std::string dir_;  // temporary: data/ and etcd.log
  std::vector<std::string> argv_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_ETCD_PROCESS_H_
