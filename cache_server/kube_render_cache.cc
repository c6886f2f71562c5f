// KubeRenderCache: see kube_render_cache.h.
#include "cache_server/kube_render_cache.h"

#include <utility>

#include "absl/hash/hash.h"

namespace shardcache {

KubeRenderCache::Rendered KubeRenderCache::Get(absl::string_view view, const ObjectRef& object,
                                               const std::function<std::string()>& render) {
  Key key(object.get(), std::string(view));
  Shard& shard = shards_[absl::HashOf(key.first) % kShards];
  {
    absl::MutexLock l(&shard.mu);
    if (auto it = shard.entries.find(key); it != shard.entries.end()) return it->second.rendered;
  }
  auto rendered = std::make_shared<const std::string>(render());
  absl::MutexLock l(&shard.mu);
  auto [it, inserted] = shard.entries.emplace(key, Entry{object, rendered});
  if (!inserted) return it->second.rendered;
  shard.order.push_back(std::move(key));
  if (shard.order.size() > per_shard_) {
    shard.entries.erase(shard.order.front());
    shard.order.pop_front();
  }
  return rendered;
}

}  // namespace shardcache
