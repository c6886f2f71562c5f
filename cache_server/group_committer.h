// GroupCommitter: the ObjectStore's committer. It makes the store's writes durable in batches
// (group commit) and completes each write only once it is durable.
//
// The store applies a write in memory under its own lock, and hands the committer what must be
// made durable: the write's event (AddEvent), a marker that ends the watches of a resource
// (AddResourceGone), or a raised fencing epoch (AddEpoch). The committer thread takes everything
// that arrived since it last took a batch and writes it as one Storage batch (Storage::Write:
// serialized and written, not synced); the sync thread syncs (Storage::Sync) every batch written
// before each sync began, one sync after the other. Once a batch's sync has returned, the
// committer thread, in this order, tells the owner that the batch's revision is durable
// (Owner::OnDurable: readers may see it; the owner compacts its history window there), publishes
// the batch's events and markers to the WatchCache, and runs the completions that waited for the
// batch (CompleteWhenDurable). It is a pipeline of two stages: while one sync runs, the committer
// thread finishes the batches of the sync before (publishes them, answers them) and takes and
// writes the next ones, so that the next sync can start as soon as this one returns and covers
// everything that arrived meanwhile. The sync thread never waits for answers, and the committer
// thread never waits for the disk. A batch written but not yet synced may or may not survive a
// crash; it has not been answered, published or made visible.
//
// What it guarantees:
// - A completion runs once, after every revision up to its own is durable and every epoch added
//   before it was registered is durable too (a write acknowledged under a new epoch must not be
//   followed, after a crash, by a write with an older one); at once, in the caller, when they
//   already are. Batches are finished one by one, in the order they were written, each only
//   once a sync that began after its write has returned: no completion of a batch runs before
//   those of the batches written before it, nor before its own batch is durable.
// - Events and markers are published once each, in the order they were added, after they are
//   durable and after Owner::OnDurable; only the committer thread publishes.
// - Each batch is one Storage::Write, and the changes that the owner adds under its
//   OperationLock go in the same batch; a batch is written only after the one before it. One
//   Storage::Sync makes durable every batch written before it (one fsync for many writes).
//   A batch holds the epochs raised since the last one, and the revision and compacted revision
//   of the last event added. A batch of epochs alone is written when only an epoch was raised.
// - A failed Storage::Write or Storage::Sync stops the process: memory is ahead of the disk and
//   cannot be taken back; the store recovers from the disk on restart. Without a Storage, a batch
//   is durable as soon as it is taken (a store in memory), in the same order, and there is no
//   sync thread.
// - When there has been nothing to commit for about a second, Owner::OnIdle is called (the
//   history window's age limit is applied then).
// - Stop writes, syncs and completes everything added before it, then ends both threads, and
//   runs every completion still waiting (a store on etcd stops while revisions that etcd has
//   already made durable are still on their way to it).
//
// Thread-safety: every method is thread-safe. The owner calls the Add methods and
// SetCompactedRevision in revision order, under its own lock; the committer's lock is only ever
// taken after the owner's, never the other way round: the Owner methods are called with no lock
// of the committer held, and neither thread holds the committer's lock while it writes or syncs.
// Completions run on the committer thread or inline in CompleteWhenDurable's caller, and must not
// block.
#ifndef SHARDCACHE_CACHE_SERVER_GROUP_COMMITTER_H_
#define SHARDCACHE_CACHE_SERVER_GROUP_COMMITTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/storage.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watch_cache.h"

namespace shardcache {

class GroupCommitter {
 public:
  // What the committer asks of the store that owns it, from the committer thread.
  class Owner {
   public:
    virtual ~Owner() = default;
    // Every revision up to `revision` is durable: make it visible to readers. Called before the
    // batch's events are published and its completions run.
    virtual void OnDurable(int64_t revision) = 0;
    // Nothing was committed for about a second.
    virtual void OnIdle() = 0;
    // The lock under which the owner adds the changes of one of its operations (a
    // ResourceDefinition's deletion and the deletions of its objects): the committer takes each
    // batch under it too, so that a batch never holds part of an operation, and a crash never
    // leaves half of one on disk.
    virtual absl::Mutex* OperationLock() = 0;
  };

