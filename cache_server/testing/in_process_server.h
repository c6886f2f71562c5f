// InProcessServer: the Store service wired as cache_server wires it (ObjectStore, WatchCache,
// StoreService on a real grpc::Server), inside the test's own process, on a loopback port it
// picks itself (127.0.0.1:0), with a Store stub on a real channel to it. For unit tests of the
// service's reactors: they drive the real gRPC stack and can reach into the store, the watch
// cache and the metrics, and hold the store's commits back (GatedStorage) to see what happens
// while writes are in flight.
//
// Thread-compatible: construct and destroy it from the test's thread; stub(), and the objects
// it exposes, are thread-safe.
#ifndef SHARDCACHE_CACHE_SERVER_TESTING_IN_PROCESS_SERVER_H_
#define SHARDCACHE_CACHE_SERVER_TESTING_IN_PROCESS_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/object_store.h"
#include "cache_server/storage.h"
#include "cache_server/store_metrics.h"
#include "cache_server/store_service.h"
#include "cache_server/watch_cache.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::testing {

// A Storage that keeps nothing and whose Commit can be held shut: the store's writes are then
// applied in memory but not acknowledged until it opens. Records every batch.
class GatedStorage : public Storage {
 public:
  absl::StatusOr<PersistedState> Load() override { return PersistedState(); }
  // Waits while closed.
  absl::Status Commit(const CommitBatch& batch) override;

  void Close();
  void Open();
  // The batches Commit was called with (the last may still be waiting).
  std::vector<CommitBatch> batches() const;
  // How many Commit calls have begun.
  size_t commits() const;
  // How many Commit calls have returned.
  size_t committed() const;
  // Waits (up to `timeout`) until a Commit has been given an epoch for `shard`; returns whether
  // one was.
  bool WaitForEpochCommit(const std::string& shard, absl::Duration timeout = absl::Seconds(10));

 private:
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<CommitBatch> batches_ ABSL_GUARDED_BY(mu_);
  size_t committed_ ABSL_GUARDED_BY(mu_) = 0;
};

class InProcessServer {
 public:
  struct Options {
    WatchCache::Options watch;
    // Its `storage` is replaced by the server's GatedStorage.
    ObjectStore::Options store;
    StoreService::Options service;
  };

  explicit InProcessServer(Options options);
  // Shuts down as cache_server does on SIGTERM (Shutdown), opening the storage first.
  ~InProcessServer();
  InProcessServer(const InProcessServer&) = delete;
  InProcessServer& operator=(const InProcessServer&) = delete;

  // Drains as cache_server does on SIGTERM: the service stops taking calls and drains the Write
  // streams, watches are ended (UNAVAILABLE), the service waits until idle (up to `timeout`),
  // then the gRPC server stops. Returns whether every watch ended and the service became idle
  // in time. Idempotent.
  bool Shutdown(absl::Duration timeout = absl::Seconds(10));

  v1::Store::Stub* stub() { return stub_.get(); }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // "127.0.0.1:<port>", for a client that needs a channel of its own.
  const std::string& target() const { return target_; }
  GatedStorage& storage() { return storage_; }
  StoreMetrics& metrics() { return metrics_; }
  WatchCache& watch_cache() { return watch_cache_; }
  ObjectStore& store() { return store_; }
  StoreService& service() { return service_; }

 private:
  GatedStorage storage_;
  StoreMetrics metrics_;
  WatchCache watch_cache_;
  ObjectStore store_;
  StoreService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Store::Stub> stub_;
  bool shut_down_ = false;
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_CACHE_SERVER_TESTING_IN_PROCESS_SERVER_H_
