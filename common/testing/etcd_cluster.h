// EtcdCluster: a real etcd cluster on loopback, for tests and for the bench (store_bench's etcd
// target is a one-member cluster). Each member is a process of the etcd binary (Debian's
// etcd-server installs /usr/bin/etcd) on 127.0.0.1 only, with a client port and a peer port that
// the cluster picks free (by binding port 0), --initial-cluster naming every member, and its data
// in a temporary directory. etcd's defaults otherwise (heartbeat 100 ms, election timeout 1 s:
// quick enough for tests, and steady on a loaded two-core machine), and fsync on every commit.
//
//   EtcdCluster::Options options;
//   options.members = 3;
//   EtcdCluster cluster(options);
//   ASSERT_TRUE(cluster.Start().ok());
//   client options: endpoints = cluster.EndpointList()   // or the flag form, cluster.Endpoints()
//   cluster.Kill(0); ... cluster.Restart(0);
//
// A member that is down keeps its ports: this object holds a socket bound to each (without
// listening, so that a client's connection is refused as by a stopped server), so that no other
// process takes them before Restart, which must reuse them (the other members know them).
//
// Every member is killed (SIGKILL) by the destructor, and by the kernel if the test process dies
// (PR_SET_PDEATHSIG), so that a hung member never outlives its test. The temporary directory
// (data and logs) is removed then, unless the test failed or Options::keep_data is set; when a
// test failed, the tail of each member's log is printed.
//
// Thread-compatible: use one EtcdCluster from one thread.
#ifndef SHARDCACHE_COMMON_TESTING_ETCD_CLUSTER_H_
#define SHARDCACHE_COMMON_TESTING_ETCD_CLUSTER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace shardcache::testing {

class EtcdCluster {
 public:
  struct Options {
    // How many members (1 or 3, usually; at least 1).
    int members = 1;
    // The etcd executable.
    std::string binary = "/usr/bin/etcd";
    // Extra flags for every member, after the cluster's own (e.g. "--quota-backend-bytes=...").
    std::vector<std::string> args;
    // Keep the temporary directory (data and logs) when this object is destroyed.
    bool keep_data = false;
    // TLS on the members' client URLs (https) when set: a directory as scripts/make-certs.sh
    // makes it. Every member serves server.crt (which names 127.0.0.1) and requires a client
    // certificate signed by ca.crt (--client-cert-auth); Start's probe presents admin.crt.
    // The members talk to each other in plaintext.
    std::string tls_dir;
  };

  explicit EtcdCluster(Options options);
  // Kills every member (SIGKILL).
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Starts every member and waits until each answers a linearizable KV.Range (the cluster has a
  // leader and every member serves). A member that cannot bind its ports makes the whole start
  // be tried again on new ones (a few times). Errors: FAILED_PRECONDITION when the binary is
  // missing (the message says apt-get install etcd-server); UNAVAILABLE with the log's tail when
  // a member exits; DEADLINE_EXCEEDED when the cluster is not ready within `timeout`.
  // REQUIRES: called once.
  absl::Status Start(absl::Duration timeout = absl::Seconds(60));

  // Member i (0-based): SIGKILL, and waits for it to exit.
  void Kill(int i);
  // Member i: SIGTERM, and waits for it to exit (SIGKILL after `grace`).
  void Stop(int i, absl::Duration grace = absl::Seconds(10));
  // Starts member i again (after Kill or Stop), with its data directory and ports, and waits
  // until it answers a linearizable KV.Range (so the cluster needs a quorum with it). Errors as
  // for Start. REQUIRES: member i is down.
  absl::Status Restart(int i, absl::Duration timeout = absl::Seconds(60));

  int size() const { return static_cast<int>(members_.size()); }
  // Whether member i's process is running (reaps it if it has exited).
  bool Running(int i);
  // "127.0.0.1:<client port>" of member i, and of every member (stopped ones too).
  std::string endpoint(int i) const;
  std::vector<std::string> EndpointList() const;
  // The same, comma-separated ("127.0.0.1:p1,127.0.0.1:p2,..."), as a flag takes them.
  std::string Endpoints() const;
  pid_t pid(int i) const { return members_[i].pid; }
  // Member i's data directory (kept across Kill, Stop and Restart).
  std::string data_dir(int i) const;
  // Everything member i has written (stdout and stderr, every run) so far.
  std::string Log(int i) const;
  // The command line member i runs with.
  std::string CommandLine(int i) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
    // Sockets bound to the member's ports while it is down, or -1.
    int client_hold = -1;
    int peer_hold = -1;
  };

  // One attempt of Start: fresh directories and ports.
  absl::Status StartOnce(absl::Time deadline);
  std::vector<std::string> Argv(int i) const;
  // Forks and execs member i.
  absl::Status Spawn(int i);
  // Waits until member i answers a linearizable KV.Range.
  absl::Status AwaitReady(int i, absl::Time deadline);
  // SIGKILLs and reaps every member.
  void KillAll();
  void HoldPorts(int i);
  void ReleasePorts(int i);
  std::string LogPath(int i) const;
  std::string LogTail(int i) const;

  const Options options_;
  std::string dir_;  // temporary: member-<i>/ (data) and member-<i>.log
  std::vector<Member> members_;
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_ETCD_CLUSTER_H_
