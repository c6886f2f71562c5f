// DynamicInformerFactory: the informers of one store, run for as long as they are used
// (client-go's dynamic shared informer factory plus discovery of what the store serves).
//
// It knows which resources the store serves:
//   * built-in resources (resourcedefinitions, leases, clustercachedresources) always;
//   * following definitions (a shard store): the resources that the store's ResourceDefinitions
//     (core.shardcache.io/v1 resourcedefinitions) define, in the versions they mark served. The
//     factory runs its own informer on those definitions;
//   * otherwise (a cache store, which serves anything): the resources it is told with
//     ServeAlways(gvr).
//
// ForResource(gvr, filters) returns the one running informer for that resource and filters,
// starting it on first use. It is never tied to leadership: it runs for as long as somebody
// holds it, as below. For a resource that is not served it returns NOT_FOUND, never a stopped
// informer. When a
// resource stops being served (its definition deleted, or its version no longer served), the
// factory drops its informers from its map at once (a recreated definition gets NEW informers)
// and stops them with NOT_FOUND; an informer whose reflector gets NOT_FOUND by itself is dropped
// too. Either way the informer's users are told through SharedInformer::OnStopped.
//
// Use counting and release. The shared_ptr that ForResource returns, and every copy of it, is a
// handle: the factory counts the handles of each informer (they share one use count, apart from
// the informer's own internal references, e.g. its delivery threads'). Once the last handle is
// gone, the informer is unused; if it stays unused for Options::release_after (on the informers'
// Clock), the factory drops it from its map and stops it (CANCELLED, "released"), which ends its
// reflector (its thread, or its turns on Options::informer.pool) and its watch stream. A
// ForResource call within that grace period takes the same running informer back (no new list or
// watch); one after the release gets a fresh running informer. So:
//   * an informer is released only when nobody holds it: one held for the life of the process
//     (e.g. a replicator's CCR informers) is never released, and a user that holds its handle
//     is never told that it stopped because of a release. Hold the handle for as long as you use
//     the informer: a Registration or an OnStopped Subscription alone does not keep it running;
//   * a release is not a resource being unserved: subscribers hear nothing about it;
//   * ForResource never returns a released (or otherwise stopped) informer: the release takes it
//     out of the map, under the same lock, before stopping it.
// The handles may outlive the factory (its destructor stops the informers anyway); dropping one
// then does nothing.
//
// Metrics (Options::registry): shardcache_informer_factory_informers{factory=Options::name},
// the informers that the factory runs now (held, or unused within their grace period), the
// definitions informer not counted; InformerCount() is the same number.
//
// Subscribe(listener) reports resource lifecycle events (served, unserved). A new subscriber is
// first told about every resource already served (as kServed events), then every change, in
// order. Listeners are called from one notifier thread, one event at a time, with no lock held.
// The thread is the factory's own, not the one that changes what is served: changes are seen
// under the factory's lock, and calling listeners on the changing threads in that order would
// make those threads wait for one another's listeners (see Notifier in the .cc).
//
// Discovery can lag the store: right after a definition is created, ForResource may still say
// NOT_FOUND; subscribers hear kServed once the factory has seen it.
//
// Where the informers list and watch is the factory's source (ListerWatcherSource): over a
// store's stub (Create(stub, ...)) in the programs, or scripted ListerWatchers in tests
// (common/testing/scripted_source.h).
//
// Thread-safety: every method may be called from any thread (including from listeners and from
// informer handlers), and a handle may be dropped on any thread, with any lock held that the
// factory's own calls do not take (the drop takes the factory's lock briefly; releases are done by
// the factory's release thread, which stops and destroys the informers). Nothing here takes a
// leadership context: the factory lives for the whole process; its destructor (process exit,
// tests) stops every informer it started.
#ifndef SHARDCACHE_COMMON_CLIENT_DYNAMIC_INFORMER_FACTORY_H_
#define SHARDCACHE_COMMON_CLIENT_DYNAMIC_INFORMER_FACTORY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/client/lister_watcher.h"
#include "common/client/shared_informer.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache {

