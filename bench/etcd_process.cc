#include "bench/etcd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/bench_util.h"
#include "common/testing/server_process.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace shardcache::bench {
namespace {

// A loopback port that was free a moment ago (0 on failure). etcd binds it by itself, so another
// process could take it in between: Start then retries on new ports.
int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace

EtcdProcess::EtcdProcess(std::string binary, std::vector<std::string> args)
    : binary_(std::move(binary)), args_(std::move(args)) {}

EtcdProcess::~EtcdProcess() { Stop(); }

std::string EtcdProcess::CommandLine() const { return absl::StrJoin(argv_, " "); }

std::string EtcdProcess::Log() const {
  if (dir_.empty()) return "";
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool EtcdProcess::Alive() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

absl::Status EtcdProcess::Start(absl::Duration timeout) {
  if (access(binary_.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd is not installed at ", binary_,
                     " (on Debian: apt-get install etcd-server; or pass --etcd=PATH)"));
  }
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    last = StartOnce(timeout);
    if (last.ok()) return last;
    Stop();
  }
  return last;
}

absl::Status EtcdProcess::StartOnce(absl::Duration timeout) {
  dir_ = testing::MakeTempDir("store_bench-etcd");
  if (dir_.empty()) return absl::InternalError("cannot make a temporary directory");
  client_port_ = PickFreePort();
  peer_port_ = PickFreePort();
  if (client_port_ == 0 || peer_port_ == 0 || client_port_ == peer_port_) {
    return absl::UnavailableError("cannot find free loopback ports");
  }
  std::string client_url = absl::StrCat("http://127.0.0.1:", client_port_);
  std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port_);
  argv_ = {binary_,
           "--name=bench",
           "--data-dir=" + data_dir(),
           "--listen-client-urls=" + client_url,
           "--advertise-client-urls=" + client_url,
           "--listen-peer-urls=" + peer_url,
           "--initial-advertise-peer-urls=" + peer_url,
           "--initial-cluster=bench=" + peer_url,
           "--initial-cluster-state=new"};
  argv_.insert(argv_.end(), args_.begin(), args_.end());
  std::string log_path = dir_ + "/etcd.log";
  pid_ = fork();
  if (pid_ < 0) return absl::InternalError("fork failed");
  if (pid_ == 0) {
    // etcd must not outlive the tool, even when the tool is killed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    std::vector<char*> argv;
    for (std::string& a : argv_) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary_.c_str(), argv.data());
    _exit(127);
  }
  // Ready once a Range answers (etcd has elected itself and serves the KV API).
  auto channel = MakeChannel(address(), 0);
  auto kv = etcdserverpb::KV::NewStub(channel);
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (!Alive()) {
      std::string log = Log();
      if (log.size() > 2000) log = "..." + log.substr(log.size() - 2000);
      return absl::UnavailableError(absl::StrCat("etcd exited while starting:\n", log));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    etcdserverpb::RangeRequest request;
    request.set_key("store_bench-ready");
    etcdserverpb::RangeResponse response;
    if (kv->Range(&ctx, request, &response).ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("etcd did not answer within ", absl::FormatDuration(timeout)));
}

void EtcdProcess::Stop(bool keep_data, absl::Duration grace) {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    absl::Time deadline = absl::Now() + grace;
    while (Alive() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  if (!dir_.empty() && !keep_data) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  dir_.clear();
}

}  // namespace shardcache::bench
