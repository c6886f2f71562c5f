#include "cache_server/watcher.h"

namespace shardcache {

const Delivery& EventForms::Get(v1::WatchEvent::Type type, ObjectEncoding encoding) {
  const int e = static_cast<int>(encoding);
  std::call_once(once_[e][type], [&] {
    ObjectRef object = EffectiveObject(*event_, type);
    EncodedEvent encoded = chunks_->Write(event_->group_resource, type, *object, encoding);
    deliveries_[e][type] =
        Delivery{type, std::move(object), std::move(encoded.bare), std::move(encoded.element)};
  });
  return *deliveries_[e][type];
}

}  // namespace shardcache
