#include "common/client/lease_lock.h"

#include <grpcpp/client_context.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/resources.h"
#include "common/status_macros.h"
#include "common/struct_codec.h"
#include "common/validation.h"
#include "shardcache/types/v1/types.pb.h"

namespace shardcache {
namespace {

using google::protobuf::Struct;

// An RFC 3339 time, or the reason it is not one.
absl::StatusOr<absl::Time> ParseRfc3339(absl::string_view path, absl::string_view value) {
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, value, &t, &err)) {
    return FieldInvalid(path, value, absl::StrCat("not an RFC 3339 time (", err, ")"));
  }
  return t;
}

// An RFC 3339 time field: "" or absent is absl::InfinitePast() (never).
absl::Status ReadTime(const std::string& value, const char* field, absl::Time* out) {
  if (value.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(*out, ParseRfc3339(absl::StrCat("spec.", field), value));
  return absl::OkStatus();
}

absl::Status NotNegative(const char* field, double value) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return FieldInvalidRendered(absl::StrCat("spec.", field), absl::StrCat(value),
                              "must not be negative");
}

std::unique_ptr<grpc::ClientContext> CallContext(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

}  // namespace

bool LeaderElectionRecord::operator==(const LeaderElectionRecord& o) const {
  return holder_identity == o.holder_identity && lease_duration == o.lease_duration &&
         acquire_time == o.acquire_time && renew_time == o.renew_time &&
         leader_transitions == o.leader_transitions;
}

std::string FormatMicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d%ET%H:%M:%E6SZ", absl::FromUnixMicros(absl::ToUnixMicros(t)),
                          absl::UTCTimeZone());
}

absl::StatusOr<absl::Time> ParseMicroTime(absl::string_view s) { return ParseRfc3339("", s); }

Struct RecordToSpec(const LeaderElectionRecord& record) {
  types::v1::LeaseSpec spec;
  spec.set_holder_identity(record.holder_identity);
  spec.set_lease_duration_seconds(std::ceil(absl::ToDoubleSeconds(record.lease_duration)));
  if (record.acquire_time != absl::InfinitePast()) {
    spec.set_acquire_time(FormatMicroTime(record.acquire_time));
  }
  if (record.renew_time != absl::InfinitePast()) {
    spec.set_renew_time(FormatMicroTime(record.renew_time));
  }
  spec.set_lease_transitions(record.leader_transitions);
  return MessageToStruct(spec);
}

absl::StatusOr<LeaderElectionRecord> RecordFromSpec(const Struct& struct_spec) {
  // Lenient: a lease may carry fields this version does not know.
  types::v1::LeaseSpec spec;
  StructCodecOptions lenient;
  lenient.ignore_unknown_fields = true;
  RETURN_IF_ERROR(StructToMessage(struct_spec, "spec", &spec, lenient));
  LeaderElectionRecord r;
  r.holder_identity = spec.holder_identity();
  RETURN_IF_ERROR(NotNegative("leaseDurationSeconds", spec.lease_duration_seconds()));
  r.lease_duration = absl::Seconds(spec.lease_duration_seconds());
  RETURN_IF_ERROR(ReadTime(spec.acquire_time(), "acquireTime", &r.acquire_time));
  RETURN_IF_ERROR(ReadTime(spec.renew_time(), "renewTime", &r.renew_time));
  RETURN_IF_ERROR(NotNegative("leaseTransitions", static_cast<double>(spec.lease_transitions())));
  r.leader_transitions = spec.lease_transitions();
  return r;
}

LeaseLock::LeaseLock(std::shared_ptr<v1::Store::StubInterface> stub, Options options)
    : stub_(std::move(stub)), options_(std::move(options)) {}

v1::GroupVersionResource LeaseLock::Resource() { return LeaseResource(); }

std::string LeaseLock::Describe() const {
  return absl::StrCat(options_.cluster, "/", options_.ns, "/", options_.name);
}

void LeaseLock::Remember(const v1::Object& object) {
  absl::MutexLock l(&mu_);
  object_ = object;
  have_object_ = true;
}

absl::StatusOr<ObservedRecord> LeaseLock::Get() {
  v1::GetRequest req;
  *req.mutable_resource() = Resource();
  req.set_cluster(options_.cluster);
  req.set_namespace_(options_.ns);
  req.set_name(options_.name);
  v1::Object object;
  auto ctx = CallContext(options_.call_timeout);
  if (grpc::Status s = stub_->Get(ctx.get(), req, &object); !s.ok()) return FromGrpcStatus(s);
  absl::StatusOr<LeaderElectionRecord> record = RecordFromSpec(object.spec());
  if (!record.ok()) {
    return absl::Status(record.status().code(),
                        absl::StrCat(Describe(), ": ", record.status().message()));
  }
  Remember(object);
  return ObservedRecord{*std::move(record), object.metadata().resource_version()};
}

absl::StatusOr<std::string> LeaseLock::Create(const LeaderElectionRecord& record) {
  v1::CreateRequest req;
  *req.mutable_resource() = Resource();
  v1::ObjectMeta& m = *req.mutable_object()->mutable_metadata();
  m.set_cluster(options_.cluster);
  m.set_namespace_(options_.ns);
  m.set_name(options_.name);
  *req.mutable_object()->mutable_spec() = RecordToSpec(record);
  v1::Object object;
  auto ctx = CallContext(options_.call_timeout);
  if (grpc::Status s = stub_->Create(ctx.get(), req, &object); !s.ok()) return FromGrpcStatus(s);
  Remember(object);
  return object.metadata().resource_version();
}

absl::StatusOr<std::string> LeaseLock::Update(const LeaderElectionRecord& record) {
  v1::UpdateRequest req;
  *req.mutable_resource() = Resource();
  {
    absl::MutexLock l(&mu_);
    if (!have_object_) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(), ": not read yet: call Get or Create before Update"));
    }
    // The last object seen, with its resourceVersion (and uid) as the precondition.
    *req.mutable_object() = object_;
  }
  *req.mutable_object()->mutable_spec() = RecordToSpec(record);
  v1::Object object;
  auto ctx = CallContext(options_.call_timeout);
  if (grpc::Status s = stub_->Update(ctx.get(), req, &object); !s.ok()) return FromGrpcStatus(s);
  Remember(object);
  return object.metadata().resource_version();
}

}  // namespace shardcache
