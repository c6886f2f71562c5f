// Authorizer: who may call what on a cache_server, decided from the caller's client certificate.
//
// The identity is the verified client certificate's (common/tls.h): user = CN, groups = O. The
// policy is small and fixed, in the spirit of Kubernetes' node authorizer: a shard's replicators
// may write only their own shard's part.
//
//   shardcache:admins (group)        everything
//   shardcache:readers (group)       get, list, watch
//   replicators of shard S           get, list, watch; and
//     (user shardcache:replicator:S    cache role: create, update, update status, upsert, delete
//      and group                       of objects whose metadata.shard is S (for a delete: the
//      shardcache:replicators)          request's shard), and ClaimEpoch for S only
//                                    shard role, in shard S's store (--shard=S): create, update,
//                                      upsert, delete of their lease (--replicator-lease), update
//                                      status of clustercachedresources, and update of a
//                                      clustercachedresource that changes nothing but its
//                                      finalizers; in another shard's store, nothing but reads
//   anyone else (a valid certificate) nothing
//
// A write that carries a fence must carry shard S's (a replicator of S cannot raise another
// shard's epoch through a write either). A denied request gets PERMISSION_DENIED with a message
// that names the identity, the verb and the resource, and is not applied: the check runs before
// the store is called. A request without a client certificate gets UNAUTHENTICATED. Every
// decision is logged at debug level, every denial at info, and counted in
// shardcache_authorization_decisions_total{verb,decision}.
//
// The finalizers-only check of a clustercachedresource update compares the request with the
// stored object; an update that names no resourceVersion is pinned to the version it was
// compared with, so a change between the check and the write makes it a conflict instead of
// letting it overwrite that change.
//
// Thread-safety: const after construction apart from metrics (thread-safe); Check* may be called
// from any thread concurrently.
#ifndef SHARDCACHE_CACHE_SERVER_AUTHORIZER_H_
#define SHARDCACHE_CACHE_SERVER_AUTHORIZER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_server/object_store.h"
#include "common/tls.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

inline constexpr char kAdminsGroup[] = "shardcache:admins";
inline constexpr char kReadersGroup[] = "shardcache:readers";
inline constexpr char kReplicatorsGroup[] = "shardcache:replicators";
inline constexpr char kReplicatorUserPrefix[] = "shardcache:replicator:";

class Authorizer {
 public:
  struct Options {
    // The store's role: decides which writes a replicator may make.
    Role role = Role::kCache;
    // Shard role: the shard whose store this is (required there).
    std::string shard;
    // Shard role: the lease the shard's replicators elect their leader with, as
    // cluster/namespace/name (their --lease-cluster, --lease-namespace, --lease-name).
    std::string lease_cluster = "root";
    std::string lease_namespace = "shardcache-system";
    std::string lease_name = "shard-replicator";
  };
  // Reads the current object, for the finalizers-only check.
  using Getter = std::function<absl::StatusOr<ObjectRef>(const v1::GetRequest&)>;

  Authorizer(Options options, Getter getter, prometheus::Registry& registry);

  // The caller of a call: its client certificate's identity, nullopt when it sent none; or,
  // for a call that carries this authorizer's delegation token (Delegate), the identity it
  // names.
  std::optional<PeerIdentity> Identify(const grpc::ServerContextBase& ctx) const;

  // Delegation, for a front end of this process that authenticated its own client (the
  // Kubernetes view over HTTPS, kube_api_server.h) and calls the Store service for it over an
  // in-process channel: makes `ctx` carry `who` and a secret token made when this authorizer
  // was, which never leaves the process, so that no other caller can claim an identity this way.
  void Delegate(const PeerIdentity& who, grpc::ClientContext* ctx) const;

  // OK, or UNAUTHENTICATED (no identity) or PERMISSION_DENIED saying who may not do what.
  absl::Status CheckGet(const std::optional<PeerIdentity>& who, const v1::GetRequest& req) const;
  absl::Status CheckList(const std::optional<PeerIdentity>& who, const v1::ListRequest& req) const;
  absl::Status CheckWatch(const std::optional<PeerIdentity>& who,
                          const v1::WatchRequest& req) const;
  absl::Status CheckCreate(const std::optional<PeerIdentity>& who,
                           const v1::CreateRequest& req) const;
  // `req` may be pinned to the compared resourceVersion (see above).
  absl::Status CheckUpdate(const std::optional<PeerIdentity>& who, v1::UpdateRequest* req) const;
  absl::Status CheckUpdateStatus(const std::optional<PeerIdentity>& who,
                                 const v1::UpdateRequest& req) const;
  absl::Status CheckUpsert(const std::optional<PeerIdentity>& who,
                           const v1::UpdateRequest& req) const;
  absl::Status CheckDelete(const std::optional<PeerIdentity>& who,
                           const v1::DeleteRequest& req) const;
  absl::Status CheckClaimEpoch(const std::optional<PeerIdentity>& who,
                               const v1::ClaimEpochRequest& req) const;
  // One write of a Write stream, by its operation.
  absl::Status CheckWrite(const std::optional<PeerIdentity>& who, v1::WriteRequest* req) const;

 private:
  // What a request asks for, as the policy sees it.
  struct Attributes {
    std::string verb;     // get, list, watch, create, update, upsert, delete, claim
    bool status = false;  // the status subresource
    v1::GroupVersionResource resource;
    std::string shard;  // the object's (or the request's filter's) shard
    std::string cluster;
    std::string ns;
    std::string name;
    const v1::Fence* fence = nullptr;
    v1::UpdateRequest* update = nullptr;  // for the finalizers-only check
    bool read() const { return verb == "get" || verb == "list" || verb == "watch"; }
  };

  // The attributes of a create, update or upsert (`req`: CreateRequest or UpdateRequest) of the
  // object it carries; `status`: of its status subresource.
  template <typename Request>
  static Attributes ObjectWrite(const char* verb, bool status, const Request& req);
  absl::Status Check(const std::optional<PeerIdentity>& who, const Attributes& a) const;
  // "" when allowed, else why not.
  std::string Decide(const PeerIdentity& who, const Attributes& a) const;
  std::string DecideReplicator(const std::string& shard, const Attributes& a) const;
  // "" when `req` changes nothing of the stored clustercachedresource but its finalizers.
  std::string OnlyFinalizersChange(v1::UpdateRequest* req) const;
  static std::string DescribeResource(const Attributes& a);

  const Options options_;
  const Getter getter_;
  // Random, made at construction (Delegate).
  const std::string delegation_token_;
  prometheus::Family<prometheus::Counter>& decisions_;
  prometheus::Counter& unauthenticated_;
};

// The service's hook: OK when `authorizer` is null (authorization off) or allows the call of
// `method` (a Store method name: "Get", ..., "ClaimEpoch"; not "Write", whose writes are checked
// one by one with CheckWrite) that `ctx` carries with request `req` (of that method's type).
absl::Status AuthorizeCall(const Authorizer* authorizer, const grpc::ServerContextBase& ctx,
                           absl::string_view method, google::protobuf::Message* req);

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_AUTHORIZER_H_
