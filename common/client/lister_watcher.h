// ListerWatcher: the only part of the informer machinery that talks to the store (client-go's
// cache.ListerWatcher). A Reflector lists through it, then watches through it.
//
//   absl::StatusOr<v1::ListResponse> page = lw->List(500, "");        // one page; blocks
//   std::unique_ptr<AsyncWatchEventStream> w = lw->Watch(page->resource_version());
//   w->Start([&] { Wake(); });                                         // never blocks
//   v1::WatchEvent e;
//   while (w->Next(&e) == AsyncWatchEventStream::Poll::kEvent) { ... }
//   // kPending: wait for Wake(); kEnded: w->Finish() says why
//
// StoreListerWatcher implements it for one resource (GroupVersionResource) and its filters over
// a shardcache.v1.Store stub. Errors are the store's codes as absl::Status: NOT_FOUND (the
// resource is not served, or stopped being served), OUT_OF_RANGE (too old resource version: list
// again), INVALID_ARGUMENT, UNAVAILABLE / DEADLINE_EXCEEDED (retry), CANCELLED (Shutdown or
// AsyncWatchEventStream::Cancel was called).
//
// Store identity: a List answer (ListResponse.store_id) and every watch event (WatchEvent.store_id)
// name the store that sent them, and so do the response headers of a watch
// (AsyncWatchEventStream::StoreId, before any event); the Reflector compares them (see
// reflector.h).
//
// Its watches are AsyncWatchStreams (async_watch_stream.h): no thread waits for them; gRPC's
// threads store what arrives and wake the reader, which takes the events when it runs. They ask
// the store for batched events and unpack them, so a Reflector sees one event at a time whatever
// the store sent; watch_stats() counts what they received. They also ask for periodic bookmarks
// (WatchRequest.allow_bookmarks), which the store sends only to watches that ask: the
// Reflector's resourceVersion stays recent and its watch_idle_timeout sees the stream alive while
// nothing changes (reflector.h).
//
// Thread-safety: a ListerWatcher may be called from any thread, and Shutdown() from any thread at
// any time. An AsyncWatchEventStream's Start, Next, StoreId and Finish are for one reader at a
// time; Cancel may be called from any thread, at any time before the stream is destroyed.
#ifndef SHARDCACHE_COMMON_CLIENT_LISTER_WATCHER_H_
#define SHARDCACHE_COMMON_CLIENT_LISTER_WATCHER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/client/async_watch_stream.h"
#include "common/client/watch_stream.h"
#include "shardcache/v1/store.grpc.pb.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

class ListerWatcher {
 public:
  virtual ~ListerWatcher() = default;

  // One page of at most `limit` objects (0: no limit), continuing `continue_token` (empty: the
  // first page). The response's resource_version is the revision of the whole snapshot; its
  // continue_token is empty on the last page.
  virtual absl::StatusOr<v1::ListResponse> List(int64_t limit,
                                                const std::string& continue_token) = 0;
  // A watch of the changes after `resource_version` (which must not be empty: a reflector
  // always watches from a list's or an event's revision), not yet started (the reader calls
  // Start). Never null; an error to open shows as Next() returning kEnded and Finish() returning
  // it. Never blocks. The stream may outlive this object.
  virtual std::unique_ptr<AsyncWatchEventStream> Watch(const std::string& resource_version) = 0;
  // Cancels the List calls and watch streams in flight, and makes every later call fail at once
  // with CANCELLED. Permanent. Any thread; idempotent.
  virtual void Shutdown() = 0;
  // What is listed and watched, for messages: "widgets.example.com/v1 cluster=c1".
  virtual std::string Describe() const = 0;
};

// Filters of a List or Watch: each empty field means "any".
struct ListWatchFilters {
  std::string shard;
  std::string cluster;
  std::string namespace_;
  // A Kubernetes label selector, e.g. "app=web,tier!=db".
  std::string label_selector;

  // "shard=a cluster=c1 namespace=ns labelSelector=app=web" (only the set fields); "" for none.
  std::string ToString() const;
  bool operator==(const ListWatchFilters& o) const {
    return shard == o.shard && cluster == o.cluster && namespace_ == o.namespace_ &&
           label_selector == o.label_selector;
  }
};

// Lists and watches one resource of a shardcache store through its gRPC stub.
class StoreListerWatcher final : public ListerWatcher {
 public:
  struct Options {
    // Deadline of each List call (one page).
    absl::Duration list_timeout = absl::Seconds(30);
    // Deadline of each watch stream: after it (plus up to the same again, at random, so that
    // many watchers do not reconnect at once) the stream ends with DEADLINE_EXCEEDED and the
    // reflector resumes from its last resourceVersion. Bounds how long a watch can sit on a
    // connection that died without the client noticing. Zero: no deadline.
    absl::Duration watch_timeout = absl::Minutes(5);
  };

  // Validates the resource (version and resource required), the label selector and the options:
  // INVALID_ARGUMENT naming the field. `stub` is shared: it may serve other callers too.
  static absl::StatusOr<std::unique_ptr<StoreListerWatcher>> Create(
      std::shared_ptr<v1::Store::StubInterface> stub, v1::GroupVersionResource resource,
      ListWatchFilters filters, Options options);
  // Shuts down: cancels what is in flight.
  ~StoreListerWatcher() override;

  absl::StatusOr<v1::ListResponse> List(int64_t limit, const std::string& continue_token) override;
  std::unique_ptr<AsyncWatchEventStream> Watch(const std::string& resource_version) override;
  void Shutdown() override;
  std::string Describe() const override;

  // "widgets.example.com/v1" ("widgets/v1" for the core group).
  static std::string ResourceName(const v1::GroupVersionResource& gvr);

  // What the watches opened so far received (messages, events, batches), in all. Any thread.
  WatchStreamStats watch_stats() const { return watch_counters_->Get(); }

 private:
  StoreListerWatcher(std::shared_ptr<v1::Store::StubInterface> stub,
                     v1::GroupVersionResource resource, ListWatchFilters filters, Options options);

  // Sets a List or Watch request's resource and filters to this ListerWatcher's.
  template <typename Request>
  void SetResourceAndFilters(Request* req) const {
    *req->mutable_resource() = resource_;
    req->set_shard(filters_.shard);
    req->set_cluster(filters_.cluster);
    req->set_namespace_(filters_.namespace_);
    req->set_label_selector(filters_.label_selector);
  }

  // Constant after construction.
  const std::shared_ptr<v1::Store::StubInterface> stub_;
  const v1::GroupVersionResource resource_;
  const ListWatchFilters filters_;
  const Options options_;
  // Provide their own synchronization; shared with the open streams, which may outlive us.
  const std::shared_ptr<CallSet> calls_;
  const std::shared_ptr<WatchStreamCounters> watch_counters_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_LISTER_WATCHER_H_
