// ReplicatorFixture: a GoogleTest fixture for process-level tests of shard_replicator. It runs real
// processes on loopback ports they pick themselves: shard stores (cache_server --role=shard), one
// cache (cache_server --role=cache) and shard_replicator replicas with short leader-election
// timings, and offers helpers to write definitions, ClusterCachedResources (CCRs) and objects, to
// read CCR status, the cache's copies and the replicators' metrics, and to wait for conditions
// with a deadline (never a fixed sleep where a condition can be polled).
//
// Every wait is built on testing::Eventually (common/testing/wait.h) and returns a
// ::testing::AssertionResult whose failure message shows the last state seen, so that
// `ASSERT_TRUE(WaitFor...)` explains itself.
//
// Thread-compatible: use a fixture from its test's thread (stubs are thread-safe; a WatchReader
// reads on its own thread).
#ifndef SHARDCACHE_INTEGRATION_TESTS_REPLICATOR_FIXTURE_H_
#define SHARDCACHE_INTEGRATION_TESTS_REPLICATOR_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/objects.h"
#include "common/testing/server_process.h"
#include "common/testing/wait.h"
#include "integration_tests/refuse_to_start.h"
#include "integration_tests/security_certs.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::testing {

// The leader-election timings every replicator in these tests runs with.
inline constexpr absl::Duration kLeaseDuration = absl::Seconds(3);
inline constexpr absl::Duration kRenewDeadline = absl::Seconds(2);
inline constexpr absl::Duration kRetryPeriod = absl::Milliseconds(500);
// How long a wait for replication to converge may take before the test fails.
inline constexpr absl::Duration kConverge = absl::Seconds(20);

// Names the tests share.
inline constexpr char kCluster[] = "root:org";
inline constexpr char kNamespace[] = "default";
inline constexpr char kOriginalRvAnnotation[] = "cache.shardcache.io/original-resource-version";
inline constexpr char kOriginalUidAnnotation[] = "cache.shardcache.io/original-uid";
inline constexpr char kFinalizer[] = "cache.shardcache.io/replicator";
// Where the replicators keep their lease (the defaults of --lease-cluster, --lease-namespace and
// --lease-name).
inline constexpr char kLeaseCluster[] = "root";
inline constexpr char kLeaseNamespace[] = "shardcache-system";
inline constexpr char kLeaseName[] = "shard-replicator";

// widgets.example.com/v1: namespaced, status as a subresource (in the shard stores).
v1::GroupVersionResource WidgetsGvr();
// clustercachedresources.cache.shardcache.io/v1alpha1 (built in; cluster-scoped).
v1::GroupVersionResource CcrGvr();
// leases.coordination.shardcache.io/v1 (built in; namespaced).
v1::GroupVersionResource LeaseGvr();

// A widget in kCluster/kNamespace. `labels` and `spec` are JSON objects, e.g. R"({"app":"web"})".
v1::Object Widget(const std::string& name, const std::string& labels = "{}",
                  const std::string& spec = R"({"size":1})");
// A CCR in `cluster` for example.com/v1/widgets (or the given gvr); `label_selector` is the JSON
// of spec.labelSelector, or "" for none.
v1::Object Ccr(const std::string& name, const std::string& label_selector = "",
               const std::string& cluster = kCluster,
               const v1::GroupVersionResource& gvr = WidgetsGvr());

// Reading a CCR's status.
std::string Phase(const v1::Object& ccr);
struct ConditionView {
  std::string status;  // "True", "False"; "" when the condition is absent
  std::string reason;
  std::string message;
};
ConditionView FindCondition(const v1::Object& ccr, const std::string& type);
// status.resourceCounts.<which> ("local" or "cache"); -1 when absent.
double ResourceCount(const v1::Object& ccr, const std::string& which);
// Phase, conditions and counts in one line, for failure messages.
std::string DescribeStatus(const v1::Object& ccr);

