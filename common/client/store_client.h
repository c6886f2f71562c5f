// StoreClient: typed, blocking calls to a shardcache Store (cache_server), with a deadline on every
// call and retries with backoff where a retry cannot apply a write twice.
//
//   auto client = StoreClient::Create(channel, StoreClient::Options{});
//   absl::StatusOr<v1::Object> obj = (*client)->Get(request);
//
// Errors are the server's, converted with FromGrpcStatus: the gRPC code and message are kept
// (see the Store service in proto/shardcache/v1/store.proto for what each code means). A call
// that gave up after retrying has " (gave up after N attempts)" appended to its message.
//
// Retries (each waits a Backoff delay first, cut short when the channel reconnects; all attempts
// share the call's deadline, Options::timeout):
// - Reads (Get, List, each page of ListAll) are retried on UNAVAILABLE, and on DEADLINE_EXCEEDED
//   when it was the attempt's own timeout (Options::attempt_timeout) that expired, not the call's.
//   So is ClaimEpoch: claiming the same epoch again succeeds, so a claim is idempotent.
// - A write is retried only on UNAVAILABLE, and only when applying it twice is impossible: a
//   Create (a second one fails with ALREADY_EXISTS), and an Update, UpdateStatus or Delete that
//   carries a resourceVersion precondition (a second one fails with ABORTED, or NOT_FOUND for a
//   delete). UNAVAILABLE does not tell whether the server applied the write, so when a retry
//   fails that way after an UNAVAILABLE attempt, the answer is reported as the server gave it
//   (ALREADY_EXISTS, ABORTED, NOT_FOUND) with a note in the message that an earlier attempt may
//   have applied the write: the caller should re-read before deciding.
// - Nothing else is retried: not ABORTED, INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION (so
//   not a ClaimEpoch fenced by a newer epoch), ALREADY_EXISTS, and not writes without a
//   precondition (a retried blind update could overwrite a newer write by someone else).
//
// There is no unary Upsert: the API has none, and emulating it with Get then Create or Update
// would differ from the server's upsert (which is atomic and also replaces a status subresource).
// Use WriteStream (write_stream.h) with a WriteRequest.upsert.
//
// Thread-safe: every method may be called from any thread, concurrently. The client must outlive
// the calls in progress on it. Watch streams it opened may outlive it; they end (as if cancelled)
// when it is destroyed.
#ifndef SHARDCACHE_COMMON_CLIENT_STORE_CLIENT_H_
#define SHARDCACHE_COMMON_CLIENT_STORE_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "common/client/watch_stream.h"
#include "common/clock.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {

// gRPC keepalive of a client channel: the channel pings its connection (HTTP/2 PING) every
// `time`, even while no call is open, and closes it when a ping is not answered within `timeout`,
// which ends the calls on it (a watch among them) with UNAVAILABLE. Without it a connection whose
// peer vanished without a reset (a partition, a paused server) looks open for ever. The server
// must accept pings this often: cache_server's --keepalive-min-client-interval (default 5 s) must
// not exceed `time`.
struct KeepaliveOptions {
  absl::Duration time = absl::Seconds(10);
  absl::Duration timeout = absl::Seconds(5);
};

