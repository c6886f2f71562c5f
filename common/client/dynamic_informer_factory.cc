#include "common/client/dynamic_informer_factory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/label_selector.h"
#include "common/resource_definition.h"
#include "common/resources.h"
#include "common/validation.h"

namespace shardcache {
namespace {

std::string InformerKey(const v1::GroupVersionResource& gvr, const ListWatchFilters& filters) {
  return absl::StrCat(GvrKey(gvr), "|", filters.ToString());
}

bool IsBuiltIn(const v1::GroupVersionResource& gvr) {
  for (const v1::GroupVersionResource& b : DynamicInformerFactory::BuiltInResources()) {
    if (GvrKey(b) == GvrKey(gvr)) return true;
  }
  return false;
}

// The resources a ResourceDefinition serves: one per version marked served (the default). The
// store validated the definition; one that does not parse serves nothing.
std::map<std::string, v1::GroupVersionResource> ServedBy(const v1::Object& definition) {
  std::map<std::string, v1::GroupVersionResource> served;
  absl::StatusOr<ResourceDefinition> parsed = ParseResourceDefinition(definition);
  if (!parsed.ok()) {
    spdlog::warn("resource definition {}: {}: it serves nothing", definition.metadata().name(),
                 std::string(parsed.status().message()));
    return served;
  }
  for (v1::GroupVersionResource& gvr : parsed->ServedResources()) {
    served.emplace(GvrKey(gvr), std::move(gvr));
  }
  return served;
}

}  // namespace

// The subscribers (a CallbackList) and the events queued for them, delivered by one thread of
// its own. Events are queued under the factory's lock, so that no change falls between a new
// subscriber's first events and the changes it hears after; listeners must then be called with
// no lock held, in that order. On the threads that queue them (the definitions informer's
// delivery thread, ServeAlways's and Subscribe's callers), that would mean either waiting for
// another thread's listener calls (a lock held across callbacks, that deadlocks when a listener
// takes a lock its caller holds: CcrController::Start subscribes under its term's mutex) or
// handing events to whichever thread is already calling (not the thread that notifies).
//
// The thread takes the queue in order. A subscriber joins the list at once (so that its
// Subscription can cancel it) but hears nothing until the thread reaches its join, where it is
// first told its initial events: events queued before it (which its initial events already
// reflect) are skipped. Holds a reference to itself from the thread, so that it may outlive the
// factory until the thread ends.
class DynamicInformerFactory::Notifier : public std::enable_shared_from_this<Notifier> {
 public:
  using Listener = std::function<void(const ResourceEvent&)>;

  void Start() {
    absl::MutexLock l(&mu_);
    thread_ = std::thread([self = shared_from_this()] { self->Run(); });
  }

  // Ends the thread (after the listener call in progress); what is queued is dropped.
  // Idempotent.
  void Shutdown() {
    std::thread thread;
    {
      absl::MutexLock l(&mu_);
      shut_down_ = true;
      queue_.clear();
      thread = std::move(thread_);
    }
    if (!thread.joinable()) return;
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();  // from a listener: the thread ends after it returns
    } else {
      thread.join();
    }
  }

  // A new subscriber, first told `initial`.
  Subscription Add(Listener listener, std::vector<ResourceEvent> initial) {
    auto joined = std::make_shared<std::atomic<bool>>(false);
    absl::MutexLock l(&mu_);
    if (shut_down_) return Subscription();
    Subscription subscription =
        listeners_.Add([joined, listener = std::move(listener)](const ResourceEvent& event) {
          if (joined->load()) listener(event);
        });
    Item join;
    join.subscriber = subscription.id();
    join.joined = std::move(joined);
    join.initial = std::move(initial);
    queue_.push_back(std::move(join));
    return subscription;
  }

  // Queues `event` for every subscriber.
  void Publish(const ResourceEvent& event) {
    absl::MutexLock l(&mu_);
    if (shut_down_) return;
    Item item;
    item.event = event;
    queue_.push_back(std::move(item));
  }

