#include "cache_server/socket_cork.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache_server/testing/in_process_server.h"
#include "common/testing/wait.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {
namespace {

// A connected loopback TCP pair: `client` connected to `server` (the accepted end), as a gRPC
// server's accepted connection is; over IPv4 (127.0.0.1) or IPv6 (::1).
struct TcpPair {
  int client = -1;
  int server = -1;
  int client_port = 0;
  bool ipv6 = false;

  explicit TcpPair(bool v6 = false) : ipv6(v6) {
    sockaddr_storage addr{};
    socklen_t len;
    if (v6) {
      auto* in = reinterpret_cast<sockaddr_in6*>(&addr);
      in->sin6_family = AF_INET6;
      in->sin6_addr = in6addr_loopback;
      len = sizeof(sockaddr_in6);
    } else {
      auto* in = reinterpret_cast<sockaddr_in*>(&addr);
      in->sin_family = AF_INET;
      in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof(sockaddr_in);
    }
    int family = v6 ? AF_INET6 : AF_INET;
    int listener = socket(family, SOCK_STREAM, 0);
    if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      close(listener);
      return;
    }
    client = socket(family, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), len), 0);
    server = accept(listener, nullptr, nullptr);
    close(listener);
    sockaddr_storage local{};
    len = sizeof(local);
    EXPECT_EQ(getsockname(client, reinterpret_cast<sockaddr*>(&local), &len), 0);
    client_port = v6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                     : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    int one = 1;
    setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~TcpPair() {
    if (client >= 0) close(client);
    if (server >= 0) close(server);
  }
  bool ok() const { return server >= 0; }
  // The server end's peer, as gRPC 1.51 names it (the IPv6 brackets percent-encoded).
  std::string peer() const {
    return ipv6 ? absl::StrCat("ipv6:%5B::1%5D:", client_port)
                : absl::StrCat("ipv4:127.0.0.1:", client_port);
  }
};

int Corked(int fd) {
  int on = -1;
  socklen_t len = sizeof(on);
  EXPECT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_CORK, &on, &len), 0);
  return on;
}

