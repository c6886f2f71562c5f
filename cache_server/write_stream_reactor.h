// WriteStreamReactor: the server side of one Write stream (gRPC callback API, raw ByteBuffer
// messages).
//
// Reads a write, parses it, hands it to its owner (Owner::Apply: the StoreService, which
// authorizes it and gives it to the store) and sends the answers in
// the order of the writes as they complete: one answer per write read, in order, and a failed
// write does not end the stream. A write that does not parse is answered INVALID_ARGUMENT (with
// the reason and the id it carries) in its turn, and the stream goes on; only when not even its
// id can be read does the stream stop reading, answer the writes before it, and end with
// INVALID_ARGUMENT.
//
// At most one read and one write in flight; reading pauses while kMaxOutstandingWrites writes
// are outstanding, and the next write is not read before the current one has been handed to the
// store, so writes are applied in the order they were sent. Finish is called only when no store
// callback is outstanding, so the reactor outlives every callback that refers to it.
//
// Drain (server shutdown): stop applying writes, answer the writes taken (a write read after
// this is answered UNAVAILABLE), then end with UNAVAILABLE.
//
// Thread-safety: the reactions come from gRPC's threads, store answers from the store's
// committer, Drain from the service; all state is guarded by mu_, and no gRPC operation
// (StartRead, StartWrite, Finish) is started while holding it.
#ifndef SHARDCACHE_CACHE_SERVER_WRITE_STREAM_REACTOR_H_
#define SHARDCACHE_CACHE_SERVER_WRITE_STREAM_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "cache_server/store_metrics.h"
#include "common/tls.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class WriteStreamReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // What a Write stream asks of the service that serves it (the StoreService). Thread-safe.
  class Owner {
   public:
    virtual ~Owner() = default;
    // Registers an open stream, which the owner drains (Drain) when it shuts down; false once
    // it is draining: the stream then ends at once with UNAVAILABLE.
    virtual bool AddStream(WriteStreamReactor* stream) = 0;
    // The stream is over; after it returns, the owner no longer calls it.
    virtual void RemoveStream(WriteStreamReactor* stream) = 0;
    // Applies one write of the stream, made by `who`; `done` receives its answer exactly once,
    // once it is durable (or failed), possibly before Apply returns.
    virtual void Apply(v1::WriteRequest* request, const std::optional<PeerIdentity>& who,
                       std::function<void(v1::WriteResponse)> done) = 0;
  };

  // Writes of one stream that may be outstanding (read but not yet answered on the wire) before
  // the stream stops reading.
  static constexpr size_t kMaxOutstandingWrites = 256;

  // Registers with `owner` (not owned; outlives the reactor) and starts reading; ends at once
  // with UNAVAILABLE if the owner is draining. `who` is the caller, whose writes the owner
  // authorizes one by one.
  WriteStreamReactor(Owner* owner, StoreMetrics* metrics,
                     std::optional<PeerIdentity> who = std::nullopt);

  // The server is shutting down: answer what was taken, then end with UNAVAILABLE.
  void Drain();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Slot {
    bool ready = false;
    grpc::ByteBuffer answer;
  };
  // What to start once mu_ is released.
  struct Next {
    bool write = false;
    bool read = false;
    std::optional<grpc::Status> finish;
  };

  // Decides the next operations; the caller starts them with Act after releasing mu_.
  Next NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Act(Next next) ABSL_LOCKS_EXCLUDED(mu_);
  // Stores the answer of `slot` and sends what is due; `from_store`: the answer of a write that
  // was handed to the store (one fewer outstanding callback).
  void Answer(Slot* slot, const v1::WriteResponse& answer, bool from_store)
      ABSL_LOCKS_EXCLUDED(mu_);

  Owner* const owner_;
  StoreMetrics* const metrics_;
  const std::optional<PeerIdentity> who_;
  // The message being read; only touched between StartRead and the end of OnReadDone.
  grpc::ByteBuffer in_;
  // The answer being written; set under mu_ while writing_ is false, then read by gRPC.
  grpc::ByteBuffer out_;

  absl::Mutex mu_;
  std::deque<Slot> slots_ ABSL_GUARDED_BY(mu_);  // one per write read, in order
  int in_store_ ABSL_GUARDED_BY(mu_) = 0;        // writes whose store callback is outstanding
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  // A read was decided and is being started outside mu_: Finish waits for it.
  bool read_starting_ ABSL_GUARDED_BY(mu_) = false;
  // A write is being handed to the store: the next one is not read before.
  bool applying_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Set when the stream must end with an error once the writes taken are answered.
  std::optional<grpc::Status> end_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_WRITE_STREAM_REACTOR_H_
