#include "common/testing/etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/testing/server_process.h"
#include "common/tls.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace shardcache::testing {
namespace {

// A loopback port that was free a moment ago (0 on failure). etcd binds it by itself, so another
// process could take it in between: Start then tries again on new ports.
int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr = LoopbackAddress(0);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// A socket bound to 127.0.0.1:port (not listening), or -1 if the port is taken.
int BindPort(int port) {
  // Close-on-exec: the members started later must not inherit it.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  // SO_REUSEADDR, as etcd's own sockets: the port may still have connections of the stopped
  // member in TIME_WAIT.
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = LoopbackAddress(port);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string Tail(std::string text, size_t max) {
  if (text.size() > max) text = "..." + text.substr(text.size() - max);
  return text;
}

}  // namespace

EtcdCluster::EtcdCluster(Options options) : options_(std::move(options)) {}

EtcdCluster::~EtcdCluster() {
  const bool failed = ::testing::Test::HasFailure();
  if (failed) {
    for (int i = 0; i < size(); ++i) {
      std::cerr << "--- etcd member " << i << " log (" << LogPath(i) << ") ---\n"
                << LogTail(i) << "---\n";
    }
  }
  KillAll();
  for (int i = 0; i < size(); ++i) ReleasePorts(i);
  // Keep the directory (data and logs) of a failed test for a look.
  if (!dir_.empty() && !failed && !options_.keep_data) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

absl::Status EtcdCluster::Start(absl::Duration timeout) {
  if (access(options_.binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("etcd is not installed at ", options_.binary,
                                                      " (on Debian: apt-get install etcd-server)"));
  }
  if (options_.members < 1) return absl::InvalidArgumentError("an etcd cluster needs a member");
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    last = StartOnce(deadline);
    if (last.ok() || absl::IsDeadlineExceeded(last)) return last;
    KillAll();
    for (int i = 0; i < size(); ++i) ReleasePorts(i);
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
      dir_.clear();
    }
  }
  return last;
}

