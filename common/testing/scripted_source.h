// ScriptedSource: a DynamicInformerFactory's source of ListerWatchers (ListerWatcherSource) made
// of ScriptedListerWatchers, one per resource and filters, so that a factory (and what runs on
// its informers) can be tested without a server.
//
//   FakeClock clock;  // or RealClock::Get()
//   ScriptedSource source(&clock);
//   source.For(widgets, filters)->SetListObjects("shard-store", "10", {w1});
//   auto factory = DynamicInformerFactory::Create(source.Source(), options);
//   ...
//   PushWhenWatching(*source.For(widgets, filters), event);  // a watch event
//
// The factory's informers list and watch the ScriptedListerWatcher of their resource and
// filters, created (empty: store "store-1", revision "1", no object) on first use by either side;
// FailLists makes their lists fail (e.g. to keep an informer from syncing).
// An informer started again for the same resource and filters (after the first one stopped)
// uses the same ScriptedListerWatcher.
//
// Thread-safe. The source must outlive the factories built over it.
#ifndef SHARDCACHE_COMMON_TESTING_SCRIPTED_SOURCE_H_
#define SHARDCACHE_COMMON_TESTING_SCRIPTED_SOURCE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/client/dynamic_informer_factory.h"
#include "common/client/lister_watcher.h"
#include "common/clock.h"
#include "common/resources.h"
#include "common/testing/scripted_lister_watcher.h"

namespace shardcache::testing {

// The script of one resource and filters: its ScriptedListerWatcher, and the error its lists
// fail with (OK: they answer).
struct SourceScript {
  explicit SourceScript(const Clock* clock) : lw(std::make_shared<ScriptedListerWatcher>(clock)) {}
  absl::Status ListError() const {
    absl::MutexLock l(&mu);
    return list_error;
  }

  const std::shared_ptr<ScriptedListerWatcher> lw;
  mutable absl::Mutex mu;
  absl::Status list_error ABSL_GUARDED_BY(mu);
};

// A ListerWatcher that forwards to a shared script (an informer owns its ListerWatcher; the test
// keeps the scripted one).
class SharedScriptedListerWatcher final : public ListerWatcher {
 public:
  explicit SharedScriptedListerWatcher(std::shared_ptr<SourceScript> script)
      : script_(std::move(script)) {}
  absl::StatusOr<v1::ListResponse> List(int64_t limit, const std::string& cont) override {
    if (absl::Status error = script_->ListError(); !error.ok()) return error;
    return script_->lw->List(limit, cont);
  }
  std::unique_ptr<AsyncWatchEventStream> Watch(const std::string& rv) override {
    return script_->lw->Watch(rv);
  }
  void Shutdown() override { script_->lw->Shutdown(); }
  std::string Describe() const override { return script_->lw->Describe(); }

 private:
  const std::shared_ptr<SourceScript> script_;
};

class ScriptedSource {
 public:
  explicit ScriptedSource(const Clock* clock) : clock_(clock) {}

  // The scripted ListerWatcher of `resource` and `filters`.
  std::shared_ptr<ScriptedListerWatcher> For(const v1::GroupVersionResource& resource,
                                             const ListWatchFilters& filters = {}) {
    absl::MutexLock l(&mu_);
    return ScriptLocked(resource, filters)->lw;
  }

  // The lists of `resource` and `filters` fail with `error` from now on (OK: they answer again).
  void FailLists(const v1::GroupVersionResource& resource, const ListWatchFilters& filters,
                 absl::Status error) {
    std::shared_ptr<SourceScript> script;
    {
      absl::MutexLock l(&mu_);
      script = ScriptLocked(resource, filters);
    }
    absl::MutexLock l(&script->mu);
    script->list_error = std::move(error);
  }

  // How many ListerWatchers of `resource` and `filters` the factory took (one per informer).
  int Taken(const v1::GroupVersionResource& resource, const ListWatchFilters& filters = {}) const {
    absl::MutexLock l(&mu_);
    auto it = taken_.find(Key(resource, filters));
    return it == taken_.end() ? 0 : it->second;
  }

  // The source to build a factory over (DynamicInformerFactory::Create(source.Source(), ...)).
  ListerWatcherSource Source() {
    return
        [this](const v1::GroupVersionResource& resource,
               const ListWatchFilters& filters) -> absl::StatusOr<std::unique_ptr<ListerWatcher>> {
          absl::MutexLock l(&mu_);
          ++taken_[Key(resource, filters)];
          return std::make_unique<SharedScriptedListerWatcher>(ScriptLocked(resource, filters));
        };
  }

 private:
  static std::string Key(const v1::GroupVersionResource& resource,
                         const ListWatchFilters& filters) {
    return absl::StrCat(GvrKey(resource), "|", filters.ToString());
  }
  std::shared_ptr<SourceScript> ScriptLocked(const v1::GroupVersionResource& resource,
                                             const ListWatchFilters& filters)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::shared_ptr<SourceScript>& script = scripts_[Key(resource, filters)];
    if (script == nullptr) {
      script = std::make_shared<SourceScript>(clock_);
      script->lw->SetListObjects("store-1", "1", {});
      script->lw->SetHeader("store-1");
    }
    return script;
  }

  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<SourceScript>> scripts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> taken_ ABSL_GUARDED_BY(mu_);
};

// A watch event of `type` carrying `object`, for PushWhenWatching.
inline v1::WatchEvent WatchEventOf(v1::WatchEvent::Type type, v1::Object object) {
  v1::WatchEvent e;
  e.set_type(type);
  *e.mutable_object() = std::move(object);
  return e;
}

// Pushes `event` into the newest watch stream of `lw`, waiting (real time, up to `timeout`)
// for one to be open. False when none opened in time.
inline bool PushWhenWatching(ScriptedListerWatcher& lw, v1::WatchEvent event,
                             absl::Duration timeout = absl::Seconds(20)) {
  absl::Time deadline = absl::Now() + timeout;
  while (lw.streams() == 0) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  lw.stream(lw.streams() - 1)->Push(std::move(event));
  return true;
}

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_SCRIPTED_SOURCE_H_
