// StoreService: the shardcache.v1.Store gRPC service over an ObjectStore (callback API; async for
// Watch).
//
// Every method is registered raw (ByteBuffer in and out) and parses its request itself
// (request_parser.h), so that a request gRPC could not parse gets INVALID_ARGUMENT saying why,
// on every method, and an unparsable write of a Write stream gets its own answer; reflection
// still describes the real message types. Watch events are also serialized once for all
// watchers (watch_cache.h).
//
// Unary reads run inline; unary writes finish once the store reports them durable (from the
// store's committer thread), so no gRPC thread waits for a disk sync. Write returns a
// WriteStreamReactor. Watch is served with gRPC's async API on the WatchCache's dispatchers
// (watch_call.h): a thread of the service's own takes the Watch calls from a completion queue
// of the server's and hands each to the dispatcher with the fewest watchers, on whose completion
// queue the call's operations then complete. Errors are converted from absl::Status to
// grpc::Status at this boundary: here, and in WatchCall for the status that ends a watch.
//
// Shutdown: Shutdown() makes new calls fail with UNAVAILABLE and drains the Write streams;
// AwaitIdle() then waits until no call of the service is in flight, so that the gRPC server can
// be shut down at once without cutting off an answer.
//
// Serving: AddTo(builder) before the server is built, AcceptWatches() once it has started, and
// StopWatches() after grpc::Server::Shutdown.
//
// Thread-safety: gRPC calls the methods from its own threads, concurrently; Watch calls are
// started on the service's acceptor thread and then live on the WatchCache's dispatchers.
// Shutdown and AwaitIdle may be called from any thread; AddTo, AcceptWatches and StopWatches from
// the thread that builds and stops the server.
#ifndef SHARDCACHE_CACHE_SERVER_STORE_SERVICE_H_
#define SHARDCACHE_CACHE_SERVER_STORE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/authorizer.h"
#include "cache_server/object_store.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watch_cache.h"
#include "cache_server/write_stream_reactor.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {

class WatchCall;

// The Store service with every method raw; Watch with the async API, the others callbacks.
using RawStoreService = v1::Store::WithRawCallbackMethod_Get<v1::Store::WithRawCallbackMethod_List<
    v1::Store::WithRawMethod_Watch<v1::Store::WithRawCallbackMethod_Create<
        v1::Store::WithRawCallbackMethod_Update<v1::Store::WithRawCallbackMethod_UpdateStatus<
            v1::Store::WithRawCallbackMethod_Delete<v1::Store::WithRawCallbackMethod_Write<
                v1::Store::WithRawCallbackMethod_ClaimEpoch<v1::Store::Service>>>>>>>>>;

class StoreService final : public RawStoreService, private WriteStreamReactor::Owner {
 public:
  struct Options {
    // Live events that may wait for a slow watcher before it is ended (RESOURCE_EXHAUSTED).
    size_t watch_queue_events = 1000;
    // Decides who may call what (authorizer.h); null: everyone may call everything. Not owned.
    const Authorizer* authorizer = nullptr;
    // Get and List run on this many threads of the service's own (0: on gRPC's, as they come).
    // A store on etcd makes its reads wait for the replica's watch (ObjectStore's consistent
    // reads), whose events come on gRPC's callback threads: a read must not hold one of those.
    int read_threads = 0;
  };