// A resource lifecycle event.
struct ResourceEvent {
  enum class Type {
    kServed,    // the store serves the resource (now, or already when the subscriber joined)
    kUnserved,  // it stopped serving it (definition deleted, or version no longer served)
  };
  Type type;
  v1::GroupVersionResource resource;
};

// Makes the ListerWatcher of one informer: `resource`'s objects that pass `filters`. Called
// under the factory's lock, from any thread: it must not block or call into the factory. Errors
// (e.g. INVALID_ARGUMENT) are ForResource's.
using ListerWatcherSource = std::function<absl::StatusOr<std::unique_ptr<ListerWatcher>>(
    const v1::GroupVersionResource& resource, const ListWatchFilters& filters)>;

class DynamicInformerFactory {
 public:
  struct Options {
    // True for a shard store: follow its ResourceDefinitions. False for a cache store: serve the
    // built-ins and what ServeAlways names.
    bool follow_definitions = true;
    // For every informer the factory starts (the definitions informer included); `name` is
    // ignored (each informer is named after its resource and filters).
    SharedInformer::Options informer;
    // For the StoreListerWatchers of Create(stub, ...); unused with another source.
    StoreListerWatcher::Options lister_watcher;
    // How long an informer that nobody holds keeps running before it is released (on
    // informer.clock), so that a user that lets go and comes back soon (a CCR deleted and
    // created again) does not restart its list and watch. Zero: released at once. Not negative.
    absl::Duration release_after = absl::Seconds(10);
    // The factory's label value in its metrics (e.g. "shard_store", "cache").
    std::string name;
    // Where its metrics are registered; null: none.
    std::shared_ptr<prometheus::Registry> registry;
  };

  // Validates the options and starts following the store (in follow_definitions mode, its
  // definitions informer starts now). `stub` is shared with the informers.
  static absl::StatusOr<std::unique_ptr<DynamicInformerFactory>> Create(
      std::shared_ptr<v1::Store::StubInterface> stub, Options options);
  // The same over any source of ListerWatchers.
  static absl::StatusOr<std::unique_ptr<DynamicInformerFactory>> Create(ListerWatcherSource source,
                                                                        Options options);
  // Stops every informer it started, the notifier thread and the release thread. REQUIRES: not
  // called from a subscriber's listener or from a handler of an informer of this factory.
  ~DynamicInformerFactory();
  DynamicInformerFactory(const DynamicInformerFactory&) = delete;
  DynamicInformerFactory& operator=(const DynamicInformerFactory&) = delete;

  // True once the factory knows what the store serves (the definitions' initial list has been
  // processed; at once when not following definitions).
  bool HasSynced() const;
  // Waits up to `timeout` (real time) for HasSynced().
  bool WaitForSync(absl::Duration timeout) const;

  // Not following definitions: from now on `resource` is served (subscribers hear kServed once).
  // FAILED_PRECONDITION when following definitions (there the definitions decide);
  // INVALID_ARGUMENT for a malformed resource.
  absl::Status ServeAlways(const v1::GroupVersionResource& resource);

  // The running informer for `resource` and `filters`, started if needed. Errors:
  //   NOT_FOUND           the resource is not served (as far as the factory has seen);
  //   UNAVAILABLE         the definitions are not synced yet, or no longer followed: retry;
  //   INVALID_ARGUMENT    a malformed resource or label selector;
  //   FAILED_PRECONDITION the factory is shutting down.
  // The informer may still stop later (e.g. its definition is deleted): use its OnStopped.
  // The result is a handle (see the file comment): the informer keeps running while it or a copy
  // of it is held, and is released some time after the last one is dropped.
  absl::StatusOr<std::shared_ptr<SharedInformer>> ForResource(
      const v1::GroupVersionResource& resource, const ListWatchFilters& filters = {});

  // The informers the factory runs now: held, or unused within their grace period (the
  // definitions informer not counted). What the metric exports.
  size_t InformerCount() const;

