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
// Each CommitBatch is one RocksDB WriteBatch. Commit writes it with sync=true unless `sync` is
// false. Write writes it unsynced (to the write-ahead log's file and the memtable) and Sync syncs
// the write-ahead log (DB::SyncWAL, which RocksDB allows while a Write runs; nothing unless
// `sync`): the ObjectStore's committer writes the next batch while one is being synced. Concurrent
// writers are not needed for group commit (RocksDB's enable_pipelined_write and two_write_queues
// serve many writer threads): the committer already batches every write that arrived during a sync.
//
// Space: a write is refused (CheckSpace: RESOURCE_EXHAUSTED, reason NO_SPACE) while the disk
// of the data directory has less than Options::min_free_bytes free, as etcd refuses writes beyond
// its space quota; reads, watches and deletes go on, and writes are accepted again once space is
// freed (checked at most once a second). The reserve is what keeps a commit from meeting a full
// disk: a commit that fails all the same (a full disk, a failed fsync) is not retried, and the
// store stops (GroupCommitter).
//
// Open refuses a directory that is damaged or not a shardcache store, with a message that names
// the problem: RocksDB's own errors (missing or truncated files, bad checksums, a MANIFEST that
// does not match) and this layout's invariants (the format marker, the meta keys, contiguous
// events, every object parseable and not newer than the revision).
//
// Thread-safety: see Storage.
#ifndef SHARDCACHE_CACHE_SERVER_ROCKSDB_STORAGE_H_
#define SHARDCACHE_CACHE_SERVER_ROCKSDB_STORAGE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/storage.h"
#include "common/clock.h"

namespace rocksdb {
class DB;
class Env;
}  // namespace rocksdb

namespace shardcache {

class RocksDbStorage : public Storage {
 public:
  struct Options {
    std::string data_dir;
    // Sync every commit to disk before it is acknowledged. false: a pure cache that may lose the
    // last writes (not the database) when the machine, not just the process, fails.
    bool sync = true;
    // Writes are refused while the disk has less free space than this (0: never).
    int64_t min_free_bytes = 64 << 20;
    // The size of one RocksDB write buffer (memtable); smaller ones flush more often.
    int64_t write_buffer_bytes = 8 << 20;
    // The files' environment (null: the machine's); tests inject faults through it. Not owned.
    rocksdb::Env* env = nullptr;
    // The clock that spaces the free-space checks (at most one a second). Not owned.
    Clock* clock = RealClock::Get();
  };

  // Opens (creating it if the directory is absent or empty) the store in options.data_dir.
  static absl::StatusOr<std::unique_ptr<RocksDbStorage>> Open(Options options);
  ~RocksDbStorage() override;

  absl::StatusOr<PersistedState> Load() override;
  absl::Status Commit(const CommitBatch& batch) override;
  absl::Status Write(const CommitBatch& batch) override;
  absl::Status Sync() override;
  absl::Status CheckSpace() override ABSL_LOCKS_EXCLUDED(space_mu_);

 private:
  RocksDbStorage(Options options, std::unique_ptr<rocksdb::DB> db);
  absl::Status Damaged(const std::string& what) const;
  // Writes `batch` as one WriteBatch, synced if `sync`.
  absl::Status WriteBatchOf(const CommitBatch& batch, bool sync);

  const Options options_;
  std::unique_ptr<rocksdb::DB> db_;
  // The compacted revision as last written (events up to it are already deleted). Only Load and
  // the writing thread touch it.
  int64_t compacted_revision_ = 1;

  absl::Mutex space_mu_;
  absl::Time space_checked_ ABSL_GUARDED_BY(space_mu_) = absl::InfinitePast();
  absl::Status space_ ABSL_GUARDED_BY(space_mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_ROCKSDB_STORAGE_H_
