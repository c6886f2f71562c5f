// Target: one server under load behind the few operations that store_bench's loads use (create,
// get, list, watch), so that the same load code drives cache_server's Store API and etcd's KV
// and Watch API, and their figures can be set side by side.
//
// A cache_server target maps each operation to one Store call (Create, Get, List of the bench
// resource, Watch of the bench resource). An etcd target stores each object serialized (the same
// v1::Object bytes that cache_server receives) under a Kubernetes-style key,
// /registry/<group>/<resource>/<cluster>/<namespace>/<name>, and maps create to KV.Put, get to a
// KV.Range of that key, list to a KV.Range of the resource's prefix (linearizable, as the
// Kubernetes API server reads), and watch to one Watch stream with one prefix watch from now.
// etcd's create is a plain Put (not the Kubernetes API server's create-if-absent Txn).
//
// Thread-safety: every method may be called from any thread, concurrently. Callbacks run on
// gRPC's threads (a watch's on its H2Client's, when it goes through one); those of one watch
// stream run one at a time.
#ifndef SHARDCACHE_BENCH_TARGET_H_
#define SHARDCACHE_BENCH_TARGET_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/h2_client.h"
#include "bench/watch_wire.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::bench {

// What a watch delivers to its load. Called on the client's threads (gRPC's, or an H2Client's),
// one call at a time per stream.
// Watches read their messages' wire bytes with the scanners of watch_wire.h (the same work per
// event for every target) and hand over only the facts the load needs.
class WatchHandler {
 public:
  virtual ~WatchHandler() = default;
  // The watch is in place: every write answered from now on will be delivered (cache_server: the
  // initial-events-end bookmark; etcd: the created response).
  virtual void OnSynced() = 0;
  // One change: `created` when it made a new object (cache_server: ADDED; etcd: a PUT of the
  // key's first version), the revision at which it happened, the object's facts (bench false if
  // it is not a bench object or could not be read), and when its message was received
  // (NowNanos(); the same for every event of one message).
  virtual void OnEvent(bool created, int64_t revision, const ObjectFacts& object,
                       int64_t received_ns) = 0;
  // The stream has ended, with this status (cancelled by Cancel, or ended by the server). Nothing
  // is called after it; the stream may then be destroyed.
  virtual void OnEnded(const grpc::Status& status) = 0;
};

// One open watch. Destroy it only after its handler's OnEnded.
class WatchStream {
 public:
  virtual ~WatchStream() = default;
  // Ends the stream from the client's side; OnEnded follows.
  virtual void Cancel() = 0;
  // Messages received so far (a batch is one message). Read it only after the handler's OnEnded.
  virtual int64_t messages() const = 0;
};

class Target {
 public:
  enum class Kind { kCacheServer, kEtcd };
  using Done = std::function<void(const grpc::Status& status)>;

  virtual ~Target() = default;

  virtual Kind kind() const = 0;
  // "cache_server" or "etcd".
  std::string Name() const { return kind() == Kind::kCacheServer ? "cache_server" : "etcd"; }
  // How many channels (connections) the operations are spread over; `slot` picks
  // slot % slots().
  virtual int slots() const = 0;

  // Creates request.object() in request.resource() (a key that does not exist yet). `done` runs
  // once, on a gRPC thread, when the server has answered or the deadline `timeout` from now has
  // passed.
  virtual void Create(int slot, v1::CreateRequest request, absl::Duration timeout, Done done) = 0;
  // Reads the object whose metadata is `key` (cluster, namespace, name); `found` tells whether it
  // was there.
  virtual void Get(int slot, const v1::ObjectMeta& key, absl::Duration timeout,
                   std::function<void(const grpc::Status& status, bool found)> done) = 0;
  // Lists every object of the bench resource, in one response; `items` is how many came.
  virtual void List(int slot, absl::Duration timeout,
                    std::function<void(const grpc::Status& status, int64_t items)> done) = 0;
  // Opens a watch of bench resource `resource` (BenchResource(resource)) from now. It has no
  // deadline: it runs until Cancel, or until the server ends it.
  virtual std::unique_ptr<WatchStream> Watch(int slot, int resource, WatchHandler* handler) = 0;

  // cache_server only: the Store stub of `slot`, for loads that use calls other targets do not
  // have (the Write stream); nullptr for etcd.
  virtual v1::Store::Stub* StoreStub(int /*slot*/) { return nullptr; }
};

// A cache_server (Store API) over `channels` (at least one). Its watches start with the current
// state (one ADDED event per object, then the initial-events-end bookmark), or, with
// `watch_from_now`, as etcd's do: every change after the store's revision when the target's
// first watch opened, and nothing before.
// With `batch_events`, its watches ask for batches (WatchRequest.batch_events: several events in
// one message when the server has more than one waiting), as etcd sends them.
// With a `watch_client`, watches go through it (watch `slot` on its connection
// slot % connections()) instead of through gRPC; the other operations always use the channels.
std::unique_ptr<Target> MakeStoreTarget(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                        bool watch_from_now = false, bool batch_events = false,
                                        std::shared_ptr<H2Client> watch_client = nullptr);

// An etcd (v3 gRPC API) over `channels` (at least one); `watch_client` as for MakeStoreTarget.
std::unique_ptr<Target> MakeEtcdTarget(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                       std::shared_ptr<H2Client> watch_client = nullptr);

// The etcd key of an object of `resource` with metadata `meta`, and the prefix of every key of
// `resource` (bench resource 0 by default).
std::string EtcdKey(const v1::GroupVersionResource& resource, const v1::ObjectMeta& meta);
std::string EtcdPrefix(const v1::GroupVersionResource& resource);
std::string EtcdPrefix();

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_TARGET_H_
