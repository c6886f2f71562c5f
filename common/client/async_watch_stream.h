// AsyncWatchStream: a Store Watch read without a thread that waits for it, so that a process can
// keep thousands of watches open on a fixed number of threads (a Reflector on a WorkerPool; see
// reflector.h). It is gRPC's callback API under the AsyncWatchEventStream interface:
//
//   AsyncWatchStream w(stub, request, options);
//   w.Start([&] { reader->Wake(); });          // from gRPC's threads: only wake the reader
//   ...                                        // later, on the reader's thread or turn:
//   v1::WatchEvent event;
//   while (w.Next(&event) == AsyncWatchEventStream::Poll::kEvent) { ... }
//   // kPending: wait to be woken; kEnded: w.Finish() says why
//
// Guarantees:
// - The same events as a WatchStream (watch_stream.h) of the same request: batches asked for and
//   unpacked (WatchBatch), in order, each with the message's store_id; the store's identity from
//   the response headers (StoreId) before any event.
// - Bounded: it holds at most one message. It asks gRPC for the next message only once the reader
//   has taken every event of the last one, so a reader that stops reading holds the server back
//   through HTTP/2 flow control, not a buffer here.
// - gRPC's threads never run the reader's code: they store what arrived and call `ready`.
// - Lifetime: the destructor cancels the call if it is still open and waits for gRPC's last
//   callback (OnDone) to have returned; after it, `ready` is never called again. The call's state
//   (its ClientContext, the message buffer) is shared with gRPC and freed by whichever lets go of
//   it last, so a callback in flight never touches freed memory.
//
// Thread-safety: Start, StoreId, Next and Finish are for one thread at a time (the reader: a
// thread, or the turns of a WorkerPool client). Cancel may be called from any thread at any time
// while the stream exists, and so may its CallSet's Shutdown. Neither may be called while holding
// a lock that `ready` takes: gRPC may run a callback, hence `ready`, on the calling thread.
#ifndef SHARDCACHE_COMMON_CLIENT_ASYNC_WATCH_STREAM_H_
#define SHARDCACHE_COMMON_CLIENT_ASYNC_WATCH_STREAM_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/client/watch_stream.h"
#include "shardcache/v1/store.grpc.pb.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

// One open watch, read by polling (the form a Reflector reads: lister_watcher.h). Events arrive
// in revision order; the stream ends on an error, on Cancel(), or when the store ends it.
// Implemented by AsyncWatchStream over the network, and by fakes in tests.
class AsyncWatchEventStream {
 public:
  enum class Poll {
    kEvent,    // *event is the next event
    kPending,  // nothing yet: `ready` will be called when there may be
    kEnded,    // the stream has ended: call Finish()
  };

  // Cancels the stream if it is still open, and returns once `ready` is no longer running and
  // will never be called again.
  virtual ~AsyncWatchEventStream() = default;
  // Opens the stream. From then on `ready` is called, from any thread, whenever StoreId or Next
  // may have something new (the headers, a message, the end); a call may cover several. It must
  // be quick, never block for long, and never call into this stream: it only wakes the reader.
  // Call once; the reader then polls at least once without waiting for `ready`.
  virtual void Start(std::function<void()> ready) = 0;
  // The identity of the store that serves the stream, as its response headers say: nullopt until
  // they have arrived, "" when the store sent none or the stream ended without them. Next returns
  // no event before it is known.
  virtual std::optional<std::string> StoreId() = 0;
  // Never blocks.
  virtual Poll Next(v1::WatchEvent* event) = 0;
  // Ends the stream: Next returns kEnded soon after (and `ready` is called). Any thread;
  // idempotent. May call `ready` before it returns.
  virtual void Cancel() = 0;
  // Why the stream ended (OK if the store ended it cleanly). Never blocks. REQUIRES: Next
  // returned kEnded. Idempotent.
  virtual absl::Status Finish() = 0;
};

class AsyncWatchStream final : public AsyncWatchEventStream {
 public:
  // Does not start the call (Start does). `stub` is kept alive. The options mean what they mean
  // for a WatchStream.
  AsyncWatchStream(std::shared_ptr<v1::Store::StubInterface> stub, v1::WatchRequest request,
                   WatchStream::Options options);
  ~AsyncWatchStream() override;
  AsyncWatchStream(const AsyncWatchStream&) = delete;
  AsyncWatchStream& operator=(const AsyncWatchStream&) = delete;

  void Start(std::function<void()> ready) override;
  std::optional<std::string> StoreId() override;
  Poll Next(v1::WatchEvent* event) override;
  void Cancel() override;
  absl::Status Finish() override;

  // What this stream has read so far. Any thread.
  WatchStreamStats stats() const { return own_counters_.Get(); }

 private:
  class Call;  // the gRPC reactor and what it shares with gRPC's threads

  // Constant after construction.
  const WatchStream::Options options_;
  const std::string what_;  // the prefix of Finish's message
  const std::shared_ptr<Call> call_;

  // Provides its own synchronization.
  WatchStreamCounters own_counters_;

  // Touched only by the reader.
  bool started_ = false;     // Start was called
  bool registered_ = false;  // the call's context is in options_.calls
  bool began_ = false;       // the call was started (not refused by a shut-down CallSet)
  WatchBatch batch_;         // the last message taken; Next hands out its events
  bool finished_ = false;
  absl::Status status_ = absl::OkStatus();
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_ASYNC_WATCH_STREAM_H_
