// Random identifiers: object uids (metadata.uid) and store identities (PersistedState::store_id).
//
// What it guarantees: a version 4 (random) RFC 4122 UUID in its canonical lower-case form,
// "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx" with y one of 8, 9, a, b, as Kubernetes uids are; 122
// random bits, so two are never the same in practice.
//
// Thread-safety: any thread.
#ifndef SHARDCACHE_CACHE_SERVER_UUID_H_
#define SHARDCACHE_CACHE_SERVER_UUID_H_

#include <string>

namespace shardcache {

std::string NewUuid();

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_UUID_H_
