#include "cache_server/authorizer.h"

#include <google/protobuf/util/message_differencer.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache_server/resource_registry.h"

namespace shardcache {
namespace {

bool HasGroup(const PeerIdentity& who, const char* group) {
  return std::find(who.groups.begin(), who.groups.end(), group) != who.groups.end();
}

// The metadata of a delegated call (Authorizer::Delegate). Binary ("-bin") keys, so that any
// certificate name passes unchanged.
constexpr char kDelegationTokenKey[] = "shardcache-delegation-token-bin";
constexpr char kDelegatedUserKey[] = "shardcache-delegated-user-bin";
constexpr char kDelegatedGroupKey[] = "shardcache-delegated-group-bin";

std::string MakeDelegationToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // Without randomness, no token can be trusted: delegation is then never accepted.
    return "";
  }
  return std::string(reinterpret_cast<const char*>(bytes), sizeof(bytes));
}

// Compares in time independent of where they differ.
bool SameSecret(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string DescribeIdentity(const PeerIdentity& who) {
  return absl::StrCat("user \"", who.user,
                      "\" (groups: ", who.groups.empty() ? "none" : absl::StrJoin(who.groups, ", "),
                      ")");
}

}  // namespace

Authorizer::Authorizer(Options options, Getter getter, prometheus::Registry& registry)
    : options_(std::move(options)),
      getter_(std::move(getter)),
      delegation_token_(MakeDelegationToken()),
      decisions_(prometheus::BuildCounter()
                     .Name("shardcache_authorization_decisions_total")
                     .Help("Authorization decisions on Store calls (and on each write of a Write "
                           "stream), by verb and decision (allow or deny)")
                     .Register(registry)),
      unauthenticated_(prometheus::BuildCounter()
                           .Name("shardcache_unauthenticated_requests_total")
                           .Help("Store calls refused with UNAUTHENTICATED: the client presented "
                                 "no certificate (an untrusted one fails the TLS handshake: "
                                 "shardcache_tls_handshake_failures_total)")
                           .Register(registry)
                           .Add({})) {}

std::optional<PeerIdentity> Authorizer::Identify(const grpc::ServerContextBase& ctx) const {
  const auto& metadata = ctx.client_metadata();
  if (auto token = metadata.find(kDelegationTokenKey); token != metadata.end()) {
    auto user = metadata.find(kDelegatedUserKey);
    if (!delegation_token_.empty() && user != metadata.end() &&
        SameSecret(absl::string_view(token->second.data(), token->second.size()),
                   delegation_token_)) {
      PeerIdentity who;
      who.user = std::string(user->second.data(), user->second.size());
      auto groups = metadata.equal_range(kDelegatedGroupKey);
      for (auto it = groups.first; it != groups.second; ++it) {
        who.groups.emplace_back(it->second.data(), it->second.size());
      }
      return who;
    }
  }
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr) return std::nullopt;
  return PeerIdentityOf(*auth);
}

void Authorizer::Delegate(const PeerIdentity& who, grpc::ClientContext* ctx) const {
  ctx->AddMetadata(kDelegationTokenKey, delegation_token_);
  ctx->AddMetadata(kDelegatedUserKey, who.user);
  for (const std::string& group : who.groups) ctx->AddMetadata(kDelegatedGroupKey, group);
}

std::string Authorizer::DescribeResource(const Attributes& a) {
  std::string resource = a.resource.group().empty()
                             ? a.resource.resource()
                             : absl::StrCat(a.resource.resource(), ".", a.resource.group());
  if (a.status) absl::StrAppend(&resource, "/status");
  std::string out = absl::StrCat("resource \"", resource, "\"");
  if (a.verb == "claim") return absl::StrCat("the epoch of shard \"", a.name, "\"");
  if (!a.name.empty()) {
    absl::StrAppend(&out, " object \"", a.cluster, "|",
                    a.ns.empty() ? a.name : absl::StrCat(a.ns, "/", a.name), "\"");
  } else if (!a.cluster.empty() || !a.ns.empty()) {
    absl::StrAppend(&out, " in \"", a.cluster, "|", a.ns, "\"");
  }
  if (!a.shard.empty()) absl::StrAppend(&out, " of shard \"", a.shard, "\"");
  return out;
}

