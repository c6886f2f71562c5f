#include "cache_server/watcher.h"

namespace shardcache {

const Delivery& EventForms::Get(v1::WatchEvent::Type type) {
  std::call_once(once_[type], [&] {
    ObjectRef object = EffectiveObject(*event_, type);
    EncodedEvent encoded = chunks_->Write(event_->group_resource, type, *object);
    deliveries_[type] =
        Delivery{type, std::move(object), std::move(encoded.bare), std::move(encoded.element)};
  });
  return *deliveries_[type];
}

}  // namespace shardcache
