// DynamicInformerFactory against a real cache_server: informers for served resources only, stop
// (with their users told) when the definition goes, NEW informers when it comes back, and
// resource lifecycle events for subscribers. One test builds it over scripted ListerWatchers
// instead (its source seam), with no server.

#include "common/client/dynamic_informer_factory.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/testing/objects.h"
#include "common/testing/scripted_source.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"
#include "prometheus/registry.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Gvr;

using ::shardcache::testing::Context;
using ::shardcache::testing::Eventually;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::ServerProcess;
using ::shardcache::testing::StatusIs;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr absl::Duration kWait = absl::Seconds(20);

const v1::GroupVersionResource kWidgets = Gvr("example.com", "v1", "widgets");
const v1::GroupVersionResource kWidgetsV2 = Gvr("example.com", "v2", "widgets");
const v1::GroupVersionResource kGadgets = Gvr("example.com", "v1", "gadgets");
const v1::GroupVersionResource kLeases = Gvr("coordination.shardcache.io", "v1", "leases");
const v1::GroupVersionResource kDefinitions =
    Gvr("core.shardcache.io", "v1", "resourcedefinitions");

std::string Describe(const ResourceEvent& e) {
  return absl::StrCat(e.type == ResourceEvent::Type::kServed ? "SERVED " : "UNSERVED ",
                      StoreListerWatcher::ResourceName(e.resource));
}

// Records the lifecycle events a subscriber is told.
class EventLog {
 public:
  std::function<void(const ResourceEvent&)> Listener() {
    return [this](const ResourceEvent& e) {
      absl::MutexLock l(&mu_);
      events_.push_back(Describe(e));
    };
  }
  std::vector<std::string> Events() const {
    absl::MutexLock l(&mu_);
    return events_;
  }
  bool Has(const std::string& e) const {
    absl::MutexLock l(&mu_);
    return std::find(events_.begin(), events_.end(), e) != events_.end();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

// Records the names of the objects a handler has added, and the stop of its informer.
struct Watcher {
  explicit Watcher(const std::shared_ptr<SharedInformer>& informer) {
    ResourceEventHandlerFuncs funcs;
    funcs.on_add = [this](const ObjectRef& o, bool) {
      absl::MutexLock l(&mu);
      added.push_back(o->metadata().name());
    };
    funcs.on_delete = [this](const ObjectRef& o) {
      absl::MutexLock l(&mu);
      deleted.push_back(o->metadata().name());
    };
    auto reg = informer->AddEventHandler(MakeHandler(funcs));
    EXPECT_TRUE(reg.ok()) << reg.status();
    if (reg.ok()) registration = *std::move(reg);
    stopped = informer->OnStopped([this](const absl::Status& why) {
      absl::MutexLock l(&mu);
      stop_reasons.push_back(why);
    });
  }
  bool Added(const std::string& name) {
    absl::MutexLock l(&mu);
    return std::find(added.begin(), added.end(), name) != added.end();
  }
  std::vector<absl::Status> StopReasons() {
    absl::MutexLock l(&mu);
    return stop_reasons;
  }

  absl::Mutex mu;
  std::vector<std::string> added ABSL_GUARDED_BY(mu);
  std::vector<std::string> deleted ABSL_GUARDED_BY(mu);
  std::vector<absl::Status> stop_reasons ABSL_GUARDED_BY(mu);
  std::unique_ptr<SharedInformer::Registration> registration;
  Subscription stopped;
};

class DynamicInformerFactoryTest : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> args) {
    args.push_back("--bookmark-interval=200ms");
    server_ = std::make_unique<ServerProcess>(testing::BinaryPath("cache_server/cache_server"),
                                              std::move(args));
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = std::shared_ptr<v1::Store::StubInterface>(v1::Store::NewStub(channel_));
  }

  void MakeFactory(bool follow_definitions) {
    DynamicInformerFactory::Options options;
    options.follow_definitions = follow_definitions;
    options.informer.reflector.backoff.initial = absl::Milliseconds(50);
    options.informer.reflector.backoff.max = absl::Milliseconds(500);
    auto factory = DynamicInformerFactory::Create(stub_, options);
    ASSERT_TRUE(factory.ok()) << factory.status();
    factory_ = *std::move(factory);
    ASSERT_TRUE(factory_->WaitForSync(kWait));
  }

