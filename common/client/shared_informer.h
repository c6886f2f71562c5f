// SharedInformer: one resource's Reflector feeding a local cache (a ThreadSafeStore), and the
// event handlers of every user of that resource (client-go's SharedIndexInformer).
//
//   ASSIGN_OR_RETURN(auto informer, SharedInformer::Create(std::move(lw), {}));
//   RETURN_IF_ERROR(informer->Run());
//   ASSIGN_OR_RETURN(auto reg, informer->AddEventHandler(handler));   // FAILED_PRECONDITION
//   ...                                                              // if the informer stopped
//   reg.reset();   // or informer->RemoveEventHandler(reg.get()): no call after it returns
//
// Where it does better than client-go:
//   * A stopped informer refuses handlers: AddEventHandler returns FAILED_PRECONDITION saying it
//     is stopped and why, so a handler that would never be called is never accepted. Its users
//     are told when it stops (OnStopped), so they can stop too and be created again elsewhere.
//   * Each handler has a BOUNDED buffer. When a handler falls so far behind that its buffer is
//     full, its pending events are dropped and the registration is marked for a resync: when its
//     delivery thread next gets to it, the handler is brought to the cache's current state by
//     the difference between what it was last told and the cache (adds, updates with the old
//     object it saw, deletes with the last state it saw). Intermediate states are coalesced, as
//     after a relist; nothing is lost silently (a warning is logged and overflows() counts it),
//     and neither the reflector nor the other handlers ever wait for a slow handler.
//
// Threads: without a WorkerPool, the reflector has a thread of its own and each registration a
// delivery thread. On a WorkerPool (Options::pool), the informer has no thread at all: its
// reflector runs as turns on the pool (its watch read with gRPC's callback API, its waits on the
// pool's timer: reflector.h), and so does each registration's delivery: a turn delivers up to
// kEventsPerTurn events and then goes to the back of the pool's line, so that a busy registration
// does not hold back the others and handlers add no threads. Either way a handler is called one
// event at a time, in order. A handler added late (or before the first list) first receives every
// object in the cache as OnAdd(object, is_initial_list=true); its HasSynced() turns true once it
// has been given that initial list of a synced informer. After a relist, a handler receives the
// difference between what it saw and the new list. With HandlerOptions::resync_period, every
// object the handler knows is re-delivered as OnUpdate(object, object) that often (on the Clock).
//
// Lifetime: the informer stops when its reflector stops for good (e.g. NOT_FOUND: the resource's
// definition was deleted) or on Stop(). Then it never restarts: a user needs a new informer.
// After a stop, each registration still delivers the events it had queued, then its thread
// ends. Each delivery thread (or turn) holds a reference to the informer while it runs. The cache
// keeps the last state the informer saw, which may be stale: a watch that (re)starts after a
// definition was deleted gets NOT_FOUND at once, without the DELETED events. Treat a stopped
// informer's content as unknown.
//
// Thread-safety: every public method may be called from any thread, including from inside
// handlers and OnStopped callbacks (see RemoveEventHandler, and Subscription in
// common/callback_list.h, for the one rule).
#ifndef SHARDCACHE_COMMON_CLIENT_SHARED_INFORMER_H_
#define SHARDCACHE_COMMON_CLIENT_SHARED_INFORMER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/callback_list.h"
#include "common/client/lister_watcher.h"
#include "common/client/reflector.h"
#include "common/client/thread_safe_store.h"
#include "common/client/worker_pool.h"
#include "common/clock.h"

namespace shardcache {

// What an informer's user implements. Calls come from the registration's delivery thread, one
// at a time, in order. They may block (only that handler waits: see the buffer above).
class ResourceEventHandler {
 public:
  virtual ~ResourceEventHandler() = default;
  // An object appeared. `is_initial_list`: it is part of the state the handler is given when it
  // starts (before HasSynced() turns true).
  virtual void OnAdd(const ObjectRef& object, bool is_initial_list) = 0;
  // An object changed from `old_object` (the state this handler last saw) to `new_object`; the
  // same pointer twice for a periodic resync.
  virtual void OnUpdate(const ObjectRef& old_object, const ObjectRef& new_object) = 0;
  // An object went away; `object` is its last known state.
  virtual void OnDelete(const ObjectRef& object) = 0;
};

// A handler from functions; a function left empty ignores its events.
struct ResourceEventHandlerFuncs {
  std::function<void(const ObjectRef&, bool)> on_add;
  std::function<void(const ObjectRef&, const ObjectRef&)> on_update;
  std::function<void(const ObjectRef&)> on_delete;
};
std::shared_ptr<ResourceEventHandler> MakeHandler(ResourceEventHandlerFuncs funcs);

// client-go's FilteringResourceEventHandler: passes to `inner` only what `predicate` selects. An
// update that crosses the filter becomes an add (the object starts matching) or a delete of the
// old state (it stops matching): exactly "replicate what the selector selects".
class FilteringResourceEventHandler : public ResourceEventHandler {
 public:
  using Predicate = std::function<bool(const v1::Object&)>;
  FilteringResourceEventHandler(Predicate predicate, std::shared_ptr<ResourceEventHandler> inner);

