// WatchStream: the one client of the Store's Watch RPC. Every watch a client opens goes through
// it: a Reflector's (through StoreListerWatcher::Watch) and StoreClient::OpenWatch's alike.
//
//   WatchStream::Options options;
//   options.description = "widgets.example.com/v1";
//   WatchStream w(stub, request, options);
//   v1::WatchEvent event;
//   while (w.Next(&event)) { ... }    // one event at a time, in revision order
//   absl::Status why = w.Finish();     // e.g. OUT_OF_RANGE ("too old"): list again
//
// Guarantees:
// - Batches: the stream asks the server for them (WatchRequest.batch_events, unless
//   Options::batch_events is false): a watcher that fell behind then gets several events in one
//   message. Next unpacks them and returns them one by one, in order, each with the message's
//   store_id, so that a caller sees exactly the events of an unbatched watch.
// - Bounded: the stream holds at most one message (the events of one batch not yet returned by
//   Next). It reads the next message only when they are all taken, so a reader that stops reading
//   holds the server back through HTTP/2 flow control, not a buffer here.
// - Cancellable from any thread at any time, also before the call has started: the call starts
//   at the first Next (or StoreId), so that Cancel also ends its set-up. A stream registered in a
//   CallSet ends (as if cancelled) when the set is shut down.
//
// Thread-safety: Next, StoreId and Finish are for one thread (the reader). Cancel and stats may be
// called from any thread, any number of times, while the stream exists; so may its CallSet's
// Shutdown.
#ifndef SHARDCACHE_COMMON_CLIENT_WATCH_STREAM_H_
#define SHARDCACHE_COMMON_CLIENT_WATCH_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardcache/v1/store.grpc.pb.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

// One open watch, as a Reflector sees it (client-go's watch.Interface). Events arrive in revision
// order; the stream ends on an error, on Cancel(), or when the store ends it. Implemented by
// WatchStream over the network, and by fakes in tests.
class WatchEventStream {
 public:
  virtual ~WatchEventStream() = default;  // cancels the stream if it is still open
  // Blocks for the next event. False when the stream has ended: then call Finish().
  virtual bool Next(v1::WatchEvent* event) = 0;
  // Ends the stream: a blocked Next() returns false soon after. Any thread; idempotent.
  virtual void Cancel() = 0;
  // Why the stream ended (OK if the store ended it cleanly). REQUIRES: Next() returned false.
  // Idempotent: later calls return the same status.
  virtual absl::Status Finish() = 0;
  // The identity of the store that serves the stream, as its response headers say; blocks until
  // they arrive (Cancel() ends the wait). Empty when the store sent none or the stream failed.
  // Call before the first Next(); later calls return the same value. The default knows of none.
  virtual std::string StoreId() { return ""; }
};

