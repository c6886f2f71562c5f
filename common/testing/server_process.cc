#include "common/testing/server_process.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace shardcache::testing {

std::string BinaryPath(const std::string& relative) {
  const char* dir = std::getenv("SHARDCACHE_BINARY_DIR");
  return absl::StrCat(dir != nullptr && *dir != '\0' ? dir : SHARDCACHE_BINARY_DIR, "/", relative);
}

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = absl::StrCat(base ? base : "/tmp", "/", prefix, "-XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  char* dir = mkdtemp(buf.data());
  return dir ? std::string(dir) : std::string();
}

ServerProcess::ServerProcess(std::string binary, std::vector<std::string> args)
    : binary_(std::move(binary)), args_(std::move(args)), dir_(MakeTempDir("server")) {}

ServerProcess::~ServerProcess() {
  if (::testing::Test::HasFailure()) {
    std::string log = Log();
    if (log.size() > 6000) log = "..." + log.substr(log.size() - 6000);
    std::cerr << "--- " << binary_ << " log (" << dir_ << "/stderr.log) ---\n" << log << "---\n";
  }
  if (pid_ > 0) Stop(absl::Seconds(5));
  ReleasePort();
  // Keep the directory (data and log) of a failed test for a look; remove the others.
  if (!::testing::Test::HasFailure() && !dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

absl::Status ServerProcess::Start(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // A restart on the port the server had may find it taken for a moment (e.g. as the local end
  // of a connection another process is making): try again for a while. A first start (port 0)
  // cannot clash.
  const absl::Time retry_until = absl::Now() + absl::Seconds(10);
  while (true) {
    const size_t log_before = Log().size();
    absl::Status started = StartOnce(deadline);
    if (started.ok() || grpc_port_ == 0 || absl::Now() >= std::min(deadline, retry_until) ||
        !absl::StrContains(Log().substr(log_before), "cannot listen on")) {
      return started;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::Status ServerProcess::StartOnce(absl::Time deadline) {
  std::string port_file = dir_ + "/ports";
  unlink(port_file.c_str());
  const bool is_cache_server = IsCacheServer();
  std::vector<std::string> argv = {binary_};
  if (is_cache_server) argv.push_back("--listen=127.0.0.1:" + std::to_string(grpc_port_));
  argv.push_back("--http-listen=127.0.0.1:0");
  argv.push_back("--port-file=" + port_file);
  bool has_data_dir = false;
  for (const auto& a : args_)
    has_data_dir |= a.rfind("--data-dir", 0) == 0 || a.rfind("--data_dir", 0) == 0;
  if (!has_data_dir && is_cache_server) argv.push_back("--data-dir=" + data_dir());
  if (is_cache_server && StorageUnderTest() == "etcd" && !NamesStorage(args_)) {
    // The same test against a store on etcd: a one-member cluster of this server's own, kept
    // across Stop and Start as the data directory is.
    if (etcd_ == nullptr) {
      EtcdCluster::Options options;
      etcd_ = std::make_unique<EtcdCluster>(options);
      RETURN_IF_ERROR(etcd_->Start(deadline - absl::Now()));
    }
    argv.push_back("--storage=etcd");
    argv.push_back("--etcd-endpoints=" + etcd_->Endpoints());
  }
  argv.insert(argv.end(), args_.begin(), args_.end());
  std::string log_path = dir_ + "/stderr.log";
  ReleasePort();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    FILE* log = fopen(log_path.c_str(), "a");
    if (log) dup2(fileno(log), STDERR_FILENO);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // A test that dies (a crash, a timeout's SIGKILL) takes its servers with it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  pid_ = pid;
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    std::string line;
    int grpc = 0, http = 0;
    while (std::getline(in, line)) {
      std::pair<std::string, std::string> kv = absl::StrSplit(line, '=');
      if (kv.first == "grpc_port") (void)absl::SimpleAtoi(kv.second, &grpc);
      if (kv.first == "http_port") (void)absl::SimpleAtoi(kv.second, &http);
    }
    if ((grpc > 0 || !is_cache_server) && http > 0) {
      grpc_port_ = is_cache_server ? grpc : 0;
      http_port_ = http;
      return absl::OkStatus();
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      HoldPort();
      return absl::InternalError(
          absl::StrCat(binary_, " exited during start-up (status ", status, "): ", Log()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  Signal(SIGKILL);
  Wait(absl::Seconds(5));
  return absl::DeadlineExceededError(absl::StrCat(binary_, " did not report its ports: ", Log()));
}

void ServerProcess::HoldPort() {
  if (grpc_port_ <= 0 || port_hold_ >= 0) return;
  // Close-on-exec: the servers this test starts later must not inherit it.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  // SO_REUSEADDR, as the server's own socket: the port may still have connections of the
  // stopped process in TIME_WAIT.
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = LoopbackAddress(grpc_port_);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);  // Taken already: Start tries again until it is free.
    return;
  }
  port_hold_ = fd;
}

void ServerProcess::ReleasePort() {
  if (port_hold_ < 0) return;
  close(port_hold_);
  port_hold_ = -1;
}

std::string StorageUnderTest() {
  const char* storage = std::getenv("SHARDCACHE_TEST_STORAGE");
  return storage == nullptr || *storage == '\0' ? "rocksdb" : storage;
}

int64_t FirstRevision() { return StorageUnderTest() == "etcd" ? 2 : 1; }

bool ServerProcess::NamesStorage(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a.rfind("--storage", 0) == 0) return true;
  }
  return false;
}

bool ServerProcess::IsCacheServer() const {
  return std::filesystem::path(binary_).filename().string().find("cache_server") !=
         std::string::npos;
}

void ServerProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

bool ServerProcess::Pause() {
  Signal(SIGSTOP);
  std::string tasks = absl::StrCat("/proc/", pid_, "/task");
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    bool all_stopped = true;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream in(task.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      size_t paren = stat.rfind(')');  // "tid (comm) state ..."
      if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') {
        all_stopped = false;
      }
    }
    if (!ec && all_stopped) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

int ServerProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      HoldPort();
      return status;
    }
    if (absl::Now() >= deadline) return -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

int ServerProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return -1;
  Signal(SIGCONT);
  Signal(SIGTERM);
  int status = Wait(grace);
  if (status == -1 && pid_ > 0) {
    Signal(SIGKILL);
    Wait(absl::Seconds(10));
    return -1;
  }
  return status;
}

std::string ServerProcess::Log() const {
  std::ifstream in(dir_ + "/stderr.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

sockaddr_in LoopbackAddress(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

std::string HttpGet(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  auto res = client.Get(path.c_str());
  if (!res) return "error: " + httplib::to_string(res.error());
  return absl::StrCat(res->status, "\n", res->body);
}

double Metric(int http_port, const std::string& name, const std::vector<std::string>& labels) {
  std::string page = HttpGet(http_port, "/metrics");
  if (!absl::StartsWith(page, "200\n")) return -1;
  double sum = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::StartsWith(line, name)) continue;
    absl::string_view rest = line.substr(name.size());
    absl::string_view label_text;
    if (absl::StartsWith(rest, "{")) {
      size_t close = rest.find('}');
      if (close == absl::string_view::npos) continue;
      label_text = rest.substr(1, close - 1);
      rest = rest.substr(close + 1);
    }
    if (!absl::StartsWith(rest, " ")) continue;  // another metric whose name starts with `name`
    bool match = true;
    for (const std::string& l : labels) match &= absl::StrContains(label_text, l);
    if (!match) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(rest.substr(1), ' ');
    double v = 0;
    if (!absl::SimpleAtod(parts[0], &v)) continue;
    sum += v;
    found = true;
  }
  return found ? sum : -1;
}

}  // namespace shardcache::testing
