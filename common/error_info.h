// Machine-readable reasons of errors: a google.rpc.ErrorInfo attached to an absl::Status.
//
// A program decides what to do from a status's code and, where the code alone does not say it,
// from its ErrorInfo's reason; never from the wording of its message, which is for people and
// may change. The ErrorInfo is the status's payload under kErrorInfoTypeUrl (the serialized
// message), so it crosses the wire with the status (common/grpc_status.h): in a unary call's
// "grpc-status-details-bin" trailer and in a Write stream answer's `details`.
//
// Reasons (domain kErrorDomain):
//   FENCED  FAILED_PRECONDITION: the write or claim carries an epoch lower than the one the store
//           holds for its shard (a newer leader holds the shard). Metadata: "shard", the shard;
//           "epoch", the store's epoch for it; "requestEpoch", the epoch the request carried.
//   NO_SPACE RESOURCE_EXHAUSTED: the disk of the store's data directory has less free space than
//           the store keeps in reserve; writes are refused until space is freed (reads, watches
//           and deletes go on). Metadata: "freeBytes", the free space seen; "reserveBytes", the
//           reserve.
//
//   absl::Status s = client->Update(req);
//   if (IsFenced(s)) resign();
//
// Thread-safe: pure functions.
#ifndef SHARDCACHE_COMMON_ERROR_INFO_H_
#define SHARDCACHE_COMMON_ERROR_INFO_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/rpc/error_details.pb.h"

namespace shardcache {

inline constexpr char kErrorInfoTypeUrl[] = "type.googleapis.com/google.rpc.ErrorInfo";
inline constexpr char kErrorDomain[] = "shardcache.io";
inline constexpr char kReasonFenced[] = "FENCED";
inline constexpr char kReasonNoSpace[] = "NO_SPACE";

// `status` with `info` attached (replacing any ErrorInfo it had). OK stays OK.
absl::Status WithErrorInfo(absl::Status status, const google::rpc::ErrorInfo& info);
// The ErrorInfo attached to `status`, if any (and parseable).
std::optional<google::rpc::ErrorInfo> GetErrorInfo(const absl::Status& status);
// True when `status` carries an ErrorInfo of kErrorDomain with this reason.
bool HasReason(const absl::Status& status, absl::string_view reason);

// The FAILED_PRECONDITION of a request for `shard` that carries `request_epoch` while the store
// holds `epoch`; `message` is the human-readable text.
absl::Status FencedError(absl::string_view message, absl::string_view shard, int64_t epoch,
                         int64_t request_epoch);
// The RESOURCE_EXHAUSTED of a write refused because the disk has `free_bytes` free, below
// `reserve_bytes`; `message` is the human-readable text.
absl::Status NoSpaceError(absl::string_view message, uint64_t free_bytes, uint64_t reserve_bytes);

// True when the status says fenced: reason FENCED of kErrorDomain.
bool IsFenced(const absl::Status& status);
bool IsFenced(const grpc::Status& status);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_ERROR_INFO_H_
