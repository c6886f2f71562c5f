// ClusterCachedResource: what a CCR object says (its spec), what a copy in the cache looks like
// (the projection of a local object), and the CCR's status as the replicator computes it.
//
// A CCR (cache.shardcache.io/v1alpha1 clustercachedresources, cluster-scoped, in a shard store)
// asks for every object of one resource in the CCR's own logical cluster, optionally only those
// that match a label selector, to be copied into the cache:
//
//   {"metadata": {"cluster": "root", "name": "widgets"},
//    "spec": {"group": "example.io", "version": "v1", "resource": "widgets",
//             "labelSelector": {"matchLabels": {"tier": "gold"}}}}
//
// Everything here is a pure function or a value type: safe from any thread.
#ifndef SHARDCACHE_SHARD_REPLICATOR_CLUSTER_CACHED_RESOURCE_H_
#define SHARDCACHE_SHARD_REPLICATOR_CLUSTER_CACHED_RESOURCE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/label_selector.h"
#include "common/resources.h"
#include "google/protobuf/struct.pb.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

// The finalizer that holds a CCR until its copies are purged from the cache.
inline constexpr char kReplicatorFinalizer[] = "cache.shardcache.io/replicator";
// Annotations on a copy: the origin's resourceVersion and uid.
inline constexpr char kOriginalResourceVersionAnnotation[] =
    "cache.shardcache.io/original-resource-version";
inline constexpr char kOriginalUidAnnotation[] = "cache.shardcache.io/original-uid";

// A CCR's spec, validated.
struct CcrSpec {
  v1::GroupVersionResource resource;
  LabelSelector selector;
  // The selector's canonical string ("" selects everything): compares two specs' selectors.
  std::string selector_string;
};

// Why a spec is invalid: the ResourceValid condition's reason and message.
struct CcrInvalid {
  std::string reason;  // "InvalidSpec" or "InvalidLabelSelector"
  std::string message;
};

// Parses and validates a CCR's spec (a types::v1::ClusterCachedResourceSpec read through
// common/struct_codec.h: unknown fields ignored, but in the label selector): group (may be empty:
// the core group), version and resource as in Kubernetes, and an optional metav1.LabelSelector.
// The error's message names the field ("spec.resource: Required value"); `*invalid` (when not
// null) gets the reason too.
absl::StatusOr<CcrSpec> ParseCcrSpec(const v1::Object& ccr, CcrInvalid* invalid);

// The copy of `origin` that the cache should hold: the origin's cluster, namespace, name, uid,
// creationTimestamp, generation, labels, annotations, spec and status; metadata.shard = `shard`;
// the annotations kOriginalResourceVersionAnnotation and kOriginalUidAnnotation set from the
// origin. No resourceVersion, finalizers or deletionTimestamp (the cache's own).
v1::Object ProjectCopy(const v1::Object& origin, const std::string& shard);

// True when `copy` (as read from the cache) already equals `desired` (from ProjectCopy):
// everything but the copy's own resourceVersion. An empty spec or status equals an absent one.
bool CopyUpToDate(const v1::Object& desired, const v1::Object& copy);

// The cache's resourceVersion of an object as a number (0 when absent or malformed).
int64_t ResourceVersionNumber(const v1::Object& object);

// What the replicator knows of a CCR at one reconcile; CcrStatusStruct renders it.
struct CcrState {
  enum class Phase { kInitializing, kReady, kDeleting, kDeleted };
  Phase phase = Phase::kInitializing;
  int64_t generation = 0;
  bool valid = false;
  std::string valid_reason;
  std::string valid_message;
  bool started = false;
  std::string started_reason;
  std::string started_message;
  int64_t local_count = 0;
  int64_t cache_count = 0;
  // Whether the cache held the whole projection when this state was computed (see Synced in
  // CcrStatusStruct).
  bool synced = false;
  std::string synced_reason;
  std::string synced_message;
  // The leadership term that computed this state (the lease's leaseTransitions).
  int64_t epoch = 0;
};

const char* PhaseName(CcrState::Phase phase);

// The CCR status for `state` (a types::v1::ClusterCachedResourceStatus written through
// common/struct_codec.h, so int64 values are exact):
//   {"phase": ..., "observedGeneration": N, "epoch": E,
//    "conditions": [{"type": "ResourceValid", "status": "True"|"False", "reason", "message",
//                    "lastTransitionTime", "observedGeneration"}, {"type": "ReplicationStarted",
//                    ...}, {"type": "Synced", ...}],
//    "resourceCounts": {"local": N, "cache": M}}
// `epoch` is the leadership term that wrote the status; Synced says whether the cache held the
// whole projection then (False: reason and message say why, and how many objects were pending).
// A condition keeps its lastTransitionTime from `previous` (the CCR's current status) while its
// status stays the same (as apimachinery's SetStatusCondition); otherwise it is `now`. Any other
// fields of `previous` are kept, lastUpdateTime among them (see WithUpdateTime).
google::protobuf::Struct CcrStatusStruct(const CcrState& state,
                                         const google::protobuf::Struct& previous, absl::Time now);

// `status` with "lastUpdateTime" set to `now`: the time the status is written. The replicator
// compares a computed status (which keeps the stored lastUpdateTime) with the stored one first,
// and stamps it only when something else changed, so that the status is not rewritten just
// because time passed.
google::protobuf::Struct WithUpdateTime(google::protobuf::Struct status, absl::Time now);

// True when two statuses are equal (the replicator writes a status only when this is false).
bool StatusEquals(const google::protobuf::Struct& a, const google::protobuf::Struct& b);

}  // namespace shardcache

#endif  // SHARDCACHE_SHARD_REPLICATOR_CLUSTER_CACHED_RESOURCE_H_