// "" when `copy` is what a replicator of `shard` should have written for `origin`: the origin's
// cluster, namespace, name, uid, creationTimestamp, generation, labels, annotations (plus
// original-resource-version and original-uid), spec and status, metadata.shard = shard, and no
// finalizers or deletionTimestamp. Otherwise a description of the differences.
std::string CopyDiff(const v1::Object& origin, const v1::Object& copy, const std::string& shard);

// How a reader tells a CCR status that holds now from the last known one
// (docs/replicator-design.md, "Status semantics"): "" when the status was written by the term that
// holds `lease` (of the CCR's shard) at `now` (status.epoch equals spec.leaseTransitions, a holder
// is named, and renewTime + leaseDurationSeconds is after `now`); otherwise why it is only the last
// known.
std::string WhyLastKnown(const v1::Object& ccr, const v1::Object& lease, absl::Time now);
// status.epoch of a CCR; -1 when absent.
double StatusEpoch(const v1::Object& ccr);

// Runs shard_replicator with `args` (after --http-listen=127.0.0.1:0 --port-file=...) until it
// exits, for at most `timeout`; one that starts serving instead is killed a second later.
RunResult RunReplicatorToExit(const std::vector<std::string>& args,
                              absl::Duration timeout = absl::Seconds(15));

class ReplicatorFixture : public ::testing::Test {
 protected:
  // A cache_server and a stub connected to it.
  struct Store {
    std::unique_ptr<ServerProcess> process;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Store::Stub> stub;
    std::string address() const { return process->grpc_address(); }
  };

  // Stops the replicators (each must exit 0 on SIGTERM), then the stores.
  void TearDown() override;

  // Starts shard `shard`'s store (cache_server --role=shard) and defines widgets in it.
  void StartShardStore(const std::string& shard = "a");
  // Starts the cache (cache_server --role=cache).
  void StartCache();
  // Restarts a stopped store on the same port and reconnects its stub.
  void RestartStore(Store* store);
  // Kills a store with SIGKILL (no drain, no clean shutdown) and waits until it is gone; its
  // data directory and port stay for RestartStore.
  void KillStore(Store* store);
  // The flags of a replica of `shard` (--shard, --shard-store, --cache, --identity and the short
  // leader-election timings), then `extra`. --cache is `cache_address`, or the fixture's cache
  // when "" (e.g. a relay in front of the cache instead).
  std::vector<std::string> ReplicatorArgs(const std::string& shard, const std::string& identity,
                                          const std::vector<std::string>& extra = {},
                                          const std::string& cache_address = "");
  // Starts a replica of `shard` and returns it (owned by the fixture).
  ServerProcess* StartReplicator(const std::string& shard = "a",
                                 const std::string& identity = "replica-0",
                                 const std::vector<std::string>& extra = {},
                                 const std::string& cache_address = "");

  v1::Store::Stub* shard(const std::string& name = "a") { return shards_.at(name).stub.get(); }
  v1::Store::Stub* cache() { return cache_.stub.get(); }

  // Writes; each fails the test (ADD_FAILURE) and returns the status when the call fails.
  grpc::Status CreateIn(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                        const v1::Object& obj, v1::Object* out = nullptr);
  // Read-modify-write of one object in a shard store, retried on conflict: reads it, applies
  // `mutate`, writes it with Update (or UpdateStatus when `status`).
  grpc::Status Modify(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                      const std::string& cluster, const std::string& ns, const std::string& name,
                      const std::function<void(v1::Object*)>& mutate, bool status = false,
                      v1::Object* out = nullptr);
  grpc::Status DeleteIn(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                        const std::string& shard, const std::string& cluster, const std::string& ns,
                        const std::string& name);
  // Defines widgets (namespaced, status subresource, version v1) in a shard store.
  void DefineWidgets(const std::string& shard_name = "a");
  // Deletes the widgets definition (the store deletes every widget) and waits until it is gone.
  void UndefineWidgets(const std::string& shard_name = "a");
  // Switches version v1 of widgets to served: `served` (objects stay in the store).
  void SetWidgetsServed(bool served, const std::string& shard_name = "a");
  // Creates CCR "widgets" and widgets w1..w3 in shard "a" (a replica must lead) and waits until
  // the CCR is Ready with 3 of each and the cache holds equal copies of the widgets and of it.
  void ReplicateWidgets();

