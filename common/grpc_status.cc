#include "common/grpc_status.h"

#include <string>
#include <utility>

#include "absl/strings/cord.h"

namespace shardcache {
namespace {

void AddDetails(const absl::Status& status,
                google::protobuf::RepeatedPtrField<google::protobuf::Any>* details) {
  status.ForEachPayload([details](absl::string_view type_url, const absl::Cord& payload) {
    google::protobuf::Any* any = details->Add();
    any->set_type_url(std::string(type_url));
    any->set_value(std::string(payload));
  });
}

absl::Status WithDetails(absl::Status status,
                         const google::protobuf::RepeatedPtrField<google::protobuf::Any>& details) {
  if (status.ok()) return status;
  for (const google::protobuf::Any& any : details) {
    status.SetPayload(any.type_url(), absl::Cord(any.value()));
  }
  return status;
}

}  // namespace

google::rpc::Status ToStatusProto(const absl::Status& status) {
  google::rpc::Status proto;
  proto.set_code(static_cast<int>(status.code()));
  proto.set_message(std::string(status.message()));
  AddDetails(status, proto.mutable_details());
  return proto;
}

absl::Status FromStatusProto(const google::rpc::Status& proto) {
  return WithDetails(absl::Status(static_cast<absl::StatusCode>(proto.code()), proto.message()),
                     proto.details());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  auto code = static_cast<grpc::StatusCode>(status.code());
  google::rpc::Status proto = ToStatusProto(status);
  if (proto.details().empty()) return grpc::Status(code, proto.message());
  return grpc::Status(code, proto.message(), proto.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status result(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  google::rpc::Status proto;
  if (status.error_details().empty() || !proto.ParseFromString(status.error_details())) {
    return result;
  }
  return WithDetails(std::move(result), proto.details());
}

void SetWriteAnswerStatus(const absl::Status& status, v1::WriteResponse* answer) {
  answer->set_code(static_cast<int>(status.code()));
  answer->set_message(std::string(status.message()));
  answer->clear_details();
  AddDetails(status, answer->mutable_details());
}

absl::Status WriteAnswerStatus(const v1::WriteResponse& answer) {
  if (answer.code() == 0) return absl::OkStatus();
  return WithDetails(absl::Status(static_cast<absl::StatusCode>(answer.code()), answer.message()),
                     answer.details());
}

absl::Status WithMessage(const absl::Status& status, absl::string_view message) {
  absl::Status result(status.code(), message);
  if (result.ok()) return result;
  status.ForEachPayload([&result](absl::string_view type_url, const absl::Cord& payload) {
    result.SetPayload(type_url, payload);
  });
  return result;
}

}  // namespace shardcache
