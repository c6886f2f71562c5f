// FaultInjectionFs: a RocksDB FileSystem for tests that knows which bytes a power loss would keep,
// and fails writes and syncs on demand.
//
// What it takes as durable (the model of RocksDB's own fault-injection file system, and of a
// journaling file system with ordered data):
// - A file written through it is durable up to the size it had when its last Sync or Fsync
//   began; bytes appended after that are lost. RangeSync makes nothing durable.
// - A name created (a new file) or changed (a rename, into its target and away from its source)
//   is durable only once its directory has been fsynced afterwards; until then a power loss
//   undoes it: a new file disappears, a renamed file is back under its old name and the target
//   holds what it held before.
// - A deletion is durable at once (a deleted file never comes back), as in RocksDB's model.
// - Files that it did not write (those that were there before, and the image of an earlier
//   power loss) are durable as they are.
//
// PowerLossImage copies into a new directory what a power loss at that instant would leave of a
// directory, atomically with respect to every write, sync and rename made through this file
// system: a test opens the store there as after the machine restarted, while the store that
// wrote the files goes on or stops normally. A write acknowledged before the image was taken was
// synced before it, so it must be in the image.
//
// Faults, each until it is turned off again: FailWrites (every Append fails with NoSpace and
// writes nothing, as on a full disk), FailSyncs (every file and directory sync fails with an
// I/O error; the bytes stay unsynced), SetFreeSpace (what GetFreeSpace reports).
//
// Files are opened only as RocksDB's default options open them: ReuseWritableFile,
// NewRandomRWFile and LinkFile are refused (NotSupported), so that no write escapes the model.
//
// Thread-safety: thread-safe (RocksDB calls it from its own threads). Use it through an Env made
// with rocksdb::NewCompositeEnv(fs), which shares its ownership.
#ifndef SHARDCACHE_CACHE_SERVER_TESTING_FAULT_INJECTION_FS_H_
#define SHARDCACHE_CACHE_SERVER_TESTING_FAULT_INJECTION_FS_H_

#include <rocksdb/file_system.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace shardcache::testing {

class FaultInjectionFs : public rocksdb::FileSystemWrapper {
 public:
  // Wraps the machine's file system (rocksdb::FileSystem::Default()).
  FaultInjectionFs();

  static const char* kClassName() { return "ShardcacheFaultInjectionFs"; }
  const char* Name() const override { return kClassName(); }

  void FailWrites(bool fail) { fail_writes_ = fail; }
  void FailSyncs(bool fail) { fail_syncs_ = fail; }
  // What GetFreeSpace reports from now on (nullopt: the real figure).
  void SetFreeSpace(std::optional<uint64_t> bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // How many files were created through it: a test checks that its store writes here at all.
  int64_t files_created() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return files_created_;
  }

  // Copies what a power loss now would leave of the regular files of `dir` into `to`, which must
  // not exist (it is created).
  absl::Status PowerLossImage(const std::string& dir, const std::string& to)
      ABSL_LOCKS_EXCLUDED(mu_);

  // FileSystem.
  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override ABSL_LOCKS_EXCLUDED(mu_);
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname,
                                       const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override
      ABSL_LOCKS_EXCLUDED(mu_);
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewRandomRWFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus LinkFile(const std::string& src, const std::string& target,
                             const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& options,
                                 std::unique_ptr<rocksdb::FSDirectory>* result,
                                 rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& target,
                               const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override ABSL_LOCKS_EXCLUDED(mu_);
  rocksdb::IOStatus DeleteFile(const std::string& fname, const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override ABSL_LOCKS_EXCLUDED(mu_);
  rocksdb::IOStatus GetFreeSpace(const std::string& path, const rocksdb::IOOptions& options,
                                 uint64_t* diskfree, rocksdb::IODebugContext* dbg) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class File;
  class Directory;

  // A file written through this file system.
  struct Written {
    uint64_t size = 0;
    uint64_t synced = 0;
  };

  // For the files: bytes reached the file, a sync is about to begin or has succeeded.
  void Appended(const std::string& path, uint64_t end) ABSL_LOCKS_EXCLUDED(mu_);
  void Truncated(const std::string& path, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t SizeBeforeSync(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);
  void Synced(const std::string& path, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // For the directories: an fsync of `dir` succeeded.
  void DirectorySynced(const std::string& dir) ABSL_LOCKS_EXCLUDED(mu_);
  bool fail_writes() const { return fail_writes_; }
  bool fail_syncs() const { return fail_syncs_; }

  // What a power loss now would leave under `path` (nullopt: no file), ignoring its directory's
  // pending changes.
  std::optional<std::string> DurableContentLocked(const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `path`'s durable state as its directory's pending change, unless one is recorded.
  void RememberNameLocked(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<bool> fail_writes_{false};
  std::atomic<bool> fail_syncs_{false};

  mutable absl::Mutex mu_;
  std::optional<uint64_t> free_space_ ABSL_GUARDED_BY(mu_);
  int64_t files_created_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Written> written_ ABSL_GUARDED_BY(mu_);
  // Per directory, the names changed since its last fsync, each with what a power loss would
  // leave under it (nullopt: nothing).
  std::map<std::string, std::map<std::string, std::optional<std::string>>> unsynced_names_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_CACHE_SERVER_TESTING_FAULT_INJECTION_FS_H_