  bool IsServed(const v1::GroupVersionResource& resource) const;
  // Every served resource, built-ins included, sorted.
  std::vector<v1::GroupVersionResource> ServedResources() const;

  // Reports resource lifecycle events to `listener` (see above) until the Subscription is
  // cancelled or destroyed: a call in progress on the notifier thread is then waited for, unless
  // the cancel comes from inside the listener (common/callback_list.h).
  Subscription Subscribe(std::function<void(const ResourceEvent&)> listener);

  // The built-in resources, served by every store.
  static std::vector<v1::GroupVersionResource> BuiltInResources();
  // core.shardcache.io/v1 resourcedefinitions.
  static v1::GroupVersionResource DefinitionsResource();

  class Notifier;  // subscribers and their queued events (internal)
  class Handles;   // where handles report that they were dropped (internal)

 private:
  struct Entry {
    // The factory's own reference; the handles' deleters hold one more each.
    std::shared_ptr<SharedInformer> informer;
    Subscription on_stopped;
    // The handles handed out now (one shared use count); expired: unused.
    std::weak_ptr<SharedInformer> handle;
    // Tells the handles of this entry from the earlier ones (ids are never reused).
    uint64_t handle_id = 0;
    // When the last handle was dropped; absl::InfiniteFuture() while one is held.
    absl::Time unused_since = absl::InfiniteFuture();
  };

  DynamicInformerFactory(ListerWatcherSource source, Options options);
  absl::Status Start();
  std::shared_ptr<ResourceEventHandler> DefinitionsHandler();
  // The definitions informer's handler: `definition` (null: deleted) now serves what it says.
  void ApplyDefinition(const std::string& name, const v1::Object* definition);
  // Marks a resource served and tells the subscribers (if it was not served).
  void ServeLocked(const v1::GroupVersionResource& resource) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks a resource unserved, tells the subscribers, and drops its informers from the map:
  // the caller stops them after releasing mu_.
  std::vector<Entry> UnserveLocked(const v1::GroupVersionResource& resource)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An informer's OnStopped callback: drops it from the map if it is still there.
  void InformerStopped(const std::string& key, const SharedInformer* informer);
  absl::StatusOr<std::shared_ptr<SharedInformer>> NewInformer(
      const v1::GroupVersionResource& resource, const ListWatchFilters& filters);
  // A new handle of `entry` (the one held now, if any, is returned instead).
  std::shared_ptr<SharedInformer> HandleLocked(const std::string& key, Entry* entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The last handle `id` of `key`'s informer was dropped: the grace period starts.
  void HandleDropped(const std::string& key, uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // The release thread: waits for the end of the earliest grace period, then releases.
  void RunReleases() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the unused informers whose grace period has ended out of the map.
  std::vector<Entry> TakeExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The end of the earliest grace period running (absl::InfiniteFuture(): none).
  absl::Time NextReleaseLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The gauge follows the map.
  void UpdateGaugeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const ListerWatcherSource source_;
  const Options options_;
  prometheus::Gauge* const informers_gauge_;  // null without a registry
  // Provide their own synchronization.
  const std::shared_ptr<Notifier> notifier_;
  const std::shared_ptr<Handles> handles_;

  // Set by Start(), then constant.
  std::shared_ptr<SharedInformer> definitions_;
  std::unique_ptr<SharedInformer::Registration> definitions_registration_;
  Subscription definitions_stopped_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status definitions_lost_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  // Served resources other than the built-ins, by key "group/version/resource".
  std::map<std::string, v1::GroupVersionResource> served_ ABSL_GUARDED_BY(mu_);
  // Definition name -> the keys of the resources it serves.
  std::map<std::string, std::set<std::string>> definitions_served_ ABSL_GUARDED_BY(mu_);
  // Running informers by key "group/version/resource|filters".
  std::map<std::string, Entry> informers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_handle_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped when a grace period starts, so that the release thread computes its deadline again.
  uint64_t releases_changed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread release_thread_;  // started by Start(), joined by the destructor
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_DYNAMIC_INFORMER_FACTORY_H_
