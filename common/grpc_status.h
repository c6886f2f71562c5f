// Conversion between absl::Status (used everywhere inside shardcache) and the statuses that cross
// the wire: grpc::Status (a call's end) and the code, message and details of one answer of a
// Write stream (v1::WriteResponse). Only the service boundary and the clients use these.
//
// The canonical codes are the same numbers everywhere; the message is kept as it is. An
// absl::Status's payloads (the machine-readable details, see common/error_info.h) travel as the
// details of a google.rpc.Status: a payload under type URL U with bytes B is the detail
// google.protobuf.Any{type_url: U, value: B}. A grpc::Status carries that google.rpc.Status,
// serialized, as its binary error details (gRPC sends them in the "grpc-status-details-bin"
// trailer, which grpcurl prints under "Details:"); a WriteResponse carries the Anys in `details`.
// So ToGrpcStatus then FromGrpcStatus gives back an equal absl::Status, payloads included.
//
// Thread-safe: pure functions.
#ifndef SHARDCACHE_COMMON_GRPC_STATUS_H_
#define SHARDCACHE_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "google/rpc/status.pb.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

grpc::Status ToGrpcStatus(const absl::Status& status);
// Details that are not a parseable google.rpc.Status are ignored (code and message are kept).
absl::Status FromGrpcStatus(const grpc::Status& status);

// The google.rpc.Status of a status: code, message, and one detail per payload.
google::rpc::Status ToStatusProto(const absl::Status& status);
absl::Status FromStatusProto(const google::rpc::Status& proto);

// Sets `answer`'s code, message and details from `status` (code 0 and nothing else when OK).
void SetWriteAnswerStatus(const absl::Status& status, v1::WriteResponse* answer);
// The status of one answer of a Write stream: code, message and details.
absl::Status WriteAnswerStatus(const v1::WriteResponse& answer);

// `status` with its message replaced by `message`: same code, same payloads. For callers that
// add context to an error without losing what a program can read from it.
absl::Status WithMessage(const absl::Status& status, absl::string_view message);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_GRPC_STATUS_H_