// Bytes readable on `fd` within `timeout_ms`.
std::string ReadSome(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return "";
  char buf[4096];
  ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

TEST(ConnectionSocketsTest, FindsTheSocketConnectedToAPeer) {
  TcpPair a, b;
  EXPECT_EQ(ConnectionSockets::PeerOf(a.server), a.peer());
  ConnectionSockets sockets;
  EXPECT_EQ(sockets.Find(a.peer()), a.server);
  EXPECT_EQ(sockets.Find(b.peer()), b.server);
  // Found again from what it learned (and checked against the socket).
  EXPECT_EQ(sockets.Find(a.peer()), a.server);
}

TEST(ConnectionSocketsTest, FindsIpv6PeersAsGrpcNamesThem) {
  TcpPair pair(/*v6=*/true);
  if (!pair.ok()) GTEST_SKIP() << "no IPv6 loopback here";
  EXPECT_EQ(ConnectionSockets::PeerOf(pair.server), pair.peer());
  ConnectionSockets sockets;
  EXPECT_EQ(sockets.Find(pair.peer()), pair.server);
}

TEST(ConnectionSocketsTest, FindsNothingForPeersThatAreNotOpenTcpConnections) {
  ConnectionSockets sockets;
  EXPECT_EQ(sockets.Find("unix:/tmp/some.sock"), -1);
  EXPECT_EQ(sockets.Find("in-process"), -1);
  EXPECT_EQ(sockets.Find("ipv4:127.0.0.1:1"), -1);
  std::string gone;
  {
    TcpPair pair;
    gone = pair.peer();
    EXPECT_EQ(sockets.Find(gone), pair.server);
  }
  // Its descriptor was closed: the entry it had learned is checked and dropped.
  EXPECT_EQ(sockets.Find(gone), -1);
  EXPECT_EQ(ConnectionSockets::PeerOf(-1), "");
}

TEST(SocketCorkTest, HoldsOnlyInsideAScopeAndReleasesEverySocket) {
  TcpPair a, b;
  // No scope on this thread: nothing is corked.
  SocketCork::Hold(a.server);
  EXPECT_EQ(Corked(a.server), 0);
  EXPECT_EQ(SocketCork::held(), 0u);
  {
    SocketCork::Scope scope;
    SocketCork::Hold(a.server);
    SocketCork::Hold(a.server);  // once per socket
    SocketCork::Hold(b.server);
    SocketCork::Hold(-1);
    EXPECT_EQ(SocketCork::held(), 2u);
    EXPECT_EQ(Corked(a.server), 1);
    EXPECT_EQ(Corked(b.server), 1);
    SocketCork::Release();
    EXPECT_EQ(SocketCork::held(), 0u);
    EXPECT_EQ(Corked(a.server), 0);
    EXPECT_EQ(Corked(b.server), 0);
    // The scope's end releases what it still holds.
    SocketCork::Hold(a.server);
    EXPECT_EQ(Corked(a.server), 1);
  }
  EXPECT_EQ(Corked(a.server), 0);
  SocketCork::Hold(a.server);
  EXPECT_EQ(Corked(a.server), 0);
}

TEST(SocketCorkTest, SmallWritesWaitForTheReleaseAndLeaveTogether) {
  TcpPair pair;
  SocketCork::Scope scope;
  SocketCork::Hold(pair.server);
  const absl::Time sent = absl::Now();
  for (const char* part : {"one ", "two ", "three"}) {
    ASSERT_EQ(send(pair.server, part, strlen(part), 0), static_cast<ssize_t>(strlen(part)));
  }
  // Corked, the kernel keeps partial segments for up to 200 ms (unless this thread was held up
  // for most of that).
  std::string early = ReadSome(pair.client, 50);
  if (absl::Now() - sent < absl::Milliseconds(150)) {
    EXPECT_EQ(early, "");
  }
  SocketCork::Release();
  std::string got;
  while (got.size() < strlen("one two three")) {
    std::string more = ReadSome(pair.client, 5000);
    ASSERT_FALSE(more.empty());
    got += more;
  }
  EXPECT_EQ(got, "one two three");
}

TEST(SocketCorkTest, ALongPassReleasesWhatItHeldBeforeHoldingMore) {
  TcpPair a, b;
  SocketCork::Scope scope;
  SocketCork::Hold(a.server);
  absl::SleepFor(SocketCork::kMaxHold + absl::Milliseconds(1));
  // Past kMaxHold since the pass's first hold: `a` goes out before `b` is corked.
  SocketCork::Hold(b.server);
  EXPECT_EQ(Corked(a.server), 0);
  EXPECT_EQ(Corked(b.server), 1);
  EXPECT_EQ(SocketCork::held(), 1u);
}

TEST(SocketCorkTest, ScopesAreThreadLocal) {
  TcpPair pair;
  SocketCork::Scope scope;
  std::thread other([&] {
    SocketCork::Hold(pair.server);
    EXPECT_EQ(SocketCork::held(), 0u);
  });
  other.join();
  EXPECT_EQ(Corked(pair.server), 0);
  EXPECT_EQ(SocketCork::held(), 0u);
}

// Calls `f(fd)` for each of this process's connected sockets whose local port is `port` (the
// server's accepted connections).
template <typename F>
void ForEachConnectionOn(int port, F f) {
  for (int fd = 3; fd < 1024; ++fd) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        (local.sin_family == AF_INET || local.sin_family == AF_INET6) &&
        ntohs(local.sin_port) == port && !ConnectionSockets::PeerOf(fd).empty()) {
      f(fd);
    }
  }
}

// The data segments that the server's connections on `port` have sent.
int64_t DataSegmentsSentFrom(int port) {
  int64_t segments = 0;
  ForEachConnectionOn(port, [&](int fd) {
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0)
      segments += info.tcpi_data_segs_out;
  });
  return segments;
}

// The server's connections on `port` that are corked now.
int CorkedSocketsOn(int port) {
  int corked = 0;
  ForEachConnectionOn(port, [&](int fd) { corked += Corked(fd); });
  return corked;
}

