// EtcdClient: cache_server's connection to an etcd cluster, over etcd's v3 gRPC API (the stubs
// are generated at build time from the protos that Debian's golang-etcd-server-dev ships; see
// proto/CMakeLists.txt).
//
// One gRPC channel to every endpoint (round robin: a member that is down is skipped, and a call
// that fails on one member because it is unreachable or has lost the cluster's leader may be
// retried by the caller on the next). TLS when Options::ca_file is set, with a client certificate
// when cert_file and key_file are; the files are read again when they change (common/tls.h).
//
// Endpoints are host:port, where host is an IPv4 address, an IPv6 address in brackets, or a DNS
// name. IP addresses, or one name (which gRPC's resolver then follows), go to gRPC as they are.
// Several endpoints that include names are resolved once, by Create (getaddrinfo), so a member
// that later moves to another address is not followed. gRPC checks a member's TLS certificate
// against one name per channel: the first endpoint's host (etcd's certificates usually name
// every member, or one common name).
//
// Every call and watch asks for a member that has a leader (etcd's "hasleader" metadata, as
// clientv3.WithRequireLeader): a member that knows it has no leader fails a call at once with
// UNAVAILABLE ("etcdserver: no leader"), and ends its watch streams after three election
// timeouts without one; they then reopen, on another member if one answers. Connections are
// kept alive with HTTP/2 pings every 10 s (etcd's default enforcement allows one per 5 s); a
// connection whose ping goes unanswered for 5 s is closed.
//
// What it guarantees:
// - Every unary call has a deadline (Options::request_timeout); an error carries etcd's code and
//   its message prefixed with "etcd: " (UNAVAILABLE when no member answers in time, as etcd's
//   own clients report it).
// - Txn, Range and Compact are etcd's linearizable operations (Range with serializable=false).
// - An EtcdWatch delivers the events of its range in revision order, with no gap and no
//   duplicate, across broken streams: it reopens its stream by itself from the revision after the
//   last one it delivered, and ends (Handler::OnEnd) only when its next revision has been
//   compacted (OUT_OF_RANGE), when etcd refuses the watch for another reason, or on Stop.
//   (One exception, see EtcdWatch: a revision learnt from RequestProgress is not resumed from.)
//
// Thread-safety: every method is thread-safe. Asynchronous callbacks run on gRPC's threads and
// must not block.
//
// Lifetime: destroy the client and its watches on threads of your own, not in a TxnAsync callback
// or a watch handler. The client's destructor waits for the TxnAsync calls in flight to call back
// (at most request_timeout), and a watch's Stop for its stream to end, so that the channel is
// always released on the caller's thread: with gRPC 1.51, the last reference to a channel dropped
// on one of gRPC's callback threads crashes the process (docs/grpc-1.51.md).
#ifndef SHARDCACHE_CACHE_SERVER_ETCD_CLIENT_H_
#define SHARDCACHE_CACHE_SERVER_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"

namespace shardcache {

class EtcdWatch;

class EtcdClient {
 public:
  struct Options {
    // host:port of each member (at least one).
    std::vector<std::string> endpoints;
    // TLS: the CA that signed the members' certificates (empty: plaintext), and this client's
    // certificate and key (both or neither).
    std::string ca_file;
    std::string cert_file;
    std::string key_file;
    // The deadline of each unary call.
    absl::Duration request_timeout = absl::Seconds(5);
  };

  // Validates the options (endpoints well formed, TLS files readable) and makes the channel. It
  // does not connect: the first call does. Errors: INVALID_ARGUMENT naming the endpoint or the
  // file that is wrong; UNAVAILABLE when a name among several endpoints does not resolve.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(Options options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const Options& options() const { return options_; }

