#include "cache_server/event.h"

namespace shardcache {

ObjectRef EffectiveObject(const Event& e, v1::WatchEvent::Type type) {
  if (type != v1::WatchEvent::DELETED || e.type != v1::WatchEvent::MODIFIED) return e.object;
  auto last = std::make_shared<v1::Object>(*e.prev);
  last->mutable_metadata()->set_resource_version(e.object->metadata().resource_version());
  return last;
}

v1::WatchEvent::Type EffectiveType(const Event& e, const ObjectFilter& filter) {
  bool now = filter.Matches(*e.object);
  bool before = e.prev != nullptr && filter.Matches(*e.prev);
  switch (e.type) {
    case v1::WatchEvent::ADDED:
      return now ? v1::WatchEvent::ADDED : v1::WatchEvent::TYPE_UNSPECIFIED;
    case v1::WatchEvent::MODIFIED:
      if (before && now) return v1::WatchEvent::MODIFIED;
      if (now) return v1::WatchEvent::ADDED;
      if (before) return v1::WatchEvent::DELETED;
      return v1::WatchEvent::TYPE_UNSPECIFIED;
    case v1::WatchEvent::DELETED:
      return (now || before) ? v1::WatchEvent::DELETED : v1::WatchEvent::TYPE_UNSPECIFIED;
    default:
      return v1::WatchEvent::TYPE_UNSPECIFIED;
  }
}

}  // namespace shardcache
