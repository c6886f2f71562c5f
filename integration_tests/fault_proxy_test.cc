// Process tests of FaultProxy: a real cache_server behind the proxy and a real gRPC client in
// front of it; each mode is observed as that client sees it, and compared with what a second
// client that talks to the server directly sees at the same time.
#include "integration_tests/fault_proxy.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/server_process.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

v1::GroupVersionResource ThingsGvr() { return Gvr("example.com", "v1", "things"); }

v1::Object Thing(const std::string& name) {
  return FromJson<v1::Object>(R"({"metadata":{"cluster":"root","namespace":"default","name":")" +
                              name + R"("},"spec":{"n":1}})");
}

class FaultProxyTest : public StoreFixture {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer({"--role=cache", "--bookmark-interval=200ms"}));
    absl::StatusOr<std::unique_ptr<FaultProxy>> proxy =
        FaultProxy::Start("127.0.0.1", server_->grpc_port());
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = *std::move(proxy);
    Connect();
  }

  void TearDown() override {
    // The channels through the proxy, then the proxy, before the server stops.
    proxied_.reset();
    proxied_channel_.reset();
    proxy_.reset();
    StoreFixture::TearDown();
  }

  // A fresh channel through the proxy (a new connection).
  void Connect() {
    grpc::ChannelArguments args;
    // Reconnect soon after a reset, so that a healed proxy is used without gRPC's long backoff.
    // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC gives each connection attempt that long at
    // least, and 100 ms is too short for a handshake through the proxy on a busy machine; the
    // attempts would then all time out.)
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
    proxied_channel_ =
        grpc::CreateCustomChannel(proxy_->address(), grpc::InsecureChannelCredentials(), args);
    proxied_ = v1::Store::NewStub(proxied_channel_);
  }

  grpc::Status GetThrough(v1::Store::Stub* stub, const std::string& name,
                          absl::Duration timeout = absl::Seconds(5)) {
    v1::GetRequest req;
    *req.mutable_resource() = ThingsGvr();
    req.set_cluster("root");
    req.set_namespace_("default");
    req.set_name(name);
    v1::Object out;
    // Fail fast: a call through a cut proxy must end UNAVAILABLE, not wait for a connection.
    return stub->Get(FailFastContext(timeout).get(), req, &out);
  }

  // A write straight to the server (never through the proxy).
  void CreateDirect(const std::string& name) { ASSERT_TRUE(Ok(Create(ThingsGvr(), Thing(name)))); }

  std::unique_ptr<FaultProxy> proxy_;
  std::shared_ptr<grpc::Channel> proxied_channel_;
  std::unique_ptr<v1::Store::Stub> proxied_;
};

TEST_F(FaultProxyTest, PassForwardsBothWays) {
  ASSERT_NO_FATAL_FAILURE(CreateDirect("t1"));
  EXPECT_TRUE(Ok(GetThrough(proxied_.get(), "t1")));
  EXPECT_EQ(proxy_->connections_accepted(), 1);
  EXPECT_GT(proxy_->bytes_to_server(), 0);
  EXPECT_GT(proxy_->bytes_to_client(), 0);
  EXPECT_EQ(proxy_->mode(), FaultProxy::Mode::kPass);
}

// Cut resets the open connection (a watch on it ends UNAVAILABLE), and every new one while it
// lasts; Heal lets new connections through again.
TEST_F(FaultProxyTest, CutResetsEveryConnectionUntilHealed) {
  WatchReader watch(proxied_.get(), WatchReq(ThingsGvr()));
  ASSERT_TRUE(watch.SkipInitial());
  proxy_->Cut();
  std::optional<grpc::Status> end = watch.WaitForEnd(absl::Seconds(5));
  ASSERT_TRUE(end.has_value()) << "the watch through a cut proxy is still open";
  EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE) << end->error_message();
  // New connections are accepted and reset: the call fails fast, not by its deadline.
  absl::Time start = absl::Now();
  grpc::Status cut = GetThrough(proxied_.get(), "t1", absl::Seconds(5));
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::UNAVAILABLE) << cut.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_GE(proxy_->connections_reset(), 2);

  proxy_->Heal();
  ASSERT_NO_FATAL_FAILURE(CreateDirect("t1"));
  grpc::Status healed;
  EXPECT_TRUE(WaitFor(
      [&] {
        healed = GetThrough(proxied_.get(), "t1", absl::Seconds(1));
        return healed.ok();
      },
      absl::Seconds(10)))
      << "the last call through the healed proxy: " << healed.error_code() << " "
      << healed.error_message() << "; connections accepted " << proxy_->connections_accepted()
      << ", reset " << proxy_->connections_reset();
}

// ResetAll ends the connections open now, and only those.
TEST_F(FaultProxyTest, ResetAllEndsOpenConnectionsOnly) {
  WatchReader watch(proxied_.get(), WatchReq(ThingsGvr()));
  ASSERT_TRUE(watch.SkipInitial());
  proxy_->ResetAll();
  std::optional<grpc::Status> end = watch.WaitForEnd(absl::Seconds(5));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE) << end->error_message();
  ASSERT_NO_FATAL_FAILURE(CreateDirect("t1"));
  EXPECT_TRUE(WaitFor([&] { return GetThrough(proxied_.get(), "t1", absl::Seconds(1)).ok(); },
                      absl::Seconds(10)));
  EXPECT_EQ(proxy_->mode(), FaultProxy::Mode::kPass);
}

