#include "common/error_info.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace shardcache {

absl::Status WithErrorInfo(absl::Status status, const google::rpc::ErrorInfo& info) {
  if (status.ok()) return status;
  status.SetPayload(kErrorInfoTypeUrl, absl::Cord(info.SerializeAsString()));
  return status;
}

std::optional<google::rpc::ErrorInfo> GetErrorInfo(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kErrorInfoTypeUrl);
  if (!payload.has_value()) return std::nullopt;
  google::rpc::ErrorInfo info;
  if (!info.ParseFromString(std::string(*payload))) return std::nullopt;
  return info;
}

bool HasReason(const absl::Status& status, absl::string_view reason) {
  std::optional<google::rpc::ErrorInfo> info = GetErrorInfo(status);
  return info.has_value() && info->domain() == kErrorDomain && info->reason() == reason;
}

namespace {

// `status` with an ErrorInfo of kErrorDomain: `reason` and `metadata`.
absl::Status WithReason(absl::Status status, absl::string_view reason,
                        std::initializer_list<std::pair<const char*, std::string>> metadata) {
  google::rpc::ErrorInfo info;
  info.set_reason(std::string(reason));
  info.set_domain(kErrorDomain);
  for (const auto& [key, value] : metadata) (*info.mutable_metadata())[key] = value;
  return WithErrorInfo(std::move(status), info);
}

}  // namespace

absl::Status FencedError(absl::string_view message, absl::string_view shard, int64_t epoch,
                         int64_t request_epoch) {
  return WithReason(absl::FailedPreconditionError(message), kReasonFenced,
                    {{"shard", std::string(shard)},
                     {"epoch", absl::StrCat(epoch)},
                     {"requestEpoch", absl::StrCat(request_epoch)}});
}

absl::Status NoSpaceError(absl::string_view message, uint64_t free_bytes, uint64_t reserve_bytes) {
  return WithReason(
      absl::ResourceExhaustedError(message), kReasonNoSpace,
      {{"freeBytes", absl::StrCat(free_bytes)}, {"reserveBytes", absl::StrCat(reserve_bytes)}});
}

bool IsFenced(const absl::Status& status) { return HasReason(status, kReasonFenced); }

bool IsFenced(const grpc::Status& status) { return IsFenced(FromGrpcStatus(status)); }

}  // namespace shardcache