 private:
  // An event for every subscriber that has joined (subscriber 0), or a subscriber joining.
  struct Item {
    ResourceEvent event;
    Subscription::Id subscriber = 0;
    std::shared_ptr<std::atomic<bool>> joined;
    std::vector<ResourceEvent> initial;
  };

  void Run() {
    while (true) {
      Item item;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return shut_down_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (shut_down_) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      if (item.subscriber == 0) {
        listeners_.Notify(item.event);
        continue;
      }
      item.joined->store(true);
      for (const ResourceEvent& event : item.initial) {
        if (!listeners_.NotifyOne(item.subscriber, event)) break;  // cancelled
      }
    }
  }

  // Provides its own synchronization; notified only from the thread.
  CallbackList<ResourceEvent> listeners_;

  absl::Mutex mu_;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
};

// Where a handle's deleter reports that the handle was dropped. Shared by the factory and every
// handle, so that a handle dropped after the factory is gone finds it detached instead of freed.
// A drop holds mu_ shared while it reports, and Detach (the destructor's first step) holds it
// exclusively: no report reaches the factory after Detach returns.
class DynamicInformerFactory::Handles {
 public:
  explicit Handles(DynamicInformerFactory* factory) : factory_(factory) {}

  void Dropped(const std::string& key, uint64_t id) {
    absl::ReaderMutexLock l(&mu_);
    if (factory_ != nullptr) factory_->HandleDropped(key, id);
  }

