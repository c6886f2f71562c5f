#include "cache_server/socket_cork.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardcache {
namespace {

// The calling thread's scope: whether it has one, the sockets it holds corked (and, indexed by
// descriptor, which they are), and when it corked the first of them.
struct CorkScope {
  bool open = false;
  std::vector<int> held;
  std::vector<char> is_held;
  int64_t first_hold_ns = 0;
};
thread_local CorkScope tls_scope;

std::atomic<int64_t> corks_total{0};

void SetCork(int fd, int on) { setsockopt(fd, IPPROTO_TCP, TCP_CORK, &on, sizeof(on)); }

}  // namespace

std::string ConnectionSockets::PeerOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char host[INET6_ADDRSTRLEN];
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    if (inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host)) == nullptr) return "";
    return absl::StrCat("ipv4:", host, ":", ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&addr);
    // gRPC names an IPv4 client of a dual-stack socket by its IPv4 address.
    if (IN6_IS_ADDR_V4MAPPED(&in->sin6_addr)) {
      if (inet_ntop(AF_INET, &in->sin6_addr.s6_addr[12], host, sizeof(host)) == nullptr) return "";
      return absl::StrCat("ipv4:", host, ":", ntohs(in->sin6_port));
    }
    if (inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host)) == nullptr) return "";
    // As gRPC writes it: "[host%scope]:port" (RFC 6874), percent-encoded as a URI path.
    std::string scope = in->sin6_scope_id != 0 ? absl::StrCat("%25", in->sin6_scope_id) : "";
    return absl::StrCat("ipv6:%5B", host, scope, "%5D:", ntohs(in->sin6_port));
  }
  return "";
}

int ConnectionSockets::Find(const std::string& peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return -1;
  absl::MutexLock l(&mu_);
  if (auto it = sockets_.find(peer); it != sockets_.end() && PeerOf(it->second) == peer) {
    return it->second;
  }
  // A connection not seen yet (or whose descriptor was reused): look at every descriptor again.
  sockets_.clear();
  if (DIR* dir = opendir("/proc/self/fd"); dir != nullptr) {
    int own = dirfd(dir);
    while (dirent* entry = readdir(dir)) {
      int fd = -1;
      if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == own) continue;
      if (std::string p = PeerOf(fd); !p.empty()) sockets_[p] = fd;
    }
    closedir(dir);
  }
  auto it = sockets_.find(peer);
  return it != sockets_.end() ? it->second : -1;
}

SocketCork::Scope::Scope() { tls_scope.open = true; }

SocketCork::Scope::~Scope() {
  Release();
  tls_scope.open = false;
}

void SocketCork::Hold(int fd) {
  CorkScope& scope = tls_scope;
  if (!scope.open || fd < 0) return;
  if (!scope.held.empty()) {
    // A long pass does not hold what others write on these connections for longer than this.
    if (absl::GetCurrentTimeNanos() - scope.first_hold_ns > absl::ToInt64Nanoseconds(kMaxHold)) {
      Release();
    } else if (static_cast<size_t>(fd) < scope.is_held.size() && scope.is_held[fd]) {
      return;
    }
  }
  if (scope.held.empty()) scope.first_hold_ns = absl::GetCurrentTimeNanos();
  if (static_cast<size_t>(fd) >= scope.is_held.size()) scope.is_held.resize(fd + 1, 0);
  SetCork(fd, 1);
  scope.is_held[fd] = 1;
  scope.held.push_back(fd);
  corks_total.fetch_add(1, std::memory_order_relaxed);
}

void SocketCork::Release() {
  CorkScope& scope = tls_scope;
  for (int fd : scope.held) {
    SetCork(fd, 0);
    scope.is_held[fd] = 0;
  }
  scope.held.clear();
}

int64_t SocketCork::corks() { return corks_total.load(std::memory_order_relaxed); }

size_t SocketCork::held() { return tls_scope.held.size(); }

}  // namespace shardcache
