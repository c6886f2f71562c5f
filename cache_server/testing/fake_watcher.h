// FakeWatcher and FakeHistory: a Watcher that records what reaches it, with a queue bound that a
// test sets and drains by hand (as a client reads), and an EventHistory kept in a vector, with a
// compaction point that a test moves. For the fan-out's tests (fan_out_test.cc,
// watch_cache_test.cc), which need no network. RecordingWatcher: a Watcher that records every
// event it is given, for the store's tests.
//
// Thread-safety: FakeWatcher is thread-safe (the fan-out calls it on a dispatcher thread, the
// test reads it on its own); FakeHistory and RecordingWatcher too.
#ifndef SHARDCACHE_CACHE_SERVER_TESTING_FAKE_WATCHER_H_
#define SHARDCACHE_CACHE_SERVER_TESTING_FAKE_WATCHER_H_

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/event.h"
#include "cache_server/watcher.h"

namespace shardcache::testing {

// Records "TYPE name app" per event, "BOOKMARK rev", "END CODE"; holds at most `capacity`
// unread events (0: no bound) and refuses more.
class FakeWatcher : public Watcher {
 public:
  explicit FakeWatcher(WatchSpec spec, size_t capacity = 0)
      : spec_(std::move(spec)), capacity_(capacity) {}
  void Init(WatchSpec, std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>>) override {}
  const WatchSpec& spec() const override { return spec_; }
  bool Deliver(const Delivery& d) override {
    absl::MutexLock l(&mu_);
    if (capacity_ > 0 && unread_ >= capacity_) {
      ++refused_;
      return false;
    }
    ++unread_;
    auto labels = d.object->metadata().labels();
    seen_.push_back(absl::StrCat(v1::WatchEvent::Type_Name(d.type), " ",
                                 d.object->metadata().name(), " ",
                                 labels.contains("app") ? labels.at("app") : ""));
    slices_.push_back(d.encoded);
    return true;
  }
  bool HasRoom() const override {
    absl::MutexLock l(&mu_);
    return capacity_ == 0 || unread_ <= capacity_ / 2;
  }
  void Bookmark(int64_t revision) override { Record(absl::StrCat("BOOKMARK ", revision)); }
  void Sweep(absl::Time now) override {
    absl::MutexLock l(&mu_);
    last_sweep_ = now;
  }
  void End(const absl::Status& s) override {
    Record(absl::StrCat("END ", absl::StatusCodeToString(s.code())));
    absl::MutexLock l(&mu_);
    end_message_ = std::string(s.message());
  }

  // The client reads `n` events (all: -1).
  void Read(int n = -1) {
    absl::MutexLock l(&mu_);
    unread_ = n < 0 ? 0 : unread_ - std::min<size_t>(unread_, n);
  }
  // What reached it so far, once there are at least `n` entries or `timeout` has passed.
  std::vector<std::string> WaitFor(size_t n, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return seen_;
  }
  std::vector<std::string> seen() const {
    absl::MutexLock l(&mu_);
    return seen_;
  }
  size_t refused() const {
    absl::MutexLock l(&mu_);
    return refused_;
  }
  std::string end_message() const {
    absl::MutexLock l(&mu_);
    return end_message_;
  }
  absl::Time last_sweep() const {
    absl::MutexLock l(&mu_);
    return last_sweep_;
  }
  // The encoded events it received, in order.
  std::vector<grpc::Slice> slices() const {
    absl::MutexLock l(&mu_);
    return slices_;
  }

