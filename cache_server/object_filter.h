// ObjectFilter: the filters of a List or Watch (shard, cluster, namespace, label selector), and
// ObjectPtr, the shared read-only form in which the store holds objects.
//
// Immutable after construction; safe to use from any thread.
#ifndef SHARDCACHE_CACHE_SERVER_OBJECT_FILTER_H_
#define SHARDCACHE_CACHE_SERVER_OBJECT_FILTER_H_

#include <memory>
#include <string>

#include "common/label_selector.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

using ObjectPtr = std::shared_ptr<const v1::Object>;

struct ObjectFilter {
  std::string shard;       // empty: any
  std::string cluster;     // empty: any
  std::string namespace_;  // empty: any
  LabelSelector selector;

  bool Matches(const v1::Object& o) const {
    const v1::ObjectMeta& m = o.metadata();
    return (shard.empty() || m.shard() == shard) && (cluster.empty() || m.cluster() == cluster) &&
           (namespace_.empty() || m.namespace_() == namespace_) && selector.Matches(m.labels());
  }
};

// The store's key of an object: shard, cluster, namespace and name joined by '\0', so that keys
// sort by those fields in that order (none of them may contain '\0').
inline std::string ObjectKey(const std::string& shard, const std::string& cluster,
                             const std::string& ns, const std::string& name) {
  std::string key;
  key.reserve(shard.size() + cluster.size() + ns.size() + name.size() + 3);
  key.append(shard).push_back('\0');
  key.append(cluster).push_back('\0');
  key.append(ns).push_back('\0');
  key.append(name);
  return key;
}

inline std::string ObjectKey(const v1::ObjectMeta& m) {
  return ObjectKey(m.shard(), m.cluster(), m.namespace_(), m.name());
}

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_OBJECT_FILTER_H_
