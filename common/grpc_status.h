// Conversion between absl::Status (used everywhere inside shardcache) and grpc::Status (used only
// at the RPC boundary). The canonical codes are the same numbers in both; the message is kept.
//
// Thread-safe: pure functions.
#ifndef SHARDCACHE_COMMON_GRPC_STATUS_H_
#define SHARDCACHE_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace shardcache {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_GRPC_STATUS_H_