  void OnAdd(const ObjectRef& object, bool is_initial_list) override;
  void OnUpdate(const ObjectRef& old_object, const ObjectRef& new_object) override;
  void OnDelete(const ObjectRef& object) override;

 private:
  const Predicate predicate_;
  const std::shared_ptr<ResourceEventHandler> inner_;
};

class SharedInformer : public std::enable_shared_from_this<SharedInformer>, private ReflectorSink {
 public:
  struct Options {
    // A name for logs and messages; empty: the ListerWatcher's Describe().
    std::string name;
    // The reflector's page size and backoff (its clock is `clock` below, its name `name`).
    Reflector::Options reflector;
    // The clock of the reflector's backoff waits and liveness timer and of periodic resyncs: they
    // all wait on it, so a FakeClock's Advance drives them. Must outlive the informer.
    const Clock* clock = RealClock::Get();
    // Secondary indexes of the cache (ThreadSafeStore::AddIndex).
    std::map<std::string, ThreadSafeStore::IndexFunc> indexers;
    // The buffer of each handler, in events, unless its HandlerOptions say otherwise.
    size_t handler_buffer = 1024;
    // Null: the reflector and each registration have a thread of their own. Set: the reflector
    // runs on the pool's threads and timer, the registrations are delivered on its threads, and
    // their periodic resyncs wait on its timer (its clock must be `clock`). Not owned; must
    // outlive the informer. A handler (or an OnStopped callback) that blocks holds one of the
    // pool's threads meanwhile.
    WorkerPool* pool = nullptr;
  };

  // On a pool, the events a registration is given in one turn before the others get theirs.
  static constexpr int kEventsPerTurn = 64;

  struct HandlerOptions {
    // Events this handler may have waiting before it is resynced instead; 0: the informer's
    // Options::handler_buffer.
    size_t buffer_size = 0;
    // Zero: none. Otherwise, every period (on the informer's clock, from when the handler
    // synced), each object the handler knows is re-delivered as OnUpdate(object, object).
    absl::Duration resync_period = absl::ZeroDuration();
  };

  class Listener;  // a registration's buffer and delivery thread or turns (internal)

  // One handler's registration. Destroying it removes the handler (as RemoveEventHandler).
  class Registration {
   public:
    ~Registration();
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

    // True once this handler has been given the initial list of a synced informer.
    bool HasSynced() const;
    // Waits up to `timeout` (real time) for HasSynced(); returns HasSynced() on timeout or as
    // soon as the informer stops.
    bool WaitForSync(absl::Duration timeout) const;
    // How many times this handler's buffer overflowed and it was resynced from the cache.
    int64_t overflows() const;

   private:
    friend class SharedInformer;
    Registration(std::weak_ptr<SharedInformer> informer, std::shared_ptr<Listener> listener)
        : informer_(std::move(informer)), listener_(std::move(listener)) {}

    const std::weak_ptr<SharedInformer> informer_;
    const std::shared_ptr<Listener> listener_;
  };

  // Validates the options and builds a stopped-until-Run informer (INVALID_ARGUMENT).
  static absl::StatusOr<std::shared_ptr<SharedInformer>> Create(std::unique_ptr<ListerWatcher> lw,
                                                                Options options);
  // Stops it and removes every handler. Runs wherever the last reference goes, which may be a
  // delivery thread or turn, or (inside OnStopped callbacks) the reflector's thread or turn: all
  // are handled.
  ~SharedInformer() override;
  SharedInformer(const SharedInformer&) = delete;
  SharedInformer& operator=(const SharedInformer&) = delete;

  // Starts the reflector. OK when it runs (a second call does nothing); FAILED_PRECONDITION once
  // the informer is stopped.
  absl::Status Run();
  // Stops the informer for good, with `reason` as its StopReason (the default says Stop() was
  // called). Cancels the list or watch in flight; OnStopped callbacks run before it returns
  // (unless it is called from one of them). Idempotent: the first reason stays.
  void Stop();
  void Stop(absl::Status reason);