// The client contexts of calls in flight, so that their owner (a StoreClient, a
// StoreListerWatcher) can cancel them all at once. Shared by the owner and its calls, either of
// which may go first. Thread-safe.
class CallSet {
 public:
  // Adds a call's context. False (and nothing added) once Shutdown has begun: do not start the
  // call. A context may be added before its call starts (gRPC cancels it when it starts).
  bool Register(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes it. REQUIRES: called before the context is destroyed.
  void Unregister(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels every registered call and makes every later Register fail. Permanent; idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> active_ ABSL_GUARDED_BY(mu_);
};

// What watch streams received. `events` > `messages` means that some messages carried batches.
struct WatchStreamStats {
  int64_t messages = 0;          // messages read from the server
  int64_t events = 0;            // events they held (what Next returns, in all)
  int64_t batched_messages = 0;  // messages that held more than one event
};

// Counts of several streams together (e.g. every watch of one StoreListerWatcher). Thread-safe.
class WatchStreamCounters {
 public:
  void Add(int64_t events);  // one message that held `events` events
  WatchStreamStats Get() const;

 private:
  std::atomic<int64_t> messages_{0};
  std::atomic<int64_t> events_{0};
  std::atomic<int64_t> batched_messages_{0};
};

// The events of one Watch message, handed out one at a time: the events of a batch
// (WatchRequest.batch_events), each with the message's store_id, or a single event as itself. It
// holds one message at most. Used by WatchStream and AsyncWatchStream alike, so that both return
// exactly the events of an unbatched watch. Not thread-safe: its reader's.
class WatchBatch {
 public:
  // How many events `message` holds (1 for a single event).
  static int64_t EventsIn(const v1::WatchEvent& message) {
    return message.events_size() == 0 ? 1 : message.events_size();
  }
  // Holds `message`, read from the server. REQUIRES: Take returned false (all taken).
  void Load(v1::WatchEvent message);
  // Moves the next event into *event. False when none is left.
  bool Take(v1::WatchEvent* event);
  void Clear();

 private:
  v1::WatchEvent message_;
  bool single_ = false;  // message_ is one event, not yet taken
  int next_ = 0;         // the index in message_.events() of the next event of a batch
};

class WatchStream : public WatchEventStream {
 public:
  struct Options {
    // When the whole stream ends with DEADLINE_EXCEEDED. Default: never (use Cancel).
    absl::Time deadline = absl::InfiniteFuture();
    // What is watched, for messages: "widgets.example.com/v1 cluster=c1". Finish's message then
    // reads "watch <description> from resourceVersion <rv>: <the server's message>".
    std::string description;
    // Whether to ask for batches (see above). Turn off only to see the server's unbatched path.
    bool batch_events = true;
    // The calls of the stream's owner (may be null): the stream registers in it, so that its
    // Shutdown ends the stream; once it is shut down the stream fails at once with CANCELLED.
    std::shared_ptr<CallSet> calls;
    // Where to count what this stream reads, besides its own stats() (may be null).
    std::shared_ptr<WatchStreamCounters> counters;
  };

  // Does not start the call (the first Next or StoreId does). `stub` is kept alive.
  WatchStream(std::shared_ptr<v1::Store::StubInterface> stub, v1::WatchRequest request,
              Options options);
  // Cancels the call if it is still open and waits for gRPC to release it.
  ~WatchStream() override;
  WatchStream(const WatchStream&) = delete;
  WatchStream& operator=(const WatchStream&) = delete;

  // Blocks for the next event. False when the stream has ended (by the server, an error, Cancel,
  // or the owner's CallSet shutting down); then call Finish for the reason.
  bool Next(v1::WatchEvent* event) override;
  // Ends the call from any thread: a blocked Next returns false soon after, and Finish returns
  // CANCELLED (unless the stream had already ended for another reason).
  void Cancel() override;
  // The stream's final status. If Next has not yet returned false, cancels the call first, so
  // that Finish never waits for the server. Idempotent: later calls return the same status.
  absl::Status Finish() override;
  std::string StoreId() override;

  // What this stream has read so far. Any thread.
  WatchStreamStats stats() const { return own_counters_.Get(); }

  // "watch <description> from resourceVersion <rv>": what Finish's message starts with.
  static std::string What(const v1::WatchRequest& request, const std::string& description);
  // The request as a WatchStream sends it: asking for batches when `batch_events`.
  static v1::WatchRequest WithBatches(v1::WatchRequest request, bool batch_events);

 private:
  // Starts the call on first use. False when the stream has ended or cannot start.
  bool Open();

  // Constant after construction.
  const std::shared_ptr<v1::Store::StubInterface> stub_;  // keeps the channel alive
  const v1::WatchRequest request_;
  const Options options_;

  // Provides its own synchronization.
  grpc::ClientContext context_;  // TryCancel is thread-safe; the rest is the reader's
  WatchStreamCounters own_counters_;

  // Touched only by the reader thread.
  std::unique_ptr<grpc::ClientReaderInterface<v1::WatchEvent>> reader_;
  bool registered_ = false;
  bool headers_read_ = false;
  std::string store_id_;
  WatchBatch batch_;       // the last message read; Next takes its events one by one
  bool ended_ = false;     // Next returned false
  bool finished_ = false;  // the final status is known
  absl::Status status_ = absl::OkStatus();
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_WATCH_STREAM_H_
