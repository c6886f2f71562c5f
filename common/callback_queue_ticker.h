// CallbackQueueTicker: keeps gRPC's callback threads from napping, so that a request or a response
// that comes after a quiet second is not held for up to 100 ms.
//
// gRPC C++ (1.51, as Debian 12 ships it, with the Linux pollers) runs every callback of its
// callback API (server reactors and unary handlers, client reactors and unary callbacks) on one
// completion queue per process, served by a few "nexting" threads. A nexting thread that waits a
// second on that queue without a completion sleeps 100 ms before it waits again, and takes no
// completion meanwhile (grpc/grpc, src/cpp/common/completion_queue_cc.cc, CallbackAlternativeCQ).
// The threads start together, so they time out together and nap together: a write that reaches
// the cache server in such a nap (the first after a second of quiet) waited up to 100 ms before its
// handler ran, and every watcher received its event that much later.
//
// The ticker completes one call on that queue every `interval` (well under the second): a call
// on a channel of its own, cancelled before it starts, so that it fails at once in the client with
// CANCELLED and never reaches a server or a socket (the channel stays idle: it never connects).
// Not on a server's in-process channel: there, a call reaches the server even when it was
// cancelled first. The nexting thread that runs the completion starts its second again; with the
// two or more nexting threads gRPC starts, one of them waits on the queue whenever the last tick
// completed less than a second ago. A tick is started only once the one before has completed, so
// ticks never pile up behind busy callback threads. Cost: one cancelled call about four times a
// second.
//
// Thread-safety: ticks() and the accessors may be called from any thread. Construct and destroy
// on any thread but gRPC's callback threads: the destructor waits (up to kStopTimeout) for the
// tick in flight, whose call holds the channel. Were the channel's last reference dropped on a
// callback thread, that thread would join the callback threads, itself among them.
#ifndef SHARDCACHE_COMMON_CALLBACK_QUEUE_TICKER_H_
#define SHARDCACHE_COMMON_CALLBACK_QUEUE_TICKER_H_

#include <grpcpp/channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shardcache {

class CallbackQueueTicker {
 public:
  // Well under the nexting threads' one second.
  static constexpr absl::Duration kDefaultInterval = absl::Milliseconds(250);
  // How long the destructor waits for the tick in flight; after that it leaves the channel to the
  // process (see Thread-safety).
  static constexpr absl::Duration kStopTimeout = absl::Seconds(5);

  // What the last completed tick saw, for tests.
  struct Completion {
    grpc::StatusCode code = grpc::StatusCode::OK;
    std::thread::id thread;
  };

  // Starts ticking on a channel of its own, which never connects. `clock` (not owned) times the
  // ticks.
  explicit CallbackQueueTicker(absl::Duration interval = kDefaultInterval,
                               const Clock* clock = RealClock::Get());
  // Starts ticking on `channel` (for tests: the calls are cancelled before they start, and
  // leave an idle TCP channel idle).
  CallbackQueueTicker(std::shared_ptr<grpc::Channel> channel, absl::Duration interval,
                      const Clock* clock = RealClock::Get());
  ~CallbackQueueTicker();
  CallbackQueueTicker(const CallbackQueueTicker&) = delete;
  CallbackQueueTicker& operator=(const CallbackQueueTicker&) = delete;

  // The calls that have completed so far.
  int64_t ticks() const;
  // The state of the channel the calls are made on (without trying to connect).
  grpc_connectivity_state channel_state() const;
  Completion last_completion() const;
  // The thread that starts the ticks.
  std::thread::id ticking_thread() const { return thread_.get_id(); }

 private:
  // Shared with the calls' completions, which may still be leaving its mutex when the destructor
  // has seen the last of them.
  struct State {
    absl::Mutex mu;
    bool stopping ABSL_GUARDED_BY(mu) = false;
    int64_t in_flight ABSL_GUARDED_BY(mu) = 0;
    int64_t ticks ABSL_GUARDED_BY(mu) = 0;
    Completion last ABSL_GUARDED_BY(mu);
  };

  void Run();
  // Starts one call; its completion counts it and lets the next one start.
  void Tick();

  const std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub stub_;
  const absl::Duration interval_;
  const Clock* const clock_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CALLBACK_QUEUE_TICKER_H_
