// Small builders of API values for tests.
//
// Pure functions; safe from any thread.
#ifndef SHARDCACHE_COMMON_TESTING_OBJECTS_H_
#define SHARDCACHE_COMMON_TESTING_OBJECTS_H_

#include <string>

#include "common/resources.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache::testing {

inline v1::GroupVersionResource Gvr(const std::string& group, const std::string& version,
                                    const std::string& resource) {
  return MakeGvr(group, version, resource);
}

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_OBJECTS_H_