absl::Status Authorizer::Check(const std::optional<PeerIdentity>& who, const Attributes& a) const {
  if (!who.has_value()) {
    unauthenticated_.Increment();
    spdlog::info("authorization: unauthenticated {} of {}: no client certificate", a.verb,
                 DescribeResource(a));
    return absl::UnauthenticatedError(
        absl::StrCat("no client certificate: cannot ", a.verb, " ", DescribeResource(a)));
  }
  std::string why_not = Decide(*who, a);
  decisions_.Add({{"verb", a.verb}, {"decision", why_not.empty() ? "allow" : "deny"}}).Increment();
  if (why_not.empty()) {
    spdlog::debug("authorization: allowed {} to {} {}", DescribeIdentity(*who), a.verb,
                  DescribeResource(a));
    return absl::OkStatus();
  }
  std::string message = absl::StrCat(DescribeIdentity(*who), " cannot ", a.verb, " ",
                                     DescribeResource(a), ": ", why_not);
  spdlog::info("authorization: denied: {}", message);
  return absl::PermissionDeniedError(message);
}

std::string Authorizer::Decide(const PeerIdentity& who, const Attributes& a) const {
  if (HasGroup(who, kAdminsGroup)) return "";
  if (HasGroup(who, kReplicatorsGroup) && absl::StartsWith(who.user, kReplicatorUserPrefix) &&
      who.user.size() > sizeof(kReplicatorUserPrefix) - 1) {
    return DecideReplicator(who.user.substr(sizeof(kReplicatorUserPrefix) - 1), a);
  }
  if (HasGroup(who, kReadersGroup)) {
    return a.read() ? "" : "readers may only get, list and watch";
  }
  return absl::StrCat("no role: the certificate's groups (O) name none of ", kAdminsGroup, ", ",
                      kReplicatorsGroup, " (with user ", kReplicatorUserPrefix, "<shard>), ",
                      kReadersGroup);
}

std::string Authorizer::DecideReplicator(const std::string& shard, const Attributes& a) const {
  if (a.read()) return "";
  std::string who = absl::StrCat("replicators of shard \"", shard, "\"");
  if (a.verb == "claim") {
    if (a.name == shard) return "";
    return absl::StrCat(who, " may claim only shard \"", shard, "\"'s epoch");
  }
  if (a.fence != nullptr && !a.fence->shard().empty() && a.fence->shard() != shard) {
    return absl::StrCat(who, " may write only under shard \"", shard, "\"'s fence, not shard \"",
                        a.fence->shard(), "\"'s");
  }
  if (options_.role == Role::kCache) {
    if (a.shard == shard) return "";
    return absl::StrCat(who, " may write only objects whose metadata.shard is \"", shard, "\"");
  }
  // Shard role.
  if (options_.shard != shard) {
    return absl::StrCat("this is shard \"", options_.shard, "\"'s store: ", who,
                        " may only read it");
  }
  const std::string& group = a.resource.group();
  const std::string& resource = a.resource.resource();
  if (group == kLeaseGroup && resource == kLeaseResource && !a.status &&
      a.cluster == options_.lease_cluster && a.ns == options_.lease_namespace &&
      a.name == options_.lease_name) {
    return "";
  }
  if (group == kCcrGroup && resource == kCcrResource) {
    if (a.verb == "update" && a.status) return "";
    if (a.verb == "update" && a.update != nullptr) {
      std::string why_not = OnlyFinalizersChange(a.update);
      if (why_not.empty()) return "";
      return absl::StrCat(who,
                          " may change only the finalizers of a clustercachedresource: ", why_not);
    }
  }
  return absl::StrCat("in shard \"", shard, "\"'s store, ", who, " may write only their lease \"",
                      options_.lease_cluster, "|", options_.lease_namespace, "/",
                      options_.lease_name,
                      "\" and the status and finalizers of clustercachedresources");
}

std::string Authorizer::OnlyFinalizersChange(v1::UpdateRequest* req) const {
  v1::GetRequest get;
  *get.mutable_resource() = req->resource();
  get.set_shard(req->object().metadata().shard());
  get.set_cluster(req->object().metadata().cluster());
  get.set_namespace_(req->object().metadata().namespace_());
  get.set_name(req->object().metadata().name());
  absl::StatusOr<ObjectRef> current = getter_(get);
  if (!current.ok()) {
    return absl::StrCat("the object cannot be read (", current.status().message(), ")");
  }
  const std::string& wanted_rv = req->object().metadata().resource_version();
  const std::string& current_rv = (*current)->metadata().resource_version();
  // An update of another version fails with a conflict in the store and changes nothing.
  if (!wanted_rv.empty() && wanted_rv != current_rv) return "";
  v1::Object before = **current;
  v1::Object after = req->object();
  for (v1::Object* o : {&before, &after}) {
    o->mutable_metadata()->clear_finalizers();
    o->mutable_metadata()->clear_resource_version();
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(before, after)) {
    return "the update changes more than metadata.finalizers";
  }
  if (wanted_rv.empty())
    req->mutable_object()->mutable_metadata()->set_resource_version(current_rv);
  return "";
}

absl::Status Authorizer::CheckGet(const std::optional<PeerIdentity>& who,
                                  const v1::GetRequest& req) const {
  return Check(who, {"get", false, req.resource(), req.shard(), req.cluster(), req.namespace_(),
                     req.name()});
}