  // Reads.
  std::optional<v1::Object> GetFrom(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                                    const std::string& shard, const std::string& cluster,
                                    const std::string& ns, const std::string& name);
  // Every object of `gvr` in a store, filtered by shard (cache), cluster and label selector,
  // keyed by "namespace/name". nullopt (and ADD_FAILURE) when the list fails.
  std::optional<std::map<std::string, v1::Object>> ListFrom(v1::Store::Stub* stub,
                                                            const v1::GroupVersionResource& gvr,
                                                            const std::string& shard,
                                                            const std::string& cluster,
                                                            const std::string& label_selector = "");
  // The replicators' lease in a shard store (kLeaseCluster/kLeaseNamespace/kLeaseName).
  std::optional<v1::Object> GetLease(const std::string& shard_name = "a");
  // The CCR `name` in kCluster of a shard store, nullopt when absent.
  std::optional<v1::Object> GetCcr(const std::string& name, const std::string& shard_name = "a",
                                   const std::string& cluster = kCluster);

  // Waits.
  // Until the CCR satisfies `pred` (it exists); the failure message shows its last status.
  ::testing::AssertionResult WaitForCcr(const std::string& name,
                                        const std::function<bool(const v1::Object&)>& pred,
                                        const std::string& what, absl::Duration timeout = kConverge,
                                        const std::string& shard_name = "a",
                                        const std::string& cluster = kCluster);
  // Until the CCR has this phase and ReplicationStarted condition (status, and reason unless "");
  // `local` and `cache` (unless -1) are its resourceCounts.
  ::testing::AssertionResult WaitForCcrState(const std::string& name, const std::string& phase,
                                             const std::string& started_status,
                                             const std::string& started_reason = "",
                                             double local = -1, double cache = -1,
                                             absl::Duration timeout = kConverge,
                                             const std::string& shard_name = "a");
  // Until the CCR is Ready with resourceCounts {local: n, cache: n}.
  ::testing::AssertionResult WaitForReady(const std::string& name, double n,
                                          absl::Duration timeout = kConverge,
                                          const std::string& shard_name = "a");
  // Until the cache holds exactly the copies of the widgets of `shard_name` in kCluster that match
  // `label_selector` (a List selector string), each equal to its origin (CopyDiff).
  ::testing::AssertionResult WaitForCacheInSync(const std::string& shard_name = "a",
                                                const std::string& label_selector = "",
                                                absl::Duration timeout = kConverge,
                                                const v1::GroupVersionResource& gvr = WidgetsGvr(),
                                                const std::string& cluster = kCluster);
  // Same check, once: "" when in sync, else what differs.
  std::string CacheDiff(const std::string& shard_name, const std::string& label_selector,
                        const v1::GroupVersionResource& gvr, const std::string& cluster);
  // Until the cache holds a copy of CCR `name` equal to its origin.
  ::testing::AssertionResult WaitForCcrCopy(const std::string& name,
                                            const std::string& shard_name = "a",
                                            absl::Duration timeout = kConverge);
  // Until the replica's shardcache_leader_election_leading is `leading` (1 or 0).
  ::testing::AssertionResult WaitForLeading(ServerProcess* replica, double leading,
                                            absl::Duration timeout);
  // 1 or 0 (or -1 when the page cannot be read): whether the replica leads.
  static double Leading(ServerProcess* replica);

  // TLS and authorization on (SHARDCACHE_TEST_SECURITY=tls, see security_certs.h): the stores
  // serve TLS with client certificates required, the fixture's stubs are the admin's, and each
  // replicator presents its shard's certificate. Set before starting anything.
  bool security_ = SecurityFromEnvironment();

  std::map<std::string, Store> shards_;
  Store cache_;
  std::vector<std::unique_ptr<ServerProcess>> replicators_;
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_INTEGRATION_TESTS_REPLICATOR_FIXTURE_H_
