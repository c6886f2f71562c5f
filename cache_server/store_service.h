// StoreService: the shardcache.v1.Store gRPC service (callback API) over an ObjectStore.
//
// Unary reads run inline; unary writes finish through the default reactor once the store reports
// them durable (from the store's committer thread), so no gRPC thread waits for a disk sync.
// Watch returns a WatchReactor; Write returns a WriteStreamReactor that applies each write in
// order and sends the answers in that order as they become durable, pausing reads while too many
// writes are outstanding. Errors are converted from absl::Status to grpc::Status here, and only
// here.
//
// Thread-safety: gRPC calls the methods from its own threads, concurrently.
#ifndef SHARDCACHE_CACHE_SERVER_STORE_SERVICE_H_
#define SHARDCACHE_CACHE_SERVER_STORE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <set>

#include "absl/synchronization/mutex.h"
#include "cache_server/object_store.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watch_cache.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {

class WriteStreamReactor;

// Watch is a raw method (ByteBuffer in and out) so that events are serialized once for all
// watchers; every other method is typed.
class StoreService final
    : public v1::Store::WithRawCallbackMethod_Watch<v1::Store::CallbackService> {
 public:
  struct Options {
    // Live events that may wait for a slow watcher before it is ended (RESOURCE_EXHAUSTED).
    size_t watch_queue_events = 1000;
  };

  // Not owned; must outlive the service.
  StoreService(Options options, ObjectStore* store, WatchCache* watch_cache, StoreMetrics* metrics);

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const v1::GetRequest* req,
                                v1::Object* resp) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const v1::ListRequest* req,
                                 v1::ListResponse* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Watch(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* req) override;
  grpc::ServerUnaryReactor* Create(grpc::CallbackServerContext* ctx, const v1::CreateRequest* req,
                                   v1::Object* resp) override;
  grpc::ServerUnaryReactor* Update(grpc::CallbackServerContext* ctx, const v1::UpdateRequest* req,
                                   v1::Object* resp) override;
  grpc::ServerUnaryReactor* UpdateStatus(grpc::CallbackServerContext* ctx,
                                         const v1::UpdateRequest* req, v1::Object* resp) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const v1::DeleteRequest* req,
                                   v1::DeleteResponse* resp) override;
  grpc::ServerBidiReactor<v1::WriteRequest, v1::WriteResponse>* Write(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ClaimEpoch(grpc::CallbackServerContext* ctx,
                                       const v1::ClaimEpochRequest* req,
                                       v1::ClaimEpochResponse* resp) override;

  // Applies one write of a Write stream; `done` receives its answer once it is durable (or
  // failed), possibly before Apply returns.
  void Apply(const v1::WriteRequest& req, std::function<void(v1::WriteResponse)> done);

  // Drains every Write stream: each stops applying writes, answers the writes it has taken (a
  // write read after this is answered UNAVAILABLE), then ends with UNAVAILABLE "server shutting
  // down". New streams end at once. Call before grpc::Server::Shutdown.
  void Shutdown();

  // For WriteStreamReactor: registration of open streams.
  bool AddStream(WriteStreamReactor* stream);
  void RemoveStream(WriteStreamReactor* stream);

 private:
  const Options options_;
  ObjectStore* const store_;
  WatchCache* const watch_cache_;
  StoreMetrics* const metrics_;

  absl::Mutex streams_mu_;
  std::set<WriteStreamReactor*> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool shutting_down_ ABSL_GUARDED_BY(streams_mu_) = false;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_STORE_SERVICE_H_
