#include "integration_tests/fault_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardcache::testing {
namespace {

// How long a thread waits in poll before it looks at the proxy's state again.
constexpr int kPollMillis = 10;
// How long a connection waits for the target to accept it.
constexpr int kConnectMillis = 2000;
// A direction stops reading once this much waits to be written.
constexpr size_t kMaxBuffered = size_t{64} << 20;
// What RecordServerToClient keeps, per connection.
constexpr size_t kMaxRecorded = size_t{16} << 20;

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Closes `fd` with a reset (RST) rather than an orderly FIN.
void ResetAndClose(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd);
}

bool Retryable(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

template <typename Deque>
size_t Buffered(const Deque& chunks) {
  size_t n = 0;
  for (const auto& c : chunks) n += c.bytes.size();
  return n;
}

// Connects (non-blocking) to the target; -1 when it refuses or does not answer in time.
int ConnectTo(const std::string& host, int port, const std::atomic<bool>& stopping) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    SetNoDelay(fd);
    return fd;
  }
  if (errno == EINPROGRESS) {
    for (int waited = 0; waited < kConnectMillis && !stopping; waited += kPollMillis) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, kPollMillis) > 0) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
          SetNoDelay(fd);
          return fd;
        }
        break;
      }
    }
  }
  close(fd);
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(const std::string& target_host,
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
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    absl::Status error = absl::InternalError(absl::StrCat("listen: ", std::strerror(errno)));
    close(fd);
    return error;
  }
  return std::unique_ptr<FaultProxy>(
      new FaultProxy(fd, ntohs(addr.sin_port), target_host, target_port));
}

FaultProxy::FaultProxy(int listen_fd, int port, std::string target_host, int target_port)
    : listen_fd_(listen_fd),
      port_(port),
      target_host_(std::move(target_host)),
      target_port_(target_port) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

FaultProxy::~FaultProxy() {
  stopping_ = true;
  accept_thread_.join();  // no connection starts after this
  std::vector<std::unique_ptr<Conn>> conns;
  {
    absl::MutexLock l(&mu_);
    conns.swap(conns_);
  }
  for (auto& c : conns) c->thread.join();
  close(listen_fd_);
}

void FaultProxy::Heal() {
  absl::MutexLock l(&mu_);
  mode_ = Mode::kPass;
  delay_ = absl::ZeroDuration();
}

void FaultProxy::Cut() {
  absl::MutexLock l(&mu_);
  mode_ = Mode::kCut;
}

void FaultProxy::BlackHole() {
  absl::MutexLock l(&mu_);
  mode_ = Mode::kBlackHole;
}

void FaultProxy::Delay(absl::Duration per_chunk) {
  absl::MutexLock l(&mu_);
  mode_ = Mode::kDelay;
  delay_ = per_chunk;
}

FaultProxy::Mode FaultProxy::mode() const {
  absl::MutexLock l(&mu_);
  return mode_;
}

const char* FaultProxy::ModeName(Mode mode) {
  switch (mode) {
    case Mode::kPass:
      return "pass";
    case Mode::kCut:
      return "cut";
    case Mode::kBlackHole:
      return "black-hole";
    case Mode::kDelay:
      return "delay";
  }
  return "?";
}

void FaultProxy::ResetAll() {
  absl::MutexLock l(&mu_);
  ++reset_generation_;
}

void FaultProxy::Hold() {
  absl::MutexLock l(&mu_);
  held_ = true;
}

void FaultProxy::Release() {
  absl::MutexLock l(&mu_);
  held_ = false;
}

size_t FaultProxy::held_bytes() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& c : conns_) n += Buffered(c->to_server);
  return n;
}

bool FaultProxy::HeldContains(std::string_view needle) const {
  absl::MutexLock l(&mu_);
  for (const auto& c : conns_) {
    std::string all;
    for (const Chunk& chunk : c->to_server) all += chunk.bytes;
    if (all.find(needle) != std::string::npos) return true;
  }
  return false;
}

void FaultProxy::RecordServerToClient() {
  absl::MutexLock l(&mu_);
  recording_ = true;
}

