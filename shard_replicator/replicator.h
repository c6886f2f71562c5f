// ShardReplicator: one shard_replicator process. It runs, for the whole life of the process and
// whether or not it leads:
//   - a DynamicInformerFactory on the shard store (following its ResourceDefinitions) and one on
//     the cache server; the informer of the shard's CCRs and the informer of this shard's CCR
//     copies in the cache; and, warmed ahead of leadership, the informers that each CCR needs
//     (its resource in its cluster, locally; its copies, in the cache). A standby is thus ready
//     to lead at once, and no informer is ever tied to a leadership term. The replicator holds
//     the CCR informers for its whole life (they are never released), and each CCR's informers
//     (their factory handles) while the CCR needs them: it lets go of them when the CCR is
//     deleted, when its spec names another resource or cluster, when it becomes invalid, or when
//     its resource is no longer served. The factory releases an informer that nobody holds any
//     more (not the term's controllers either) after its grace period, which ends its threads
//     and its watch;
//   - a LeaderElector on the shard's lease in the shard store.
// While it leads (one term), a Term claims the term's epoch at the cache server (ClaimEpoch),
// then runs a CacheWriter fenced with that epoch and a CcrController with a fresh queue, which
// runs the ReplicationControllers. When the term ends (lease lost, renew deadline passed, or a
// write was rejected as fenced, which resigns the term), the writer stops first, so that no
// write is sent after that, then the controllers stop (handlers removed, queues shut down); the
// informers keep running. The next term starts everything afresh: a full resync.
//
// Threads: Start, Stop and the destructor from one thread (main); Ready from any thread.
#ifndef SHARDCACHE_SHARD_REPLICATOR_REPLICATOR_H_
#define SHARDCACHE_SHARD_REPLICATOR_REPLICATOR_H_

#include <grpcpp/channel.h>

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/client/dynamic_informer_factory.h"
#include "common/client/leader_elector.h"
#include "common/client/memory_trimmer.h"
#include "common/client/shared_informer.h"
#include "common/client/store_client.h"
#include "common/client/worker_pool.h"
#include "common/clock.h"
#include "shard_replicator/cache_writer.h"
#include "shard_replicator/ccr_controller.h"
#include "shard_replicator/replicator_metrics.h"
#include "shard_replicator/shard_store_writer.h"

namespace shardcache {

class ShardReplicator {
 public:
  struct Options {
    std::string shard;        // this shard's name
    std::string shard_store;  // host:port of the shard's store
    std::string cache;        // host:port of the cache server
    std::string identity;     // this replica's identity in the lease
    std::string lease_cluster = "root";
    std::string lease_namespace = "shardcache-system";
    std::string lease_name = "shard-replicator";
    absl::Duration lease_duration = absl::Seconds(15);
    absl::Duration renew_deadline = absl::Seconds(10);
    absl::Duration retry_period = absl::Seconds(2);
    // How many keys of each controller's queue are reconciled at once (--workers).
    int workers = 4;
    // The threads that run every controller's reconciles and every informer's reflector and
    // handlers, however many CCRs there are (--worker-threads).
    int worker_threads = 8;
    // How often the heap that the replicator has freed is returned to the system
    // (--memory-trim-interval; common/client/memory_trimmer.h). Zero: never.
    absl::Duration memory_trim_interval = absl::Seconds(30);
    absl::Duration resync_period = absl::Minutes(5);
    // gRPC keepalive of the channels to the shard store and the cache.
    KeepaliveOptions keepalive;
    // The credentials of the channels to the shard store and the cache (common/tls.h); null:
    // plaintext.
    std::shared_ptr<grpc::ChannelCredentials> shard_store_credentials;
    std::shared_ptr<grpc::ChannelCredentials> cache_credentials;
    // A watch of either store that receives neither an event nor a bookmark for this long is
    // taken for dead and opened again (Reflector::Options::watch_idle_timeout). Zero: never.
    absl::Duration watch_idle_timeout = absl::Seconds(15);
    const Clock* clock = RealClock::Get();
    std::shared_ptr<prometheus::Registry> registry;  // required
  };

  // Validates the options (INVALID_ARGUMENT naming the flag), connects, starts the informers and
  // the election. Connections are lazy: a store that is down delays readiness, not start-up.
  static absl::StatusOr<std::unique_ptr<ShardReplicator>> Start(Options options);
  ~ShardReplicator();
  ShardReplicator(const ShardReplicator&) = delete;
  ShardReplicator& operator=(const ShardReplicator&) = delete;

  // Ends the term if leading (controllers stopped, nothing written after), releases the lease,
  // and stops the informers. Idempotent.
  void Stop();

  // OK once the informers the replicator starts with have synced and, while it leads, while it
  // can write to the cache; else UNAVAILABLE saying why not: informers not synced yet, or
  // "leading (epoch N) but unable to write to the cache since T" (writes wait and resume when
  // it can), or the term's epoch cannot be claimed at the cache. A standby that has synced is
  // ready: it can take over.
  absl::Status Ready() const;

 private:
  struct Term;

  explicit ShardReplicator(Options options);
  absl::Status Init();
  // Makes the informers held for the CCR `key` (of ccrs_'s store) what it needs now, as the
  // store shows it: its two informers when it exists, its spec is valid and its resource
  // served; none otherwise. Level-triggered: any event of the CCR, or any change of what is
  // served, calls it again.
  void Warm(const std::string& key) ABSL_LOCKS_EXCLUDED(warm_mu_);
  void StartedLeading(LeadingContext context);
  void StoppedLeading();
  // A term's start-up, on its own thread: claim the epoch, then start the controllers.
  void RunTerm(Term* term);

  const Options options_;
  ReplicatorMetrics metrics_;
  std::shared_ptr<grpc::Channel> shard_channel_;
  std::shared_ptr<grpc::Channel> cache_channel_;
  std::shared_ptr<v1::Store::StubInterface> shard_stub_;
  std::shared_ptr<v1::Store::StubInterface> cache_stub_;
  std::unique_ptr<StoreClient> shard_client_;
  std::unique_ptr<StoreClient> cache_client_;
  std::unique_ptr<ShardStoreWriter> shard_writer_;
  // The terms' controllers and every informer's handlers run on it; declared before the
  // factories, so that it outlives their informers.
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<MemoryTrimmer> trimmer_;  // on pool_; null when off
  std::unique_ptr<DynamicInformerFactory> shard_informers_;
  std::unique_ptr<DynamicInformerFactory> cache_informers_;
  std::shared_ptr<SharedInformer> ccrs_;
  std::shared_ptr<SharedInformer> cache_ccrs_;
  std::unique_ptr<SharedInformer::Registration> warm_registration_;
  Subscription warm_subscription_;
  // The informers held for one CCR, and what they are for ("group/version/resource|cluster").
  struct Warmed {
    std::string need;
    std::shared_ptr<SharedInformer> local;
    std::shared_ptr<SharedInformer> copies;
  };
  absl::Mutex warm_mu_;  // before the factories' own
  // By CCR key (ObjectKey of the CCR).
  std::map<std::string, Warmed> warm_ ABSL_GUARDED_BY(warm_mu_);
  std::unique_ptr<LeaderElector> elector_;  // last: stopped first

  mutable absl::Mutex term_mu_;  // before a Term's mu
  std::unique_ptr<Term> term_ ABSL_GUARDED_BY(term_mu_);
  bool stopped_ = false;  // main thread only
};

}  // namespace shardcache

#endif  // SHARDCACHE_SHARD_REPLICATOR_REPLICATOR_H_