// The channel arguments every Store client channel uses: keepalive as `keepalive` says (pings
// also while no call is open and while no data flows), and reconnection attempts at least every
// second while the server is unreachable. INVALID_ARGUMENT when a time is not
// between 1 ms and 24 h.
absl::StatusOr<grpc::ChannelArguments> StoreChannelArguments(const KeepaliveOptions& keepalive);
// A channel to a Store at `target` ("host:port") with StoreChannelArguments, over `credentials`
// (insecure when null; see common/tls.h for TLS ones).
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateStoreChannel(
    const std::string& target, const KeepaliveOptions& keepalive = {},
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

class StoreClient {
 public:
  struct Options {
    // Deadline of one call: all its attempts and the waits between them. Default 10 s.
    absl::Duration timeout = absl::Seconds(10);
    // The longest a single attempt of a read (or of a ClaimEpoch) may take before it is given up
    // and retried, when shorter than what is left of the call's timeout. Default: no separate
    // limit.
    absl::Duration attempt_timeout = absl::InfiniteDuration();
    // Attempts per call, the first included; 1 disables retries. Default 5.
    int max_attempts = 5;
    // Delays between attempts: 50 ms doubling to 2 s, up to +20% jitter.
    Backoff::Options backoff = {absl::Milliseconds(50), 2.0, absl::Seconds(2), 0.2,
                                absl::Minutes(2)};
    // The page size ListAll asks for when its request sets no limit. Default 500.
    int64_t list_page_size = 500;
    // The source of "now" for deadlines and backoff. gRPC enforces deadlines in real time, so
    // anything but a real-time clock makes deadlines meaningless. Not owned; must outlive the
    // client. Default: RealClock::Get().
    const Clock* clock = RealClock::Get();
  };

  // A whole list: every item of every page, and the revision of the consistent snapshot.
  struct ListResult {
    std::vector<v1::Object> items;
    std::string resource_version;
  };

  // Validates `options` (timeout > 0, max_attempts >= 1, list_page_size >= 1, backoff as
  // Backoff::Create wants, clock set). The client keeps the channel (or stub) alive. Prefer the
  // channel form: between attempts the client then starts a connection attempt at once and
  // watches the channel, so that a retry reaches a server as soon as it is back. With only a
  // stub it just sleeps, and gRPC's own reconnect backoff (1 s growing to 2 min) and its 5 s
  // backup poller may make retries fail at once for seconds after the server is back.
  static absl::StatusOr<std::unique_ptr<StoreClient>> Create(
      std::shared_ptr<grpc::ChannelInterface> channel, Options options);
  static absl::StatusOr<std::unique_ptr<StoreClient>> Create(
      std::shared_ptr<v1::Store::StubInterface> stub, Options options);

  // Ends every watch stream opened through this client (their Next returns false).
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Reads one object. Retried (see above).
  absl::StatusOr<v1::Object> Get(const v1::GetRequest& request);
  // Reads one page, as the request asks. Retried.
  absl::StatusOr<v1::ListResponse> List(const v1::ListRequest& request);
  // Reads every page, following continue tokens from request.continue_token (usually empty);
  // pages of request.limit items, or Options::list_page_size when it is 0. Each page is one
  // retried call with its own deadline. Errors: those of List; OUT_OF_RANGE when the snapshot
  // left the history window between pages (list again); INTERNAL if the server answered pages
  // at different revisions.
  absl::StatusOr<ListResult> ListAll(const v1::ListRequest& request);

  // Writes; retried only as described above.
  absl::StatusOr<v1::Object> Create(const v1::CreateRequest& request);
  absl::StatusOr<v1::Object> Update(const v1::UpdateRequest& request);
  absl::StatusOr<v1::Object> UpdateStatus(const v1::UpdateRequest& request);
  absl::StatusOr<v1::DeleteResponse> Delete(const v1::DeleteRequest& request);

  // Claims a fencing epoch for a shard (see the ClaimEpoch RPC); OK once it is durable, and
  // FAILED_PRECONDITION when a newer epoch holds the shard. Retried as a read (see above).
  absl::StatusOr<v1::ClaimEpochResponse> ClaimEpoch(const v1::ClaimEpochRequest& request);

  // Opens a Watch call (it is not retried: the caller, e.g. a Reflector, resumes or relists),
  // as a WatchStream (watch_stream.h): it asks for batched events and returns them one by one,
  // and the call starts at its first Next. `timeout` bounds the whole stream; the default is none
  // (watches are long-lived; use Cancel). Errors (bad request, too old revision, server down)
  // are reported by the stream's Finish. After a break, WaitForConnected before reopening: on a
  // channel that is not connected the call fails at once.
  std::unique_ptr<WatchStream> OpenWatch(const v1::WatchRequest& request,
                                         absl::Duration timeout = absl::InfiniteDuration());

  // Blocks until the channel is connected (starting a connection attempt at once, whatever
  // gRPC's reconnect backoff) or `timeout` has passed; returns whether it is connected. Useful
  // before reopening a stream after a break: a stream opened on a channel that is not connected
  // fails at once. Always false for a client created from a stub.
  bool WaitForConnected(absl::Duration timeout);

  // The stub the client calls, e.g. to open a WriteStream on the same channel.
  const std::shared_ptr<v1::Store::StubInterface>& stub() const { return stub_; }
  const Options& options() const { return options_; }

 private:
  // Whether a call may be retried, and on what.
  enum class Retry {
    kRead,   // UNAVAILABLE, or the attempt's own timeout
    kWrite,  // UNAVAILABLE only; later ALREADY_EXISTS/ABORTED/NOT_FOUND get a note
    kNever,
  };
  StoreClient(std::shared_ptr<v1::Store::StubInterface> stub, Options options);

  // Runs `attempt` (one RPC on the given context) until it succeeds, fails for good, runs out of
  // attempts or of time. `method` names the call in messages.
  absl::Status Call(const char* method, Retry retry,
                    const std::function<grpc::Status(grpc::ClientContext*)>& attempt);

  // Waits `delay` before the next attempt; with a channel, returns early once it is connected.
  void PauseBeforeRetry(absl::Duration delay);

  // Constant after construction.
  const std::shared_ptr<v1::Store::StubInterface> stub_;
  const Options options_;
  // The channel when the client was created with a grpc::Channel (else null), watched between
  // attempts so that a retry goes out as soon as the server is back. Set in Create.
  std::shared_ptr<grpc::Channel> channel_;
  // Provides its own synchronization; shared with the watch streams, which may outlive us.
  const std::shared_ptr<CallSet> watches_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_STORE_CLIENT_H_