  void Detach() {
    absl::WriterMutexLock l(&mu_);
    factory_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  DynamicInformerFactory* factory_ ABSL_GUARDED_BY(mu_);
};

namespace {

prometheus::Gauge* InformersGauge(const DynamicInformerFactory::Options& options) {
  if (options.registry == nullptr) return nullptr;
  return &prometheus::BuildGauge()
              .Name("shardcache_informer_factory_informers")
              .Help(
                  "Informers that a DynamicInformerFactory runs: held by a user, or unused "
                  "and not yet released (the definitions informer not counted).")
              .Register(*options.registry)
              .Add({{"factory", options.name}});
}

}  // namespace

std::vector<v1::GroupVersionResource> DynamicInformerFactory::BuiltInResources() {
  return {DefinitionResource(), LeaseResource(), CcrResource()};
}

v1::GroupVersionResource DynamicInformerFactory::DefinitionsResource() {
  return DefinitionResource();
}

absl::StatusOr<std::unique_ptr<DynamicInformerFactory>> DynamicInformerFactory::Create(
    std::shared_ptr<v1::Store::StubInterface> stub, Options options) {
  if (stub == nullptr) return absl::InvalidArgumentError("stub: Required value");
  if (!options.follow_definitions) {
    // Validate now the options every informer will use (following definitions, the
    // definitions informer's creation does).
    absl::StatusOr<std::unique_ptr<StoreListerWatcher>> lw =
        StoreListerWatcher::Create(stub, DefinitionsResource(), {}, options.lister_watcher);
    if (!lw.ok()) return lw.status();
  }
  StoreListerWatcher::Options lister_watcher = options.lister_watcher;
  ListerWatcherSource source =
      [stub = std::move(stub), lister_watcher](
          const v1::GroupVersionResource& resource,
          const ListWatchFilters& filters) -> absl::StatusOr<std::unique_ptr<ListerWatcher>> {
    absl::StatusOr<std::unique_ptr<StoreListerWatcher>> lw =
        StoreListerWatcher::Create(stub, resource, filters, lister_watcher);
    if (!lw.ok()) return lw.status();
    return std::unique_ptr<ListerWatcher>(*std::move(lw));
  };
  return Create(std::move(source), std::move(options));
}

absl::StatusOr<std::unique_ptr<DynamicInformerFactory>> DynamicInformerFactory::Create(
    ListerWatcherSource source, Options options) {
  if (source == nullptr) return absl::InvalidArgumentError("source: Required value");
  std::unique_ptr<DynamicInformerFactory> factory(
      new DynamicInformerFactory(std::move(source), std::move(options)));
  // Validates the options, and in follow_definitions mode starts the definitions informer.
  if (absl::Status s = factory->Start(); !s.ok()) return s;
  return factory;
}

DynamicInformerFactory::DynamicInformerFactory(ListerWatcherSource source, Options options)
    : source_(std::move(source)),
      options_(std::move(options)),
      informers_gauge_(InformersGauge(options_)),
      notifier_(std::make_shared<Notifier>()),
      handles_(std::make_shared<Handles>(this)) {
  if (informers_gauge_ != nullptr) informers_gauge_->Set(0);
}

absl::Status DynamicInformerFactory::Start() {
  if (options_.informer.clock == nullptr) {
    return absl::InvalidArgumentError("informer.clock: Required value");
  }
  if (options_.release_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("release_after: must not be negative");
  }
  release_thread_ = std::thread([this] { RunReleases(); });
  if (!options_.follow_definitions) {
    // Validate now the options every informer will use.
    const SharedInformer::Options& o = options_.informer;
    if (o.handler_buffer == 0) {
      return absl::InvalidArgumentError("informer.handler_buffer: must be positive");
    }
    if (o.reflector.page_size < 0) {
      return absl::InvalidArgumentError("informer.reflector.page_size: must not be negative");
    }
    if (absl::StatusOr<Backoff> b = Backoff::Create(o.reflector.backoff, o.clock); !b.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("informer.reflector.", b.status().message()));
    }
    notifier_->Start();
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<SharedInformer>> definitions =
      NewInformer(DefinitionsResource(), {});
  if (!definitions.ok()) return definitions.status();
  notifier_->Start();
  definitions_ = *std::move(definitions);
  definitions_stopped_ = definitions_->OnStopped([this](const absl::Status& why) {
    absl::MutexLock l(&mu_);
    if (shut_down_) return;
    spdlog::error(
        "informer factory: the ResourceDefinitions informer stopped ({}): the factory no longer "
        "knows what the store serves",
        why.ToString());
    definitions_lost_ = why;
  });
  absl::StatusOr<std::unique_ptr<SharedInformer::Registration>> registration =
      definitions_->AddEventHandler(DefinitionsHandler());
  if (!registration.ok()) return registration.status();
  definitions_registration_ = *std::move(registration);
  return definitions_->Run();
}

DynamicInformerFactory::~DynamicInformerFactory() {
  handles_->Detach();  // handles dropped from now on (possibly after this) do nothing
  std::map<std::string, Entry> entries;
  {
    absl::MutexLock l(&mu_);
    shut_down_ = true;
    entries.swap(informers_);
    UpdateGaugeLocked();
  }
  if (release_thread_.joinable()) release_thread_.join();
  definitions_registration_.reset();
  definitions_stopped_.Cancel();
  for (auto& [key, entry] : entries) entry.on_stopped.Cancel();
  const absl::Status reason =
      absl::CancelledError("the DynamicInformerFactory that started this informer shut down");
  for (auto& [key, entry] : entries) entry.informer->Stop(reason);
  if (definitions_ != nullptr) definitions_->Stop(reason);
  notifier_->Shutdown();
}

bool DynamicInformerFactory::HasSynced() const {
  if (!options_.follow_definitions) return true;
  return definitions_registration_ != nullptr && definitions_registration_->HasSynced();
}

bool DynamicInformerFactory::WaitForSync(absl::Duration timeout) const {
  if (!options_.follow_definitions) return true;
  return definitions_registration_ != nullptr && definitions_registration_->WaitForSync(timeout);
}

absl::Status DynamicInformerFactory::ServeAlways(const v1::GroupVersionResource& resource) {
  if (options_.follow_definitions) {
    return absl::FailedPreconditionError(
        absl::StrCat("ServeAlways(", StoreListerWatcher::ResourceName(resource),
                     "): this factory follows the store's ResourceDefinitions, which decide what "
                     "is served"));
  }
  if (absl::Status s = ValidateGroupVersionResource("resource", resource); !s.ok()) return s;
  if (IsBuiltIn(resource)) return absl::OkStatus();
  absl::MutexLock l(&mu_);
  if (shut_down_) return absl::FailedPreconditionError("the informer factory is shutting down");
  ServeLocked(resource);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SharedInformer>> DynamicInformerFactory::ForResource(
    const v1::GroupVersionResource& resource, const ListWatchFilters& filters) {
  if (absl::Status s = ValidateGroupVersionResource("resource", resource); !s.ok()) return s;
  if (absl::StatusOr<LabelSelector> sel = LabelSelector::Parse(filters.label_selector); !sel.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("filters.labelSelector: ", sel.status().message()));
  }
  const std::string name = StoreListerWatcher::ResourceName(resource);
  const std::string key = InformerKey(resource, filters);
  std::vector<Entry> dead;  // destroyed after the lock is released (see InformerStopped)
  absl::MutexLock l(&mu_);
  if (shut_down_) return absl::FailedPreconditionError("the informer factory is shutting down");
  if (!IsBuiltIn(resource)) {
    if (options_.follow_definitions) {
      if (!definitions_lost_.ok()) {
        return absl::UnavailableError(
            absl::StrCat("cannot tell whether ", name,
                         " is served: the informer factory lost the store's "
                         "ResourceDefinitions (",
                         definitions_lost_.ToString(), ")"));
      }
      if (!definitions_registration_->HasSynced()) {
        return absl::UnavailableError(
            absl::StrCat("cannot tell whether ", name,
                         " is served yet: the informer factory has not synced the store's "
                         "ResourceDefinitions; retry"));
      }
    }
    if (served_.count(GvrKey(resource)) == 0) {
      return absl::NotFoundError(absl::StrCat(
          "resource ", name, " is not served by the store: ",
          options_.follow_definitions
              ? "no ResourceDefinition defines it (in that version), as far as the informer "
                "factory has seen; subscribers are told when it becomes served"
              : "the informer factory was not told to serve it (ServeAlways)"));
    }
  }
  if (auto it = informers_.find(key); it != informers_.end()) {
    // Running, held or not (an unused one within its grace period is taken back).
    if (!it->second.informer->IsStopped()) return HandleLocked(key, &it->second);
    dead.push_back(std::move(it->second));  // stopped; its callback has not removed it yet
    informers_.erase(it);
    UpdateGaugeLocked();
  }
  absl::StatusOr<std::shared_ptr<SharedInformer>> informer = NewInformer(resource, filters);
  if (!informer.ok()) return informer.status();
  Entry entry;
  entry.informer = *informer;
  // Registered before Run(): it cannot be called on this thread, under mu_.
  entry.on_stopped = entry.informer->OnStopped(
      [this, key, raw = entry.informer.get()](const absl::Status&) { InformerStopped(key, raw); });
  if (absl::Status s = entry.informer->Run(); !s.ok()) return s;
  Entry& stored = informers_[key];
  stored = std::move(entry);
  UpdateGaugeLocked();
  return HandleLocked(key, &stored);
}

std::shared_ptr<SharedInformer> DynamicInformerFactory::HandleLocked(const std::string& key,
                                                                     Entry* entry) {
  if (std::shared_ptr<SharedInformer> held = entry->handle.lock()) return held;
  // A new use count of its own: its deleter runs when the last copy is dropped. It holds a
  // reference to the informer, which may outlive the entry (unserved, stopped, factory gone).
  const uint64_t id = ++next_handle_id_;
  std::shared_ptr<SharedInformer> handle(
      entry->informer.get(),
      [handles = handles_, key, id, informer = entry->informer](SharedInformer*) mutable {
        handles->Dropped(key, id);
        informer.reset();
      });
  entry->handle = handle;
  entry->handle_id = id;
  entry->unused_since = absl::InfiniteFuture();
  return handle;
}

void DynamicInformerFactory::HandleDropped(const std::string& key, uint64_t id) {
  absl::MutexLock l(&mu_);
  if (shut_down_) return;
  auto it = informers_.find(key);
  // Another informer by now (this one was dropped from the map), or handed out again since.
  if (it == informers_.end() || it->second.handle_id != id) return;
  it->second.unused_since = options_.informer.clock->Now();
  ++releases_changed_;
}

size_t DynamicInformerFactory::InformerCount() const {
  absl::MutexLock l(&mu_);
  return informers_.size();
}

void DynamicInformerFactory::RunReleases() {
  const Clock* clock = options_.informer.clock;
  while (true) {
    std::vector<Entry> released;
    {
      absl::MutexLock l(&mu_);
      const uint64_t seen = releases_changed_;
      auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shut_down_ || releases_changed_ != seen;
      };
      clock->AwaitWithDeadline(&mu_, absl::Condition(&changed), NextReleaseLocked());
      if (shut_down_) return;
      released = TakeExpiredLocked(clock->Now());
    }
    // Out of the map already: nobody can be handed them. Nobody holds them either, so the stop
    // tells no user (the factory's own callback is cancelled first).
    for (Entry& e : released) e.on_stopped.Cancel();
    for (Entry& e : released) {
      spdlog::info("informer factory: releasing informer {}: unused for {}", e.informer->name(),
                   absl::FormatDuration(options_.release_after));
      e.informer->Stop(absl::CancelledError(
          absl::StrCat("informer ", e.informer->name(), " was released: nobody used it for ",
                       absl::FormatDuration(options_.release_after))));
    }
    released.clear();  // the informers are destroyed here, their threads joined
  }
}

