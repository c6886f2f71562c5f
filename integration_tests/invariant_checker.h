// InvariantChecker: what the cache must hold, computed from every shard store, compared copy by
// copy with what the cache holds, and every ClusterCachedResource's status compared with the
// truth. It is the oracle of fault tests and of the chaos soak: after every fault is healed,
// polling Check() until it reports nothing proves that replication converged.
//
// The projection (the replicator contract): for each shard S and each CCR in S's store that is
// valid (its spec parses; no CCR of its cluster created earlier names the same group/resource) and
// not being deleted, and whose resource S serves (a ResourceDefinition defines the group, plural
// and a served version):
//   - every object of that resource in S's store, in the CCR's cluster, that matches its
//     labelSelector has exactly one copy in the cache (resource as the CCR names it, metadata.shard
//     = S) that carries the origin's cluster, namespace, name, uid, creationTimestamp, generation,
//     labels, annotations plus cache.shardcache.io/original-resource-version and original-uid (the
//     origin's resourceVersion and uid), spec and status, and no finalizers or deletionTimestamp;
//   - the CCR is Ready, ResourceValid=True, ReplicationStarted=True, Synced=True (reason
//     InSync), observedGeneration = its generation, and resourceCounts local = cache = the number
//     of such objects.
// A CCR whose resource S does not serve: no copies, phase Initializing, ReplicationStarted=False,
// Synced not True. An invalid CCR: ResourceValid=False, phase Initializing, Synced not True.
// Every CCR's status was written by the term that leads now (docs/replicator-design.md, "Status
// semantics"): S's lease names a holder, and status.epoch equals its leaseTransitions. Every CCR
// has the replicator's finalizer and a copy in the cache (the CCR projected like any object, its
// status included); a CCR still being deleted once converged is a difference (its deletion never
// finished). Every other copy with metadata.shard = S (of a resource that a CCR names, or that
// Options lists) is a copy that nothing backs. An object in a shard store that carries
// metadata.shard is a difference too (a shard store must refuse it).
//
// Thread-compatible: one Check at a time per checker; Compare is a pure function.
#ifndef SHARDCACHE_INTEGRATION_TESTS_INVARIANT_CHECKER_H_
#define SHARDCACHE_INTEGRATION_TESTS_INVARIANT_CHECKER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/client/store_client.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache::testing {

// One way in which the cache or a CCR's status differs from the truth.
struct Difference {
  enum class Kind {
    kMissingCopy,  // a selected local object has no copy
    kExtraCopy,    // a copy that no (selected) local object backs
    kStaleCopy,    // a copy of an older version of its origin (original-resource-version)
    kWrongCopy,    // a copy that differs from its origin otherwise
    kMissingCcrCopy,
    kStaleCcrCopy,   // the CCR's copy differs from the CCR (spec, status, ...)
    kWrongStatus,    // a CCR's status says something other than the truth
    kStuckDeleting,  // a CCR with a deletionTimestamp that is still there
    kMissingFinalizer,
    kLocalHasShard,  // an object in a shard store carries metadata.shard
  };
  Kind kind;
  std::string shard;
  std::string ccr;     // "cluster|name" of the CCR concerned, "" when none
  std::string key;     // "group/version/resource cluster/namespace/name" of the object
  std::string detail;  // what differs: got ..., want ...

  static const char* KindName(Kind kind);
  std::string ToString() const;
};

// Everything the checker reads, in one pass (not one snapshot: each list is its own).
struct ClusterState {
  struct Shard {
    std::vector<v1::Object> definitions;
    std::vector<v1::Object> ccrs;
    // Every object of each resource that a CCR of this shard names, keyed by "group/version/
    // resource" (absent when the shard does not serve it).
    std::map<std::string, std::vector<v1::Object>> objects;
    // The replicators' lease (absent when nobody ever led).
    std::optional<v1::Object> lease;
  };
  std::map<std::string, Shard> shards;
  // What the cache holds of each resource that a CCR names (and of the CCR resource, and of
  // Options::resources), every shard's copies, keyed by "group/version/resource".
  std::map<std::string, std::vector<v1::Object>> cache;
};

// The differences between what `state.cache` holds and what it must hold; each sorted by kind,
// shard and key. `check_status`: compare the CCRs' statuses too.
std::vector<Difference> Compare(const ClusterState& state, bool check_status = true);

// Differences, one per line; "none" when empty.
std::string Describe(const std::vector<Difference>& diffs);

class InvariantChecker {
 public:
  struct Options {
    // Shard name -> its store's address (host:port).
    std::map<std::string, std::string> shards;
    // The cache's address.
    std::string cache;
    // Resources to look for copies of in the cache, besides those a CCR names now (e.g. those a
    // deleted CCR named). "group/version/resource" values are GroupVersionResource messages.
    std::vector<v1::GroupVersionResource> resources;
    // Where the replicators of every shard keep their lease (shard_replicator's defaults).
    std::string lease_cluster = "root";
    std::string lease_namespace = "shardcache-system";
    std::string lease_name = "shard-replicator";
    // Deadline of each list call.
    absl::Duration timeout = absl::Seconds(10);
  };

  // Connects (lazily, as gRPC does) to every store.
  static absl::StatusOr<std::unique_ptr<InvariantChecker>> Create(Options options);

  // Lists everything (definitions, CCRs, the objects they name, the lease, the cache's copies). An
  // error when a store cannot be listed (down, partitioned).
  absl::StatusOr<ClusterState> Read();
  // Read and Compare.
  absl::StatusOr<std::vector<Difference>> Check(bool check_status = true);

 private:
  explicit InvariantChecker(Options options) : options_(std::move(options)) {}

  const Options options_;
  std::map<std::string, std::unique_ptr<StoreClient>> shard_clients_;
  std::unique_ptr<StoreClient> cache_client_;
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_INTEGRATION_TESTS_INVARIANT_CHECKER_H_
