// WriteStream: many writes pipelined over one Store.Write call, each answered through its own
// callback, in the order the writes were sent.
//
//   auto stream = WriteStream::Open(client->stub(), WriteStream::Options{});
//   v1::WriteRequest req;
//   *req.mutable_upsert() = ...;
//   absl::Status sent = (*stream)->Send(req, [](const v1::WriteResponse& answer) { ... });
//   ...
//   absl::Status closed = (*stream)->Close();   // waits for the remaining answers
//
// Guarantees:
// - Send assigns the write's id (1, 2, 3, ... per stream; any id in the request is replaced).
//   When Send returns OK, the callback is called exactly once: with the server's answer (whose
//   code is the write's gRPC code: a failed write does not end the stream), or, if the stream
//   breaks first, with a synthetic answer for that id whose code is the stream's (UNAVAILABLE
//   when the server is gone or ended the call; CANCELLED after Cancel; DEADLINE_EXCEEDED when
//   Options::stream_timeout passed; INTERNAL if the server broke the protocol) and whose message
//   says that the write may or may not have been applied. When Send fails, the callback is
//   never called.
// - Callbacks are called one at a time, in the order of the writes, and never concurrently.
// - At most Options::window writes are outstanding (sent, or queued to be sent, and not yet
//   answered). Send waits for room (up to a deadline); TrySend does not wait.
// - Writes go out as they come; while more are queued, each is written with gRPC's buffer hint
//   so that a burst leaves in few packets.
// - Once the stream has broken, Broken() is true and every Send fails with the stream's status.
//   A WriteStream is not reopened: open a new one to carry on, once the channel is connected
//   again (StoreClient::WaitForConnected, or grpc::Channel::WaitForConnected): a stream opened
//   on a channel that is not connected breaks at once with UNAVAILABLE.
//
// Threads: Send, TrySend, Close, Cancel, Broken and status may be called from any thread,
// concurrently. Callbacks run on gRPC's threads and must not block: they may call TrySend but
// not Send or Close (the next answer is not read until the callback returns).
#ifndef SHARDCACHE_COMMON_CLIENT_WRITE_STREAM_H_
#define SHARDCACHE_COMMON_CLIENT_WRITE_STREAM_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {

class WriteStream {
 public:
  struct Options {
    // Writes that may be outstanding at once; at least 1. Default 64.
    int window = 64;
    // How long Send(request, callback) waits for room in the window. Default 10 s.
    absl::Duration send_timeout = absl::Seconds(10);
    // Deadline of the whole stream, after which it breaks with DEADLINE_EXCEEDED. Default:
    // none (a write stream is long-lived; use Close or Cancel).
    absl::Duration stream_timeout = absl::InfiniteDuration();
  };

  using AnswerCallback = std::function<void(const v1::WriteResponse&)>;

  // Starts a Write call on `stub`'s channel (kept alive by the stream). Fails with
  // INVALID_ARGUMENT on bad options or a stub without the callback API. The call itself starts
  // asynchronously: a server that is down shows as a break, not as an error here.
  static absl::StatusOr<std::unique_ptr<WriteStream>> Open(
      std::shared_ptr<v1::Store::StubInterface> stub, Options options);

  // Cancels the call if it has not ended (outstanding callbacks get CANCELLED answers) and waits
  // for gRPC to finish with it. REQUIRES: not called from one of this stream's callbacks.
  ~WriteStream();
  WriteStream(const WriteStream&) = delete;
  WriteStream& operator=(const WriteStream&) = delete;

  // Queues `request` (its id replaced) for sending, waiting up to Options::send_timeout (or
  // until `deadline`) for room in the window. `on_answer` may be null (the answer is dropped).
  // Errors: DEADLINE_EXCEEDED (no room in time), the stream's status once it has broken,
  // FAILED_PRECONDITION after Close. REQUIRES: not called from a callback.
  absl::Status Send(v1::WriteRequest request, AnswerCallback on_answer);
  absl::Status Send(v1::WriteRequest request, AnswerCallback on_answer, absl::Time deadline);
  // As Send, but fails at once with RESOURCE_EXHAUSTED when the window is full.
  absl::Status TrySend(v1::WriteRequest request, AnswerCallback on_answer);

  // Half-closes the stream and waits up to `timeout` for every answer and the server's final
  // status, which it returns (OK when every write was answered and the call ended cleanly).
  // On timeout, cancels the call (the unanswered writes get CANCELLED answers) and returns
  // DEADLINE_EXCEEDED. Later Sends fail. Calling it again returns the same status.
  // REQUIRES: not called from a callback.
  absl::Status Close(absl::Duration timeout = absl::Seconds(30));

  // Breaks the stream now: every outstanding write is answered CANCELLED. Never blocks.
  void Cancel();

  // True once the stream has failed (server gone, cancelled, timed out, protocol error). A
  // stream ended by a successful Close is not broken.
  bool Broken() const;
  // OK while the stream is healthy (or closed cleanly); else why it broke.
  absl::Status status() const;
  // Writes sent or queued and not yet answered.
  int outstanding() const;

 private:
  class Reactor;
  explicit WriteStream(std::unique_ptr<Reactor> reactor);

  const std::unique_ptr<Reactor> reactor_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_WRITE_STREAM_H_
