// Storage: where the ObjectStore makes its state durable. One interface, so that another backend
// can be added; RocksDbStorage (rocksdb_storage.h) is the one the server uses.
//
// The ObjectStore serves every read and watch from memory; Storage is written on the commit path
// and read once, at start-up.
//
// Thread-safety: Load is called once, before any Commit or Write. Commit and Write are called
// from one thread at a time (the store's committer), in revision order. Sync is called from one
// thread at a time, which may be another than Write's, while a Write runs (the committer writes
// the next batch while the last one is being synced). CheckSpace may be called from any thread.
#ifndef SHARDCACHE_CACHE_SERVER_STORAGE_H_
#define SHARDCACHE_CACHE_SERVER_STORAGE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cache_server/event.h"

namespace shardcache {

// What Load returns: the state as of the last successful Commit.
struct PersistedState {
  // The store's revision (1 for a new store).
  int64_t revision = 1;
  // Events at or below this revision have left the history window.
  int64_t compacted_revision = 1;
  // Every live object, with its "group/resource".
  std::vector<std::pair<std::string, ObjectRef>> objects;
  // The events of the history window, in revision order.
  std::vector<EventPtr> history;
  // The highest fencing epoch seen per shard.
  std::map<std::string, int64_t> epochs;
  // The store's identity, made when its data was created and kept ever after; empty when there
  // is no storage (the ObjectStore then makes one for the life of the process).
  std::string store_id;
};

// One atomic unit of durable change.
struct CommitBatch {
  // New events, in revision order (may be empty, e.g. when only an epoch changed).
  std::vector<EventPtr> events;
  // The store's revision after the batch.
  int64_t revision = 1;
  // Events at or below this revision are dropped from the history window.
  int64_t compacted_revision = 1;
  // Epochs that changed.
  std::map<std::string, int64_t> epochs;
};

class Storage {
 public:
  virtual ~Storage() = default;
  // Reads the whole state. Fails (never returns a partial state) when the data is damaged; the
  // message names the problem.
  virtual absl::StatusOr<PersistedState> Load() = 0;
  // Applies `batch` atomically; when it returns OK the batch is durable (subject to the
  // backend's sync setting).
  virtual absl::Status Commit(const CommitBatch& batch) = 0;
  // Commit in two halves, so that one batch can be written while the one before it is synced.
  // Write applies `batch` atomically, but need not make it durable; Sync makes every batch whose
  // Write returned before it was called durable (subject to the sync setting). A batch written
  // after a failed Sync, or whose own Write failed, may or may not survive a crash. Defaults: Write
  // is Commit, and Sync has nothing to do.
  virtual absl::Status Write(const CommitBatch& batch) { return Commit(batch); }
  virtual absl::Status Sync() { return absl::OkStatus(); }
  // Whether there is room for new writes: OK, or RESOURCE_EXHAUSTED with reason NO_SPACE
  // (common/error_info.h) when the disk is nearly full. Cheap (the answer may be about a second
  // old). Thread-safe, unlike Load and Commit.
  virtual absl::Status CheckSpace() { return absl::OkStatus(); }
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_STORAGE_H_