 private:
  void Record(std::string s) {
    absl::MutexLock l(&mu_);
    seen_.push_back(std::move(s));
  }
  const WatchSpec spec_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
  std::vector<grpc::Slice> slices_ ABSL_GUARDED_BY(mu_);
  size_t unread_ ABSL_GUARDED_BY(mu_) = 0;
  size_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::string end_message_ ABSL_GUARDED_BY(mu_);
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The store's history window, in a vector: Add appends, Compact moves the window's start.
class FakeHistory : public EventHistory {
 public:
  void Add(EventPtr e) {
    absl::MutexLock l(&mu_);
    events_.push_back(std::move(e));
  }
  // Events at or below `revision` leave the window.
  void Compact(int64_t revision) {
    absl::MutexLock l(&mu_);
    compacted_ = revision;
  }
  size_t reads() const {
    absl::MutexLock l(&mu_);
    return reads_;
  }
  absl::Status ReadHistory(const std::string& group_resource, int64_t after, int64_t up_to,
                           size_t max_events, std::vector<EventPtr>* out) const override {
    absl::MutexLock l(&mu_);
    ++reads_;
    if (after < compacted_) return absl::OutOfRangeError("compacted");
    size_t n = 0;
    for (const EventPtr& e : events_) {
      if (e->revision <= after || e->revision > up_to || e->group_resource != group_resource) {
        continue;
      }
      out->push_back(e);
      if (++n == max_events) break;
    }
    return absl::OkStatus();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<EventPtr> events_ ABSL_GUARDED_BY(mu_);
  int64_t compacted_ ABSL_GUARDED_BY(mu_) = 0;
  mutable size_t reads_ ABSL_GUARDED_BY(mu_) = 0;
};

// A watch of "example.com/widgets" v1 from `start`, with a label selector.
inline WatchSpec Spec(int64_t start, const std::string& selector = "") {
  WatchSpec s;
  s.group_resource = "example.com/widgets";
  s.version = "v1";
  s.start_revision = start;
  s.filter.selector = *LabelSelector::Parse(selector);
  return s;
}
// `spec`, asking for periodic bookmarks (WatchRequest.allow_bookmarks).
inline WatchSpec WithBookmarks(WatchSpec spec) {
  spec.periodic_bookmarks = true;
  return spec;
}

// An event of "example.com/widgets": `name` labelled app=`app` (and before the change
// app=`prev_app`, when given).
inline EventPtr MakeEvent(int64_t rev, v1::WatchEvent::Type type, const std::string& name,
                          const std::string& app, const std::string& prev_app = "") {
  auto e = std::make_shared<Event>();
  e->revision = rev;
  e->type = type;
  e->group_resource = "example.com/widgets";
  auto o = std::make_shared<v1::Object>();
  o->mutable_metadata()->set_name(name);
  o->mutable_metadata()->set_resource_version(absl::StrCat(rev));
  (*o->mutable_metadata()->mutable_labels())["app"] = app;
  e->object = o;
  if (!prev_app.empty()) {
    auto p = std::make_shared<v1::Object>(*o);
    (*p->mutable_metadata()->mutable_labels())["app"] = prev_app;
    e->prev = p;
  }
  return e;
}

// Records "TYPE name resourceVersion" for each initial event (Init) and each event delivered, and
// "END CODE"; never full. For the store's tests (object_store_test.cc, power_loss_test.cc).
class RecordingWatcher : public Watcher {
 public:
  void Init(WatchSpec spec,
            std::vector<std::pair<v1::WatchEvent::Type, ObjectRef>> initial) override {
    spec_ = std::move(spec);
    absl::MutexLock l(&mu_);
    for (auto& [type, obj] : initial) events_.push_back(Describe(type, *obj));
  }
  const WatchSpec& spec() const override { return spec_; }
  bool Deliver(const Delivery& d) override {
    absl::MutexLock l(&mu_);
    events_.push_back(Describe(d.type, *d.object));
    return true;
  }
  bool HasRoom() const override { return true; }
  void Bookmark(int64_t) override {}
  void End(const absl::Status& status) override {
    absl::MutexLock l(&mu_);
    events_.push_back(absl::StrCat("END ", absl::StatusCodeToString(status.code())));
  }
  // Waits until `n` events were recorded (or 10 s) and returns them.
  std::vector<std::string> WaitFor(size_t n) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return events_;
  }

 private:
  static std::string Describe(v1::WatchEvent::Type type, const v1::Object& o) {
    return absl::StrCat(v1::WatchEvent::Type_Name(type), " ", o.metadata().name(), " ",
                        o.metadata().resource_version());
  }
  WatchSpec spec_;
  absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_CACHE_SERVER_TESTING_FAKE_WATCHER_H_