absl::Status EtcdCluster::StartOnce(absl::Time deadline) {
  dir_ = MakeTempDir("etcd");
  if (dir_.empty()) return absl::InternalError("cannot make a temporary directory");
  members_.assign(options_.members, Member{});
  std::set<int> ports;
  for (int i = 0; i < size(); ++i) {
    Member& m = members_[i];
    m.name = absl::StrCat("member", i);
    m.client_port = PickFreePort();
    m.peer_port = PickFreePort();
    if (m.client_port == 0 || m.peer_port == 0 || !ports.insert(m.client_port).second ||
        !ports.insert(m.peer_port).second) {
      return absl::UnavailableError("cannot find free loopback ports");
    }
  }
  for (int i = 0; i < size(); ++i) {
    absl::Status s = Spawn(i);
    if (!s.ok()) return s;
  }
  for (int i = 0; i < size(); ++i) {
    absl::Status s = AwaitReady(i, deadline);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::vector<std::string> EtcdCluster::Argv(int i) const {
  const Member& m = members_[i];
  std::vector<std::string> initial;
  for (const Member& other : members_) {
    initial.push_back(absl::StrCat(other.name, "=http://127.0.0.1:", other.peer_port));
  }
  const std::string client_url =
      absl::StrCat(options_.tls_dir.empty() ? "http" : "https", "://127.0.0.1:", m.client_port);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", m.peer_port);
  std::vector<std::string> argv = {options_.binary,
                                   "--name=" + m.name,
                                   "--data-dir=" + data_dir(i),
                                   "--listen-client-urls=" + client_url,
                                   "--advertise-client-urls=" + client_url,
                                   "--listen-peer-urls=" + peer_url,
                                   "--initial-advertise-peer-urls=" + peer_url,
                                   "--initial-cluster=" + absl::StrJoin(initial, ","),
                                   "--initial-cluster-state=new",
                                   "--initial-cluster-token=" + dir_};
  if (!options_.tls_dir.empty()) {
    argv.push_back("--cert-file=" + options_.tls_dir + "/server.crt");
    argv.push_back("--key-file=" + options_.tls_dir + "/server.key");
    argv.push_back("--trusted-ca-file=" + options_.tls_dir + "/ca.crt");
    argv.push_back("--client-cert-auth");
  }
  argv.insert(argv.end(), options_.args.begin(), options_.args.end());
  return argv;
}

absl::Status EtcdCluster::Spawn(int i) {
  Member& m = members_[i];
  ReleasePorts(i);
  std::vector<std::string> args = Argv(i);
  const std::string log_path = LogPath(i);
  m.pid = fork();
  if (m.pid < 0) {
    m.pid = -1;
    return absl::InternalError("fork failed");
  }
  if (m.pid == 0) {
    // A member must not outlive the test, even when the test process is killed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(args[0].c_str(), argv.data());
    _exit(127);
  }
  return absl::OkStatus();
}

absl::Status EtcdCluster::AwaitReady(int i, absl::Time deadline) {
  // A fresh channel, so that its reconnection backoff does not outlast the member's start.
  TlsFiles tls;
  if (!options_.tls_dir.empty()) {
    tls.cert_file = options_.tls_dir + "/admin.crt";
    tls.key_file = options_.tls_dir + "/admin.key";
    tls.ca_file = options_.tls_dir + "/ca.crt";
  }
  auto kv =
      etcdserverpb::KV::NewStub(grpc::CreateChannel(endpoint(i), MakeChannelCredentials(tls)));
  while (absl::Now() < deadline) {
    if (!Running(i)) {
      return absl::UnavailableError(
          absl::StrCat("etcd member ", i, " exited while starting:\n", LogTail(i)));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(2))));
    ctx.set_wait_for_ready(true);
    etcdserverpb::RangeRequest request;
    request.set_key("etcd-cluster-ready");
    etcdserverpb::RangeResponse response;
    if (kv->Range(&ctx, request, &response).ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("etcd member ", i, " did not answer a KV.Range in time:\n", LogTail(i)));
}

void EtcdCluster::Kill(int i) {
  Member& m = members_[i];
  if (m.pid > 0) {
    kill(m.pid, SIGKILL);
    waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }
  HoldPorts(i);
}

void EtcdCluster::Stop(int i, absl::Duration grace) {
  Member& m = members_[i];
  if (m.pid > 0) {
    kill(m.pid, SIGTERM);
    const absl::Time deadline = absl::Now() + grace;
    while (Running(i) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  }
  Kill(i);  // if it is still running; holds its ports
}

absl::Status EtcdCluster::Restart(int i, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (Running(i)) {
    return absl::FailedPreconditionError(absl::StrCat("etcd member ", i, " is running"));
  }
  // The ports were held since the member went down; between their release and etcd's bind
  // another process may take one for a moment (e.g. as the local end of a connection): try again.
  absl::Status s;
  do {
    s = Spawn(i);
    if (!s.ok()) return s;
    s = AwaitReady(i, deadline);
    if (s.ok() || absl::IsDeadlineExceeded(s)) return s;
    Kill(i);
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < deadline);
  return s;
}

bool EtcdCluster::Running(int i) {
  Member& m = members_[i];
  if (m.pid <= 0) return false;
  if (waitpid(m.pid, nullptr, WNOHANG) == m.pid) {
    m.pid = -1;
    HoldPorts(i);
    return false;
  }
  return true;
}

void EtcdCluster::KillAll() {
  for (Member& m : members_) {
    if (m.pid > 0) kill(m.pid, SIGKILL);
  }
  for (Member& m : members_) {
    if (m.pid > 0) waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }
}

void EtcdCluster::HoldPorts(int i) {
  Member& m = members_[i];
  if (m.client_hold < 0) m.client_hold = BindPort(m.client_port);
  if (m.peer_hold < 0) m.peer_hold = BindPort(m.peer_port);
}

void EtcdCluster::ReleasePorts(int i) {
  Member& m = members_[i];
  for (int* fd : {&m.client_hold, &m.peer_hold}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

std::string EtcdCluster::endpoint(int i) const {
  return absl::StrCat("127.0.0.1:", members_[i].client_port);
}

std::vector<std::string> EtcdCluster::EndpointList() const {
  std::vector<std::string> list;
  for (int i = 0; i < size(); ++i) list.push_back(endpoint(i));
  return list;
}

std::string EtcdCluster::Endpoints() const { return absl::StrJoin(EndpointList(), ","); }

std::string EtcdCluster::data_dir(int i) const { return absl::StrCat(dir_, "/member-", i); }

std::string EtcdCluster::LogPath(int i) const { return absl::StrCat(dir_, "/member-", i, ".log"); }

std::string EtcdCluster::Log(int i) const {
  std::ifstream in(LogPath(i));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string EtcdCluster::LogTail(int i) const { return Tail(Log(i), 3000); }

std::string EtcdCluster::CommandLine(int i) const { return absl::StrJoin(Argv(i), " "); }

}  // namespace shardcache::testing
