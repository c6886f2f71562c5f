#include "common/testing/wait.h"

#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardcache::testing {

::testing::AssertionResult Eventually(const std::function<bool()>& cond, absl::Duration timeout,
                                      const std::string& what,
                                      const std::function<std::string()>& describe) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::Duration interval = absl::Milliseconds(5);
  while (!cond()) {
    if (absl::Now() >= deadline) {
      auto failure = ::testing::AssertionFailure() << "not within " << timeout << ": " << what;
      if (describe) failure << "; last seen: " << describe();
      return failure;
    }
    absl::SleepFor(std::min(interval, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    interval = std::min(interval * 2, absl::Milliseconds(50));
  }
  return ::testing::AssertionSuccess() << what << " after " << absl::Now() - start;
}

::testing::AssertionResult Eventually(const std::function<bool()>& cond, const std::string& what,
                                      const std::function<std::string()>& describe) {
  return Eventually(cond, kDefaultWait, what, describe);
}

bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout) {
  return static_cast<bool>(Eventually(cond, timeout, "the condition"));
}

pid_t ThisThreadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

bool ThreadAsleep(pid_t tid) {
  std::ifstream in(absl::StrCat("/proc/self/task/", tid, "/stat"));
  if (!in) return false;
  std::stringstream stat;
  stat << in.rdbuf();
  const std::string text = stat.str();
  // "pid (comm) state ...": comm may hold spaces and parentheses; the last ')' ends it.
  const size_t end = text.rfind(')');
  return end != std::string::npos && end + 2 < text.size() && text[end + 2] == 'S';
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto ctx = FailFastContext(timeout);
  ctx->set_wait_for_ready(true);
  return ctx;
}

std::unique_ptr<grpc::ClientContext> FailFastContext(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

grpc::Status RetryingUnavailable(const std::function<grpc::Status()>& call, int attempts) {
  grpc::Status s;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    s = call();
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
  }
  return s;
}

int ThreadsOfThisProcess() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.' ? 1 : 0;
  closedir(dir);
  return n;
}

}  // namespace shardcache::testing