  // Not owned; must outlive the service.
  StoreService(Options options, ObjectStore* store, WatchCache* watch_cache, StoreMetrics* metrics);

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Create(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                   grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Update(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                   grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* UpdateStatus(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                   grpc::ByteBuffer* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Write(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ClaimEpoch(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;

  // Registers the service with `builder`, with a completion queue of the server's for the Watch
  // calls. Call once, before BuildAndStart.
  void AddTo(grpc::ServerBuilder* builder);
  // Once the server has started: starts the thread that takes Watch calls.
  void AcceptWatches();
  // After grpc::Server::Shutdown: stops that thread and shuts down the WatchCache's completion
  // queues. Idempotent; the destructor calls it.
  void StopWatches();
  ~StoreService() override;

  // Starts draining: new calls fail with UNAVAILABLE "server shutting down"; each Write stream
  // stops applying writes, answers the writes it has taken (a write read after this is
  // answered UNAVAILABLE), then ends with UNAVAILABLE. Call before grpc::Server::Shutdown.
  void Shutdown();
  // After Shutdown: waits up to `timeout` until no call of this service (unary or Write stream)
  // is in flight. Returns whether none is. (Watches are drained by WatchCache::Shutdown.)
  bool AwaitIdle(absl::Duration timeout);

 private:
  // WriteStreamReactor::Owner: registration of open streams (AddStream fails once draining),
  // and one write of a stream: `who` is the stream's caller; a write it may not make is
  // answered PERMISSION_DENIED (or UNAUTHENTICATED) and not applied.
  bool AddStream(WriteStreamReactor* stream) override;
  void RemoveStream(WriteStreamReactor* stream) override;
  void Apply(v1::WriteRequest* req, const std::optional<PeerIdentity>& who,
             std::function<void(v1::WriteResponse)> done) override;

  class UnaryCall;

  // Starts a unary call of `method` that answers into `response`. When the service is draining,
  // `raw` does not parse into `req` or the caller may not make it, answers it at once and sets
  // `*admitted` to false; otherwise the caller answers it with UnaryCall::Reply. The caller
  // returns it to gRPC.
  UnaryCall* Begin(const grpc::CallbackServerContext& ctx, const char* method,
                   const grpc::ByteBuffer& raw, google::protobuf::Message* req,
                   grpc::ByteBuffer* response, bool* admitted);
  void EndCall();
  // Asks the server for the next Watch call, to be served by the dispatcher with the fewest
  // watchers.
  void AcceptWatch();
  // Starts an accepted Watch call: parses and authorizes its request, sends the headers and
  // registers the watch (or rejects it).
  void StartWatch(WatchCall* reactor);
  // Serves a unary call of `method`: parses `raw` into a Request and, when the call is admitted
  // (Begin), hands it to `handle(request, call)`, which answers it with UnaryCall::Reply.
  template <typename Request, typename Handler>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx, const char* method,
                                  const grpc::ByteBuffer* raw, grpc::ByteBuffer* resp,
                                  Handler handle);
  // Serves a unary write whose answer is the object stored: `write` is the ObjectStore's.
  template <typename Request>
  grpc::ServerUnaryReactor* ServeWrite(grpc::CallbackServerContext* ctx, const char* method,
                                       const grpc::ByteBuffer* raw, grpc::ByteBuffer* resp,
                                       void (ObjectStore::*write)(const Request&,
                                                                  ObjectStore::ObjectCallback));

  // Runs `read` on a read thread, or at once when there is none.
  void RunRead(std::function<void()> read) ABSL_LOCKS_EXCLUDED(reads_mu_);
  void ReadLoop() ABSL_LOCKS_EXCLUDED(reads_mu_);

  const Options options_;
  ObjectStore* const store_;
  WatchCache* const watch_cache_;
  StoreMetrics* const metrics_;

  // Where the server announces Watch calls, and the thread that takes them.
  std::unique_ptr<grpc::ServerCompletionQueue> watch_calls_;
  std::thread watch_acceptor_;

  absl::Mutex mu_;
  std::set<WriteStreamReactor*> streams_ ABSL_GUARDED_BY(mu_);
  // Unary calls started and not yet done.
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;

  // Reads waiting for a read thread (Options::read_threads).
  absl::Mutex reads_mu_;
  std::deque<std::function<void()>> reads_ ABSL_GUARDED_BY(reads_mu_);
  bool reads_stopping_ ABSL_GUARDED_BY(reads_mu_) = false;
  std::vector<std::thread> readers_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_STORE_SERVICE_H_
