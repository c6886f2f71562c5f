// KubeRenderCache: see kube_render_cache.h.
#include "cache_server/kube_render_cache.h"

#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace shardcache {

KubeRenderCache::Rendered KubeRenderCache::Get(absl::string_view view,
                                               absl::string_view object_json,
                                               const std::function<std::string()>& render) {
  std::string key = absl::StrCat(view, "\n", object_json);
  Shard& shard = shards_[absl::HashOf(key) % kShards];
  {
    absl::MutexLock l(&shard.mu);
    if (auto it = shard.entries.find(key); it != shard.entries.end()) return it->second;
  }
  auto rendered = std::make_shared<const std::string>(render());
  absl::MutexLock l(&shard.mu);
  auto [it, inserted] = shard.entries.emplace(key, rendered);
  if (!inserted) return it->second;
  shard.order.push_back(std::move(key));
  if (shard.order.size() > per_shard_) {
    shard.entries.erase(shard.order.front());
    shard.order.pop_front();
  }
  return rendered;
}

}  // namespace shardcache
