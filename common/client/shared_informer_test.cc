// SharedInformer against a real cache_server: a stopped informer refuses handlers, late handlers
// get the current objects as adds, per-registration HasSynced, RemoveEventHandler, the filtering
// handler, the bounded per-handler buffer, periodic resync on a fake clock, and stop on
// NOT_FOUND with OnStopped.

#include "common/client/shared_informer.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/client/lister_watcher.h"
#include "common/testing/objects.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Gvr;

using ::shardcache::testing::Context;
using ::shardcache::testing::Eventually;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::ServerProcess;
using ::shardcache::testing::StatusIs;
using ::shardcache::testing::ThreadsOfThisProcess;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr absl::Duration kWait = absl::Seconds(20);

const v1::GroupVersionResource kWidgets = Gvr("example.com", "v1", "widgets");
const v1::GroupVersionResource kDefinitions =
    Gvr("core.shardcache.io", "v1", "resourcedefinitions");

std::string Color(const v1::Object& o) {
  auto it = o.spec().fields().find("color");
  return it == o.spec().fields().end() ? "" : it->second.string_value();
}

// Records what a handler is told; can be made to block inside its calls.
class Recorder : public ResourceEventHandler {
 public:
  void OnAdd(const ObjectRef& o, bool initial) override {
    Call call(this);
    absl::MutexLock l(&mu_);
    log_.push_back(absl::StrCat("ADD ", o->metadata().name(), initial ? " initial" : ""));
    content_[o->metadata().name()] = o;
  }
  void OnUpdate(const ObjectRef& old_object, const ObjectRef& new_object) override {
    Call call(this);
    absl::MutexLock l(&mu_);
    if (old_object == new_object) {
      ++resyncs_;
    } else {
      log_.push_back(absl::StrCat("UPDATE ", new_object->metadata().name()));
    }
    content_[new_object->metadata().name()] = new_object;
  }
  void OnDelete(const ObjectRef& o) override {
    Call call(this);
    absl::MutexLock l(&mu_);
    log_.push_back(absl::StrCat("DELETE ", o->metadata().name()));
    content_.erase(o->metadata().name());
  }

  // While blocked, every call waits on entry.
  void Block() {
    absl::MutexLock l(&mu_);
    blocked_ = true;
  }
  void Unblock() {
    absl::MutexLock l(&mu_);
    blocked_ = false;
  }
  // Calls that are waiting on entry right now.
  int waiting() const {
    absl::MutexLock l(&mu_);
    return waiting_;
  }
  std::vector<std::string> Log() const {
    absl::MutexLock l(&mu_);
    return log_;
  }
  bool Saw(const std::string& entry) const {
    absl::MutexLock l(&mu_);
    return std::find(log_.begin(), log_.end(), entry) != log_.end();
  }
  // name -> resourceVersion of what it was told.
  std::map<std::string, std::string> Content() const {
    absl::MutexLock l(&mu_);
    std::map<std::string, std::string> out;
    for (const auto& [name, o] : content_) out[name] = o->metadata().resource_version();
    return out;
  }
  int resyncs() const {
    absl::MutexLock l(&mu_);
    return resyncs_;
  }
  int calls() const {
    absl::MutexLock l(&mu_);
    return calls_;
  }
  // Calls in progress right now (blocked on entry or running).
  int in_call() const {
    absl::MutexLock l(&mu_);
    return in_call_;
  }

 private:
  // Called first by each call: counts it, waits while blocked. The call is in progress until
  // the Leave() of its Call guard.
  void Enter() {
    absl::MutexLock l(&mu_);
    ++calls_;
    ++in_call_;
    ++waiting_;
    auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !blocked_; };
    mu_.Await(absl::Condition(&free));
    --waiting_;
  }
  void Leave() {
    absl::MutexLock l(&mu_);
    --in_call_;
  }
  // Enter() now, Leave() when the call returns.
  class Call {
   public:
    explicit Call(Recorder* r) : r_(r) { r_->Enter(); }
    ~Call() { r_->Leave(); }

   private:
    Recorder* r_;
  };

  mutable absl::Mutex mu_;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int in_call_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int resyncs_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ObjectRef> content_ ABSL_GUARDED_BY(mu_);
};