  // `storage` (null: nothing is written), `watch_cache`, `metrics` and `owner` are not owned and
  // must outlive the committer. `revision` is the store's durable revision at start.
  GroupCommitter(Storage* storage, WatchCache* watch_cache, StoreMetrics* metrics, Owner* owner,
                 int64_t revision, int64_t compacted_revision);
  // Stops (see Stop).
  ~GroupCommitter();
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Starts the committer thread, and the sync thread if there is a Storage. REQUIRES: called
  // once.
  void Start();
  // Commits and completes everything added so far, then ends the threads. Safe to call twice;
  // nothing may be added after it.
  void Stop();

  // Queues the event of a change; `event->revision` must be the revision after the last one
  // added.
  void AddEvent(EventPtr event);
  // Queues the end of the watches of `group_resource` (only those of `version`, when it is not
  // empty) that started before `revision`, with `status` (WatchCache::PublishResourceGone),
  // published after the events added before it.
  void AddResourceGone(std::string group_resource, std::string version, int64_t revision,
                       absl::Status status);
  // Queues a raised fencing epoch: `epoch` is now the highest seen for `shard`.
  void AddEpoch(const std::string& shard, int64_t epoch);
  // Events at or below `revision` have left the history window (written with the next batch).
  void SetCompactedRevision(int64_t revision);

  // Runs `complete` once revision `revision` is durable, and every epoch added so far too: at
  // once, in this thread, if they already are; else from the committer thread.
  void CompleteWhenDurable(int64_t revision, std::function<void()> complete);

  // The last revision made durable.
  int64_t durable_revision() const;

 private:
  // An event, or a marker that ends the watches of a resource.
  struct Item {
    EventPtr event;
    std::string gone_resource;
    std::string gone_version;
    int64_t gone_revision = 0;
    absl::Status gone_status;
  };
  struct Waiter {
    int64_t revision;
    int64_t epoch_claims;
    std::function<void()> complete;
  };
  // A batch written, waiting for its sync, then to be finished.
  struct Written {
    // Its place in the order of writes: 1 for the first batch.
    int64_t sequence;
    std::vector<Item> items;
    int64_t revision;
    int64_t epoch_claims;
    absl::Time write_start;
  };

  // The committer thread.
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // The sync thread: syncs every batch written, one sync after the other.
  void RunSync() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes what is pending as one batch (under the owner's operation lock) and writes it.
  void TakeAndWrite() ABSL_LOCKS_EXCLUDED(mu_);
  // Tells the owner, publishes and completes `batch`, which is durable, as are those before it.
  void Finish(Written batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Publishes `items` in order: runs of events, and the markers between them.
  void Publish(std::vector<Item> items);
  bool HasPendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.empty() || !pending_epochs_.empty();
  }
  // Whether the oldest batch written has been synced.
  bool HasSyncedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !written_.empty() && written_.front().sequence <= synced_sequence_;
  }

  // Constant after construction.
  Storage* const storage_;
  WatchCache* const watch_cache_;
  StoreMetrics* const metrics_;
  Owner* const owner_;

  mutable absl::Mutex mu_;
  std::vector<Item> pending_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> pending_epochs_ ABSL_GUARDED_BY(mu_);
  // The revision of the last event added, and the last one made durable.
  int64_t revision_ ABSL_GUARDED_BY(mu_);
  int64_t durable_revision_ ABSL_GUARDED_BY(mu_);
  int64_t compacted_revision_ ABSL_GUARDED_BY(mu_);
  // How many epochs were added, and how many of those are durable.
  int64_t epoch_claims_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t durable_epoch_claims_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // Batches written and not yet finished, oldest first; how many batches were written, and how
  // many of those a sync has made durable. Only the committer thread adds or removes batches;
  // only the sync thread raises synced_sequence_.
  std::deque<Written> written_ ABSL_GUARDED_BY(mu_);
  int64_t written_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t synced_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set once the committer thread has ended: the sync thread ends once it has nothing to sync.
  bool committer_done_ ABSL_GUARDED_BY(mu_) = false;

  // Started once by Start, joined once by Stop.
  std::thread thread_;
  std::thread sync_thread_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_GROUP_COMMITTER_H_
