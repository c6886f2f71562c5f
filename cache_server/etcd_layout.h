// EtcdLayout: how a store's state lies in etcd under its prefix (--etcd-prefix), how it is read
// at start-up, and the transactions that change it (--storage=etcd; object_store.h).
//
// Keys, under `prefix` (e.g. "/shardcache"):
//   <prefix>/m/format     "shardcache-store/1": marks the prefix as a shardcache store's
//   <prefix>/m/store-id   the store's identity (a UUID), written with the format marker
//   <prefix>/m/progress   written (empty) by a replica that must see its watch reach etcd's
//                         current revision when no other change of the prefix is coming
//   <prefix>/o/<group>/<resource>/<shard>/<cluster>/<namespace>/<name>
//                         a live object: shardcache.v1.Object in protobuf's binary form, without
//                         its resourceVersion, which is the key's mod revision (as Kubernetes
//                         stores objects in etcd); empty fields stay empty between the slashes
//   <prefix>/e/<shard>    the highest fencing epoch seen for the shard, in decimal with leading
//                         zeros to 19 digits, so that etcd orders epochs as it orders values
// A resourceVersion is the etcd revision at which the object last changed, so every replica on
// one cluster gives an object the same resourceVersion.
//
// Each write is one etcd transaction (MakeTxn): it compares the object's key (absent for a
// create, else its mod revision as the writer saw it) and, for a fenced write, the shard's epoch
// key (as the writer saw it), and only then puts or deletes the object and raises the epoch.
// When a compare fails, the writer's view was stale: it catches up with the answer's revision and
// decides again. One transaction changes at most one object, except a ResourceDefinition's
// deletion, which deletes every object of its resource in the same transaction.
//
// Pure functions, except LoadEtcdState, which talks to etcd; all are thread-safe.
#ifndef SHARDCACHE_CACHE_SERVER_ETCD_LAYOUT_H_
#define SHARDCACHE_CACHE_SERVER_ETCD_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "cache_server/etcd_client.h"
#include "cache_server/storage.h"
#include "common/object_key.h"

namespace shardcache {

inline constexpr char kEtcdFormat[] = "shardcache-store/1";

// Checks a --etcd-prefix: it starts with '/', does not end with one, and has no empty segment.
absl::Status ValidateEtcdPrefix(const std::string& prefix);

// The keys of the layout above.
std::string EtcdObjectKey(const std::string& prefix, const std::string& group_resource,
                          const v1::ObjectMeta& meta);
// Every object key of one resource starts with this.
std::string EtcdResourcePrefix(const std::string& prefix, const std::string& group_resource);
std::string EtcdEpochKey(const std::string& prefix, const std::string& shard);
std::string EtcdFormatKey(const std::string& prefix);
std::string EtcdStoreIdKey(const std::string& prefix);
std::string EtcdProgressKey(const std::string& prefix);
// An epoch as the epoch keys hold it.
std::string EtcdEpochValue(int64_t epoch);

// What a key of the layout names.
struct EtcdKey {
  enum Kind { kOther, kObject, kEpoch };
  Kind kind = kOther;
  std::string group_resource;  // kObject
  std::string object_key;      // kObject: ObjectKey(shard, cluster, namespace, name)
  std::string shard;           // kEpoch
};
EtcdKey ParseEtcdKey(const std::string& prefix, const std::string& key);

// An object as an etcd key holds it (kObject), with its resourceVersion set to `mod_revision`.
absl::StatusOr<ObjectRef> ParseEtcdObject(const std::string& value, int64_t mod_revision);
absl::StatusOr<int64_t> ParseEtcdEpoch(const std::string& value);
// `object` with its resourceVersion set to `revision` (`object` itself when `revision` is 0).
ObjectRef WithRevision(const ObjectRef& object, int64_t revision);

// A write, as the writer decided it against its replica's state.
struct EtcdWrite {
  // The object change, if any.
  bool has_change = false;
  std::string group_resource;
  // Put `object` (its resourceVersion is not stored), or delete its key.
  bool is_delete = false;
  ObjectRef object;
  // The object's key must be absent (0) or last changed at this revision.
  int64_t expected_mod_revision = 0;
  // Also deletes every object of this resource (a ResourceDefinition's deletion).
  std::string purge_group_resource;
  // Only compares that the object at `group_resource`/`object` is still at
  // expected_mod_revision (a write that changes nothing).
  bool check_only = false;
  // With an object change in the shard role: the etcd key of the ResourceDefinition that serves
  // the object's resource, which must still be at `definition_mod_revision`, so that a write
  // decided while the definition existed cannot land after another replica deleted it (and
  // purged its objects). Empty: no such compare (built-in resources, the cache role).
  std::string definition_key;
  int64_t definition_mod_revision = 0;

  // The fence, if the write carries one: the shard's epoch key must hold `seen_epoch` (0: be
  // absent), and is raised to `epoch` when that is higher.
  std::string fence_shard;
  int64_t fence_epoch = 0;
  int64_t seen_epoch = 0;
};
// The transaction of `write`: its compares, and its changes when they hold (nothing when not).
// Whether it changes anything (puts or deletes) goes to `changes`, when it is not null.
etcdserverpb::TxnRequest MakeEtcdTxn(const std::string& prefix, const EtcdWrite& write,
                                     bool* changes = nullptr);

// Reads a store's whole state under `prefix` at one revision, for ObjectStore's start: the
// objects (resourceVersion from their mod revision), the epochs, the store id, and the revision
// read at (its revision and compacted revision: a replica's history window starts when it
// loads). An empty prefix is made a store (the format marker and a new store id, in one
// transaction that requires the marker to be absent). Refuses, writing nothing, a prefix that
// holds keys but no format marker (someone else's data), another format, or an object that does
// not parse.
absl::StatusOr<PersistedState> LoadEtcdState(EtcdClient* etcd, const std::string& prefix);

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_ETCD_LAYOUT_H_
