// KubeRenderCache: the Kubernetes JSON of recent watch events, shared by the watches of the
// Kubernetes view (kube_api_server.h), so that an event that a thousand watchers receive is
// rendered once, not a thousand times, and each of them only copies the line.
//
// An entry is keyed by the object (the store's shared, immutable version of it: one version of
// one object is one ObjectRef, which every watcher of the event receives) and by a view: what
// the caller renders it as (the view's apiVersion, kind and the event's type). An entry holds its
// object, so that its address is not reused while the entry lives. At most `capacity` entries are
// kept; the oldest leaves first.
//
// Thread-safe: any thread; entries are spread over shards with a lock each.
#ifndef SHARDCACHE_CACHE_SERVER_KUBE_RENDER_CACHE_H_
#define SHARDCACHE_CACHE_SERVER_KUBE_RENDER_CACHE_H_

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/object_key.h"

namespace shardcache {

class KubeRenderCache {
 public:
  using Rendered = std::shared_ptr<const std::string>;

  explicit KubeRenderCache(size_t capacity = 4096) : per_shard_(capacity / kShards + 1) {}

  // The rendering of `object` for `view`: the cached one, or `render()`'s (which is then kept).
  // `render` may run at the same time in two threads for one key; both results are equal.
  Rendered Get(absl::string_view view, const ObjectRef& object,
               const std::function<std::string()>& render);

 private:
  static constexpr size_t kShards = 16;
  using Key = std::pair<const v1::Object*, std::string>;
  struct Entry {
    ObjectRef object;  // keeps the key's address from being reused
    Rendered rendered;
  };
  struct Shard {
    absl::Mutex mu;
    absl::flat_hash_map<Key, Entry> entries ABSL_GUARDED_BY(mu);
    std::deque<Key> order ABSL_GUARDED_BY(mu);  // oldest first
  };
  const size_t per_shard_;
  std::array<Shard, kShards> shards_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_KUBE_RENDER_CACHE_H_