// Each test runs twice: with a delivery thread per registration, and on a WorkerPool.
class SharedInformerTest : public ::testing::TestWithParam<bool> {
 protected:
  void StartServer(std::vector<std::string> args = {}) {
    args.push_back("--bookmark-interval=200ms");
    server_ = std::make_unique<ServerProcess>(testing::BinaryPath("cache_server/cache_server"),
                                              std::move(args));
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = std::shared_ptr<v1::Store::StubInterface>(v1::Store::NewStub(channel_));
  }

  void TearDown() override {
    for (auto& informer : informers_) informer->Stop();
    informers_.clear();
    if (server_ != nullptr && server_->Running()) {
      EXPECT_EQ(server_->Stop(), 0);
    }
  }

  std::shared_ptr<SharedInformer> MakeInformer(const v1::GroupVersionResource& gvr,
                                               SharedInformer::Options options = {}) {
    if (OnPool()) {
      std::unique_ptr<WorkerPool>& pool = pools_[options.clock];
      if (pool == nullptr) {
        absl::StatusOr<std::unique_ptr<WorkerPool>> created =
            WorkerPool::Create({.threads = 3, .clock = options.clock});
        EXPECT_TRUE(created.ok()) << created.status();
        pool = *std::move(created);
      }
      options.pool = pool.get();
    }
    options.reflector.backoff.initial = absl::Milliseconds(50);
    options.reflector.backoff.max = absl::Milliseconds(500);
    auto lw = StoreListerWatcher::Create(stub_, gvr, {}, {});
    EXPECT_TRUE(lw.ok()) << lw.status();
    auto informer = SharedInformer::Create(*std::move(lw), options);
    EXPECT_TRUE(informer.ok()) << informer.status();
    informers_.push_back(*informer);
    return *informer;
  }

