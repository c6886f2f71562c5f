// Process-level tests of cache_server's life: health and readiness while serving (HTTP and the
// standard grpc.health.v1.Health service), draining on SIGTERM with open streams, and refusing to
// start, with a clear message, when its flags or its ports are wrong.

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/server_process.h"
#include "integration_tests/refuse_to_start.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

constexpr absl::Duration kWait = absl::Seconds(10);

v1::WatchRequest WatchWidgets() {
  v1::WatchRequest req;
  *req.mutable_resource() = Gvr("example.com", "v1", "widgets");
  return req;
}

v1::Object Widget(const std::string& name) {
  return FromJson<v1::Object>(absl::StrCat(R"({"metadata":{"cluster":"root","namespace":"ns1",)",
                                           R"("name":")", name, R"("},"spec":{"n":1}})"));
}

// Calls grpc.health.v1.Health/Check for `service` without generated code: HealthCheckRequest
// is {1: service}, HealthCheckResponse is {1: status enum} (SERVING = 1).
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                         std::string* response_bytes) {
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);  // field 1, length-delimited
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::GenericStub stub(channel);
  auto ctx = Context();
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(ctx.get(), "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request_buffer,
                 &response_buffer, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(15))) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer from the health check");
  }
  response_bytes->clear();
  if (status.ok()) {
    std::vector<grpc::Slice> slices;
    (void)response_buffer.Dump(&slices);
    for (const auto& s : slices) {
      response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

bool IsExitCode(int wait_status, int code) {
  return wait_status != -1 && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == code;
}

class ServerLifecycleTest : public StoreFixture {};

// ---- health and readiness ----

TEST_F(ServerLifecycleTest, Health_WhileServing_HttpAndGrpcReportServing) {
  StartServer({});
  EXPECT_THAT(HttpGet(server_->http_port(), "/healthz"), StartsWith("200\n"));
  EXPECT_THAT(HttpGet(server_->http_port(), "/readyz"), StartsWith("200\n"));
  EXPECT_THAT(HttpGet(server_->http_port(), "/metrics"), HasSubstr("shardcache_store_revision"));
  EXPECT_EQ(Metric(server_->http_port(), "shardcache_build_info", {"version=\"", "commit=\""}), 1);

  std::string response;
  ASSERT_TRUE(Ok(HealthCheck(channel_, "", &response)));
  EXPECT_EQ(response, std::string("\x08\x01", 2)) << "want status SERVING (1)";
  grpc::Status unknown = HealthCheck(channel_, "no.such.Service", &response);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();
}

// ---- SIGTERM ----

TEST_F(ServerLifecycleTest, Sigterm_WithOpenWatchesAndWriteStream_DrainsAndExitsZero) {
  const absl::Duration kDrain = absl::Seconds(3);
  StartServer({"--drain-timeout=3s"});
  std::vector<std::unique_ptr<WatchReader>> watches;
  for (int i = 0; i < 3; ++i) {
    watches.push_back(std::make_unique<WatchReader>(stub_.get(), WatchWidgets()));
    ASSERT_TRUE(watches.back()->SkipInitial());
  }
  // A Write stream with one answered write, left open (no WritesDone).
  grpc::ClientContext write_ctx;
  write_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto writes = stub_->Write(&write_ctx);
  v1::WriteRequest w;
  w.set_id(1);
  *w.mutable_create()->mutable_resource() = Gvr("example.com", "v1", "widgets");
  *w.mutable_create()->mutable_object() = Widget("w1");
  ASSERT_TRUE(writes->Write(w));
  v1::WriteResponse answer;
  ASSERT_TRUE(writes->Read(&answer));
  EXPECT_EQ(answer.code(), 0) << answer.message();

  absl::Time sigterm = absl::Now();
  server_->Signal(SIGTERM);

  // While it drains it is not ready; its watches end at once with UNAVAILABLE.
  int exit_status = -1;
  bool exited = false;
  std::string readyz;
  absl::Time deadline = absl::Now() + kWait;
  while (absl::Now() < deadline) {
    readyz = HttpGet(server_->http_port(), "/readyz");
    if (!absl::StartsWith(readyz, "200\n")) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (int s = server_->Wait(absl::ZeroDuration()); s != -1) {
    exited = true;
    exit_status = s;
  }
  if (!exited && absl::StartsWith(readyz, "error:")) {
    // The HTTP endpoint stops last, once the drain is over, just before the process exits: a
    // drain that short can fall between two polls. Then the endpoint is gone, not still ready.
    exit_status = server_->Wait(kDrain + absl::Seconds(10));
    exited = exit_status != -1;
  }
  if (!exited) {
    EXPECT_THAT(readyz, StartsWith("503\n")) << "/readyz while draining";
  }
  for (auto& watch : watches) {
    auto s = watch->WaitForEnd();
    ASSERT_TRUE(s.has_value()) << "a watch stayed open after SIGTERM";
    EXPECT_EQ(s->error_code(), grpc::StatusCode::UNAVAILABLE) << s->error_message();
  }

  if (!exited) exit_status = server_->Wait(kDrain + absl::Seconds(10));
  absl::Duration took = absl::Now() - sigterm;
  EXPECT_TRUE(IsExitCode(exit_status, 0)) << DescribeWaitStatus(exit_status);
  // Beyond the drain, the rest of the shutdown (gRPC, the store's close) on a busy machine.
  EXPECT_LT(took, kDrain + absl::Seconds(4)) << "the drain took longer than --drain-timeout";

  // The open Write stream was ended by the server, not left hanging.
  EXPECT_FALSE(writes->Read(&answer));
  grpc::Status finished = writes->Finish();
  EXPECT_FALSE(finished.ok());
}

TEST_F(ServerLifecycleTest, Sigterm_WithOnlyWatchesOpen_ExitsWithoutWaitingForTheDrainTimeout) {
  StartServer({"--drain-timeout=60s"});
  std::vector<std::unique_ptr<WatchReader>> watches;
  for (int i = 0; i < 5; ++i) {
    watches.push_back(std::make_unique<WatchReader>(stub_.get(), WatchWidgets()));
    ASSERT_TRUE(watches.back()->SkipInitial());
  }
  absl::Time sigterm = absl::Now();
  server_->Signal(SIGTERM);
  int exit_status = server_->Wait(absl::Seconds(20));
  EXPECT_TRUE(IsExitCode(exit_status, 0)) << DescribeWaitStatus(exit_status);
  // Far below the 60 s drain timeout: the server does not wait for watches to end by
  // themselves.
  EXPECT_LT(absl::Now() - sigterm, absl::Seconds(30));
  for (auto& watch : watches) {
    auto s = watch->WaitForEnd();
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->error_code(), grpc::StatusCode::UNAVAILABLE) << s->error_message();
  }
}

// ---- refusing to start ----

// A listening TCP socket on a free loopback port, without SO_REUSEPORT.
class BusyPort {
 public:
  BusyPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = LoopbackAddress(0);
    socklen_t len = sizeof(addr);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        listen(fd_, 16) == 0 && getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~BusyPort() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(RefuseToStartTest, BadRole) { ExpectRefused(RunCacheServer({"--role=primary"}), "--role"); }

TEST(RefuseToStartTest, NegativeDiskReserve) {
  ExpectRefused(RunCacheServer({"--min-free-disk-bytes=-1"}), "--min-free-disk-bytes: must not");
}

// Abseil's parser would exit 1 with its own message: every bad flag takes the one path.
TEST(RefuseToStartTest, UnknownOrUnparsableFlag_ExitsTwoNamingIt) {
  ExpectRefused(RunCacheServer({"--bogus-flag=1"}), "--bogus-flag: unknown flag", 2);
  ExpectRefused(RunCacheServer({"--history-events=many"}), "--history-events: invalid value", 2);
  ExpectRefused(RunCacheServer({"--sync=perhaps"}), "--sync: invalid value", 2);
  ExpectRefused(RunCacheServer({"--data-dir"}), "--data-dir: missing value", 2);
  ExpectRefused(RunCacheServer({"stray"}), "unexpected argument \"stray\"", 2);
}

TEST(RefuseToStartTest, HelpAndVersion_PrintWithoutBuildPaths) {
  RunResult help = RunCacheServer({"--help"});
  EXPECT_THAT(help.stdout_text, HasSubstr("Flags from cache_server/cache_server_main.cc:\n"));
  EXPECT_THAT(help.stdout_text, HasSubstr("--history_events"));
  EXPECT_THAT(help.stdout_text, Not(HasSubstr("../"))) << help.stdout_text;
  EXPECT_FALSE(help.wrote_port_file);
  RunResult version = RunCacheServer({"--version"});
  EXPECT_EQ(ExitCode(version), 0) << version.stderr_text;
  EXPECT_THAT(version.stdout_text, MatchesRegex("cache_server [0-9]+\\.[0-9]+\\.[0-9]+ "
                                                "\\(commit ([0-9a-f]+|unknown)\\)\n"));
  EXPECT_FALSE(version.wrote_port_file);
}

TEST(RefuseToStartTest, BadListenAddress) {
  for (const char* listen : {"--listen=nonsense", "--listen=127.0.0.1:99999", "--listen=:7070",
                             "--listen=127.0.0.1:http"}) {
    SCOPED_TRACE(listen);
    ExpectRefused(RunCacheServer({listen}), "--listen");
  }
  ExpectRefused(RunCacheServer({"--http-listen=localhost"}), "--http-listen");
}

TEST(RefuseToStartTest, ListenAddressNotLocal) {
  // 192.0.2.1 (TEST-NET-1) is no address of this machine.
  ExpectRefused(RunCacheServer({"--listen=192.0.2.1:0"}), "--listen");
}

TEST(RefuseToStartTest, GrpcPortInUse) {
  BusyPort busy;
  ASSERT_GT(busy.port(), 0);
  ExpectRefused(RunCacheServer({absl::StrCat("--listen=127.0.0.1:", busy.port())}), "--listen");
}

TEST(RefuseToStartTest, HttpPortInUse) {
  BusyPort busy;
  ASSERT_GT(busy.port(), 0);
  ExpectRefused(RunCacheServer({absl::StrCat("--http-listen=127.0.0.1:", busy.port())}),
                "--http-listen");
}

// Another cache_server already serving on the port: a second one must not share it.
TEST_F(ServerLifecycleTest, PortsOfARunningServer_SecondServerRefusesToStart) {
  StartServer({});
  {
    SCOPED_TRACE("gRPC port");
    ExpectRefused(RunCacheServer({absl::StrCat("--listen=127.0.0.1:", server_->grpc_port())}),
                  "--listen");
  }
  {
    SCOPED_TRACE("HTTP port");
    ExpectRefused(RunCacheServer({absl::StrCat("--http-listen=127.0.0.1:", server_->http_port())}),
                  "--http-listen");
  }
  // The first server is unharmed.
  EXPECT_THAT(HttpGet(server_->http_port(), "/readyz"), StartsWith("200\n"));
  EXPECT_TRUE(Ok(Create(Gvr("example.com", "v1", "widgets"), Widget("w1"))));
}

// ---- SIGTERM while clients come and go ----

// Clients that keep opening watches and cancelling them, each on a channel of its own that it
// then drops, from several threads, until stopped.
class WatchChurn {
 public:
  WatchChurn(std::string address, int threads) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this, address, i] { Run(address, i); });
    }
  }
  ~WatchChurn() { Stop(); }

  // Watches opened and then cancelled so far.
  int cancelled() {
    absl::MutexLock l(&mu_);
    return cancelled_;
  }
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  bool stopping() {
    absl::MutexLock l(&mu_);
    return stop_;
  }

  void Run(const std::string& address, int seed) {
    for (int round = 0; !stopping(); ++round) {
      auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
      auto stub = v1::Store::NewStub(channel);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
      auto reader = stub->Watch(&ctx, WatchWidgets());
      v1::WatchEvent event;
      // Half of the watches are cancelled once registered (after their initial events), the
      // others at once, possibly before the server has registered them.
      if ((round + seed) % 2 == 0) (void)reader->Read(&event);
      ctx.TryCancel();
      while (reader->Read(&event)) {
      }
      (void)reader->Finish();
      absl::MutexLock l(&mu_);
      ++cancelled_;
    }
  }

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
};

