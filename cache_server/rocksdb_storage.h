// RocksDbStorage: Storage in a RocksDB database in a data directory.
//
// Layout (one key space, prefixed):
//   m/format                  "shardcache-store/1": marks the directory as a shardcache store
//   m/revision, m/compacted   the store's revision and compacted revision (decimal)
//   m/store-id                the store's identity (a UUID), written when the directory is
//                             created; a directory from before identities gets one at its first
//                             Load, kept from then on
//   o/<group/resource>\0<key> a live object (shardcache.v1.Object)
//   e/<revision, 8 bytes BE>  an event of the history window (shardcache.storage.v1.StoredEvent)
//   f/<shard>                 the highest fencing epoch seen for the shard (decimal)
// Each CommitBatch is one RocksDB WriteBatch, written with sync=true unless `sync` is false;
// concurrent callers are not needed for group commit: the ObjectStore's committer already batches
// every write that arrived while the previous batch was being synced.
//
// Open refuses a directory that is damaged or not a shardcache store, with a message that names
// the problem: RocksDB's own errors (missing or truncated files, bad checksums, a MANIFEST that
// does not match) and this layout's invariants (the format marker, the meta keys, contiguous
// events, every object parseable and not newer than the revision).
//
// Thread-safety: see Storage.
#ifndef SHARDCACHE_CACHE_SERVER_ROCKSDB_STORAGE_H_
#define SHARDCACHE_CACHE_SERVER_ROCKSDB_STORAGE_H_

#include <memory>
#include <string>

#include "cache_server/storage.h"

namespace rocksdb {
class DB;
}

namespace shardcache {

class RocksDbStorage : public Storage {
 public:
  struct Options {
    std::string data_dir;
    // Sync every commit to disk before it is acknowledged. false: a pure cache that may lose the
    // last writes (not the database) when the machine, not just the process, fails.
    bool sync = true;
  };

  // Opens (creating it if the directory is absent or empty) the store in options.data_dir.
  static absl::StatusOr<std::unique_ptr<RocksDbStorage>> Open(Options options);
  ~RocksDbStorage() override;

  absl::StatusOr<PersistedState> Load() override;
  absl::Status Commit(const CommitBatch& batch) override;

 private:
  RocksDbStorage(Options options, std::unique_ptr<rocksdb::DB> db);
  absl::Status Damaged(const std::string& what) const;

  const Options options_;
  std::unique_ptr<rocksdb::DB> db_;
  // The compacted revision as last written (events up to it are already deleted).
  int64_t compacted_revision_ = 1;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_ROCKSDB_STORAGE_H_
