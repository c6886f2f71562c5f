// ObjectKey: the key of an object in a store or an informer's cache: shard, cluster, namespace
// and name joined by '\0', so that keys sort by those fields in that order (none of them may
// contain '\0'). And ObjectRef: the shared, read-only form in which the server's store and the
// clients' caches hold objects.
//
// Pure functions; safe from any thread.
#ifndef SHARDCACHE_COMMON_OBJECT_KEY_H_
#define SHARDCACHE_COMMON_OBJECT_KEY_H_

#include <memory>
#include <string>

#include "shardcache/v1/store.pb.h"

namespace shardcache {

using ObjectRef = std::shared_ptr<const v1::Object>;

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

#endif  // SHARDCACHE_COMMON_OBJECT_KEY_H_