std::vector<DynamicInformerFactory::Entry> DynamicInformerFactory::TakeExpiredLocked(
    absl::Time now) {
  std::vector<Entry> expired;
  for (auto it = informers_.begin(); it != informers_.end();) {
    const Entry& e = it->second;
    // unused_since is finite only once the last handle's deleter has run.
    if (e.handle.expired() && e.unused_since != absl::InfiniteFuture() &&
        e.unused_since + options_.release_after <= now) {
      expired.push_back(std::move(it->second));
      it = informers_.erase(it);
    } else {
      ++it;
    }
  }
  if (!expired.empty()) UpdateGaugeLocked();
  return expired;
}

absl::Time DynamicInformerFactory::NextReleaseLocked() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [key, e] : informers_) {
    if (!e.handle.expired() || e.unused_since == absl::InfiniteFuture()) continue;
    next = std::min(next, e.unused_since + options_.release_after);
  }
  return next;
}

void DynamicInformerFactory::UpdateGaugeLocked() {
  if (informers_gauge_ != nullptr) informers_gauge_->Set(static_cast<double>(informers_.size()));
}

bool DynamicInformerFactory::IsServed(const v1::GroupVersionResource& resource) const {
  if (IsBuiltIn(resource)) return true;
  absl::MutexLock l(&mu_);
  return served_.count(GvrKey(resource)) > 0;
}

