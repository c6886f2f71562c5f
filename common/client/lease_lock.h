// ResourceLock and LeaseLock: the object that leader election competes for (client-go's
// resourcelock.Interface and its LeaseLock), and the record kept in it.
//
// A LeaderElectionRecord is the spec of a `leases` object (coordination.shardcache.io/v1):
//
//   {"holderIdentity": "replica-1", "leaseDurationSeconds": 15,
//    "acquireTime": "2024-05-01T10:00:00.000000Z", "renewTime": "2024-05-01T10:00:04.000000Z",
//    "leaseTransitions": 3}
//
// Times are RFC 3339 in UTC with microseconds (Kubernetes' MicroTime). Missing fields read as
// empty / zero (an object created by hand with an empty spec is a free lease).
//
// The epoch (for fencing writes, see Fence in proto/shardcache/v1/store.proto) is the record's
// leaseTransitions as written by the acquisition that started a term. Every acquisition that
// starts a new term raises leaseTransitions by one, including one by the identity that already
// appears as holder (a replica that stopped leading, or restarted, and takes the lease again);
// renewals and releases keep it. Every write of the record carries the resourceVersion last read
// as a precondition, so the writes form one sequence and no two terms get the same epoch: epochs
// rise strictly from term to term across all replicas. (Deleting the lease object starts the
// count again; an elector then creates it with one more than the highest value it has seen, and a
// store that has seen a higher epoch rejects the newcomer's fenced writes: safe, but stuck until
// the count passes the old value, so do not delete a lease that is in use.)
//
// Thread-safety: LeaderElectionRecord and the free functions are values / pure. LeaseLock is
// thread-safe, but its Update depends on the last Get, Create or Update, so it is meant for one
// caller at a time (a LeaderElector's own thread).
#ifndef SHARDCACHE_COMMON_CLIENT_LEASE_LOCK_H_
#define SHARDCACHE_COMMON_CLIENT_LEASE_LOCK_H_

#include <google/protobuf/struct.pb.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {

// What a lease says (client-go's LeaderElectionRecord).
struct LeaderElectionRecord {
  // Who holds the lease; empty: nobody (free, e.g. released).
  std::string holder_identity;
  // How long the lease is valid after its holder renews it (as observed by the others).
  absl::Duration lease_duration = absl::ZeroDuration();
  // When the current term started; absl::InfinitePast() when unset.
  absl::Time acquire_time = absl::InfinitePast();
  // When the holder last renewed it; absl::InfinitePast() when unset.
  absl::Time renew_time = absl::InfinitePast();
  // How many terms have started (the epoch of the latest).
  int64_t leader_transitions = 0;

  bool operator==(const LeaderElectionRecord& o) const;
  bool operator!=(const LeaderElectionRecord& o) const { return !(*this == o); }
};

// A record as read from the store, with the object's resourceVersion (which every write changes).
struct ObservedRecord {
  LeaderElectionRecord record;
  std::string resource_version;
};

// Formats a time as RFC 3339 in UTC with exactly six fractional digits
// ("2024-05-01T10:00:00.123456Z"); sub-microsecond digits are truncated.
std::string FormatMicroTime(absl::Time t);
// Parses an RFC 3339 time (any offset, any number of fractional digits). INVALID_ARGUMENT
// otherwise.
absl::StatusOr<absl::Time> ParseMicroTime(absl::string_view s);

// The lease object's spec for a record (types::v1::LeaseSpec through common/struct_codec.h).
// Unset times are left out; leaseDurationSeconds is the duration rounded up to whole seconds
// (never shorter than the holder assumes); leaseTransitions is exact (a JSON number up to 2^53,
// a decimal string above).
google::protobuf::Struct RecordToSpec(const LeaderElectionRecord& record);
// The record in a lease object's spec (unknown fields ignored; leaseTransitions read from a
// number or a decimal string). INVALID_ARGUMENT (naming the field) for a field of the wrong
// type, a negative number or a malformed time.
absl::StatusOr<LeaderElectionRecord> RecordFromSpec(const google::protobuf::Struct& spec);

// The object that electors compete for. Implementations: LeaseLock, and fakes in tests.
class ResourceLock {
 public:
  virtual ~ResourceLock() = default;

  // Reads the record. NOT_FOUND when the object does not exist; other errors as the store's.
  virtual absl::StatusOr<ObservedRecord> Get() = 0;
  // Creates the object with this record; returns its resourceVersion. ALREADY_EXISTS when it
  // exists.
  virtual absl::StatusOr<std::string> Create(const LeaderElectionRecord& record) = 0;
  // Replaces the record, on the condition that the object has not changed since the last Get,
  // Create or Update; returns the new resourceVersion. ABORTED when it has changed;
  // FAILED_PRECONDITION when nothing was read or written before.
  virtual absl::StatusOr<std::string> Update(const LeaderElectionRecord& record) = 0;
  // The lock's name for logs and metrics, as client-go's: e.g. "root/kube-system/shard-a" (no
  // spaces: it is a Prometheus label value).
  virtual std::string Describe() const = 0;
  // The identity this lock writes as holder.
  virtual std::string Identity() const = 0;
};

// A ResourceLock over a `leases` object in a store, through the generated Store stub.
class LeaseLock : public ResourceLock {
 public:
  struct Options {
    std::string cluster;   // the lease object's logical cluster, e.g. "root" (required)
    std::string ns;        // its namespace, e.g. "kube-system" (required: leases are namespaced)
    std::string name;      // its name, e.g. "shard-a" (required)
    std::string identity;  // this replica's identity, unique among the competitors (required)
    // The deadline of each RPC. Keep it at most the elector's retry period: a call that takes
    // longer delays the next attempt (it never delays stopping leading, see leader_elector.h).
    absl::Duration call_timeout = absl::Seconds(2);
  };

  // `stub` is shared (gRPC stubs are thread-safe) and must not be null.
  LeaseLock(std::shared_ptr<v1::Store::StubInterface> stub, Options options);

  absl::StatusOr<ObservedRecord> Get() override;
  absl::StatusOr<std::string> Create(const LeaderElectionRecord& record) override;
  absl::StatusOr<std::string> Update(const LeaderElectionRecord& record) override;
  std::string Describe() const override;
  std::string Identity() const override { return options_.identity; }

  // The resource `leases` in coordination.shardcache.io/v1.
  static v1::GroupVersionResource Resource();

 private:
  // Remembers the object as last read or written: Update's precondition and base.
  void Remember(const v1::Object& object) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const std::shared_ptr<v1::Store::StubInterface> stub_;
  const Options options_;

  absl::Mutex mu_;
  bool have_object_ ABSL_GUARDED_BY(mu_) = false;
  v1::Object object_ ABSL_GUARDED_BY(mu_);  // metadata carries the resourceVersion and uid
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_LEASE_LOCK_H_