// A black hole: nothing moves and nobody is told. The proxied watch neither ends nor sees an
// event that a direct watch sees; a call through it waits for its deadline (no reset). Healed,
// the held event arrives on the same stream.
TEST_F(FaultProxyTest, BlackHoleStallsSilentlyAndHealResumes) {
  WatchReader proxied_watch(proxied_.get(), WatchReq(ThingsGvr()));
  ASSERT_TRUE(proxied_watch.SkipInitial());
  WatchReader direct_watch(stub_.get(), WatchReq(ThingsGvr()));
  ASSERT_TRUE(direct_watch.SkipInitial());
  proxy_->BlackHole();
  int64_t to_client = proxy_->bytes_to_client();
  ASSERT_NO_FATAL_FAILURE(CreateDirect("t1"));
  // The direct watch sees the event, and later bookmarks: the proxied one would have too.
  std::optional<v1::WatchEvent> seen = direct_watch.NextObjectEvent();
  ASSERT_TRUE(seen.has_value());
  ASSERT_TRUE(direct_watch.Next().has_value());  // a bookmark after the event
  ASSERT_TRUE(direct_watch.Next().has_value());
  EXPECT_EQ(proxy_->bytes_to_client(), to_client);
  EXPECT_FALSE(proxied_watch.WaitForEnd(absl::ZeroDuration()).has_value())
      << "a black hole ended the stream";
  grpc::Status stalled = GetThrough(proxied_.get(), "t1", absl::Milliseconds(700));
  EXPECT_EQ(stalled.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << stalled.error_message();
  EXPECT_EQ(proxy_->connections_reset(), 0);

  proxy_->Heal();
  std::optional<v1::WatchEvent> late = proxied_watch.NextObjectEvent();
  ASSERT_TRUE(late.has_value()) << "the event held in the black hole did not arrive";
  EXPECT_EQ(late->object().metadata().name(), "t1");
  EXPECT_TRUE(Ok(GetThrough(proxied_.get(), "t1")));
}

// A server restarted inside a black hole: after the heal the client is not told (its connection
// stays open and silent) until it sends, and then it is reset, as by a real peer that forgot it.
// The client is a plain TCP connection, so that nothing is sent on it but what the test sends
// (a gRPC client sends on its own: window updates, pings).
TEST_F(FaultProxyTest, ServerRestartedInBlackHoleLeavesHalfOpenConnection) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr = LoopbackAddress(proxy_->port());
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  // The HTTP/2 client preface with an empty SETTINGS frame; the server's SETTINGS in reply prove
  // that the proxy holds a connection to the server.
  const std::string preface = std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
                              std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
  ASSERT_EQ(send(fd, preface.data(), preface.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(preface.size()));
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "no answer from the server through the proxy";
  ASSERT_GT(recv(fd, buf, sizeof(buf), 0), 0);

  proxy_->BlackHole();
  server_->Signal(SIGKILL);
  ASSERT_NE(server_->Wait(absl::Seconds(10)), -1);
  ASSERT_TRUE(server_->Start().ok());
  channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
  stub_ = v1::Store::NewStub(channel_);
  ASSERT_NO_FATAL_FAILURE(CreateDirect("t1"));
  proxy_->Heal();
  // A fresh client through the healed proxy reaches the new server: the old connection would
  // have had time to hear of the old server's end.
  {
    auto fresh = v1::Store::NewStub(
        grpc::CreateChannel(proxy_->address(), grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(Ok(GetThrough(fresh.get(), "t1")));
  }
  // Bytes the old server sent before it died may still arrive; after them, nothing: no end of
  // stream, no reset.
  while (poll(&p, 1, 300) == 1) {
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    ASSERT_GT(n, 0) << "the client was told of a server end that happened inside the partition";
  }
  int resets = proxy_->connections_reset();
  // The client sends: it is reset.
  ASSERT_EQ(send(fd, preface.data(), preface.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(preface.size()));
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "sending on the half-open connection did not reset it";
  ssize_t n = recv(fd, buf, sizeof(buf), 0);
  EXPECT_LE(n, 0) << "the forgetful peer answered";
  EXPECT_GT(proxy_->connections_reset(), resets);
  close(fd);
}

// Delay holds every chunk for the given time in each direction: a call takes at least twice it.
TEST_F(FaultProxyTest, DelayAddsLatencyPerChunkBothWays) {
  ASSERT_NO_FATAL_FAILURE(CreateDirect("t1"));
  ASSERT_TRUE(Ok(GetThrough(proxied_.get(), "t1")));  // connected
  proxy_->Delay(absl::Milliseconds(300));
  absl::Time start = absl::Now();
  ASSERT_TRUE(Ok(GetThrough(proxied_.get(), "t1")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(600));
  proxy_->Heal();
  EXPECT_EQ(proxy_->mode(), FaultProxy::Mode::kPass);
  // Back to pass: the next calls are not delayed (at least one of a few is fast).
  bool fast = false;
  for (int i = 0; i < 5 && !fast; ++i) {
    start = absl::Now();
    ASSERT_TRUE(Ok(GetThrough(proxied_.get(), "t1")));
    fast = absl::Now() - start < absl::Milliseconds(300);
  }
  EXPECT_TRUE(fast);
}

}  // namespace
}  // namespace shardcache::testing