// A client connected over HTTP/2 that then never reads nor answers: a paused or partitioned
// client machine.
class SilentConnection {
 public:
  explicit SilentConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = LoopbackAddress(port);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    // The client preface and an empty SETTINGS frame.
    static const char kHello[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
    connected_ = write(fd_, kHello, sizeof(kHello) - 1) == static_cast<ssize_t>(sizeof(kHello) - 1);
  }
  ~SilentConnection() {
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// A watch cancelled by its client is finished at once, whatever it races with (its
// registration, the shutdown): nothing waits for the next bookmark (60 s here). And SIGTERM stops
// the server in well under a second while clients open and cancel watches, one client stays
// connected with no call in flight, and another never answers at all: once every call is
// answered, the server does not wait for idle connections to acknowledge its GOAWAY.
TEST_F(ServerLifecycleTest, Sigterm_WhileClientsComeAndGo_ExitsAtOnce) {
  StartServer({"--bookmark-interval=60s", "--drain-timeout=60s"});
  // channel_ stays connected, idle, to the end.
  ASSERT_TRUE(Ok(Create(Gvr("example.com", "v1", "widgets"), Widget("w1"))));
  SilentConnection silent(server_->grpc_port());
  ASSERT_TRUE(silent.connected());
  {
    WatchChurn churn(server_->grpc_address(), 6);
    ASSERT_TRUE(WaitFor([&] { return churn.cancelled() >= 30; }))
        << "the clients could not open and cancel watches";
  }
  EXPECT_TRUE(
      WaitFor([&] { return Metric(server_->http_port(), "shardcache_store_watchers") == 0; },
              absl::Seconds(10)))
      << "cancelled watches are still registered: "
      << Metric(server_->http_port(), "shardcache_store_watchers");

  WatchChurn churn(server_->grpc_address(), 6);
  ASSERT_TRUE(WaitFor([&] { return churn.cancelled() >= 30; }));
  absl::Time sigterm = absl::Now();
  server_->Signal(SIGTERM);
  int exit_status = server_->Wait(absl::Seconds(90));
  absl::Duration took = absl::Now() - sigterm;
  churn.Stop();
  EXPECT_TRUE(IsExitCode(exit_status, 0)) << DescribeWaitStatus(exit_status) << server_->Log();
  // Generous for a loaded machine; the drain timeout and the bookmark interval are 60 s, and an
  // idle gRPC client acknowledges a GOAWAY only at its next poll, up to 5 s later.
  EXPECT_LT(took, absl::Seconds(4)) << server_->Log();
}

}  // namespace
}  // namespace shardcache::testing
