#include "integration_tests/refuse_to_start.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/testing/server_process.h"

namespace shardcache::testing {

std::string DescribeWaitStatus(int wait_status) {
  if (wait_status == -1) return "did not exit by itself";
  if (WIFEXITED(wait_status)) return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return absl::StrCat("killed by signal ", WTERMSIG(wait_status));
  return absl::StrCat("wait status ", wait_status);
}

RunResult RunToExit(const std::string& binary, const std::vector<std::string>& leading_args,
                    const std::vector<std::string>& args, absl::Duration timeout) {
  std::string dir = MakeTempDir("refuse");
  std::string port_file = dir + "/ports";
  std::string log = dir + "/stderr.log";
  std::string out = dir + "/stdout.log";
  std::vector<std::string> argv = {BinaryPath(binary)};
  argv.insert(argv.end(), leading_args.begin(), leading_args.end());
  argv.push_back("--port-file=" + port_file);
  argv.insert(argv.end(), args.begin(), args.end());
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, STDERR_FILENO);
    int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);
    // Its own working directory: what a run creates by default (cache_server's data directory,
    // shardcache-data) is its own, not shared with runs of other tests at the same time.
    if (chdir(dir.c_str()) != 0) _exit(126);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  RunResult r;
  r.program = binary.substr(binary.rfind('/') + 1);  // npos + 1 == 0: all of it
  absl::Time deadline = absl::Now() + timeout;
  std::optional<absl::Time> started_at;
  while (pid > 0) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      r.wait_status = status;
      break;
    }
    struct stat st;
    if (!started_at.has_value() && stat(port_file.c_str(), &st) == 0) started_at = absl::Now();
    // Serving (give it a moment to change its mind), or hung: either way it did not refuse.
    if (absl::Now() >= deadline ||
        (started_at.has_value() && absl::Now() - *started_at > absl::Seconds(1))) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  struct stat st;
  r.wrote_port_file = stat(port_file.c_str(), &st) == 0;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.stderr_text = read(log);
  r.stdout_text = read(out);
  std::error_code ignored;
  std::filesystem::remove_all(dir + "/shardcache-data", ignored);  // RocksDB preallocates
  return r;
}

int ExitCode(const RunResult& r) {
  return r.wait_status != -1 && WIFEXITED(r.wait_status) ? WEXITSTATUS(r.wait_status) : -1;
}

RunResult RunCacheServer(const std::vector<std::string>& args, absl::Duration timeout) {
  return RunToExit("cache_server/cache_server",
                   {"--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0"}, args, timeout);
}

void ExpectRefused(const RunResult& r, const std::vector<std::string>& mentions, int exit_code) {
  bool exited = r.wait_status != -1 && WIFEXITED(r.wait_status);
  if (exit_code == -1) {
    EXPECT_TRUE(exited && WEXITSTATUS(r.wait_status) != 0)
        << "it did not refuse to start: " << DescribeWaitStatus(r.wait_status) << "; stderr:\n"
        << r.stderr_text;
  } else {
    EXPECT_TRUE(exited && WEXITSTATUS(r.wait_status) == exit_code)
        << "want exit code " << exit_code << ", got " << DescribeWaitStatus(r.wait_status)
        << "; stderr:\n"
        << r.stderr_text;
  }
  EXPECT_FALSE(r.wrote_port_file) << "it reported ports as if serving";
  const std::string prefix = r.program + ": refusing to start:";
  bool found = false;
  for (absl::string_view line : absl::StrSplit(r.stderr_text, '\n')) {
    if (absl::StartsWith(line, prefix)) {
      found = true;
      for (const std::string& m : mentions) {
        EXPECT_THAT(std::string(line), ::testing::HasSubstr(m));
      }
    }
  }
  EXPECT_TRUE(found) << "no line starting \"" << prefix << "\" in stderr:\n" << r.stderr_text;
}

}  // namespace shardcache::testing
