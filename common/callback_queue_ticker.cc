#include "common/callback_queue_ticker.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/stub_options.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "common/tsan_annotations.h"

namespace shardcache {
namespace {

// No service has it: a call that reached a server by mistake would be answered UNIMPLEMENTED.
constexpr char kMethod[] = "/shardcache.internal.CallbackQueueTicker/Tick";

// One call's buffers and context, from its start to its completion.
struct TickCall {
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
};

}  // namespace

CallbackQueueTicker::CallbackQueueTicker(absl::Duration interval, const Clock* clock)
    // Never dialled (the calls are cancelled before they start); were it, the connection would
    // be refused: nothing listens on port 1.
    : CallbackQueueTicker(grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()),
                          interval, clock) {}

CallbackQueueTicker::CallbackQueueTicker(std::shared_ptr<grpc::Channel> channel,
                                         absl::Duration interval, const Clock* clock)
    : channel_(std::move(channel)), stub_(channel_), interval_(interval), clock_(clock) {
  thread_ = std::thread([this] { Run(); });
}

CallbackQueueTicker::~CallbackQueueTicker() {
  {
    absl::MutexLock l(&state_->mu);
    state_->stopping = true;
  }
  thread_.join();
  State* s = state_.get();
  absl::MutexLock l(&s->mu);
  auto done = [s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->in_flight == 0; };
  // A cancelled call completes at once, unless every callback thread is stuck.
  if (!s->mu.AwaitWithTimeout(absl::Condition(&done), kStopTimeout)) {
    spdlog::warn("the last gRPC callback queue tick did not complete within {}",
                 absl::FormatDuration(kStopTimeout));
    // Its completion drops its reference to the channel: ours must outlive it (see the header).
    new std::shared_ptr<grpc::Channel>(channel_);
  }
}

grpc_connectivity_state CallbackQueueTicker::channel_state() const {
  return channel_->GetState(/*try_to_connect=*/false);
}

CallbackQueueTicker::Completion CallbackQueueTicker::last_completion() const {
  absl::MutexLock l(&state_->mu);
  return state_->last;
}

int64_t CallbackQueueTicker::ticks() const {
  absl::MutexLock l(&state_->mu);
  return state_->ticks;
}

void CallbackQueueTicker::Run() {
  State* s = state_.get();
  s->mu.Lock();
  while (!s->stopping) {
    // Only once the last tick has completed: behind stuck callback threads, ticks would pile up.
    if (s->in_flight == 0) {
      ++s->in_flight;
      s->mu.Unlock();
      Tick();
      s->mu.Lock();
    }
    clock_->AwaitWithDeadline(&s->mu, absl::Condition(&s->stopping), clock_->Now() + interval_);
  }
  s->mu.Unlock();
}

void CallbackQueueTicker::Tick() {
  auto* call = new TickCall;
  grpc::Slice empty(std::string{});
  call->request = grpc::ByteBuffer(&empty, 1);
  // Cancelled before it starts: it fails in the client, and its completion runs on one of the
  // callback threads, which is the point.
  call->context.TryCancel();
  std::function<void(grpc::Status)> done = [state = state_, call](const grpc::Status& status) {
    // gRPC's core, which ThreadSanitizer does not see, ordered the start before this.
    TsanAcquire(call);
    delete call;
    absl::MutexLock l(&state->mu);
    state->last = Completion{status.error_code(), std::this_thread::get_id()};
    --state->in_flight;
    ++state->ticks;
  };
  TsanRelease(call);
  stub_.UnaryCall(&call->context, kMethod, grpc::StubOptions(), &call->request, &call->response,
                  std::move(done));
}

}  // namespace shardcache
