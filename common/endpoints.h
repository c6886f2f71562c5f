// Endpoints: the gRPC channel target for one or several host:port endpoints of one service (etcd's
// members, cache_server replicas), for a channel that goes to whichever of them answers.
//
// An endpoint is host:port, where host is an IPv4 address, an IPv6 address in brackets, or a DNS
// name. One name goes to gRPC as it is (dns:///name:port: gRPC's resolver follows every address
// the name has, and its changes). Several endpoints become one address list (ipv4:a:p,b:q or
// ipv6:...); the names among them are resolved once, here (getaddrinfo), so a member that later
// moves to another address is not followed. TLS checks the servers' certificates against one name
// per channel: `authority`, the first endpoint's host:port.
//
// Pure functions (MakeChannelTarget may resolve names); thread-safe.
#ifndef SHARDCACHE_COMMON_ENDPOINTS_H_
#define SHARDCACHE_COMMON_ENDPOINTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardcache {

struct ChannelTarget {
  // The channel's target.
  std::string uri;
  // The authority to set on the channel (GRPC_ARG_DEFAULT_AUTHORITY); empty: the target's own.
  std::string authority;
};

// The target for `endpoints`. Errors name the endpoint with `what` (e.g. "etcd endpoint"):
// INVALID_ARGUMENT for one that is not host:port, or a mix of IPv4-only and IPv6-only ones;
// UNAVAILABLE when a name among several does not resolve.
absl::StatusOr<ChannelTarget> MakeChannelTarget(const std::vector<std::string>& endpoints,
                                                absl::string_view what);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_ENDPOINTS_H_
