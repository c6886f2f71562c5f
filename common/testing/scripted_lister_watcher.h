// ScriptedListerWatcher: a ListerWatcher whose lists and watch streams a test scripts, for
// reflectors and informers without a server. SetList says what the next lists answer (objects, a
// revision, the store's identity); every Watch opens a ScriptedStream that the test pushes events
// into, breaks (as a lost connection) or sees cancelled; SetHeader says which store the next
// streams' response headers name. Its streams are read as a StoreListerWatcher's are, by polling,
// with no thread of their own: a reflector on a WorkerPool runs on them as it does in production.
//
// Thread-safe: the reflector's thread or turns call List, Watch and the streams; the test's
// thread scripts them.
#ifndef SHARDCACHE_COMMON_TESTING_SCRIPTED_LISTER_WATCHER_H_
#define SHARDCACHE_COMMON_TESTING_SCRIPTED_LISTER_WATCHER_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/client/lister_watcher.h"
#include "common/clock.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache::testing {

// One scripted watch stream: the test pushes events; the reader polls them (Next never blocks)
// and is woken (the `ready` of AsyncWatchEventStream::Start) by every Push, Cancel and Break.
// Records when (on the clock) it was cancelled.
class ScriptedStream {
 public:
  ScriptedStream(const Clock* clock, std::string from, std::string header)
      : clock_(clock), from_(std::move(from)), header_(std::move(header)) {}

  void Push(v1::WatchEvent event) {
    {
      absl::MutexLock l(&mu_);
      events_.push_back(std::move(event));
    }
    Ready();
  }
  AsyncWatchEventStream::Poll Next(v1::WatchEvent* event) {
    absl::MutexLock l(&mu_);
    if (cancelled_ || broken_) return AsyncWatchEventStream::Poll::kEnded;
    if (events_.empty()) return AsyncWatchEventStream::Poll::kPending;
    *event = std::move(events_.front());
    events_.pop_front();
    ++delivered_;
    return AsyncWatchEventStream::Poll::kEvent;
  }
  void Cancel() {
    {
      absl::MutexLock l(&mu_);
      if (cancelled_ || broken_) return;
      cancelled_ = true;
      cancelled_at_ = clock_->Now();
    }
    Ready();
  }
  // Ends the stream as a broken connection does (Finish: UNAVAILABLE).
  void Break() {
    {
      absl::MutexLock l(&mu_);
      broken_ = true;
    }
    Ready();
  }
  // Who to wake from now on (null: nobody). Returns once a call to the previous one is over.
  void SetReady(std::function<void()> ready) {
    absl::MutexLock r(&ready_mu_);
    ready_ = std::move(ready);
  }
  bool broken() const {
    absl::MutexLock l(&mu_);
    return broken_;
  }
  bool cancelled() const {
    absl::MutexLock l(&mu_);
    return cancelled_;
  }
  absl::Time cancelled_at() const {
    absl::MutexLock l(&mu_);
    return cancelled_at_;
  }
  int delivered() const {
    absl::MutexLock l(&mu_);
    return delivered_;
  }
  const std::string& from() const { return from_; }
  const std::string& header() const { return header_; }

 private:
  // Called with mu_ released: the reader's `ready` may take its own locks.
  void Ready() {
    absl::MutexLock r(&ready_mu_);
    if (ready_) ready_();
  }

  const Clock* const clock_;
  const std::string from_;
  const std::string header_;
  absl::Mutex ready_mu_;
  std::function<void()> ready_ ABSL_GUARDED_BY(ready_mu_);
  mutable absl::Mutex mu_;
  std::deque<v1::WatchEvent> events_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time cancelled_at_ ABSL_GUARDED_BY(mu_);
  int delivered_ ABSL_GUARDED_BY(mu_) = 0;
};

// The reader's side of a ScriptedStream. Its response headers are known at once.
class StreamHandle final : public AsyncWatchEventStream {
 public:
  explicit StreamHandle(std::shared_ptr<ScriptedStream> s) : s_(std::move(s)) {}
  ~StreamHandle() override { s_->SetReady(nullptr); }
  void Start(std::function<void()> ready) override { s_->SetReady(std::move(ready)); }
  std::optional<std::string> StoreId() override { return s_->header(); }
  Poll Next(v1::WatchEvent* event) override { return s_->Next(event); }
  void Cancel() override { s_->Cancel(); }
  absl::Status Finish() override {
    if (s_->broken()) return absl::UnavailableError("connection broken");
    return s_->cancelled() ? absl::CancelledError("cancelled") : absl::OkStatus();
  }

 private:
  std::shared_ptr<ScriptedStream> s_;
};

// Lists what SetList says (objects at a revision of a store), and hands out scripted streams
// whose response headers name the store that SetHeader says.
class ScriptedListerWatcher final : public ListerWatcher {
 public:
  explicit ScriptedListerWatcher(const Clock* clock) : clock_(clock) {}

  // The next lists answer `objects` at revision `rv` of store `store_id`.
  void SetListObjects(const std::string& store_id, const std::string& rv,
                      std::vector<v1::Object> objects) {
    absl::MutexLock l(&mu_);
    store_id_ = store_id;
    list_rv_ = rv;
    objects_ = std::move(objects);
  }
  // ... objects that have only a name (and `rv` as their resourceVersion).
  void SetList(const std::string& store_id, const std::string& rv,
               const std::vector<std::string>& names) {
    std::vector<v1::Object> objects;
    for (const std::string& name : names) {
      v1::Object o;
      o.mutable_metadata()->set_name(name);
      o.mutable_metadata()->set_resource_version(rv);
      objects.push_back(std::move(o));
    }
    SetListObjects(store_id, rv, std::move(objects));
  }
  absl::StatusOr<v1::ListResponse> List(int64_t, const std::string&) override {
    absl::MutexLock l(&mu_);
    v1::ListResponse resp;
    resp.set_resource_version(list_rv_);
    resp.set_store_id(store_id_);
    for (const v1::Object& o : objects_) *resp.add_items() = o;
    ++lists_;
    return resp;
  }
  // The store id that the response headers of the next streams carry ("": none).
  void SetHeader(const std::string& id) {
    absl::MutexLock l(&mu_);
    header_ = id;
  }
  std::unique_ptr<AsyncWatchEventStream> Watch(const std::string& rv) override {
    absl::MutexLock l(&mu_);
    auto s = std::make_shared<ScriptedStream>(clock_, rv, header_);
    streams_.push_back(s);
    return std::make_unique<StreamHandle>(s);
  }
  void Shutdown() override {
    absl::MutexLock l(&mu_);
    for (const auto& s : streams_) s->Cancel();
  }
  std::string Describe() const override { return "scripted"; }

  int streams() const {
    absl::MutexLock l(&mu_);
    return static_cast<int>(streams_.size());
  }
  std::shared_ptr<ScriptedStream> stream(int i) const {
    absl::MutexLock l(&mu_);
    return streams_.at(i);
  }

 private:
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::string store_id_ ABSL_GUARDED_BY(mu_);
  std::string list_rv_ ABSL_GUARDED_BY(mu_);
  std::string header_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::Object> objects_ ABSL_GUARDED_BY(mu_);
  int lists_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<ScriptedStream>> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_SCRIPTED_LISTER_WATCHER_H_