  void TearDown() override {
    factory_.reset();
    if (server_ != nullptr && server_->Running()) {
      EXPECT_EQ(server_->Stop(), 0);
    }
  }

  // Creates or replaces the ResourceDefinition of `plural`.example.com; `versions` are
  // (name, served) pairs.
  void Define(const std::string& plural,
              const std::vector<std::pair<std::string, bool>>& versions = {{"v1", true}}) {
    v1::Object def;
    def.mutable_metadata()->set_name(plural + ".example.com");
    auto& spec = *def.mutable_spec()->mutable_fields();
    spec["group"].set_string_value("example.com");
    (*spec["names"].mutable_struct_value()->mutable_fields())["plural"].set_string_value(plural);
    spec["scope"].set_string_value("Cluster");
    for (const auto& [name, served] : versions) {
      auto* v = spec["versions"].mutable_list_value()->add_values()->mutable_struct_value();
      (*v->mutable_fields())["name"].set_string_value(name);
      (*v->mutable_fields())["served"].set_bool_value(served);
    }
    v1::Object out;
    v1::CreateRequest create;
    *create.mutable_resource() = kDefinitions;
    *create.mutable_object() = def;
    grpc::Status s = stub_->Create(Context().get(), create, &out);
    if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      v1::UpdateRequest update;
      *update.mutable_resource() = kDefinitions;
      *update.mutable_object() = def;
      s = stub_->Update(Context().get(), update, &out);
    }
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  void Undefine(const std::string& plural) {
    v1::DeleteRequest del;
    *del.mutable_resource() = kDefinitions;
    del.set_name(plural + ".example.com");
    v1::DeleteResponse resp;
    grpc::Status s = stub_->Delete(Context().get(), del, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  void Put(const v1::GroupVersionResource& gvr, const std::string& name) {
    v1::CreateRequest create;
    *create.mutable_resource() = gvr;
    create.mutable_object()->mutable_metadata()->set_name(name);
    v1::Object out;
    grpc::Status s = stub_->Create(Context().get(), create, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::Store::StubInterface> stub_;
  std::unique_ptr<DynamicInformerFactory> factory_;
};

TEST_F(DynamicInformerFactoryTest, ForResource_UnservedResource_IsNotFound) {
  StartServer({"--role=shard"});
  MakeFactory(true);
  EXPECT_THAT(factory_->ForResource(kWidgets),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("widgets.example.com/v1"), HasSubstr("not served"),
                             HasSubstr("no ResourceDefinition defines it"))));
  EXPECT_FALSE(factory_->IsServed(kWidgets));
  // Built-in resources are always served.
  auto leases = factory_->ForResource(kLeases);
  ASSERT_THAT(leases, IsOk());
  EXPECT_FALSE((*leases)->IsStopped());
  EXPECT_TRUE((*leases)->WaitForSync(kWait));
  EXPECT_THAT(factory_->ForResource(Gvr("example.com", "", "widgets")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ListWatchFilters bad;
  bad.label_selector = "a in (";
  EXPECT_THAT(factory_->ForResource(kLeases, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labelSelector")));
}

TEST_F(DynamicInformerFactoryTest, ForResource_ReturnsOneRunningInformerPerResourceAndFilters) {
  StartServer({"--role=shard"});
  Define("widgets");
  MakeFactory(true);
  ASSERT_TRUE(
      Eventually([&] { return factory_->IsServed(kWidgets); }, "factory_->IsServed(kWidgets)"));
  auto a = factory_->ForResource(kWidgets);
  auto b = factory_->ForResource(kWidgets);
  ListWatchFilters cluster;
  cluster.cluster = "c1";
  auto c = factory_->ForResource(kWidgets, cluster);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_NE(a->get(), c->get());
  EXPECT_TRUE((*a)->WaitForSync(kWait));
  EXPECT_TRUE((*c)->WaitForSync(kWait));
}

TEST_F(DynamicInformerFactoryTest,
       DefinitionDeleted_StopsTheInformer_TellsItsUsers_ThenRecreated_GetsANewInformer) {
  StartServer({"--role=shard"});
  Define("widgets");
  Put(kWidgets, "w0");
  MakeFactory(true);
  ASSERT_TRUE(
      Eventually([&] { return factory_->IsServed(kWidgets); }, "factory_->IsServed(kWidgets)"));
  auto first = factory_->ForResource(kWidgets);
  ASSERT_THAT(first, IsOk());
  std::shared_ptr<SharedInformer> old_informer = *first;
  Watcher user(old_informer);
  ASSERT_TRUE(Eventually([&] { return user.Added("w0"); }, "user.Added(\"w0\")"));
  Put(kWidgets, "live");  // seen live: the watch is open when the definition goes
  ASSERT_TRUE(Eventually([&] { return user.Added("live"); }, "user.Added(\"live\")"));

  Undefine("widgets");
  ASSERT_TRUE(
      Eventually([&] { return !user.StopReasons().empty(); }, "!user.StopReasons().empty()"));
  EXPECT_THAT(user.StopReasons(),
              ElementsAre(StatusIs(absl::StatusCode::kNotFound, HasSubstr("no longer served"))));
  EXPECT_TRUE(old_informer->IsStopped());
  EXPECT_THAT(old_informer->AddEventHandler(MakeHandler({})),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Once the factory has seen the deletion, the resource is not served: NOT_FOUND, never the
  // stopped informer.
  ASSERT_TRUE(
      Eventually([&] { return !factory_->IsServed(kWidgets); }, "!factory_->IsServed(kWidgets)"));
  EXPECT_THAT(factory_->ForResource(kWidgets), StatusIs(absl::StatusCode::kNotFound));

  Define("widgets");
  Put(kWidgets, "w1");
  ASSERT_TRUE(
      Eventually([&] { return factory_->IsServed(kWidgets); }, "factory_->IsServed(kWidgets)"));
  auto second = factory_->ForResource(kWidgets);
  ASSERT_THAT(second, IsOk());
  EXPECT_NE(second->get(), old_informer.get()) << "a recreated definition needs a new informer";
  EXPECT_FALSE((*second)->IsStopped());
  Watcher new_user(*second);
  ASSERT_TRUE(Eventually([&] { return new_user.Added("w1"); }, "new_user.Added(\"w1\")"));
  EXPECT_TRUE(new_user.StopReasons().empty());
  EXPECT_TRUE(old_informer->IsStopped());
}

TEST_F(DynamicInformerFactoryTest, VersionNoLongerServed_StopsThatVersionsInformerOnly) {
  StartServer({"--role=shard"});
  Define("widgets", {{"v1", true}, {"v2", true}});
  MakeFactory(true);
  ASSERT_TRUE(
      Eventually([&] { return factory_->IsServed(kWidgetsV2); }, "factory_->IsServed(kWidgetsV2)"));
  auto v1 = factory_->ForResource(kWidgets);
  auto v2 = factory_->ForResource(kWidgetsV2);
  ASSERT_THAT(v1, IsOk());
  ASSERT_THAT(v2, IsOk());
  ASSERT_TRUE((*v2)->WaitForSync(kWait));
  Watcher v2_user(*v2);

  Define("widgets", {{"v1", true}, {"v2", false}});
  ASSERT_TRUE(
      Eventually([&] { return !v2_user.StopReasons().empty(); }, "!v2_user.StopReasons().empty()"));
  EXPECT_THAT(v2_user.StopReasons()[0], StatusIs(absl::StatusCode::kNotFound));
  ASSERT_TRUE(Eventually([&] { return !factory_->IsServed(kWidgetsV2); },
                         "!factory_->IsServed(kWidgetsV2)"));
  EXPECT_THAT(factory_->ForResource(kWidgetsV2), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(factory_->IsServed(kWidgets));
  EXPECT_FALSE((*v1)->IsStopped());
  auto again = factory_->ForResource(kWidgets);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->get(), v1->get());
}

TEST_F(DynamicInformerFactoryTest, Subscribers_AreToldWhatIsServed_ThenEveryChange) {
  StartServer({"--role=shard"});
  Define("gadgets");
  MakeFactory(true);
  EventLog early;
  Subscription early_sub = factory_->Subscribe(early.Listener());
  ASSERT_TRUE(Eventually([&] { return early.Events().size() >= 4; }, "early.Events().size() >= 4"));
  EXPECT_THAT(early.Events(),
              UnorderedElementsAre("SERVED resourcedefinitions.core.shardcache.io/v1",
                                   "SERVED leases.coordination.shardcache.io/v1",
                                   "SERVED clustercachedresources.cache.shardcache.io/v1alpha1",
                                   "SERVED gadgets.example.com/v1"));

  Define("widgets");
  ASSERT_TRUE(Eventually([&] { return early.Has("SERVED widgets.example.com/v1"); },
                         "early.Has(\"SERVED widgets.example.com/v1\")"));
  Undefine("widgets");
  ASSERT_TRUE(Eventually([&] { return early.Has("UNSERVED widgets.example.com/v1"); },
                         "early.Has(\"UNSERVED widgets.example.com/v1\")"));
  std::vector<std::string> events = early.Events();
  EXPECT_THAT(std::vector<std::string>(events.begin() + 4, events.end()),
              ElementsAre("SERVED widgets.example.com/v1", "UNSERVED widgets.example.com/v1"));

  // A late subscriber hears what is served now, and not what came and went before it.
  EventLog late;
  Subscription late_sub = factory_->Subscribe(late.Listener());
  ASSERT_TRUE(Eventually([&] { return late.Events().size() >= 4; }, "late.Events().size() >= 4"));
  EXPECT_THAT(late.Events(), Contains("SERVED gadgets.example.com/v1"));
  EXPECT_THAT(late.Events(), Not(Contains(HasSubstr("widgets"))));

  // A cancelled subscription hears nothing more; the others go on.
  late_sub.Cancel();
  size_t late_count = late.Events().size();
  Define("widgets");
  ASSERT_TRUE(Eventually(
      [&] {
        std::vector<std::string> e = early.Events();
        return std::count(e.begin(), e.end(), "SERVED widgets.example.com/v1") == 2;
      },
      "widgets served twice", [&] { return ::testing::PrintToString(early.Events()); }));
  EXPECT_EQ(late.Events().size(), late_count);
}

TEST_F(DynamicInformerFactoryTest, CacheRole_ServesWhatItIsTold) {
  StartServer({"--role=cache"});
  MakeFactory(false);
  EventLog log;
  Subscription sub = factory_->Subscribe(log.Listener());
  EXPECT_THAT(factory_->ForResource(kWidgets),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("ServeAlways")));
  ASSERT_THAT(factory_->ServeAlways(kWidgets), IsOk());
  ASSERT_THAT(factory_->ServeAlways(kWidgets), IsOk());  // once is enough; twice is harmless
  ASSERT_TRUE(Eventually([&] { return log.Has("SERVED widgets.example.com/v1"); },
                         "log.Has(\"SERVED widgets.example.com/v1\")"));
  auto informer = factory_->ForResource(kWidgets);
  ASSERT_THAT(informer, IsOk());
  Put(kWidgets, "w0");
  Watcher user(*informer);
  ASSERT_TRUE(Eventually([&] { return user.Added("w0"); }, "user.Added(\"w0\")"));
  EXPECT_THAT(factory_->ServedResources().size(), 4u);
  std::vector<std::string> events = log.Events();
  EXPECT_EQ(std::count(events.begin(), events.end(), "SERVED widgets.example.com/v1"), 1);
}

// From inside a listener (on the notifier thread): cancelling its own subscription returns at
// once, and a new subscriber hears its initial events first and each change once, although the
// change (gadgets) was queued before it subscribed and is in its initial events too.
TEST_F(DynamicInformerFactoryTest, SubscribeAndCancelFromInsideAListener) {
  StartServer({"--role=cache"});
  MakeFactory(false);
  EventLog first, late;
  Subscription first_sub, late_sub;
  absl::Notification subscribed;
  first_sub = factory_->Subscribe([&](const ResourceEvent& e) {
    first.Listener()(e);
    if (e.type != ResourceEvent::Type::kServed || e.resource.resource() != "widgets") return;
    first_sub.Cancel();  // waiting here for the call in progress would wait for ever
    EXPECT_THAT(factory_->ServeAlways(kGadgets), IsOk());
    late_sub = factory_->Subscribe(late.Listener());
    subscribed.Notify();
  });
  ASSERT_THAT(factory_->ServeAlways(kWidgets), IsOk());
  ASSERT_TRUE(subscribed.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(Eventually([&] { return late.Events().size() >= 5; }, "late.Events().size() >= 5"));
  const v1::GroupVersionResource gizmos = Gvr("example.com", "v1", "gizmos");
  ASSERT_THAT(factory_->ServeAlways(gizmos), IsOk());
  ASSERT_TRUE(Eventually([&] { return late.Has("SERVED gizmos.example.com/v1"); },
                         "late.Has(\"SERVED gizmos.example.com/v1\")"));
  std::vector<std::string> events = late.Events();
  ASSERT_EQ(events.size(), 6u) << ::testing::PrintToString(events);
  EXPECT_THAT(
      std::vector<std::string>(events.begin(), events.begin() + 5),
      UnorderedElementsAre("SERVED resourcedefinitions.core.shardcache.io/v1",
                           "SERVED leases.coordination.shardcache.io/v1",
                           "SERVED clustercachedresources.cache.shardcache.io/v1alpha1",
                           "SERVED widgets.example.com/v1", "SERVED gadgets.example.com/v1"));
  EXPECT_EQ(events.back(), "SERVED gizmos.example.com/v1");
  // The first subscriber heard nothing after it cancelled.
  EXPECT_FALSE(first.Has("SERVED gadgets.example.com/v1"));
  EXPECT_FALSE(first.Has("SERVED gizmos.example.com/v1"));
}

TEST_F(DynamicInformerFactoryTest, ServeAlways_WhenFollowingDefinitions_IsRefused) {
  StartServer({"--role=shard"});
  MakeFactory(true);
  EXPECT_THAT(factory_->ServeAlways(kWidgets),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("ResourceDefinitions")));
}

TEST_F(DynamicInformerFactoryTest, Destruction_StopsItsInformers_AndTellsTheirUsers) {
  StartServer({"--role=shard"});
  MakeFactory(true);
  auto leases = factory_->ForResource(kLeases);
  ASSERT_THAT(leases, IsOk());
  std::shared_ptr<SharedInformer> informer = *leases;
  Watcher user(informer);
  factory_.reset();
  EXPECT_TRUE(informer->IsStopped());
  EXPECT_THAT(user.StopReasons(), ElementsAre(StatusIs(absl::StatusCode::kCancelled,
                                                       HasSubstr("DynamicInformerFactory"))));
}

// Over a scripted source, the factory follows the definitions it lists and watches, and its
// informers read the scripted ListerWatchers of their resource and filters: no server.
TEST(DynamicInformerFactoryScriptedTest, FollowsDefinitionsFromItsSource) {
  testing::ScriptedSource source(RealClock::Get());
  v1::Object definition;
  definition.mutable_metadata()->set_name("widgets.example.com");
  definition.mutable_metadata()->set_resource_version("1");
  google::protobuf::Struct& spec = *definition.mutable_spec();
  (*spec.mutable_fields())["group"].set_string_value("example.com");
  (*(*spec.mutable_fields())["names"].mutable_struct_value()->mutable_fields())["plural"]
      .set_string_value("widgets");
  (*spec.mutable_fields())["scope"].set_string_value("Namespaced");
  google::protobuf::Struct v1;
  (*v1.mutable_fields())["name"].set_string_value("v1");
  *(*spec.mutable_fields())["versions"].mutable_list_value()->add_values()->mutable_struct_value() =
      v1;
  source.For(DynamicInformerFactory::DefinitionsResource())
      ->SetListObjects("store-1", "1", {definition});
  ListWatchFilters filters;
  filters.cluster = "root";
  v1::Object widget;
  widget.mutable_metadata()->set_cluster("root");
  widget.mutable_metadata()->set_namespace_("default");
  widget.mutable_metadata()->set_name("w1");
  widget.mutable_metadata()->set_resource_version("5");
  const v1::GroupVersionResource widgets = Gvr("example.com", "v1", "widgets");
  source.For(widgets, filters)->SetListObjects("store-1", "5", {widget});

  auto factory = DynamicInformerFactory::Create(source.Source(), {});
  ASSERT_THAT(factory.status(), IsOk());
  ASSERT_TRUE((*factory)->WaitForSync(kWait));
  EXPECT_TRUE((*factory)->IsServed(widgets));
  EXPECT_THAT((*factory)->ForResource(Gvr("example.com", "v1", "gadgets")).status(),
              StatusIs(absl::StatusCode::kNotFound));
  auto informer = (*factory)->ForResource(widgets, filters);
  ASSERT_THAT(informer.status(), IsOk());
  ASSERT_TRUE((*informer)->WaitForSync(kWait));
  EXPECT_EQ((*informer)->store().Size(), 1u);
  EXPECT_EQ(source.Taken(widgets, filters), 1);

  // The definition goes: the informer stops with NOT_FOUND.
  v1::WatchEvent deleted;
  deleted.set_type(v1::WatchEvent::DELETED);
  *deleted.mutable_object() = definition;
  ASSERT_TRUE(testing::PushWhenWatching(*source.For(DynamicInformerFactory::DefinitionsResource()),
                                        deleted));
  ASSERT_TRUE(Eventually([&] { return (*informer)->IsStopped(); }, kWait, "the informer stops"));
  EXPECT_THAT((*informer)->StopReason(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE((*factory)->IsServed(widgets));
}

// ---- Release of unused informers (scripted source, cache role, FakeClock) ----

class DynamicInformerFactoryReleaseTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kGrace = absl::Seconds(10);

  void SetUp() override { MakeFactory(kGrace); }

  void MakeFactory(absl::Duration release_after) {
    factory_.reset();
    DynamicInformerFactory::Options options;
    options.follow_definitions = false;
    options.informer.clock = &clock_;
    options.informer.reflector.watch_idle_timeout = absl::ZeroDuration();
    options.release_after = release_after;
    options.name = "test";
    options.registry = registry_;
    auto factory = DynamicInformerFactory::Create(source_.Source(), options);
    ASSERT_THAT(factory.status(), IsOk());
    factory_ = *std::move(factory);
    ASSERT_THAT(factory_->ServeAlways(kWidgets), IsOk());
    ASSERT_THAT(factory_->ServeAlways(kGadgets), IsOk());
    source_.For(kWidgets)->SetList("store-1", "3", {"w1"});
  }

  // shardcache_informer_factory_informers{factory="test"}.
  double Gauge() const {
    for (const prometheus::MetricFamily& f : registry_->Collect()) {
      if (f.name != "shardcache_informer_factory_informers") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        if (m.label.size() == 1 && m.label[0].value == "test") return m.gauge.value;
      }
    }
    ADD_FAILURE() << "no shardcache_informer_factory_informers{factory=\"test\"}";
    return -1;
  }

  // True once the release thread waits for `deadline` (it has seen the last handle go).
  ::testing::AssertionResult ReleaseDue(absl::Time deadline) {
    if (Eventually([&] { return clock_.NextDeadline() == deadline; }, kWait,
                   "the release thread waits for the grace period's end")) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "next deadline " << clock_.NextDeadline() << ", want " << deadline;
  }

  FakeClock clock_;
  testing::ScriptedSource source_{&clock_};
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<DynamicInformerFactory> factory_;
};

// Records the stop reasons an informer reports (without holding the informer).
struct StopLog {
  explicit StopLog(SharedInformer& informer)
      : subscription(informer.OnStopped([this](const absl::Status& why) {
          absl::MutexLock l(&mu);
          reasons.push_back(why);
        })) {}
  std::vector<absl::Status> Reasons() {
    absl::MutexLock l(&mu);
    return reasons;
  }
  absl::Mutex mu;
  std::vector<absl::Status> reasons ABSL_GUARDED_BY(mu);
  Subscription subscription;
};

TEST_F(DynamicInformerFactoryReleaseTest, Unused_IsReleasedWhenTheGracePeriodEnds) {
  auto informer = factory_->ForResource(kWidgets);
  ASSERT_THAT(informer.status(), IsOk());
  ASSERT_TRUE((*informer)->WaitForSync(kWait));
  EXPECT_EQ(factory_->InformerCount(), 1u);
  EXPECT_EQ(Gauge(), 1);
  ASSERT_TRUE(Eventually([&] { return source_.For(kWidgets)->streams() == 1; }, kWait,
                         "the informer watches"));
  StopLog log(**informer);
  const absl::Time dropped = clock_.Now();
  informer->reset();

  // Not before the grace period ends.
  ASSERT_TRUE(ReleaseDue(dropped + kGrace));
  clock_.Advance(kGrace - absl::Milliseconds(1));
  ASSERT_TRUE(ReleaseDue(dropped + kGrace));
  EXPECT_EQ(factory_->InformerCount(), 1u);
  EXPECT_TRUE(log.Reasons().empty());
  EXPECT_FALSE(source_.For(kWidgets)->stream(0)->cancelled());

  clock_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(Eventually([&] { return factory_->InformerCount() == 0; }, kWait,
                         "the informer is released"));
  EXPECT_EQ(Gauge(), 0);
  ASSERT_TRUE(Eventually([&] { return !log.Reasons().empty(); }, kWait, "it stops"));
  EXPECT_THAT(log.Reasons(),
              ElementsAre(StatusIs(absl::StatusCode::kCancelled, HasSubstr("released"))));
  EXPECT_TRUE(source_.For(kWidgets)->stream(0)->cancelled()) << "its watch is closed";
}

TEST_F(DynamicInformerFactoryReleaseTest, Held_IsNeverReleased_AndItsUsersAreNotTold) {
  auto first = factory_->ForResource(kWidgets);
  auto second = factory_->ForResource(kWidgets);
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_THAT(second.status(), IsOk());
  ASSERT_EQ(first->get(), second->get());
  Watcher user(*second);
  first->reset();  // one of two handles: still held
  // Another informer released meanwhile: the release thread runs, and keeps the held one.
  auto gadgets = factory_->ForResource(kGadgets);
  ASSERT_THAT(gadgets.status(), IsOk());
  const absl::Time dropped = clock_.Now();
  gadgets->reset();
  ASSERT_TRUE(ReleaseDue(dropped + kGrace));
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(Eventually([&] { return factory_->InformerCount() == 1; }, kWait,
                         "the unused informer is released"));
  EXPECT_EQ(clock_.NextDeadline(), absl::InfiniteFuture());
  EXPECT_FALSE((*second)->IsStopped());
  EXPECT_TRUE(user.StopReasons().empty());
  ASSERT_TRUE(Eventually([&] { return user.Added("w1"); }, kWait, "user.Added(\"w1\")"));
  auto again = factory_->ForResource(kWidgets);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->get(), second->get());
  EXPECT_EQ(source_.Taken(kWidgets), 1);
}

TEST_F(DynamicInformerFactoryReleaseTest, RequestedWithinTheGracePeriod_GetsTheSameInformerBack) {
  auto informer = factory_->ForResource(kWidgets);
  ASSERT_THAT(informer.status(), IsOk());
  SharedInformer* raw = informer->get();
  informer->reset();
  clock_.Advance(kGrace - absl::Seconds(1));
  auto back = factory_->ForResource(kWidgets);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->get(), raw);
  EXPECT_FALSE((*back)->IsStopped());
  // Held again: the grace period that had begun is over, and no other begins.
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(clock_.NextDeadline(), absl::InfiniteFuture());
  EXPECT_EQ(factory_->InformerCount(), 1u);
  EXPECT_FALSE((*back)->IsStopped());
  EXPECT_EQ(source_.Taken(kWidgets), 1) << "no second list and watch";

  // Dropped again: a new grace period, from then.
  const absl::Time dropped = clock_.Now();
  back->reset();
  ASSERT_TRUE(ReleaseDue(dropped + kGrace));
}

TEST_F(DynamicInformerFactoryReleaseTest, RequestedAfterTheRelease_GetsAFreshRunningInformer) {
  auto informer = factory_->ForResource(kWidgets);
  ASSERT_THAT(informer.status(), IsOk());
  informer->reset();
  clock_.Advance(kGrace);
  ASSERT_TRUE(Eventually([&] { return factory_->InformerCount() == 0; }, kWait,
                         "the informer is released"));
  source_.For(kWidgets)->SetList("store-1", "4", {"w1", "w2"});
  auto fresh = factory_->ForResource(kWidgets);
  ASSERT_THAT(fresh.status(), IsOk());
  EXPECT_EQ(source_.Taken(kWidgets), 2) << "a new informer, with its own list and watch";
  EXPECT_FALSE((*fresh)->IsStopped());
  Watcher user(*fresh);
  ASSERT_TRUE((*fresh)->WaitForSync(kWait));
  ASSERT_TRUE(Eventually([&] { return user.Added("w2"); }, kWait, "user.Added(\"w2\")"));
  EXPECT_EQ(factory_->InformerCount(), 1u);
  EXPECT_EQ(Gauge(), 1);
}

TEST_F(DynamicInformerFactoryReleaseTest, Release_IsNotTheResourceBeingUnserved) {
  EventLog log;
  Subscription sub = factory_->Subscribe(log.Listener());
  ASSERT_TRUE(Eventually([&] { return log.Events().size() == 5; }, kWait, "initial events"));
  auto informer = factory_->ForResource(kWidgets);
  ASSERT_THAT(informer.status(), IsOk());
  informer->reset();
  clock_.Advance(kGrace);
  ASSERT_TRUE(Eventually([&] { return factory_->InformerCount() == 0; }, kWait,
                         "the informer is released"));
  EXPECT_TRUE(factory_->IsServed(kWidgets));
  ASSERT_THAT(factory_->ServeAlways(Gvr("example.com", "v1", "gizmos")),
              IsOk());  // an event after the release's time
  ASSERT_TRUE(Eventually([&] { return log.Events().size() == 6; }, kWait, "the marker"));
  EXPECT_THAT(log.Events(), Not(Contains(HasSubstr("UNSERVED"))));
}

// Many threads take and drop handles of a few informers while the factory releases each one
// the moment it is unused: a handle is never of a stopped informer, and a held informer never
// stops (a handler can always be added); once every handle is dropped, every informer goes.
TEST_F(DynamicInformerFactoryReleaseTest, RequestsRaceWithReleases_NeverAStoppedInformer) {
  MakeFactory(absl::ZeroDuration());
  constexpr int kThreads = 8;
  constexpr int kRounds = 40;
  std::vector<ListWatchFilters> filters(3);
  filters[1].cluster = "c1";
  filters[2].cluster = "c2";
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        auto informer = factory_->ForResource(kWidgets, filters[(t + i) % filters.size()]);
        if (!informer.ok() || (*informer)->IsStopped()) {
          ++failures;
          continue;
        }
        auto registration = (*informer)->AddEventHandler(MakeHandler({}));
        if (!registration.ok()) ++failures;
        if ((*informer)->IsStopped()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(Eventually([&] { return factory_->InformerCount() == 0; }, kWait,
                         "every informer is released"));
  EXPECT_EQ(Gauge(), 0);
  int taken = 0;
  for (const ListWatchFilters& f : filters) taken += source_.Taken(kWidgets, f);
  EXPECT_GE(taken, 3);
}

TEST_F(DynamicInformerFactoryReleaseTest, HandleDroppedAfterTheFactory_DoesNothing) {
  auto informer = factory_->ForResource(kWidgets);
  ASSERT_THAT(informer.status(), IsOk());
  factory_.reset();
  EXPECT_TRUE((*informer)->IsStopped());
  informer->reset();
}

TEST(DynamicInformerFactoryOptionsTest, NegativeReleaseAfter_IsInvalid) {
  testing::ScriptedSource source(RealClock::Get());
  DynamicInformerFactory::Options options;
  options.follow_definitions = false;
  options.release_after = absl::Seconds(-1);
  EXPECT_THAT(DynamicInformerFactory::Create(source.Source(), options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("release_after")));
}

}  // namespace
}  // namespace shardcache