bool FaultProxy::RecordedContains(std::string_view needle) const {
  absl::MutexLock l(&mu_);
  for (const auto& c : conns_) {
    if (c->recorded.find(needle) != std::string::npos) return true;
  }
  return false;
}

int FaultProxy::connections_accepted() const {
  absl::MutexLock l(&mu_);
  return accepted_;
}

int FaultProxy::connections_open() const {
  absl::MutexLock l(&mu_);
  int n = 0;
  for (const auto& c : conns_) n += c->finished ? 0 : 1;
  return n;
}

int FaultProxy::connections_reset() const {
  absl::MutexLock l(&mu_);
  return reset_;
}

int64_t FaultProxy::bytes_to_server() const {
  absl::MutexLock l(&mu_);
  return bytes_to_server_;
}

int64_t FaultProxy::bytes_to_client() const {
  absl::MutexLock l(&mu_);
  return bytes_to_client_;
}

absl::Duration FaultProxy::DelayLocked() const {
  return mode_ == Mode::kDelay ? delay_ : absl::ZeroDuration();
}

bool FaultProxy::FlowingLocked(const Conn& conn) const {
  return (mode_ == Mode::kPass || mode_ == Mode::kDelay) &&
         conn.reset_generation == reset_generation_;
}

void FaultProxy::Reap() {
  std::vector<std::unique_ptr<Conn>> done;
  {
    absl::MutexLock l(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      // Recorded bytes are kept for RecordedContains while recording.
      if ((*it)->finished && !recording_) {
        done.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done) c->thread.join();
}

void FaultProxy::AcceptLoop() {
  while (!stopping_) {
    Reap();
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMillis) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    SetNoDelay(fd);
    auto conn = std::make_unique<Conn>();
    conn->client_fd = fd;
    Conn* raw = conn.get();
    absl::MutexLock l(&mu_);
    ++accepted_;
    conn->reset_generation = reset_generation_;
    conn->thread = std::thread([this, raw] { Relay(raw); });
    conns_.push_back(std::move(conn));
  }
}

void FaultProxy::Relay(Conn* conn) {
  const int client = conn->client_fd;
  int server = -1;
  bool client_eof = false;  // the client will send no more
  bool server_eof = false;  // the server will send no more
  bool server_shut = false;
  bool client_shut = false;
  // The connection is in a black hole, or was at the last look.
  bool partitioned = false;
  // The server side ended during (or right after) a black hole: the client is not told until it
  // sends, and then it is reset.
  bool orphaned = false;
  bool reset = false;  // end with RST on both sides
  char buf[64 * 1024];

  while (!stopping_) {
    Mode mode;
    bool held;
    {
      absl::MutexLock l(&mu_);
      mode = mode_;
      held = held_;
      if (conn->reset_generation != reset_generation_) mode = Mode::kCut;
      // Done: both directions ended and everything was delivered.
      if (client_eof && (server_eof || orphaned) && conn->to_server.empty() &&
          conn->to_client.empty()) {
        break;
      }
    }
    if (mode == Mode::kCut) {
      reset = true;
      break;
    }
    if (mode == Mode::kBlackHole) {
      partitioned = true;
      poll(nullptr, 0, kPollMillis);
      continue;
    }
    if (partitioned) {
      // Healed. A server side that ended meanwhile is forgotten, with what it sent during the
      // partition, and the client is not told: as after a partition that outlasted the server
      // host's retransmissions. A server side still there keeps what it sent.
      partitioned = false;
      if (server >= 0) {
        std::string pending;
        ssize_t n;
        while ((n = recv(server, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
          pending.append(buf, static_cast<size_t>(n));
        }
        if (n == 0 || !Retryable(errno)) {
          orphaned = true;
          close(server);
          server = -1;
          // What the client sent during the partition was lost in it (gRPC sends on its own:
          // window updates, pings): only what it sends after the heal reaches the forgetful
          // peer and is reset.
          while (recv(client, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
          }
          absl::MutexLock l(&mu_);
          conn->to_server.clear();
        } else if (!pending.empty()) {
          absl::MutexLock l(&mu_);
          conn->to_client.push_back({absl::Now() + DelayLocked(), std::move(pending)});
        }
      }
    }
    if (server < 0 && !orphaned) {
      server = ConnectTo(target_host_, target_port_, stopping_);
      if (server < 0) {
        reset = true;
        break;
      }
    }

    absl::Time now = absl::Now();
    pollfd p[2] = {{client, 0, 0}, {server, 0, 0}};
    {
      absl::MutexLock l(&mu_);
      if (!client_eof && Buffered(conn->to_server) < kMaxBuffered) p[0].events |= POLLIN;
      if (!conn->to_client.empty() && conn->to_client.front().due <= now) {
        p[0].events |= POLLOUT;
      }
      if (!orphaned && !server_eof && Buffered(conn->to_client) < kMaxBuffered) {
        p[1].events |= POLLIN;
      }
      if (!orphaned && !held && !conn->to_server.empty() && conn->to_server.front().due <= now) {
        p[1].events |= POLLOUT;
      }
    }
    // A socket with nothing to wait for is left out, so that a hang-up it reports does not spin.
    for (pollfd& q : p) {
      if (q.events == 0) q.fd = -1;
    }
    if (poll(p, 2, kPollMillis) <= 0) continue;

    // Reads and writes happen under the lock, unless the mode changed since the poll: a switch
    // applies to every byte sent after it returns, and to everything read after it too (a server
    // side that ends once a black hole has begun is the partition's, dealt with at the heal). The
    // sockets do not block here: poll said they were ready, and every call is non-blocking.
    absl::MutexLock l(&mu_);
    if (!FlowingLocked(*conn)) continue;
    bool failed = false;
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = recv(client, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0 && orphaned) {
        reset = true;  // what a real peer that forgot the connection answers
        break;
      } else if (n > 0) {
        conn->to_server.push_back(
            {absl::Now() + DelayLocked(), std::string(buf, static_cast<size_t>(n))});
      } else if (n == 0) {
        client_eof = true;
      } else if (!Retryable(errno)) {
        failed = true;
      }
    }
    if (!failed && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = recv(server, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        conn->to_client.push_back(
            {absl::Now() + DelayLocked(), std::string(buf, static_cast<size_t>(n))});
        if (recording_ && conn->recorded.size() < kMaxRecorded) {
          conn->recorded.append(buf, static_cast<size_t>(n));
        }
      } else if (n == 0) {
        server_eof = true;
      } else if (!Retryable(errno)) {
        failed = true;
      }
    }
    if (failed) {
      reset = true;
      break;
    }
    if (server >= 0 && (p[1].revents & POLLOUT) && !conn->to_server.empty()) {
      std::string& bytes = conn->to_server.front().bytes;
      ssize_t n = send(server, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes_to_server_ += n;
        bytes.erase(0, static_cast<size_t>(n));
        if (bytes.empty()) conn->to_server.pop_front();
      } else if (n < 0 && !Retryable(errno)) {
        reset = true;
        break;
      }
    }
    if ((p[0].revents & POLLOUT) && !conn->to_client.empty()) {
      std::string& bytes = conn->to_client.front().bytes;
      ssize_t n = send(client, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes_to_client_ += n;
        bytes.erase(0, static_cast<size_t>(n));
        if (bytes.empty()) conn->to_client.pop_front();
      } else if (n < 0 && !Retryable(errno)) {
        reset = true;
        break;
      }
    }
    // Pass on a half-close once what came before it is delivered.
    if (server >= 0 && client_eof && !server_shut && conn->to_server.empty()) {
      shutdown(server, SHUT_WR);
      server_shut = true;
    }
    if (server_eof && !client_shut && conn->to_client.empty()) {
      shutdown(client, SHUT_WR);
      client_shut = true;
    }
  }

  // Closed: what was not delivered is dropped.
  absl::MutexLock l(&mu_);
  conn->to_server.clear();
  conn->to_client.clear();
  if (reset) {
    ++reset_;
    ResetAndClose(client);
    if (server >= 0) ResetAndClose(server);
  } else {
    close(client);
    if (server >= 0) close(server);
  }
  conn->finished = true;
}

}  // namespace shardcache::testing