  v1::Object Put(const std::string& name, const std::string& color = "red",
                 const std::string& size = "") {
    v1::Object obj;
    obj.mutable_metadata()->set_name(name);
    (*obj.mutable_spec()->mutable_fields())["color"].set_string_value(color);
    if (!size.empty()) (*obj.mutable_spec()->mutable_fields())["size"].set_string_value(size);
    v1::Object out;
    v1::CreateRequest create;
    *create.mutable_resource() = kWidgets;
    *create.mutable_object() = obj;
    grpc::Status s = stub_->Create(Context().get(), create, &out);
    if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      v1::UpdateRequest update;
      *update.mutable_resource() = kWidgets;
      *update.mutable_object() = obj;
      s = stub_->Update(Context().get(), update, &out);
    }
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  void Remove(const std::string& name) {
    v1::DeleteRequest req;
    *req.mutable_resource() = kWidgets;
    req.set_name(name);
    v1::DeleteResponse resp;
    grpc::Status s = stub_->Delete(Context().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }

  // Shard role: defines widgets.example.com.
  void DefineWidgets() {
    v1::CreateRequest def;
    *def.mutable_resource() = kDefinitions;
    def.mutable_object()->mutable_metadata()->set_name("widgets.example.com");
    auto& spec = *def.mutable_object()->mutable_spec()->mutable_fields();
    spec["group"].set_string_value("example.com");
    (*spec["names"].mutable_struct_value()->mutable_fields())["plural"].set_string_value("widgets");
    spec["scope"].set_string_value("Cluster");
    auto* version = spec["versions"].mutable_list_value()->add_values()->mutable_struct_value();
    (*version->mutable_fields())["name"].set_string_value("v1");
    v1::Object out;
    grpc::Status s = stub_->Create(Context().get(), def, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  void DeleteWidgetsDefinition() {
    v1::DeleteRequest del;
    *del.mutable_resource() = kDefinitions;
    del.set_name("widgets.example.com");
    v1::DeleteResponse resp;
    grpc::Status s = stub_->Delete(Context().get(), del, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  std::map<std::string, std::string> ServerContent() {
    v1::ListRequest req;
    *req.mutable_resource() = kWidgets;
    v1::ListResponse resp;
    grpc::Status s = stub_->List(Context().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::map<std::string, std::string> out;
    for (const v1::Object& o : resp.items()) {
      out[o.metadata().name()] = o.metadata().resource_version();
    }
    return out;
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::Store::StubInterface> stub_;
  // The clock of tests that move time themselves: a member, declared before what reads it, so that
  // it outlives the threads (the reflector's watchdog) that read it until they are stopped.
  FakeClock fake_clock_;
  // On a pool: one per clock, destroyed after the informers.
  std::map<const Clock*, std::unique_ptr<WorkerPool>> pools_;
  std::vector<std::shared_ptr<SharedInformer>> informers_;

  bool OnPool() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Delivery, SharedInformerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "OnAPool" : "ThreadPerHandler";
                         });

TEST_P(SharedInformerTest, AddEventHandler_OnStoppedInformer_FailsWithFailedPrecondition) {
  StartServer();
  auto informer = MakeInformer(kWidgets);
  ASSERT_THAT(informer->Run(), IsOk());
  ASSERT_TRUE(informer->WaitForSync(kWait));
  informer->Stop();
  EXPECT_TRUE(informer->IsStopped());
  EXPECT_THAT(informer->StopReason(), StatusIs(absl::StatusCode::kCancelled));

  auto reg = informer->AddEventHandler(std::make_shared<Recorder>());
  EXPECT_THAT(reg, StatusIs(absl::StatusCode::kFailedPrecondition,
                            AllOf(HasSubstr("is stopped"), HasSubstr("Stop()"),
                                  HasSubstr("the handler was not added"))));
  EXPECT_THAT(informer->Run(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_P(SharedInformerTest, NotFound_StopsTheInformer_TellsItsUsers_AndRefusesHandlers) {
  StartServer({"--role=shard"});
  DefineWidgets();
  Put("w0");
  auto informer = MakeInformer(kWidgets);
  auto recorder = std::make_shared<Recorder>();
  auto reg = informer->AddEventHandler(recorder);
  ASSERT_THAT(reg, IsOk());
  absl::Mutex mu;
  std::vector<absl::Status> told;
  Subscription sub = informer->OnStopped([&](const absl::Status& why) {
    absl::MutexLock l(&mu);
    told.push_back(why);
  });
  bool cancelled_called = false;
  Subscription cancelled =
      informer->OnStopped([&](const absl::Status&) { cancelled_called = true; });
  cancelled.Cancel();
  ASSERT_THAT(informer->Run(), IsOk());
  ASSERT_TRUE((*reg)->WaitForSync(kWait));
  // A live event proves the watch is open: a watch that starts after the deletion gets
  // NOT_FOUND at once, without the DELETED events.
  Put("w1");
  ASSERT_TRUE(Eventually([&] { return recorder->Saw("ADD w1"); }, "recorder->Saw(\"ADD w1\")"));

  DeleteWidgetsDefinition();
  ASSERT_TRUE(Eventually([&] { return informer->IsStopped(); }, "informer->IsStopped()"));
  EXPECT_THAT(informer->StopReason(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no longer served")));
  // The subscribers are told on the reflector's thread, just after IsStopped() turns true.
  ASSERT_TRUE(Eventually(
      [&] {
        absl::MutexLock l(&mu);
        return !told.empty();
      },
      "an OnStopped callback was called"));
  {
    absl::MutexLock l(&mu);
    ASSERT_EQ(told.size(), 1u);
    EXPECT_THAT(told[0], StatusIs(absl::StatusCode::kNotFound));
  }
  EXPECT_FALSE(cancelled_called);
  // The handler got the deletes the store sent before NOT_FOUND.
  ASSERT_TRUE(Eventually([&] { return recorder->Saw("DELETE w0") && recorder->Saw("DELETE w1"); },
                         "recorder->Saw(\"DELETE w0\") && recorder->Saw(\"DELETE w1\")"));
  EXPECT_EQ(informer->store().Size(), 0u);

  // A late subscriber is told at once, on its own thread.
  absl::Status late;
  Subscription late_sub = informer->OnStopped([&](const absl::Status& why) { late = why; });
  EXPECT_THAT(late, StatusIs(absl::StatusCode::kNotFound));
  // And a handler is refused, with the reason.
  EXPECT_THAT(informer->AddEventHandler(std::make_shared<Recorder>()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("is stopped"), HasSubstr("no longer served"))));
}

TEST_P(SharedInformerTest, LateHandler_ReceivesTheCurrentObjectsAsAdds) {
  StartServer();
  Put("w0");
  Put("w1");
  auto informer = MakeInformer(kWidgets);
  ASSERT_THAT(informer->Run(), IsOk());
  ASSERT_TRUE(informer->WaitForSync(kWait));

  auto recorder = std::make_shared<Recorder>();
  auto reg = informer->AddEventHandler(recorder);
  ASSERT_THAT(reg, IsOk());
  ASSERT_TRUE((*reg)->WaitForSync(kWait));
  EXPECT_THAT(recorder->Log(), UnorderedElementsAre("ADD w0 initial", "ADD w1 initial"));

  Put("w2");
  Put("w0", "blue");
  Remove("w1");
  ASSERT_TRUE(Eventually([&] { return recorder->Content() == ServerContent(); },
                         "recorder->Content() == ServerContent()"))
      << ::testing::PrintToString(recorder->Log());
  EXPECT_THAT(recorder->Log(), ElementsAre(HasSubstr("initial"), HasSubstr("initial"), "ADD w2",
                                           "UPDATE w0", "DELETE w1"));
}

// Many handlers, each given every change in order: a thread each, or none more on a pool, where
// a turn's bound (kEventsPerTurn) interleaves them.
TEST_P(SharedInformerTest, ManyHandlers_EachGetsEverything_OnAPoolWithNoThreadOfTheirOwn) {
  StartServer();
  constexpr int kObjects = 3 * SharedInformer::kEventsPerTurn;
  for (int i = 0; i < kObjects; ++i) Put(absl::StrCat("w", i));
  auto informer = MakeInformer(kWidgets);
  ASSERT_THAT(informer->Run(), IsOk());
  ASSERT_TRUE(informer->WaitForSync(kWait));
  const int threads_before = ThreadsOfThisProcess();
  constexpr int kHandlers = 40;
  std::vector<std::shared_ptr<Recorder>> recorders;
  std::vector<std::unique_ptr<SharedInformer::Registration>> registrations;
  for (int i = 0; i < kHandlers; ++i) {
    recorders.push_back(std::make_shared<Recorder>());
    auto reg = informer->AddEventHandler(recorders.back());
    ASSERT_THAT(reg, IsOk());
    registrations.push_back(*std::move(reg));
  }
  // (gRPC starts and ends threads of its own meanwhile: a few either way.)
  constexpr int kSlack = 4;
  const int added = ThreadsOfThisProcess() - threads_before;
  if (OnPool()) {
    EXPECT_LE(added, kSlack);
  } else {
    EXPECT_GE(added, kHandlers - kSlack);
  }
  for (const auto& reg : registrations) ASSERT_TRUE(reg->WaitForSync(kWait));
  for (int i = 0; i < kObjects; ++i) Put(absl::StrCat("w", i), "blue");
  std::map<std::string, std::string> want = ServerContent();
  for (int i = 0; i < kHandlers; ++i) {
    ASSERT_TRUE(Eventually([&] { return recorders[i]->Content() == want; },
                           absl::StrCat("handler ", i, " has every object at its last version")));
    // The initial adds, then one update per object, in the order they were made.
    std::vector<std::string> log = recorders[i]->Log();
    ASSERT_EQ(log.size(), 2u * kObjects);
    for (int j = 0; j < kObjects; ++j) {
      EXPECT_EQ(log[kObjects + j], absl::StrCat("UPDATE w", j)) << "handler " << i;
    }
  }
  registrations.clear();
  EXPECT_LE(ThreadsOfThisProcess(), threads_before + kSlack);
}

// Many informers, each with its own list and watch against the real server: on a pool their
// reflectors add no thread (a thread each otherwise), and every one syncs and sees a write.
TEST_P(SharedInformerTest, ManyInformers_OnAPool_AddNoThreadPerInformer_AndAllSeeAWrite) {
  StartServer();
  Put("before");
  // The first informer starts what every watch shares (gRPC's threads, the pool).
  std::shared_ptr<SharedInformer> first = MakeInformer(kWidgets);
  ASSERT_THAT(first->Run(), IsOk());
  ASSERT_TRUE(first->WaitForSync(kWait));
  const int threads_before = ThreadsOfThisProcess();
  constexpr int kInformers = 200;
  std::vector<std::shared_ptr<SharedInformer>> informers;
  for (int i = 0; i < kInformers; ++i) {
    informers.push_back(MakeInformer(kWidgets));
    ASSERT_THAT(informers.back()->Run(), IsOk());
  }
  for (const auto& informer : informers) ASSERT_TRUE(informer->WaitForSync(kWait));
  Put("after");
  for (int i = 0; i < kInformers; ++i) {
    ASSERT_TRUE(Eventually([&] { return informers[i]->store().List().size() == 2; },
                           absl::StrCat("informer ", i, " sees the write")));
  }
  // gRPC starts and ends threads of its own as calls come and go: a fixed number, whatever the
  // number of watches.
  constexpr int kSlack = 12;
  const int added = ThreadsOfThisProcess() - threads_before;
  if (OnPool()) {
    EXPECT_LE(added, kSlack) << kInformers << " informers on a pool added " << added
                             << " threads to " << threads_before;
  } else {
    EXPECT_GE(added, kInformers - kSlack);
  }
  for (const auto& informer : informers) informer->Stop();
  informers.clear();
  EXPECT_TRUE(Eventually(
      [&] { return testing::Metric(server_->http_port(), "shardcache_store_watchers") == 1; },
      "the server has the first informer's watch only"));
}

TEST_P(SharedInformerTest, HasSynced_IsPerRegistration) {
  StartServer();
  Put("w0");
  Put("w1");
  auto informer = MakeInformer(kWidgets);
  auto slow = std::make_shared<Recorder>();
  slow->Block();
  auto slow_reg = informer->AddEventHandler(slow);  // before Run: gets the first list
  ASSERT_THAT(slow_reg, IsOk());
  EXPECT_FALSE((*slow_reg)->HasSynced());
  ASSERT_THAT(informer->Run(), IsOk());
  ASSERT_TRUE(informer->WaitForSync(kWait));
  ASSERT_TRUE(Eventually([&] { return slow->waiting() == 1; },
                         "slow->waiting() == 1"));  // stuck in its first add

  auto fast = std::make_shared<Recorder>();
  auto fast_reg = informer->AddEventHandler(fast);
  ASSERT_THAT(fast_reg, IsOk());
  ASSERT_TRUE((*fast_reg)->WaitForSync(kWait));
  EXPECT_TRUE(informer->HasSynced());
  EXPECT_FALSE((*slow_reg)->HasSynced()) << "synced before its handler got the initial list";

  slow->Unblock();
  ASSERT_TRUE((*slow_reg)->WaitForSync(kWait));
  EXPECT_THAT(slow->Log(), UnorderedElementsAre("ADD w0 initial", "ADD w1 initial"));
}

TEST_P(SharedInformerTest, RemoveEventHandler_StopsDelivery_AndWaitsForTheCallInProgress) {
  StartServer();
  auto informer = MakeInformer(kWidgets);
  ASSERT_THAT(informer->Run(), IsOk());
  ASSERT_TRUE(informer->WaitForSync(kWait));
  auto removed = std::make_shared<Recorder>();
  auto removed_reg = informer->AddEventHandler(removed);
  auto sentinel = std::make_shared<Recorder>();
  auto sentinel_reg = informer->AddEventHandler(sentinel);
  ASSERT_THAT(removed_reg, IsOk());
  ASSERT_THAT(sentinel_reg, IsOk());
  ASSERT_TRUE((*removed_reg)->WaitForSync(kWait));

  removed->Block();
  Put("w0");
  ASSERT_TRUE(Eventually([&] { return removed->waiting() == 1; }, "the handler is inside OnAdd"));
  std::atomic<bool> returned{false};
  std::atomic<pid_t> remover_tid{0};
  std::atomic<int> in_call_at_return{-1};
  std::thread remover([&] {
    remover_tid = testing::ThisThreadId();
    EXPECT_THAT(informer->RemoveEventHandler(removed_reg->get()), IsOk());
    in_call_at_return = removed->in_call();
    returned = true;
  });
  // It must not return while the handler's call is in progress: once the remover thread is
  // asleep inside RemoveEventHandler (nothing else blocks it: the informer is idle), it has
  // either returned already or is waiting for the call. (No ASSERT: the thread must be joined.)
  EXPECT_TRUE(Eventually(
      [&] {
        return returned.load() ||
               (remover_tid.load() != 0 && testing::ThreadAsleep(remover_tid.load()));
      },
      "RemoveEventHandler returns or blocks"));
  EXPECT_FALSE(returned.load());
  removed->Unblock();
  remover.join();
  EXPECT_TRUE(returned.load());
  EXPECT_EQ(in_call_at_return.load(), 0) << "returned while the handler's call was in progress";
  const int calls = removed->calls();

  Put("w1");
  Put("w0", "blue");
  ASSERT_TRUE(
      Eventually([&] { return sentinel->Saw("UPDATE w0"); }, "sentinel->Saw(\"UPDATE w0\")"));
  EXPECT_EQ(removed->calls(), calls);
  EXPECT_THAT(removed->Log(), Not(Contains("ADD w1")));
  // Idempotent, also through the registration's destructor.
  EXPECT_THAT(informer->RemoveEventHandler(removed_reg->get()), IsOk());
  removed_reg->reset();
}

TEST_P(SharedInformerTest, RemoveEventHandler_FromInsideItsOwnHandler_ReturnsAtOnce) {
  StartServer();
  auto informer = MakeInformer(kWidgets);
  ASSERT_THAT(informer->Run(), IsOk());
  ASSERT_TRUE(informer->WaitForSync(kWait));
  absl::Mutex mu;
  SharedInformer::Registration* self = nullptr;
  std::vector<std::string> seen;
  absl::Status removal = absl::UnknownError("not called");
  ResourceEventHandlerFuncs funcs;
  funcs.on_add = [&](const ObjectRef& o, bool) {
    absl::MutexLock l(&mu);
    seen.push_back(o->metadata().name());
    if (o->metadata().name() == "remove-me") removal = informer->RemoveEventHandler(self);
  };
  auto reg = informer->AddEventHandler(MakeHandler(funcs));
  ASSERT_THAT(reg, IsOk());
  {
    absl::MutexLock l(&mu);
    self = reg->get();
  }
  auto sentinel = std::make_shared<Recorder>();
  auto sentinel_reg = informer->AddEventHandler(sentinel);  // removed when destroyed
  ASSERT_THAT(sentinel_reg, IsOk());
  Put("remove-me");
  Put("after");
  // Each registration has its own delivery thread: the sentinel may see "after" before the
  // handler has seen "remove-me".
  ASSERT_TRUE(Eventually(
      [&] {
        absl::MutexLock l(&mu);
        return removal.code() != absl::StatusCode::kUnknown;
      },
      "the handler removed itself"));
  ASSERT_TRUE(
      Eventually([&] { return sentinel->Saw("ADD after"); }, "sentinel->Saw(\"ADD after\")"));
  absl::MutexLock l(&mu);
  EXPECT_THAT(removal, IsOk());
  EXPECT_THAT(seen, ElementsAre("remove-me"));
}

TEST_P(SharedInformerTest, FilteringHandler_UpdatesThatCrossTheFilterBecomeAddOrDelete) {
  StartServer();
  Put("a", "red");
  Put("b", "blue");
  auto informer = MakeInformer(kWidgets);
  ASSERT_THAT(informer->Run(), IsOk());
  auto recorder = std::make_shared<Recorder>();
  auto filtered = std::make_shared<FilteringResourceEventHandler>(
      [](const v1::Object& o) { return Color(o) == "red"; }, recorder);
  auto reg = informer->AddEventHandler(filtered);
  ASSERT_THAT(reg, IsOk());
  ASSERT_TRUE((*reg)->WaitForSync(kWait));
  EXPECT_THAT(recorder->Log(), ElementsAre("ADD a initial"));

  Put("b", "red");         // starts matching: an add
  Put("a", "blue");        // stops matching: a delete (of the state it had)
  Put("b", "red", "big");  // still matches: an update
  Put("a", "green");       // matches neither before nor after: nothing
  Remove("a");             // did not match: nothing
  Remove("b");             // matched: a delete
  Put("sentinel", "red");
  ASSERT_TRUE(
      Eventually([&] { return recorder->Saw("ADD sentinel"); }, "recorder->Saw(\"ADD sentinel\")"));
  EXPECT_THAT(recorder->Log(), ElementsAre("ADD a initial", "ADD b", "DELETE a", "UPDATE b",
                                           "DELETE b", "ADD sentinel"));
}

TEST_P(SharedInformerTest, FilteringHandler_Unit) {
  auto recorder = std::make_shared<Recorder>();
  FilteringResourceEventHandler filter([](const v1::Object& o) { return Color(o) == "red"; },
                                       recorder);
  auto obj = [](const std::string& name, const std::string& color) {
    auto o = std::make_shared<v1::Object>();
    o->mutable_metadata()->set_name(name);
    (*o->mutable_spec()->mutable_fields())["color"].set_string_value(color);
    return ObjectRef(o);
  };
  filter.OnAdd(obj("x", "blue"), true);
  filter.OnAdd(obj("y", "red"), true);
  filter.OnUpdate(obj("x", "blue"), obj("x", "red"));
  filter.OnUpdate(obj("y", "red"), obj("y", "blue"));
  filter.OnUpdate(obj("x", "red"), obj("x", "red"));
  filter.OnUpdate(obj("y", "blue"), obj("y", "green"));
  filter.OnDelete(obj("y", "green"));
  filter.OnDelete(obj("x", "red"));
  EXPECT_THAT(recorder->Log(),
              ElementsAre("ADD y initial", "ADD x", "DELETE y", "UPDATE x", "DELETE x"));
}

TEST_P(SharedInformerTest, BoundedBuffer_SlowHandlerIsResynced_OthersAreNotHeldUp) {
  StartServer();
  auto informer = MakeInformer(kWidgets);
  ASSERT_THAT(informer->Run(), IsOk());
  ASSERT_TRUE(informer->WaitForSync(kWait));
  auto slow = std::make_shared<Recorder>();
  SharedInformer::HandlerOptions small;
  small.buffer_size = 3;
  auto slow_reg = informer->AddEventHandler(slow, small);
  auto fast = std::make_shared<Recorder>();
  auto fast_reg = informer->AddEventHandler(fast, small);
  ASSERT_THAT(slow_reg, IsOk());
  ASSERT_THAT(fast_reg, IsOk());
  ASSERT_TRUE((*slow_reg)->WaitForSync(kWait));
  ASSERT_TRUE((*fast_reg)->WaitForSync(kWait));

  slow->Block();
  // The fast handler and the cache keep up while the slow one is stuck in its first call. Each
  // change reaches the fast handler before the next is made, so that its small buffer holds at
  // most one event however late its thread is scheduled; the slow handler's overflows all the
  // same.
  auto delivered_to_fast = [&](const std::string& name, const std::string& rv) {
    return Eventually(
        [&] {
          auto content = fast->Content();
          auto it = content.find(name);
          return rv.empty() ? it == content.end() : it != content.end() && it->second == rv;
        },
        absl::StrCat("the fast handler has ", name, rv.empty() ? " deleted" : " at " + rv),
        [&] { return ::testing::PrintToString(fast->Log()); });
  };
  constexpr int kObjects = 30;
  for (int i = 0; i < kObjects; ++i) {
    const std::string name = absl::StrCat("w", i);
    ASSERT_TRUE(delivered_to_fast(name, Put(name).metadata().resource_version()));
  }
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(delivered_to_fast(
        "w0", Put("w0", "blue", absl::StrCat("size", i)).metadata().resource_version()));
  }
  Remove("w1");
  ASSERT_TRUE(delivered_to_fast("w1", ""));
  std::map<std::string, std::string> want = ServerContent();
  ASSERT_TRUE(Eventually([&] { return fast->Content() == want; }, "the fast handler has it all",
                         [&] { return ::testing::PrintToString(fast->Log()); }));
  EXPECT_EQ(informer->store().Size(), want.size());
  EXPECT_EQ(slow->waiting(), 1);
  EXPECT_GE((*slow_reg)->overflows(), 1);
  EXPECT_EQ((*fast_reg)->overflows(), 0);

  // Released, the slow handler catches up from the cache: the same final state, each object
  // added once.
  slow->Unblock();
  ASSERT_TRUE(Eventually([&] { return slow->Content() == want; }, "slow->Content() == want"))
      << ::testing::PrintToString(slow->Log());
  int adds = 0;
  for (const std::string& e : slow->Log()) adds += e.rfind("ADD ", 0) == 0 ? 1 : 0;
  EXPECT_EQ(adds, kObjects - 1);  // w1 was gone before the handler got to it
  // Without coalescing it would have had 41 calls (30 adds, 10 updates, 1 delete).
  EXPECT_LE(slow->calls(), kObjects + 1) << ::testing::PrintToString(slow->Log());
}

TEST_P(SharedInformerTest, Resync_RedeliversEveryObjectEachPeriod_OnTheClock) {
  StartServer();
  Put("w0");
  Put("w1");
  FakeClock& clock = fake_clock_;
  SharedInformer::Options options;
  options.clock = &clock;
  // No watch liveness timer: the delivery threads are then the only waiters on the clock.
  options.reflector.watch_idle_timeout = absl::ZeroDuration();
  auto informer = MakeInformer(kWidgets, options);
  ASSERT_THAT(informer->Run(), IsOk());
  auto recorder = std::make_shared<Recorder>();
  SharedInformer::HandlerOptions every_minute;
  every_minute.resync_period = absl::Minutes(1);
  auto reg = informer->AddEventHandler(recorder, every_minute);
  auto plain = std::make_shared<Recorder>();
  auto plain_reg = informer->AddEventHandler(plain);
  ASSERT_THAT(reg, IsOk());
  ASSERT_THAT(plain_reg, IsOk());
  ASSERT_TRUE((*reg)->WaitForSync(kWait));
  EXPECT_EQ(recorder->resyncs(), 0);

  ASSERT_TRUE((*plain_reg)->WaitForSync(kWait));
  // Both delivery threads wait on the clock, the resyncing one until a minute after it synced;
  // on a pool, its timer thread waits for that minute.
  const size_t waiters = OnPool() ? 1 : 2;
  ASSERT_TRUE(clock.AwaitWaiters(waiters));
  clock.Advance(absl::Seconds(59));
  // Advance wakes the waiters it reaches before it returns: all still wait, so no resync ran.
  EXPECT_EQ(clock.Waiters(), waiters);
  EXPECT_EQ(recorder->resyncs(), 0);
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return recorder->resyncs() == 2; }, "recorder->resyncs() == 2"));
  clock.Advance(absl::Minutes(1));
  ASSERT_TRUE(Eventually([&] { return recorder->resyncs() == 4; }, "recorder->resyncs() == 4"));
  EXPECT_EQ(plain->resyncs(), 0);
  EXPECT_THAT(recorder->Log(), UnorderedElementsAre("ADD w0 initial", "ADD w1 initial"));
}

TEST_P(SharedInformerTest, Create_RejectsBadArguments) {
  StartServer();
  auto lw = StoreListerWatcher::Create(stub_, kWidgets, {}, {});
  ASSERT_THAT(lw, IsOk());
  SharedInformer::Options options;
  options.handler_buffer = 0;
  EXPECT_THAT(SharedInformer::Create(*std::move(lw), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("handler_buffer")));
  auto informer = MakeInformer(kWidgets);
  EXPECT_THAT(informer->AddEventHandler(nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  auto other = MakeInformer(kWidgets);
  auto reg = other->AddEventHandler(std::make_shared<Recorder>());
  ASSERT_THAT(reg, IsOk());
  EXPECT_THAT(informer->RemoveEventHandler(reg->get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not belong")));
}

}  // namespace
}  // namespace shardcache