std::vector<v1::GroupVersionResource> DynamicInformerFactory::ServedResources() const {
  std::map<std::string, v1::GroupVersionResource> all;
  for (const v1::GroupVersionResource& b : BuiltInResources()) all.emplace(GvrKey(b), b);
  {
    absl::MutexLock l(&mu_);
    all.insert(served_.begin(), served_.end());
  }
  std::vector<v1::GroupVersionResource> out;
  for (auto& [key, gvr] : all) out.push_back(gvr);
  return out;
}

Subscription DynamicInformerFactory::Subscribe(std::function<void(const ResourceEvent&)> listener) {
  // Under mu_, so that no change falls between the snapshot and the subscription.
  absl::MutexLock l(&mu_);
  std::vector<ResourceEvent> initial;
  for (const v1::GroupVersionResource& b : BuiltInResources()) {
    initial.push_back({ResourceEvent::Type::kServed, b});
  }
  for (const auto& [key, gvr] : served_) initial.push_back({ResourceEvent::Type::kServed, gvr});
  return notifier_->Add(std::move(listener), std::move(initial));
}

absl::StatusOr<std::shared_ptr<SharedInformer>> DynamicInformerFactory::NewInformer(
    const v1::GroupVersionResource& resource, const ListWatchFilters& filters) {
  absl::StatusOr<std::unique_ptr<ListerWatcher>> lw = source_(resource, filters);
  if (!lw.ok()) return lw.status();
  SharedInformer::Options informer_options = options_.informer;
  informer_options.name.clear();
  return SharedInformer::Create(*std::move(lw), std::move(informer_options));
}

