// CallbackList and Subscription: callbacks that one part of the program calls (on a stop, a
// cancellation, a change) and that others add and cancel, under the one rule that makes cancelling
// safe. CancellationToken, SharedInformer's OnStopped and OnStoreChanged, and
// DynamicInformerFactory's subscribers are built on it.
//
//   CallbackList<absl::Status> stopped;
//   Subscription s = stopped.Add([](const absl::Status& why) { ... });
//   stopped.Notify(status);   // calls every callback, on this thread, with no lock held
//   s.Cancel();               // or ~Subscription: then the callback never runs again
//
// The rule (Subscription::Cancel, CallbackList::Remove):
//   * After Cancel() returns, the callback is not running and no call of it will start: a call in
//     progress on another thread is waited for. So whoever cancels may then free what the
//     callback uses.
//   * Called from inside the callback itself (on the thread that runs that call), Cancel() returns
//     at once: the running call finishes and no other follows. Waiting there would wait forever.
//   A Cancel() must not hold a lock that the callback takes: it may wait for the callback.
//
// Calls: every call runs on the thread of the Notify, NotifyOne or Close that makes it, or (a
// callback added to a closed list) of the Add, with no lock of the list held: a callback may add,
// cancel, notify, or destroy the list. Notify calls the callbacks registered when it starts, in
// the order they were added, one at a time; a callback added during it waits for the next one.
// Close is the one-shot form (a stop, a cancellation): each callback is called once, and the
// list stays closed.
//
// Thread-safety: every method of both classes may be called from any thread, concurrently.
// Notify calls made at once on several threads may call the same callback at once. A
// Subscription may outlive its list (its Cancel then does nothing), and a Notify or Close in
// progress goes on when the list is destroyed (it keeps what it needs).
#ifndef SHARDCACHE_COMMON_CALLBACK_LIST_H_
#define SHARDCACHE_COMMON_CALLBACK_LIST_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardcache {

namespace internal {

// The state of a CallbackList that does not depend on the callbacks' arguments: the callbacks,
// type-erased, and the calls in progress. Shared by the list, its Subscriptions (weakly) and the
// Notify or Close in progress. Thread-safe.
class CallbackListCore {
 public:
  // Calls one callback with arguments that only the list's template knows the type of.
  using Invoker = std::function<void(const void* args)>;
  using InvokerRef = std::shared_ptr<const Invoker>;

  // Registers `invoker` and returns its id (from 1, rising). On a closed list, registers nothing
  // and returns 0 with *closed_values set to what Close was given.
  uint64_t Add(InvokerRef invoker, std::shared_ptr<const void>* closed_values)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Unregisters `id` under the rule above. 0 or an unknown id: nothing to do.
  void Remove(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls every callback registered when it starts and still registered at its turn.
  void Notify(const void* args) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls callback `id` if it is registered; returns whether it did.
  bool NotifyOne(uint64_t id, const void* args) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the list (keeping `values` for later Adds) and calls every callback once, unregistering
  // each before its call. False, calling nothing, if it was closed already.
  bool Close(std::shared_ptr<const void> values, const void* args) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Call {
    uint64_t id;
    std::thread::id thread;
  };

  // Calls `invoker` (callback `id`) with mu_ released, recording the call as in progress.
  void CallLocked(uint64_t id, InvokerRef invoker, const void* args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // By id, which is the order they were added in.
  std::map<uint64_t, InvokerRef> callbacks_ ABSL_GUARDED_BY(mu_);
  // Calls in progress, with their threads (the same callback may run on several).
  std::vector<Call> running_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const void> closed_values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

// A callback's registration in a CallbackList. Destroying it, or Cancel(), unregisters the
// callback under the rule above. Movable; moving onto a Subscription cancels the one it held. An
// empty Subscription (default, moved from, cancelled, released, or from an Add that ran its
// callback at once) does nothing.
class Subscription {
 public:
  using Id = uint64_t;

  Subscription() = default;
  Subscription(Subscription&& other) noexcept;
  Subscription& operator=(Subscription&& other) noexcept;
  ~Subscription() { Cancel(); }

  // Unregisters the callback: afterwards it is not running (unless this is called from inside
  // it) and never called again. Idempotent.
  void Cancel();
  // The callback's id in its list (for CallbackList::NotifyOne and Remove); 0 when empty.
  Id id() const { return id_; }
  // Lets the callback go without cancelling it: it stays registered until CallbackList::Remove
  // (or for the list's life). Returns its id; the Subscription is empty afterwards.
  Id Release();

 private:
  template <typename... Args>
  friend class CallbackList;
  Subscription(std::weak_ptr<internal::CallbackListCore> core, Id id)
      : core_(std::move(core)), id_(id) {}

  std::weak_ptr<internal::CallbackListCore> core_;
  Id id_ = 0;
};

// Callbacks taking `const Args&...`. Thread-safe (see above).
template <typename... Args>
class CallbackList {
 public:
  using Callback = std::function<void(const Args&...)>;

  CallbackList() : core_(std::make_shared<internal::CallbackListCore>()) {}
  CallbackList(const CallbackList&) = delete;
  CallbackList& operator=(const CallbackList&) = delete;

  // Registers `callback` until the returned Subscription is cancelled. On a closed list, calls it
  // at once, on this thread, with Close's arguments, keeps nothing, and returns an empty one.
  Subscription Add(Callback callback) {
    auto invoker = std::make_shared<const internal::CallbackListCore::Invoker>(
        [callback = std::move(callback)](const void* args) {
          std::apply(callback, *static_cast<const Refs*>(args));
        });
    std::shared_ptr<const void> closed_values;
    Subscription::Id id = core_->Add(invoker, &closed_values);
    if (id == 0) {
      Refs refs = RefsTo(*static_cast<const Values*>(closed_values.get()));
      (*invoker)(&refs);
      return Subscription();
    }
    return Subscription(core_, id);
  }

  // Unregisters callback `id` (a Subscription's id() or Release()) under the rule above.
  void Remove(Subscription::Id id) { core_->Remove(id); }

  // Calls every callback registered now (not those added while it runs, nor those cancelled
  // before their turn), in the order they were added, on this thread, one at a time.
  void Notify(const Args&... args) {
    std::shared_ptr<internal::CallbackListCore> core = core_;  // the list may go meanwhile
    Refs refs(args...);
    core->Notify(&refs);
  }

  // Calls only callback `id`, if it is registered; returns whether it was.
  bool NotifyOne(Subscription::Id id, const Args&... args) {
    std::shared_ptr<internal::CallbackListCore> core = core_;
    Refs refs(args...);
    return core->NotifyOne(id, &refs);
  }

  // The one-shot notification: closes the list and calls every registered callback once, on this
  // thread, unregistering each before its call; a callback added from then on is called at once
  // by Add (on the adding thread), with copies of these arguments. Only the first Close calls;
  // a later one returns false at once (even while the first is still calling).
  bool Close(const Args&... args) {
    std::shared_ptr<internal::CallbackListCore> core = core_;
    auto values = std::make_shared<const Values>(args...);
    Refs refs = RefsTo(*values);
    return core->Close(std::move(values), &refs);
  }

 private:
  using Values = std::tuple<Args...>;
  using Refs = std::tuple<const Args&...>;

  static Refs RefsTo(const Values& values) {
    return std::apply([](const Args&... a) { return Refs(a...); }, values);
  }

  // Constant after construction; provides its own synchronization.
  const std::shared_ptr<internal::CallbackListCore> core_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_CALLBACK_LIST_H_