// A dispatcher that sends one event to many watch streams of one connection sends it in a few
// TCP segments, not one per stream; and what it corks reaches the clients.
TEST(SocketCorkTest, OneEventToManyStreamsOfAConnectionLeavesInFewSegments) {
  // One dispatcher: two that write to one connection at once sometimes meet in gRPC's transport,
  // which then sends their messages together even without corks.
  testing::InProcessServer::Options options;
  options.watch.dispatchers = 1;
  testing::InProcessServer server(options);
  ASSERT_TRUE(server.watch_cache().options().cork_writes);
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(server.target().substr(server.target().rfind(':') + 1), &port));
  v1::GroupVersionResource resource;
  resource.set_version("v1");
  resource.set_resource("configmaps");

  constexpr int kWatchers = 40;
  constexpr int kEvents = 30;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::WatchEvent>>> readers;
  for (int i = 0; i < kWatchers; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::WatchRequest request;
    *request.mutable_resource() = resource;
    readers.push_back(server.stub()->Watch(contexts.back().get(), request));
    // The initial-events-end bookmark: the watch is in place.
    v1::WatchEvent first;
    ASSERT_TRUE(readers.back()->Read(&first));
    ASSERT_EQ(first.type(), v1::WatchEvent::BOOKMARK);
  }
  absl::Mutex mu;
  std::vector<int> received(kWatchers, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWatchers; ++i) {
    threads.emplace_back([&, i] {
      v1::WatchEvent event;
      while (readers[i]->Read(&event)) {
        if (event.type() != v1::WatchEvent::ADDED) continue;
        absl::MutexLock l(&mu);
        if (++received[i] == kEvents) return;
      }
    });
  }
  int64_t before = DataSegmentsSentFrom(port);
  int64_t corks_before = SocketCork::corks();
  std::string failure;
  for (int e = 1; e <= kEvents && failure.empty(); ++e) {
    grpc::ClientContext ctx;
    v1::CreateRequest create;
    *create.mutable_resource() = resource;
    create.mutable_object()->mutable_metadata()->set_name(absl::StrCat("cm-", e));
    create.mutable_object()->mutable_metadata()->set_namespace_("default");
    v1::Object created;
    if (!server.stub()->Create(&ctx, create, &created).ok()) {
      failure = absl::StrCat("create ", e, " failed");
      break;
    }
    // Every watcher has it before the next: each event is one pass of the dispatcher, with no
    // write of the last one still in flight.
    absl::MutexLock l(&mu);
    auto all_have_it = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return std::all_of(received.begin(), received.end(), [e](int n) { return n >= e; });
    };
    if (!mu.AwaitWithTimeout(absl::Condition(&all_have_it), absl::Seconds(30))) {
      failure = absl::StrCat("event ", e, " did not reach every watcher");
    }
  }
  int64_t segments = DataSegmentsSentFrom(port) - before;
  // The pass is over once the event has arrived (only its release, or the kernel's 200 ms limit,
  // sends it): no connection stays corked.
  ::testing::AssertionResult uncorked = testing::Eventually(
      [&] { return CorkedSocketsOn(port) == 0; }, "every connection is uncorked");
  for (auto& c : contexts) c->TryCancel();
  for (auto& t : threads) t.join();
  ASSERT_EQ(failure, "");
  EXPECT_TRUE(uncorked);
  // Each event's pass corked the connection.
  EXPECT_GE(SocketCork::corks() - corks_before, kEvents);
  // Corked, each cork sends one segment at its release, and each Create's answer one or two
  // (about 60 in all here). A pass that a busy machine (or a sanitizer) stretches past
  // SocketCork::kMaxHold releases and corks again, one more segment for each such cork. Uncorked,
  // most of the kWatchers * kEvents messages go in segments of their own (240 to 500 here).
  const int64_t corks = SocketCork::corks() - corks_before;
  EXPECT_LE(segments, corks + 2 * kEvents + 10) << corks << " corks";
}

}  // namespace
}  // namespace shardcache
