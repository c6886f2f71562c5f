// Tests of CallbackQueueTicker: it completes a call at once and then once per interval of its
// clock, never sooner; its calls reach no server and leave an idle channel idle; its destructor
// returns only after every call it started has completed (run under the sanitizers, a completion
// that outlived the ticker would be reported). What the ticks are for (no 100 ms wait for a request
// after a quiet second) is measured by store_bench (docs/BENCHMARKS.md), not asserted here.
#include "common/callback_queue_ticker.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::WaitFor;

constexpr absl::Duration kTimeout = absl::Seconds(20);

// A server on a loopback port of its choosing that counts every call of any method, and answers
// each UNIMPLEMENTED.
class CountingServer {
 public:
  CountingServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~CountingServer() { server_->Shutdown(); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::shared_ptr<grpc::Channel> InProcessChannel() { return server_->InProcessChannel({}); }
  int calls() const { return service_.calls.load(); }

 private:
  struct Service : grpc::CallbackGenericService {
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
      ++calls;
      struct Reactor : grpc::ServerGenericBidiReactor {
        Reactor() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "counted")); }
        void OnDone() override { delete this; }
      };
      return new Reactor;
    }
    std::atomic<int> calls{0};
  };

  int port_ = 0;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST(CallbackQueueTickerTest, TicksAtOnceThenOncePerIntervalOfItsClock) {
  CountingServer server;
  FakeClock clock;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  CallbackQueueTicker ticker(channel, absl::Milliseconds(250), &clock);

  ASSERT_TRUE(WaitFor([&] { return ticker.ticks() == 1; }, kTimeout));
  ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
  EXPECT_EQ(clock.NextDeadline(), clock.Now() + absl::Milliseconds(250));

  // Not before the interval has passed: the ticker waits again, and has not ticked.
  clock.Advance(absl::Milliseconds(249));
  ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
  EXPECT_EQ(ticker.ticks(), 1);

  clock.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(WaitFor([&] { return ticker.ticks() == 2; }, kTimeout));
  ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
  clock.Advance(absl::Milliseconds(250));
  ASSERT_TRUE(WaitFor([&] { return ticker.ticks() == 3; }, kTimeout));
}

TEST(CallbackQueueTickerTest, ItsCallsReachNoServerAndLeaveAnIdleChannelIdle) {
  CountingServer server;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  {
    CallbackQueueTicker ticker(channel, absl::Milliseconds(1));
    ASSERT_TRUE(WaitFor([&] { return ticker.ticks() >= 20; }, kTimeout));
  }
  EXPECT_EQ(channel->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_IDLE);
  EXPECT_EQ(server.calls(), 0);

  // The server counts calls that do reach it: the check above can fail.
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  grpc::ByteBuffer request, response;
  grpc::Slice empty(std::string{});
  request = grpc::ByteBuffer(&empty, 1);
  std::atomic<bool> done{false};
  grpc::Status status;
  stub.UnaryCall(&context, "/any.Service/Method", grpc::StubOptions(), &request, &response,
                 [&](const grpc::Status& s) {
                   status = s;
                   done = true;
                 });
  ASSERT_TRUE(WaitFor([&] { return done.load(); }, kTimeout));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(server.calls(), 1);
}

// Why the ticker does not use a server's in-process channel: there, a call cancelled before it
// starts still reaches the server.
TEST(CallbackQueueTickerTest, OnAServersInProcessChannel_ItsCallsWouldReachTheServer) {
  CountingServer server;
  {
    CallbackQueueTicker ticker(server.InProcessChannel(), absl::Milliseconds(1));
    ASSERT_TRUE(WaitFor([&] { return ticker.ticks() >= 20; }, kTimeout));
  }
  EXPECT_GT(server.calls(), 0);
}

TEST(CallbackQueueTickerTest, ItsOwnChannelNeverConnects) {
  CallbackQueueTicker ticker(absl::Milliseconds(1));
  ASSERT_TRUE(WaitFor([&] { return ticker.ticks() >= 20; }, kTimeout));
  EXPECT_EQ(ticker.channel_state(), GRPC_CHANNEL_IDLE);
}

TEST(CallbackQueueTickerTest, DestroyedAtOnce_NoCompletionOutlivesIt) {
  CountingServer server;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  for (int i = 0; i < 50; ++i) {
    CallbackQueueTicker ticker(channel, absl::Microseconds(100));
  }
  CallbackQueueTicker last(channel, absl::Microseconds(100));
  ASSERT_TRUE(WaitFor([&] { return last.ticks() >= 1; }, kTimeout));
}

}  // namespace
}  // namespace shardcache
