// ThreadSafeStore: an informer's local cache (client-go's ThreadSafeStore / Indexer): objects by
// key, as shared read-only pointers, with optional secondary indexes.
//
// Objects are std::shared_ptr<const v1::Object>: a reader keeps what it got for as long as it
// likes, and nobody can change it. Keys are ObjectKey(metadata): shard, cluster, namespace and
// name joined by '\0' (common/object_key.h).
//
// Thread-safe: every method may be called from any thread; reads share a lock.
#ifndef SHARDCACHE_COMMON_CLIENT_THREAD_SAFE_STORE_H_
#define SHARDCACHE_COMMON_CLIENT_THREAD_SAFE_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/object_key.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class ThreadSafeStore {
 public:
  // An index function returns the index values of an object (e.g. its cluster).
  using IndexFunc = std::function<std::vector<std::string>(const v1::Object&)>;

  // Adds an index. REQUIRES: called before any object is added. Returns ALREADY_EXISTS for a
  // name in use.
  absl::Status AddIndex(const std::string& name, IndexFunc func);

  // Adds or replaces the object at its key.
  void Upsert(ObjectRef object);
  // Removes the object with this key, if present.
  void Delete(const std::string& key);
  // Replaces the whole content (after a relist).
  void Replace(std::vector<ObjectRef> objects);

  ObjectRef Get(const std::string& key) const;  // null when absent
  std::vector<ObjectRef> List() const;
  std::vector<std::string> Keys() const;
  size_t Size() const;
  // The objects whose index `name` has `value`. Empty for an unknown index.
  std::vector<ObjectRef> ByIndex(const std::string& name, const std::string& value) const;

 private:
  void IndexLocked(const std::string& key, const v1::Object& o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnindexLocked(const std::string& key, const v1::Object& o)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, ObjectRef> objects_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, IndexFunc> index_funcs_ ABSL_GUARDED_BY(mu_);
  // index name -> value -> keys
  std::map<std::string, std::map<std::string, std::set<std::string>>> indexes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_THREAD_SAFE_STORE_H_