  // True once the first list is in the cache.
  bool HasSynced() const;
  // Waits up to `timeout` (real time) for HasSynced(); false on timeout or if it stopped first.
  bool WaitForSync(absl::Duration timeout) const;
  bool IsStopped() const;
  // Why it stopped (e.g. NOT_FOUND: the resource is no longer served); OK while it runs.
  absl::Status StopReason() const;
  // Calls `callback(reason)` once when the informer stops: from the thread that stops it (the
  // reflector's thread or pool turn, or Stop()'s caller), with no lock held; immediately, on this
  // thread, if it is already stopped. Keep the Subscription for as long as the callback may run.
  Subscription OnStopped(std::function<void(const absl::Status&)> callback);
  // Calls `callback(store_id)` after every list that came from another store than the list
  // before it (the first list included): the cache then holds the new store's content (the
  // handlers may not have seen it yet). On the reflector's thread or turn, with no lock held; never
  // after the Subscription is cancelled (a call in progress on another thread is waited for).
  // A client that trusted something of the previous store (a write it made there and has not
  // seen come back) must forget it.
  Subscription OnStoreChanged(std::function<void(const std::string&)> callback);
  // The store of the last list ("" before the first).
  std::string StoreId() const;

  // Registers a handler; it receives the cache's current objects as adds, then every change.
  // FAILED_PRECONDITION (saying why the informer stopped) on a stopped informer; INVALID_ARGUMENT
  // for a null handler. Allowed before Run().
  absl::StatusOr<std::unique_ptr<Registration>> AddEventHandler(
      std::shared_ptr<ResourceEventHandler> handler, HandlerOptions options);
  absl::StatusOr<std::unique_ptr<Registration>> AddEventHandler(
      std::shared_ptr<ResourceEventHandler> handler) {
    return AddEventHandler(std::move(handler), HandlerOptions());
  }
  // Removes a handler. After it returns the handler is never called again; a call in progress on
  // the delivery thread is waited for. Called from inside that handler's own callback, it returns
  // at once (the current call finishes; no other follows). OK when already removed;
  // INVALID_ARGUMENT for a registration of another informer.
  absl::Status RemoveEventHandler(Registration* registration);

  // The cache: read-only for users; objects are shared and immutable.
  const ThreadSafeStore& store() const { return store_; }
  // The last revision the reflector has seen.
  std::string LastSyncResourceVersion() const;
  const std::string& name() const { return name_; }
  // The reflector, for its counters (lists_started(), watches_started()).
  const Reflector& reflector() const { return *reflector_; }

 private:
  SharedInformer(std::string name, const Clock* clock, size_t handler_buffer, WorkerPool* pool);

  // ReflectorSink: called on the reflector's thread or turn, one at a time.
  void Replace(std::vector<ObjectRef> objects, const std::string& resource_version) override;
  void Add(ObjectRef object) override;
  void Update(ObjectRef object) override;
  void Delete(ObjectRef object) override;
  void Bookmark(const std::string& resource_version) override;
  void StoreChanged(const std::string& store_id) override;
  void Stopped(const absl::Status& reason) override;

  // Queues one change for every handler. REQUIRES: mu_ held.
  void EnqueueLocked(const ObjectRef& object, bool deleted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the informer stopped and runs the stop callbacks (if this call stopped it).
  void MarkStopped(absl::Status reason) ABSL_LOCKS_EXCLUDED(mu_);
  // What a registration is to do next: nothing yet, nothing ever again (removed, or stopped with
  // everything delivered), or one step (a change is taken from its buffer).
  enum class Work { kNone, kEnd, kResync, kPeriodic, kChange };
  // One change in a registration's buffer.
  struct Change {
    ObjectRef object;
    bool deleted = false;
  };
  // REQUIRES: listener->mu held (not annotated: Listener is defined in the .cc file).
  Work TakeWork(Listener* listener, Change* change) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Does one step of a registration's work. False if it was removed meanwhile.
  bool DoWork(Listener* listener, Work work, Change change);
  // A registration's delivery thread.
  void Deliver(const std::shared_ptr<Listener>& listener);
  // A registration's turn on the pool.
  void DeliverTurn(Listener* listener);
  // Brings a registration's handler to the cache's current state. False if it was removed.
  bool Resync(Listener* listener);

  // Constant after construction.
  const std::string name_;
  const Clock* const clock_;
  const size_t handler_buffer_;
  WorkerPool* const pool_;
  std::unique_ptr<Reflector> reflector_;  // set by Create, then constant

  // Provides its own synchronization; written only under mu_, so that each change and the
  // handlers' queues move together.
  ThreadSafeStore store_;

  // Provide their own synchronization. stop_callbacks_ is closed by MarkStopped, after stopped_
  // is set.
  CallbackList<absl::Status> stop_callbacks_;
  CallbackList<std::string> store_callbacks_;

  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // The reason Stop() was given, used when the reflector reports that it stopped.
  absl::Status requested_stop_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  absl::Status stop_reason_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  std::vector<std::shared_ptr<Listener>> listeners_ ABSL_GUARDED_BY(mu_);
  int64_t next_listener_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CLIENT_SHARED_INFORMER_H_
