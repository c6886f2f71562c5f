#include "common/lease_lock.h"

#include <grpcpp/client_context.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace shardcache {
namespace {

constexpr char kHolderIdentity[] = "holderIdentity";
constexpr char kLeaseDurationSeconds[] = "leaseDurationSeconds";
constexpr char kAcquireTime[] = "acquireTime";
constexpr char kRenewTime[] = "renewTime";
constexpr char kLeaseTransitions[] = "leaseTransitions";

using google::protobuf::Struct;
using google::protobuf::Value;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, ": Invalid value: ", what));
}

// The field's value, or null when absent or JSON null.
const Value* FindField(const Struct& spec, const char* field) {
  auto it = spec.fields().find(field);
  if (it == spec.fields().end() || it->second.kind_case() == Value::kNullValue) return nullptr;
  return &it->second;
}

absl::Status ReadTime(const Struct& spec, const char* field, absl::Time* out) {
  const Value* v = FindField(spec, field);
  if (v == nullptr) return absl::OkStatus();
  if (v->kind_case() != Value::kStringValue) return FieldError(field, "must be a string");
  if (v->string_value().empty()) return absl::OkStatus();
  absl::StatusOr<absl::Time> t = ParseMicroTime(v->string_value());
  if (!t.ok()) return FieldError(field, t.status().message());
  *out = *t;
  return absl::OkStatus();
}

// A non-negative number; `integer` also requires a whole one.
absl::Status ReadNumber(const Struct& spec, const char* field, bool integer, double* out) {
  const Value* v = FindField(spec, field);
  if (v == nullptr) return absl::OkStatus();
  if (v->kind_case() != Value::kNumberValue || !std::isfinite(v->number_value()) ||
      v->number_value() < 0 || (integer && std::floor(v->number_value()) != v->number_value())) {
    return FieldError(field,
                      integer ? "must be a non-negative integer" : "must be a non-negative number");
  }
  *out = v->number_value();
  return absl::OkStatus();
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

absl::StatusOr<absl::Time> ParseMicroTime(absl::string_view s) {
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, s, &t, &err)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", s, "\": not an RFC 3339 time (", err, ")"));
  }
  return t;
}

Struct RecordToSpec(const LeaderElectionRecord& record) {
  Struct spec;
  auto& f = *spec.mutable_fields();
  f[kHolderIdentity].set_string_value(record.holder_identity);
  f[kLeaseDurationSeconds].set_number_value(
      std::ceil(absl::ToDoubleSeconds(record.lease_duration)));
  if (record.acquire_time != absl::InfinitePast()) {
    f[kAcquireTime].set_string_value(FormatMicroTime(record.acquire_time));
  }
  if (record.renew_time != absl::InfinitePast()) {
    f[kRenewTime].set_string_value(FormatMicroTime(record.renew_time));
  }
  f[kLeaseTransitions].set_number_value(static_cast<double>(record.leader_transitions));
  return spec;
}

absl::StatusOr<LeaderElectionRecord> RecordFromSpec(const Struct& spec) {
  LeaderElectionRecord r;
  if (const Value* v = FindField(spec, kHolderIdentity); v != nullptr) {
    if (v->kind_case() != Value::kStringValue)
      return FieldError(kHolderIdentity, "must be a string");
    r.holder_identity = v->string_value();
  }
  double seconds = 0;
  if (absl::Status s = ReadNumber(spec, kLeaseDurationSeconds, false, &seconds); !s.ok()) return s;
  r.lease_duration = absl::Seconds(seconds);
  if (absl::Status s = ReadTime(spec, kAcquireTime, &r.acquire_time); !s.ok()) return s;
  if (absl::Status s = ReadTime(spec, kRenewTime, &r.renew_time); !s.ok()) return s;
  double transitions = 0;
  if (absl::Status s = ReadNumber(spec, kLeaseTransitions, true, &transitions); !s.ok()) return s;
  r.leader_transitions = static_cast<int64_t>(transitions);
  return r;
}

LeaseLock::LeaseLock(std::shared_ptr<v1::Store::StubInterface> stub, Options options)
    : stub_(std::move(stub)), options_(std::move(options)) {}

v1::GroupVersionResource LeaseLock::Resource() {
  v1::GroupVersionResource gvr;
  gvr.set_group("coordination.shardcache.io");
  gvr.set_version("v1");
  gvr.set_resource("leases");
  return gvr;
}

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
