// Tests of CallbackQueueTicker: it completes a call at once and then once per interval of its
// clock, never sooner; each is cancelled before it starts, completes on one of gRPC's threads (not
// the ticker's, not the caller's), reaches no server, and leaves an idle channel idle throughout;
// the ticker's own channel never connects. The destructor waits for the tick in flight, whose call
// holds the channel (without that wait the channel's last reference could go on a callback
// thread). What the ticks are for (no 100 ms wait for a request after a quiet second) is measured
// by store_bench (docs/BENCHMARKS.md, Figure 7), not asserted here.
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
#include <thread>

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/testing/wait.h"
#include "common/tsan_annotations.h"

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
        void OnDone() override {
          TsanAcquire(this);
          delete this;
        }
      };
      auto* reactor = new Reactor;
      // Replayed once the reactor is returned and bound: OnDone comes after this function.
      reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "counted"));
      // OnDone runs on another thread, ordered after this by gRPC's core.
      TsanRelease(reactor);
      return reactor;
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
  const absl::Time first_deadline = clock.NextDeadline();
  EXPECT_EQ(first_deadline, clock.Now() + absl::Milliseconds(250));
  CallbackQueueTicker::Completion completion = ticker.last_completion();
  EXPECT_EQ(completion.code, grpc::StatusCode::CANCELLED);
  EXPECT_NE(completion.thread, std::this_thread::get_id());
  EXPECT_NE(completion.thread, ticker.ticking_thread());

  // Not before the interval has passed: the ticker still waits for the same deadline (a tick
  // would have been followed by a wait for a later one).
  clock.Advance(absl::Milliseconds(249));
  ASSERT_TRUE(clock.AwaitWaiters(1, kTimeout));
  EXPECT_EQ(clock.NextDeadline(), first_deadline);
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
    bool ever_left_idle = false;
    ASSERT_TRUE(WaitFor(
        [&] {
          ever_left_idle = ever_left_idle || ticker.channel_state() != GRPC_CHANNEL_IDLE;
          return ticker.ticks() >= 20;
        },
        kTimeout));
    EXPECT_FALSE(ever_left_idle);
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

// Each ticker holds the only reference to its channel (each test runs in a process of its own):
// the destructor must keep it until the tick in flight has let go of it.
TEST(CallbackQueueTickerTest, DestroyedAtOnce_TheTickInFlightCompletesFirst) {
  for (int i = 0; i < 50; ++i) {
    CallbackQueueTicker ticker(absl::Microseconds(100));
  }
  CallbackQueueTicker last(absl::Microseconds(100));
  ASSERT_TRUE(WaitFor([&] { return last.ticks() >= 1; }, kTimeout));
}

}  // namespace
}  // namespace shardcache