absl::Status Authorizer::CheckList(const std::optional<PeerIdentity>& who,
                                   const v1::ListRequest& req) const {
  return Check(who,
               {"list", false, req.resource(), req.shard(), req.cluster(), req.namespace_(), ""});
}

absl::Status Authorizer::CheckWatch(const std::optional<PeerIdentity>& who,
                                    const v1::WatchRequest& req) const {
  return Check(who,
               {"watch", false, req.resource(), req.shard(), req.cluster(), req.namespace_(), ""});
}

template <typename Request>
Authorizer::Attributes Authorizer::ObjectWrite(const char* verb, bool status, const Request& req) {
  const v1::ObjectMeta& m = req.object().metadata();
  Attributes a{verb, status, req.resource(), m.shard(), m.cluster(), m.namespace_(), m.name()};
  if (req.has_fence()) a.fence = &req.fence();
  return a;
}

absl::Status Authorizer::CheckCreate(const std::optional<PeerIdentity>& who,
                                     const v1::CreateRequest& req) const {
  return Check(who, ObjectWrite("create", false, req));
}

absl::Status Authorizer::CheckUpdate(const std::optional<PeerIdentity>& who,
                                     v1::UpdateRequest* req) const {
  Attributes a = ObjectWrite("update", false, *req);
  a.update = req;
  return Check(who, a);
}

absl::Status Authorizer::CheckUpdateStatus(const std::optional<PeerIdentity>& who,
                                           const v1::UpdateRequest& req) const {
  return Check(who, ObjectWrite("update", true, req));
}

absl::Status Authorizer::CheckUpsert(const std::optional<PeerIdentity>& who,
                                     const v1::UpdateRequest& req) const {
  return Check(who, ObjectWrite("upsert", false, req));
}

absl::Status Authorizer::CheckDelete(const std::optional<PeerIdentity>& who,
                                     const v1::DeleteRequest& req) const {
  Attributes a{"delete",         false,     req.resource(), req.shard(), req.cluster(),
               req.namespace_(), req.name()};
  if (req.has_fence()) a.fence = &req.fence();
  return Check(who, a);
}

absl::Status Authorizer::CheckClaimEpoch(const std::optional<PeerIdentity>& who,
                                         const v1::ClaimEpochRequest& req) const {
  Attributes a;
  a.verb = "claim";
  a.name = req.fence().shard();
  a.fence = &req.fence();
  return Check(who, a);
}

absl::Status Authorizer::CheckWrite(const std::optional<PeerIdentity>& who,
                                    v1::WriteRequest* req) const {
  switch (req->operation_case()) {
    case v1::WriteRequest::kCreate:
      return CheckCreate(who, req->create());
    case v1::WriteRequest::kUpdate:
      return CheckUpdate(who, req->mutable_update());
    case v1::WriteRequest::kUpdateStatus:
      return CheckUpdateStatus(who, req->update_status());
    case v1::WriteRequest::kUpsert:
      return CheckUpsert(who, req->upsert());
    case v1::WriteRequest::kDelete:
      return CheckDelete(who, req->delete_());
    case v1::WriteRequest::OPERATION_NOT_SET:
      return absl::OkStatus();  // answered INVALID_ARGUMENT by the service
  }
  return absl::OkStatus();
}

absl::Status AuthorizeCall(const Authorizer* authorizer, const grpc::ServerContextBase& ctx,
                           absl::string_view method, google::protobuf::Message* req) {
  if (authorizer == nullptr) return absl::OkStatus();
  std::optional<PeerIdentity> who = authorizer->Identify(ctx);
  if (method == "Get") return authorizer->CheckGet(who, *static_cast<v1::GetRequest*>(req));
  if (method == "List") return authorizer->CheckList(who, *static_cast<v1::ListRequest*>(req));
  if (method == "Watch") return authorizer->CheckWatch(who, *static_cast<v1::WatchRequest*>(req));
  if (method == "Create") {
    return authorizer->CheckCreate(who, *static_cast<v1::CreateRequest*>(req));
  }
  if (method == "Update") return authorizer->CheckUpdate(who, static_cast<v1::UpdateRequest*>(req));
  if (method == "UpdateStatus") {
    return authorizer->CheckUpdateStatus(who, *static_cast<v1::UpdateRequest*>(req));
  }
  if (method == "Delete") {
    return authorizer->CheckDelete(who, *static_cast<v1::DeleteRequest*>(req));
  }
  if (method == "ClaimEpoch") {
    return authorizer->CheckClaimEpoch(who, *static_cast<v1::ClaimEpochRequest*>(req));
  }
  return absl::PermissionDeniedError(absl::StrCat("no policy for method ", method));
}

}  // namespace shardcache
