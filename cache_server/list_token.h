// List continue tokens: where a paginated List stopped, handed to the client and back.
//
// A token names the revision of the list's first page (every later page reads at it, so the
// pages together are one consistent snapshot) and the key of the last object returned (the next
// page starts after it). It is opaque to clients: URL-safe base64, as Kubernetes' continue
// tokens are; it is not signed, and needs not be: a token edited into another valid one only
// asks for another page of objects the caller may list anyway.
//
// What it guarantees: DecodeContinueToken(EncodeContinueToken(r, k)) gives back r and k for
// every positive r and every key; anything else that is not such a token is refused with
// INVALID_ARGUMENT naming the field (continue_token) and what to do.
//
// Thread-safety: pure functions; any thread.
#ifndef SHARDCACHE_CACHE_SERVER_LIST_TOKEN_H_
#define SHARDCACHE_CACHE_SERVER_LIST_TOKEN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace shardcache {

// Where a paginated List continues.
struct ListPosition {
  // The revision every page of the list reads at (positive).
  int64_t revision = 0;
  // The key of the last object returned; the next page starts after it.
  std::string last_key;
};

// The token for the page after `last_key`, of a list at `revision`. REQUIRES: revision > 0.
std::string EncodeContinueToken(int64_t revision, const std::string& last_key);

// The position a token names, or INVALID_ARGUMENT ("continue_token: Invalid value: malformed
// ...") for anything EncodeContinueToken did not make.
absl::StatusOr<ListPosition> DecodeContinueToken(const std::string& token);

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_LIST_TOKEN_H_