  // KV.Txn, asynchronously: `done` runs once, on a gRPC thread (never inside TxnAsync).
  using TxnCallback = std::function<void(absl::StatusOr<etcdserverpb::TxnResponse>)>;
  void TxnAsync(etcdserverpb::TxnRequest request, TxnCallback done);
  // KV.Compact (physical=false), asynchronously, as TxnAsync; a revision that is already
  // compacted is not an error.
  void CompactAsync(int64_t revision, std::function<void(absl::Status)> done);
  // Blocking calls. Errors: etcd's (e.g. "etcd: etcdserver: request is too large"), or
  // UNAVAILABLE when no member could be reached or none answered within request_timeout (the
  // call may then have been applied or not).
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request);
  // Range's deadline is the earlier of `deadline` and request_timeout from now; so is
  // CurrentRevision's.
  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& request,
                                                    absl::Time deadline = absl::InfiniteFuture());
  // Maintenance.Status of whichever member the channel picks.
  absl::StatusOr<etcdserverpb::StatusResponse> Status();

  // The cluster's current revision: the header of a linearizable Range of `key` (limit 1,
  // keys only), which goes through etcd's leader (KEP-2340's way of learning it).
  absl::StatusOr<int64_t> CurrentRevision(const std::string& key,
                                          absl::Time deadline = absl::InfiniteFuture());

  // Opens a watch of [key, range_end) from `start_revision` (> 0), with progress notifications
  // on. See EtcdWatch. The watch may outlive this client. `handler` must outlive the watch's
  // Stop. A start_revision <= 0 ends the watch at once: OnEnd(INVALID_ARGUMENT), before Watch
  // returns.
  class WatchHandler {
   public:
    virtual ~WatchHandler() = default;
    // Events, in revision order (several may share one revision: one transaction's changes),
    // then `revision`: every change in the range up to it has been delivered. With events it is
    // the last event's revision (etcd's response header may name a later one while it is still
    // catching up, so that is not used); a progress notification has no events and carries the
    // revision of the whole store. Never decreases. Called from one thread at a time, never
    // after OnEnd.
    virtual void OnEvents(const std::vector<mvccpb::Event>& events, int64_t revision) = 0;
    // The watch has ended for good (never after Stop returned): OUT_OF_RANGE when its next
    // revision was compacted (the message names etcd's compacted revision), or etcd's error.
    virtual void OnEnd(absl::Status status) = 0;
  };
  std::unique_ptr<EtcdWatch> Watch(std::string key, std::string range_end, int64_t start_revision,
                                   WatchHandler* handler);

  // The key just after every key with prefix `prefix` (etcd's range_end for a prefix); "\0"
  // (every key from `key` on) when there is none.
  static std::string PrefixEnd(const std::string& prefix);

 private:
  EtcdClient(Options options, std::shared_ptr<grpc::Channel> channel);
  // Sets the deadline (the earlier of `deadline` and request_timeout from now) and the metadata.
  void PrepareContext(grpc::ClientContext* ctx, absl::Time deadline = absl::InfiniteFuture()) const;
  // Starts a unary call with `start(context, request, response, on_status)` (a stub's async()
  // method); `done` gets the response or the error, once, on a gRPC thread. Counted in
  // calls_in_flight_.
  template <typename Request, typename Response, typename Start>
  void CallAsync(Request request, Start start, std::function<void(absl::StatusOr<Response>)> done);

  // Constant after construction.
  const Options options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  const std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance_;

  absl::Mutex mu_;
  // Asynchronous calls whose callback has not finished; the destructor waits for 0.
  int calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

// One watch (EtcdClient::Watch). It runs on gRPC's callback API: no thread of its own. A stream
// that breaks (a member stopped or lost its leader, a network error) is reopened after a backoff
// (100 ms, doubling to 2 s, reset once a stream has been up for 10 s), with no handler call for
// the break; while it is down nothing is delivered. Its handler's methods run on gRPC's threads,
// one at a time, in order.
//
// The stream is reopened from the revision after the last event delivered or after the last
// progress notification that etcd sent on its own (those are ordered with the events), whichever
// is later. A progress notification asked for with RequestProgress is delivered but not resumed
// from: etcd before 3.4.25 and 3.5.8 (Debian 12 ships 3.4.23) may answer a progress request
// before events of revisions up to the one it names (etcd issue 15220), and such events, should
// the stream break in between, would otherwise be skipped. The same bug means that on those
// versions a RequestProgress answer may name a revision whose events arrive just after it.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  // Asks etcd for a progress notification (OnEvents with no events and the current revision),
  // as Kubernetes' consistent reads from cache do. Nothing happens while the stream is down or
  // after the watch ended. Several requests before an answer may get one answer.
  virtual void RequestProgress() = 0;
  // Ends the watch; once it returns no handler method runs or will run. Must not be called from
  // a handler method (it then returns without waiting, so it does not deadlock, and the watch
  // ends soon after). Idempotent; the destructor calls it.
  virtual void Stop() = 0;
  // The last revision delivered (OnEvents' `revision`), or start_revision - 1.
  virtual int64_t revision() const = 0;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_ETCD_CLIENT_H_
