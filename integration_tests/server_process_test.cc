// Process tests of the test harness's ServerProcess: while a cache_server is down between a stop
// and a restart, its gRPC port stays reserved for it. No other socket gets it, neither by binding
// it nor by binding port 0 (as another test's server picks its port), a call to it is refused as
// to a stopped server, and the restarted server serves on it again.

#include "common/testing/server_process.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/time/time.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::testing {
namespace {

// IP_LOCAL_PORT_RANGE (Linux 6.3): the ports a socket's bind to port 0, or its connect, may
// take. Debian 12's headers predate it.
#ifndef IP_LOCAL_PORT_RANGE
#define IP_LOCAL_PORT_RANGE 51
#endif

// errno of `op` (bind or connect) on 127.0.0.1:port by a new socket without SO_REUSEADDR; 0 if
// it succeeded.
int Error(int (*op)(int, const sockaddr*, socklen_t), int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  sockaddr_in addr = LoopbackAddress(port);
  int err = 0;
  if (op(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) err = errno;
  close(fd);
  return err;
}

// errno of a bind to port 0 that may take only `port`, as another test's server picks its port
// (with SO_REUSEADDR, as gRPC sets it); 0 if the kernel gave it `port`; ENOPROTOOPT when the
// kernel cannot limit the ports.
int PortZeroBindError(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  uint32_t range = (static_cast<uint32_t>(port) << 16) | static_cast<uint32_t>(port);
  int err = 0;
  sockaddr_in addr = LoopbackAddress(0);
  socklen_t len = sizeof(addr);
  if (setsockopt(fd, IPPROTO_IP, IP_LOCAL_PORT_RANGE, &range, sizeof(range)) != 0) {
    err = ENOPROTOOPT;
  } else if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    err = errno;
  } else if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
             ntohs(addr.sin_port) != port) {
    err = EINVAL;  // The kernel ignored the range.
  }
  close(fd);
  return err;
}

// Checks that no other socket can get `port`: neither by binding it nor by binding port 0.
void ExpectTaken(int port) {
  EXPECT_EQ(Error(bind, port), EADDRINUSE) << "another socket could bind the port";
  int err = PortZeroBindError(port);
  if (err == ENOPROTOOPT) return;  // A kernel before 6.3: only the check above.
  EXPECT_EQ(err, EADDRINUSE) << "a bind to port 0 could get the port: " << strerror(err);
}

// Whether the server at `address` answers a List.
bool Serves(const std::string& address) {
  auto stub = v1::Store::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  v1::ListRequest req;
  req.mutable_resource()->set_group("example.com");
  req.mutable_resource()->set_version("v1");
  req.mutable_resource()->set_resource("widgets");
  v1::ListResponse resp;
  grpc::Status s = stub->List(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  return s.ok();
}

TEST(ServerProcessTest, StoppedServersPort_StaysReservedForIt_UntilItStartsAgain) {
  ServerProcess server(BinaryPath("cache_server/cache_server"), {"--role=cache"});
  ASSERT_TRUE(server.Start().ok());
  const int port = server.grpc_port();
  ASSERT_GT(port, 0);
  ExpectTaken(port);  // the server listens on it

  for (int sig : {SIGTERM, SIGKILL}) {
    SCOPED_TRACE(strsignal(sig));
    if (sig == SIGTERM) {
      ASSERT_NE(server.Stop(), -1);
    } else {
      server.Signal(SIGKILL);
      ASSERT_NE(server.Wait(absl::Seconds(10)), -1);
    }
    ExpectTaken(port);
    EXPECT_EQ(Error(connect, port), ECONNREFUSED) << "a call to the stopped server was not refused";

    ASSERT_TRUE(server.Start().ok());
    EXPECT_EQ(server.grpc_port(), port);
    EXPECT_TRUE(Serves(server.grpc_address()));
  }

  ASSERT_NE(server.Stop(), -1);
  ExpectTaken(port);
}

// A reserved port is given back when the ServerProcess goes.
TEST(ServerProcessTest, PortIsFreeOnceTheServerProcessIsGone) {
  int port = 0;
  {
    ServerProcess server(BinaryPath("cache_server/cache_server"), {"--role=cache"});
    ASSERT_TRUE(server.Start().ok());
    port = server.grpc_port();
    ASSERT_NE(server.Stop(), -1);
    ExpectTaken(port);
  }
  EXPECT_EQ(Error(bind, port), 0);
  int err = PortZeroBindError(port);
  if (err != ENOPROTOOPT) {
    EXPECT_EQ(err, 0) << strerror(err);
  }
}

}  // namespace
}  // namespace shardcache::testing