std::shared_ptr<ResourceEventHandler> DynamicInformerFactory::DefinitionsHandler() {
  ResourceEventHandlerFuncs funcs;
  funcs.on_add = [this](const ObjectRef& o, bool) {
    ApplyDefinition(o->metadata().name(), o.get());
  };
  funcs.on_update = [this](const ObjectRef&, const ObjectRef& o) {
    ApplyDefinition(o->metadata().name(), o.get());
  };
  funcs.on_delete = [this](const ObjectRef& o) { ApplyDefinition(o->metadata().name(), nullptr); };
  return MakeHandler(std::move(funcs));
}

void DynamicInformerFactory::ApplyDefinition(const std::string& name,
                                             const v1::Object* definition) {
  std::map<std::string, v1::GroupVersionResource> now;
  if (definition != nullptr) now = ServedBy(*definition);
  std::vector<Entry> to_stop;
  std::vector<std::pair<std::string, std::string>> gone;  // resource name, why
  {
    absl::MutexLock l(&mu_);
    if (shut_down_) return;
    std::set<std::string>& before = definitions_served_[name];
    for (const std::string& key : std::set<std::string>(before)) {
      if (now.count(key) > 0) continue;
      auto it = served_.find(key);
      if (it == served_.end()) continue;
      v1::GroupVersionResource gvr = it->second;
      for (Entry& e : UnserveLocked(gvr)) to_stop.push_back(std::move(e));
      gone.emplace_back(StoreListerWatcher::ResourceName(gvr),
                        definition == nullptr
                            ? absl::StrCat("its ResourceDefinition ", name, " was deleted")
                            : absl::StrCat("its ResourceDefinition ", name,
                                           " no longer serves version ", gvr.version()));
      before.erase(key);
    }
    for (const auto& [key, gvr] : now) {
      if (before.insert(key).second) ServeLocked(gvr);
    }
    if (before.empty()) definitions_served_.erase(name);
  }
  for (const auto& [resource, why] : gone) {
    spdlog::info("informer factory: {} is no longer served: {}", resource, why);
  }
  // Unsubscribe first (the factory has already dropped them), then stop: their users are told.
  for (Entry& e : to_stop) e.on_stopped.Cancel();
  for (Entry& e : to_stop) {
    std::string resource = e.informer->name();
    e.informer->Stop(absl::NotFoundError(absl::StrCat(
        "informer ", resource, ": the resource is no longer served by the store (",
        definition == nullptr ? absl::StrCat("its ResourceDefinition ", name, " was deleted")
                              : absl::StrCat("its ResourceDefinition ", name, " changed"),
        ")")));
  }
}

void DynamicInformerFactory::ServeLocked(const v1::GroupVersionResource& resource) {
  if (served_.emplace(GvrKey(resource), resource).second) {
    spdlog::info("informer factory: {} is served", StoreListerWatcher::ResourceName(resource));
    notifier_->Publish({ResourceEvent::Type::kServed, resource});
  }
}

std::vector<DynamicInformerFactory::Entry> DynamicInformerFactory::UnserveLocked(
    const v1::GroupVersionResource& resource) {
  std::vector<Entry> dropped;
  const std::string key = GvrKey(resource);
  if (served_.erase(key) == 0) return dropped;
  notifier_->Publish({ResourceEvent::Type::kUnserved, resource});
  const std::string prefix = key + "|";
  for (auto it = informers_.lower_bound(prefix);
       it != informers_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    dropped.push_back(std::move(it->second));
    it = informers_.erase(it);
  }
  UpdateGaugeLocked();
  return dropped;
}

void DynamicInformerFactory::InformerStopped(const std::string& key,
                                             const SharedInformer* informer) {
  Entry dead;  // destroyed after the lock: its Subscription is the one calling us (no wait)
  absl::MutexLock l(&mu_);
  auto it = informers_.find(key);
  if (it == informers_.end() || it->second.informer.get() != informer) return;
  spdlog::info("informer factory: dropping stopped informer {}: {}", informer->name(),
               informer->StopReason().ToString());
  dead = std::move(it->second);
  informers_.erase(it);
  UpdateGaugeLocked();
}

}  // namespace shardcache
