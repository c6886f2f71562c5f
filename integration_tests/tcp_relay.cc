#include "integration_tests/tcp_relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardcache::testing {
namespace {

// How long a thread waits in poll before it looks at the relay's state again (Hold, Release, the
// destructor).
constexpr int kPollMillis = 10;
// How long a connection waits for the target to accept it.
constexpr int kConnectMillis = 2000;
// A direction stops reading once this much waits to be written (or is held).
constexpr size_t kMaxBuffered = size_t{64} << 20;
// What RecordServerToClient keeps, per connection.
constexpr size_t kMaxRecorded = size_t{16} << 20;

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool Retryable(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

}  // namespace

absl::StatusOr<std::unique_ptr<TcpRelay>> TcpRelay::Start(const std::string& target_host,
                                                          int target_port) {
  in_addr target{};
  if (inet_pton(AF_INET, target_host.c_str(), &target) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", target_host));
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    absl::Status error = absl::InternalError(absl::StrCat("listen: ", std::strerror(errno)));
    close(fd);
    return error;
  }
  return std::unique_ptr<TcpRelay>(
      new TcpRelay(fd, ntohs(addr.sin_port), target_host, target_port));
}

TcpRelay::TcpRelay(int listen_fd, int port, std::string target_host, int target_port)
    : listen_fd_(listen_fd),
      port_(port),
      target_host_(std::move(target_host)),
      target_port_(target_port) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

TcpRelay::~TcpRelay() {
  stopping_ = true;
  accept_thread_.join();  // no connection thread starts after this
  std::vector<std::thread> threads;
  {
    absl::MutexLock l(&mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
  close(listen_fd_);
}

void TcpRelay::Hold() {
  absl::MutexLock l(&mu_);
  held_ = true;
}

void TcpRelay::Release() {
  absl::MutexLock l(&mu_);
  held_ = false;
}

size_t TcpRelay::held_bytes() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& c : conns_) n += c->to_server.size();
  return n;
}

bool TcpRelay::HeldContains(std::string_view needle) const {
  absl::MutexLock l(&mu_);
  for (const auto& c : conns_) {
    if (c->to_server.find(needle) != std::string::npos) return true;
  }
  return false;
}

void TcpRelay::RecordServerToClient() {
  absl::MutexLock l(&mu_);
  recording_ = true;
}

bool TcpRelay::RecordedContains(std::string_view needle) const {
  absl::MutexLock l(&mu_);
  for (const auto& c : conns_) {
    if (c->recorded.find(needle) != std::string::npos) return true;
  }
  return false;
}

int TcpRelay::connections_accepted() const {
  absl::MutexLock l(&mu_);
  return accepted_;
}

void TcpRelay::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMillis) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    SetNoDelay(fd);
    auto conn = std::make_shared<Conn>();
    conn->client_fd = fd;
    absl::MutexLock l(&mu_);
    ++accepted_;
    conns_.push_back(conn);
    threads_.emplace_back([this, conn] { Relay(conn); });
  }
}

void TcpRelay::Relay(std::shared_ptr<Conn> conn) {
  const int client = conn->client_fd;
  // Connect to the target (non-blocking, so that the destructor is not kept waiting).
  int server = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool connected = false;
  if (server >= 0) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(target_port_));
    inet_pton(AF_INET, target_host_.c_str(), &addr.sin_addr);
    if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      connected = true;
    } else if (errno == EINPROGRESS) {
      for (int waited = 0; waited < kConnectMillis && !stopping_; waited += kPollMillis) {
        pollfd p{server, POLLOUT, 0};
        if (poll(&p, 1, kPollMillis) > 0) {
          int err = 0;
          socklen_t len = sizeof(err);
          connected = getsockopt(server, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
          break;
        }
      }
    }
  }
  if (connected) {
    SetNoDelay(server);
    conn->server_fd = server;
  }

  bool client_eof = false;  // the client will send no more
  bool server_eof = false;  // the server will send no more
  bool server_shut = false;
  bool client_shut = false;
  char buf[64 * 1024];
  while (connected && !stopping_) {
    pollfd p[2] = {{client, 0, 0}, {server, 0, 0}};
    {
      absl::MutexLock l(&mu_);
      if (!client_eof && conn->to_server.size() < kMaxBuffered) p[0].events |= POLLIN;
      if (!conn->to_client.empty()) p[0].events |= POLLOUT;
      if (!server_eof && conn->to_client.size() < kMaxBuffered) p[1].events |= POLLIN;
      if (!held_ && !conn->to_server.empty()) p[1].events |= POLLOUT;
      // Done: both directions ended and everything was delivered.
      if (client_eof && server_eof && conn->to_server.empty() && conn->to_client.empty()) break;
    }
    // A socket with nothing to wait for is left out, so that a hang-up it reports does not spin.
    for (pollfd& q : p) {
      if (q.events == 0) q.fd = -1;
    }
    // After Release the buffered bytes must go out: poll with a timeout, then look again.
    if (poll(p, 2, kPollMillis) <= 0) continue;

    bool failed = false;
    // Reads: client -> to_server, server -> to_client.
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = recv(client, buf, sizeof(buf), 0);
      if (n > 0) {
        absl::MutexLock l(&mu_);
        conn->to_server.append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        client_eof = true;
      } else if (!Retryable(errno)) {
        failed = true;
      }
    }
    if (!failed && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = recv(server, buf, sizeof(buf), 0);
      if (n > 0) {
        absl::MutexLock l(&mu_);
        conn->to_client.append(buf, static_cast<size_t>(n));
        if (recording_ && conn->recorded.size() < kMaxRecorded) {
          conn->recorded.append(buf, static_cast<size_t>(n));
        }
      } else if (n == 0) {
        server_eof = true;
      } else if (!Retryable(errno)) {
        failed = true;
      }
    }
    // Writes (non-blocking, so they may be done under the lock).
    if (!failed) {
      absl::MutexLock l(&mu_);
      if ((p[1].revents & POLLOUT) && !held_ && !conn->to_server.empty()) {
        ssize_t n = send(server, conn->to_server.data(), conn->to_server.size(), MSG_NOSIGNAL);
        if (n > 0) {
          conn->to_server.erase(0, static_cast<size_t>(n));
        } else if (n < 0 && !Retryable(errno)) {
          failed = true;
        }
      }
      if (!failed && (p[0].revents & POLLOUT) && !conn->to_client.empty()) {
        ssize_t n = send(client, conn->to_client.data(), conn->to_client.size(), MSG_NOSIGNAL);
        if (n > 0) {
          conn->to_client.erase(0, static_cast<size_t>(n));
        } else if (n < 0 && !Retryable(errno)) {
          failed = true;
        }
      }
      // Pass on a half-close once what came before it is delivered.
      if (client_eof && !server_shut && conn->to_server.empty()) {
        shutdown(server, SHUT_WR);
        server_shut = true;
      }
      if (server_eof && !client_shut && conn->to_client.empty()) {
        shutdown(client, SHUT_WR);
        client_shut = true;
      }
    }
    if (failed) break;
  }

  // Closed: what was not delivered is dropped.
  {
    absl::MutexLock l(&mu_);
    conn->to_server.clear();
    conn->to_client.clear();
  }
  close(client);
  if (server >= 0) close(server);
}

}  // namespace shardcache::testing
