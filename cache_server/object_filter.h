// ObjectFilter: the filters of a List or Watch (shard, cluster, namespace, label selector).
//
// Immutable after construction; safe to use from any thread.
#ifndef SHARDCACHE_CACHE_SERVER_OBJECT_FILTER_H_
#define SHARDCACHE_CACHE_SERVER_OBJECT_FILTER_H_

#include <memory>
#include <string>

#include "common/label_selector.h"
#include "common/object_key.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

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

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_OBJECT_FILTER_H_
