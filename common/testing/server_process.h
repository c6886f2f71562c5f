// ServerProcess: runs a real shardcache binary for a test, on loopback ports that the binary
// picks itself and reports through --port-file, with its data in the test's own temporary
// directory.
//
// cache_server (any binary whose file name contains "cache_server") gets
// --listen=127.0.0.1:0 --http-listen=127.0.0.1:0 --port-file=... (and --data-dir unless `args`
// name one); Start waits until the port file has both grpc_port= and http_port=. Any other
// binary (e.g. shard_replicator, which serves no gRPC) gets only --http-listen=127.0.0.1:0
// --port-file=...; Start waits for http_port= alone, and grpc_port() stays 0.
//
// With SHARDCACHE_TEST_STORAGE=etcd in the environment (ctest runs the store's process tests a
// second time so), a cache_server whose `args` name no --storage gets --storage=etcd on a
// one-member etcd cluster (EtcdCluster) that this object starts at the first Start and keeps,
// as it keeps the data directory, until it is destroyed.
//
// The process's stderr goes to a log file in the test's temporary directory; when a test fails
// the log's tail is printed. The destructor stops the process (SIGTERM, then SIGKILL after a
// grace period), so a hung server never outlives its test.
//
// Thread-compatible: use one ServerProcess from one thread.
#ifndef SHARDCACHE_COMMON_TESTING_SERVER_PROCESS_H_
#define SHARDCACHE_COMMON_TESTING_SERVER_PROCESS_H_

#include <netinet/in.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/testing/etcd_cluster.h"

namespace shardcache::testing {

// The storage that the process tests run cache_server on: "rocksdb", or "etcd" with
// SHARDCACHE_TEST_STORAGE=etcd (see ServerProcess).
std::string StorageUnderTest();
// The revision of a new store: 1 on RocksDB; 2 on etcd, where the store's creation (format
// marker and identity) is a new cluster's first change. Each write raises it by one; on etcd
// (in a cluster that holds only this store) so does a consistent read that found no write
// coming (it writes the progress key).
int64_t FirstRevision();

// The path of a binary built by this project, e.g. BinaryPath("cache_server/cache_server"): under
// the build tree, or under $SHARDCACHE_BINARY_DIR when it is set (to run the tests against
// binaries copied elsewhere, e.g. a long soak that must not see a rebuild).
std::string BinaryPath(const std::string& relative);

// A fresh empty directory under the test temporary directory.
std::string MakeTempDir(const std::string& prefix);

class ServerProcess {
 public:
  // `binary` is a path; `args` are extra flags (the listen and port-file flags are added, see
  // above).
  ServerProcess(std::string binary, std::vector<std::string> args);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts the process and waits until it has written its port file (grpc_port= and http_port=
  // for cache_server, http_port= for other binaries). A restarted cache_server gets the gRPC
  // port it had; when that is taken for a moment, the start is tried again for up to 10 s.
  //
  // While a cache_server is down between a stop and a restart, its gRPC port stays reserved for
  // it: this object keeps a socket bound to the port (without listening, so that a call to it is
  // refused as to a stopped server). The kernel gives a port that has a bound socket neither to a
  // bind to port 0 nor to an outgoing connection, so no server of another test gets the port
  // meanwhile, and the clients of this test, which keep calling the address, never reach one.
  absl::Status Start(absl::Duration timeout = absl::Seconds(30));
  // Sends SIGTERM and waits for exit; returns the exit status as from waitpid (or -1 on
  // timeout, after which the process was killed with SIGKILL).
  int Stop(absl::Duration grace = absl::Seconds(15));
  // Sends a signal without waiting (e.g. SIGKILL, SIGSTOP, SIGCONT).
  void Signal(int sig);
  // Sends SIGSTOP and waits (up to 10 s) until every thread of the process is stopped, so that
  // not even a request already being read is served. Returns false if they did not all stop.
  // Resume with Signal(SIGCONT).
  bool Pause();
  // Waits for the process to exit by itself; returns the waitpid status or -1 on timeout.
  int Wait(absl::Duration timeout);
  bool Running() const { return pid_ > 0; }

  // 0 for binaries other than cache_server.
  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }
  std::string grpc_address() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  pid_t pid() const { return pid_; }
  // The data directory a cache_server uses unless `args` name one: kept across Stop and Start,
  // so that a restarted server finds its data.
  std::string data_dir() const { return dir_ + "/data"; }
  // Everything the process has written to stderr so far.
  std::string Log() const;

 private:
  // One attempt of Start.
  absl::Status StartOnce(absl::Time deadline);
  // Whether binary_ is a cache_server (gets --listen and --data-dir, reports a gRPC port).
  bool IsCacheServer() const;
  // Whether `args` choose a storage (--storage=...).
  static bool NamesStorage(const std::vector<std::string>& args);
  // Once the process has exited: binds port_hold_ to the gRPC port (see Start).
  void HoldPort();
  // Closes port_hold_, so that the process can listen on the port again.
  void ReleasePort();

  std::string binary_;
  std::vector<std::string> args_;
  std::string dir_;
  pid_t pid_ = -1;
  int grpc_port_ = 0;
  int http_port_ = 0;
  // A socket bound to grpc_port_ while the process is down, or -1.
  int port_hold_ = -1;
  // With SHARDCACHE_TEST_STORAGE=etcd: the cluster the cache_server stores in.
  std::unique_ptr<EtcdCluster> etcd_;
};

// The address 127.0.0.1:port.
sockaddr_in LoopbackAddress(int port);

// A minimal HTTP GET against 127.0.0.1:port; returns "<status code>\n<body>" or an error.
std::string HttpGet(int port, const std::string& path);

// The value of metric `name` on the process's /metrics page: the sum over every series whose
// labels contain each of `labels` (e.g. {"code=\"ABORTED\""}); -1 when no series matches or the
// page cannot be read.
double Metric(int http_port, const std::string& name, const std::vector<std::string>& labels = {});

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_SERVER_PROCESS_H_
