// ShardStoreWriter: the writes that the CCR controller makes to the shard store (the CCRs'
// finalizers and statuses), behind an interface so that the controller can be tested without a
// server (shard_replicator/testing/fake_shard_store_writer.h).
//
// StoreClientShardStoreWriter is the real one: Update and UpdateStatus over a StoreClient, with
// the StoreClient's errors (ABORTED on a resourceVersion conflict, NOT_FOUND when the object is
// gone, FAILED_PRECONDITION with IsFenced (common/error_info.h) when the request's fence is
// older than the shard's).
//
// Threads: every method may be called from any thread, concurrently (the calls block until the
// store answers).
#ifndef SHARDCACHE_SHARD_REPLICATOR_SHARD_STORE_WRITER_H_
#define SHARDCACHE_SHARD_REPLICATOR_SHARD_STORE_WRITER_H_

#include "absl/status/statusor.h"
#include "common/client/store_client.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class ShardStoreWriter {
 public:
  virtual ~ShardStoreWriter() = default;
  // Replaces the object's metadata and spec (e.g. its finalizers); returns it as now stored.
  virtual absl::StatusOr<v1::Object> Update(const v1::UpdateRequest& request) = 0;
  // Replaces the object's status; returns it as now stored.
  virtual absl::StatusOr<v1::Object> UpdateStatus(const v1::UpdateRequest& request) = 0;
};

class StoreClientShardStoreWriter : public ShardStoreWriter {
 public:
  // `client` is not owned and must outlive this writer.
  explicit StoreClientShardStoreWriter(StoreClient* client) : client_(client) {}

  absl::StatusOr<v1::Object> Update(const v1::UpdateRequest& request) override {
    return client_->Update(request);
  }
  absl::StatusOr<v1::Object> UpdateStatus(const v1::UpdateRequest& request) override {
    return client_->UpdateStatus(request);
  }

 private:
  StoreClient* const client_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_SHARD_REPLICATOR_SHARD_STORE_WRITER_H_
