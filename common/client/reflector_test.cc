// Reflector against a real cache_server: list then watch, resume without a relist after the
// server drops the stream, relist after "too old" and after the store behind the address was
// replaced, a watch on a paused server taken for dead, NOT_FOUND is terminal, and backoff on the
// Clock.

#include "common/client/reflector.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/client/lister_watcher.h"
#include "common/client/worker_pool.h"
#include "common/object_key.h"
#include "common/testing/objects.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Context;
using ::shardcache::testing::Gvr;

using ::shardcache::testing::Eventually;
using ::shardcache::testing::ServerProcess;
using ::shardcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const v1::GroupVersionResource kWidgets = Gvr("example.com", "v1", "widgets");

// A recording sink: the content it has been given, by name, and a log of what happened.
class RecordingSink : public ReflectorSink {
 public:
  void Replace(std::vector<ObjectRef> objects, const std::string& rv) override {
    absl::MutexLock l(&mu_);
    content_.clear();
    for (const ObjectRef& o : objects) content_[o->metadata().name()] = o;
    log_.push_back(absl::StrCat("REPLACE ", objects.size(), "@", rv));
    ++replaces_;
  }
  void Add(ObjectRef o) override { Record("ADD", o, false); }
  void Update(ObjectRef o) override { Record("UPDATE", o, false); }
  void Delete(ObjectRef o) override { Record("DELETE", o, true); }
  void Bookmark(const std::string&) override {
    absl::MutexLock l(&mu_);
    ++bookmarks_;
  }
  void Stopped(const absl::Status& reason) override {
    absl::MutexLock l(&mu_);
    ++stopped_calls_;
    stop_reason_ = reason;
  }

  // name -> resourceVersion of the content.
  std::map<std::string, std::string> Content() const {
    absl::MutexLock l(&mu_);
    std::map<std::string, std::string> out;
    for (const auto& [name, o] : content_) out[name] = o->metadata().resource_version();
    return out;
  }
  std::vector<std::string> Log() const {
    absl::MutexLock l(&mu_);
    return log_;
  }
  int replaces() const {
    absl::MutexLock l(&mu_);
    return replaces_;
  }
  int bookmarks() const {
    absl::MutexLock l(&mu_);
    return bookmarks_;
  }
  int stopped_calls() const {
    absl::MutexLock l(&mu_);
    return stopped_calls_;
  }
  absl::Status stop_reason() const {
    absl::MutexLock l(&mu_);
    return stop_reason_;
  }

 private:
  void Record(const char* what, const ObjectRef& o, bool deleted) {
    absl::MutexLock l(&mu_);
    if (deleted) {
      content_.erase(o->metadata().name());
    } else {
      content_[o->metadata().name()] = o;
    }
    log_.push_back(absl::StrCat(what, " ", o->metadata().name()));
  }

  mutable absl::Mutex mu_;
  std::map<std::string, ObjectRef> content_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  int replaces_ ABSL_GUARDED_BY(mu_) = 0;
  int bookmarks_ ABSL_GUARDED_BY(mu_) = 0;
  int stopped_calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status stop_reason_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
};

// Each test runs twice: on a thread of the reflector's own, and as turns on a WorkerPool.
class ReflectorTest : public ::testing::TestWithParam<bool> {
 protected:
  void StartServer(std::vector<std::string> args) {
    args.push_back("--bookmark-interval=200ms");
    server_ = std::make_unique<ServerProcess>(testing::BinaryPath("cache_server/cache_server"),
                                              std::move(args));
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    Connect(server_->grpc_address());
  }

  // A channel that reconnects quickly after the server comes back. (Not
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC gives each connection attempt that long at least, and
  // on a busy machine a handshake may take longer than a short one.)
  void Connect(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub_ = std::shared_ptr<v1::Store::StubInterface>(v1::Store::NewStub(channel_));
  }

  void TearDown() override {
    reflector_.reset();
    if (server_ != nullptr && server_->Running()) {
      EXPECT_EQ(server_->Stop(), 0);
    }
  }

  // Small real-time backoff, so that tests reconnect quickly.
  static Reflector::Options FastOptions() {
    Reflector::Options o;
    o.page_size = 2;
    o.backoff.initial = absl::Milliseconds(50);
    o.backoff.max = absl::Milliseconds(500);
    o.backoff.reset_after = absl::Seconds(1);
    return o;
  }

  // `options` on the test's pool (one of two threads, on options.clock), when the test runs on
  // one.
  Reflector::Options Pooled(Reflector::Options options) {
    if (!GetParam()) return options;
    if (pool_ == nullptr) {
      auto pool = WorkerPool::Create({.threads = 2, .clock = options.clock});
      EXPECT_TRUE(pool.ok()) << pool.status();
      pool_ = *std::move(pool);
    }
    EXPECT_EQ(pool_->clock(), options.clock);
    options.pool = pool_.get();
    return options;
  }

  void MakeReflector(const v1::GroupVersionResource& gvr, Reflector::Options options) {
    auto lw = StoreListerWatcher::Create(stub_, gvr, {}, {});
    ASSERT_TRUE(lw.ok()) << lw.status();
    auto r = Reflector::Create(*std::move(lw), &sink_, Pooled(options));
    ASSERT_TRUE(r.ok()) << r.status();
    reflector_ = *std::move(r);
  }

  // A reflector of widgets with FastOptions (on the pool, if asked) that feeds `sink`; null (and
  // a failure) if it cannot be made.
  std::unique_ptr<Reflector> NewReflector(ReflectorSink* sink) {
    auto lw = StoreListerWatcher::Create(stub_, kWidgets, {}, {});
    EXPECT_TRUE(lw.ok()) << lw.status();
    if (!lw.ok()) return nullptr;
    auto r = Reflector::Create(*std::move(lw), sink, Pooled(FastOptions()));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }

  v1::Object Put(const v1::GroupVersionResource& gvr, const std::string& name,
                 const std::string& color = "red") {
    v1::UpdateRequest req;
    *req.mutable_resource() = gvr;
    req.mutable_object()->mutable_metadata()->set_name(name);
    (*req.mutable_object()->mutable_spec()->mutable_fields())["color"].set_string_value(color);
    v1::Object out;
    // Create, or replace when it exists (an Update without a resourceVersion).
    v1::CreateRequest create;
    *create.mutable_resource() = gvr;
    *create.mutable_object() = req.object();
    grpc::Status s =
        testing::RetryingUnavailable([&] { return stub_->Create(Context().get(), create, &out); });
    if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      s = testing::RetryingUnavailable([&] { return stub_->Update(Context().get(), req, &out); });
    }
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  void Remove(const v1::GroupVersionResource& gvr, const std::string& name) {
    v1::DeleteRequest req;
    *req.mutable_resource() = gvr;
    req.set_name(name);
    v1::DeleteResponse resp;
    grpc::Status s =
        testing::RetryingUnavailable([&] { return stub_->Delete(Context().get(), req, &resp); });
    EXPECT_TRUE(s.ok()) << s.error_message();
  }

  // name -> resourceVersion, as the server lists it now.
  std::map<std::string, std::string> ServerContent(const v1::GroupVersionResource& gvr) {
    v1::ListRequest req;
    *req.mutable_resource() = gvr;
    v1::ListResponse resp;
    grpc::Status s =
        testing::RetryingUnavailable([&] { return stub_->List(Context().get(), req, &resp); });
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::map<std::string, std::string> out;
    for (const v1::Object& o : resp.items())
      out[o.metadata().name()] = o.metadata().resource_version();
    return out;
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::Store::StubInterface> stub_;
  RecordingSink sink_;
  // The clock of tests that move time themselves: a member, declared before what reads it, so that
  // it outlives the threads (the reflector's watchdog) that read it until they are stopped.
  FakeClock fake_clock_;
  std::unique_ptr<WorkerPool> pool_;  // outlives the reflectors
  std::unique_ptr<Reflector> reflector_;
};

INSTANTIATE_TEST_SUITE_P(Driver, ReflectorTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "OnAPool" : "OwnThread";
                         });

TEST_P(ReflectorTest, ListThenWatch_DeliversEverything) {
  StartServer({});
  for (int i = 0; i < 5; ++i) Put(kWidgets, absl::StrCat("w", i));  // three pages of two
  MakeReflector(kWidgets, FastOptions());
  reflector_->Start();
  ASSERT_TRUE(Eventually([&] { return reflector_->HasSynced(); }, "reflector_->HasSynced()"));
  EXPECT_EQ(sink_.Content(), ServerContent(kWidgets));
  EXPECT_EQ(sink_.Content().size(), 5u);

  Put(kWidgets, "w5");
  Put(kWidgets, "w0", "blue");
  Remove(kWidgets, "w1");
  std::map<std::string, std::string> want = ServerContent(kWidgets);
  ASSERT_TRUE(Eventually([&] { return sink_.Content() == want; }, "sink_.Content() == want"))
      << ::testing::PrintToString(sink_.Log());
  EXPECT_THAT(sink_.Log(),
              ElementsAre(HasSubstr("REPLACE 5@"), "ADD w5", "UPDATE w0", "DELETE w1"));
  EXPECT_EQ(reflector_->lists_started(), 1);
  EXPECT_EQ(reflector_->watches_started(), 1);

  // Bookmarks keep the last resourceVersion fresh.
  ASSERT_TRUE(Eventually([&] { return sink_.bookmarks() > 0; }, "sink_.bookmarks() > 0"));
  reflector_->Stop();
  EXPECT_TRUE(reflector_->IsStopped());
  EXPECT_EQ(sink_.stopped_calls(), 1);
  EXPECT_THAT(sink_.stop_reason(), StatusIs(absl::StatusCode::kCancelled));
}

TEST_P(ReflectorTest, Resume_AfterServerRestart_DoesNotRelist) {
  StartServer({});
  Put(kWidgets, "before");
  MakeReflector(kWidgets, FastOptions());
  reflector_->Start();
  ASSERT_TRUE(Eventually([&] { return reflector_->HasSynced(); }, "reflector_->HasSynced()"));
  Put(kWidgets, "live");
  ASSERT_TRUE(Eventually([&] { return sink_.Content().count("live") > 0; },
                         "sink_.Content().count(\"live\") > 0"));
  const int64_t watches_before = reflector_->watches_started();

  // The server drops every watch on SIGTERM; it comes back on the same port with the same data.
  ASSERT_EQ(server_->Stop(), 0);
  ASSERT_TRUE(server_->Start().ok());
  // The channel may be waiting out a reconnect backoff: the writes below must not fail for that.
  ASSERT_TRUE(channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + testing::kDefaultWait)));
  Put(kWidgets, "after-restart");
  Put(kWidgets, "before", "green");

  std::map<std::string, std::string> want = ServerContent(kWidgets);
  ASSERT_TRUE(Eventually([&] { return sink_.Content() == want; }, "sink_.Content() == want"))
      << ::testing::PrintToString(sink_.Log());
  EXPECT_EQ(reflector_->lists_started(), 1) << "the reflector listed again after a stream drop";
  EXPECT_EQ(sink_.replaces(), 1);
  EXPECT_GT(reflector_->watches_started(), watches_before);
  EXPECT_THAT(sink_.Log(), ElementsAre(HasSubstr("REPLACE 1@"), "ADD live", "ADD after-restart",
                                       "UPDATE before"));
  EXPECT_FALSE(reflector_->IsStopped());
}

// Writes `writes` objects through the store after the first page of a list is served, so that
// the list's snapshot leaves a small history window before the next page is asked for.
class ExpiringListerWatcher final : public ListerWatcher {
 public:
  ExpiringListerWatcher(std::unique_ptr<ListerWatcher> inner, std::function<void()> writes)
      : inner_(std::move(inner)), writes_(std::move(writes)) {}
  absl::StatusOr<v1::ListResponse> List(int64_t limit, const std::string& token) override {
    limits_.push_back(limit);
    absl::StatusOr<v1::ListResponse> page = inner_->List(limit, token);
    if (limits_.size() == 1) writes_();
    return page;
  }
  std::unique_ptr<AsyncWatchEventStream> Watch(const std::string& rv) override {
    return inner_->Watch(rv);
  }
  void Shutdown() override { inner_->Shutdown(); }
  std::string Describe() const override { return inner_->Describe(); }
  // The limit of each List call, in order (read once the reflector has synced).
  std::vector<int64_t> limits_;

 private:
  std::unique_ptr<ListerWatcher> inner_;
  std::function<void()> writes_;
};

TEST_P(ReflectorTest, PagedListExpired_ListsAgainInOnePage) {
  StartServer({"--history-events=5"});
  for (int i = 0; i < 6; ++i) Put(kWidgets, absl::StrCat("w", i));
  auto lw = StoreListerWatcher::Create(stub_, kWidgets, {}, {});
  ASSERT_TRUE(lw.ok()) << lw.status();
  auto expiring = std::make_unique<ExpiringListerWatcher>(*std::move(lw), [&] {
    for (int i = 0; i < 6; ++i) Put(kWidgets, absl::StrCat("late", i));
  });
  ExpiringListerWatcher* probe = expiring.get();
  auto r = Reflector::Create(std::move(expiring), &sink_, Pooled(FastOptions()));  // pages of 2
  ASSERT_TRUE(r.ok()) << r.status();
  reflector_ = *std::move(r);
  reflector_->Start();
  ASSERT_TRUE(Eventually([&] { return reflector_->HasSynced(); }, "reflector_->HasSynced()"));
  std::map<std::string, std::string> want = ServerContent(kWidgets);
  EXPECT_EQ(want.size(), 12u);
  ASSERT_TRUE(Eventually([&] { return sink_.Content() == want; }, "sink_.Content() == want"))
      << ::testing::PrintToString(sink_.Log());
  // One list: a first page of 2, a second page refused (expired), then everything in one page.
  EXPECT_EQ(reflector_->lists_started(), 1);
  EXPECT_EQ(reflector_->backoff_waits(), 0);
  EXPECT_THAT(probe->limits_, ::testing::ElementsAre(2, 2, 0));
}

TEST_P(ReflectorTest, Relist_AfterTooOldResourceVersion) {
  StartServer({"--history-events=5"});
  Put(kWidgets, "keep");
  Put(kWidgets, "gone");
  FakeClock& clock = fake_clock_;
  Reflector::Options options = FastOptions();
  options.clock = &clock;  // the backoff wait only ends when the test moves the clock
  options.backoff.jitter = 0;
  MakeReflector(kWidgets, options);
  reflector_->Start();
  ASSERT_TRUE(Eventually([&] { return reflector_->HasSynced(); }, "reflector_->HasSynced()"));

  // Stop the server: the watch ends and the reflector waits out its backoff on the fake clock.
  ASSERT_EQ(server_->Stop(), 0);
  ASSERT_TRUE(Eventually([&] { return reflector_->backoff_waits() >= 1; },
                         "reflector_->backoff_waits() >= 1"));
  ASSERT_TRUE(server_->Start().ok());
  ASSERT_TRUE(channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + testing::kDefaultWait)));
  // Seven events while the reflector waits: its revision leaves the five-event history window.
  Put(kWidgets, "keep", "blue");
  Remove(kWidgets, "gone");
  for (int i = 0; i < 5; ++i) Put(kWidgets, absl::StrCat("new", i));

  // Move the clock until the reflector has listed again (a retry may meet the channel still
  // reconnecting, and wait again on the clock).
  ASSERT_TRUE(Eventually(
      [&] {
        clock.Advance(absl::Minutes(1));
        return reflector_->lists_started() >= 2;
      },
      "a second list after advancing the clock"));
  std::map<std::string, std::string> want = ServerContent(kWidgets);
  ASSERT_TRUE(Eventually([&] { return sink_.Content() == want; }, "sink_.Content() == want"))
      << ::testing::PrintToString(sink_.Log());
  EXPECT_EQ(reflector_->lists_started(), 2);
  EXPECT_EQ(sink_.replaces(), 2);
  EXPECT_EQ(want.count("gone"), 0u);
  EXPECT_EQ(want.size(), 6u);
  EXPECT_FALSE(reflector_->IsStopped());
}

// Creates `count` objects named <prefix>0.. of `gvr` in the store at `address`.
void Fill(const std::string& address, const v1::GroupVersionResource& gvr,
          const std::string& prefix, int count) {
  std::unique_ptr<v1::Store::Stub> stub =
      v1::Store::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < count; ++i) {
    v1::CreateRequest req;
    *req.mutable_resource() = gvr;
    req.mutable_object()->mutable_metadata()->set_name(absl::StrCat(prefix, i));
    v1::Object out;
    grpc::Status s = stub->Create(Context().get(), req, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
}

// The store behind the address is replaced by another whose revision is past the reflector's
// (its data directory wiped and refilled by another writer before the reflector reconnects), and
// whose changes since that revision concern another resource only: the resumed watch gets
// nothing but bookmarks. Only the store identity they carry tells the reflector to list again.
TEST_P(ReflectorTest, StoreReplaced_ByOneAheadOfTheReflector_Relists) {
  StartServer({});
  for (int i = 0; i < 3; ++i) Put(kWidgets, absl::StrCat("old", i));
  MakeReflector(kWidgets, FastOptions());
  reflector_->Start();
  ASSERT_TRUE(
      Eventually([&] { return sink_.Content().size() == 3; }, "sink_.Content().size() == 3"));
  int64_t seen = 0;
  ASSERT_TRUE(absl::SimpleAtoi(reflector_->LastResourceVersion(), &seen));
  const std::string old_store = reflector_->StoreId();
  EXPECT_FALSE(old_store.empty());

  // The replacement: a new store in which another client wrote two widgets, then enough gadgets
  // to take its revision well past the reflector's.
  const v1::GroupVersionResource gadgets = Gvr("example.com", "v1", "gadgets");
  const std::string replacement = testing::MakeTempDir("replacement") + "/data";
  {
    ServerProcess other(testing::BinaryPath("cache_server/cache_server"),
                        {"--data-dir=" + replacement});
    ASSERT_TRUE(other.Start().ok());
    Fill(other.grpc_address(), kWidgets, "new", 2);
    Fill(other.grpc_address(), gadgets, "g", static_cast<int>(seen) + 5);
    ASSERT_EQ(other.Stop(), 0);
  }
  // Wipe the data directory, put the replacement's in its place, restart on the same port.
  ASSERT_EQ(server_->Stop(), 0);
  std::filesystem::remove_all(server_->data_dir());
  std::filesystem::rename(replacement, server_->data_dir());
  ASSERT_TRUE(server_->Start().ok());
  ASSERT_TRUE(channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + testing::kDefaultWait)));
  std::map<std::string, std::string> want = ServerContent(kWidgets);
  ASSERT_EQ(want.size(), 2u);

  ASSERT_TRUE(Eventually([&] { return sink_.Content() == want; }, "sink_.Content() == want"))
      << "the reflector kept the old store's objects: " << ::testing::PrintToString(sink_.Log());
  EXPECT_EQ(reflector_->lists_started(), 2);
  EXPECT_EQ(reflector_->store_changes(), 1);
  EXPECT_NE(reflector_->StoreId(), old_store);
  // A restart with the same data keeps the identity: the reflector resumes without a list.
  ASSERT_EQ(server_->Stop(), 0);
  ASSERT_TRUE(server_->Start().ok());
  ASSERT_TRUE(channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + testing::kDefaultWait)));
  Put(kWidgets, "after-restart");
  want = ServerContent(kWidgets);
  ASSERT_TRUE(Eventually([&] { return sink_.Content() == want; }, "sink_.Content() == want"))
      << ::testing::PrintToString(sink_.Log());
  EXPECT_EQ(reflector_->lists_started(), 2);
  EXPECT_EQ(reflector_->store_changes(), 1);
}

// A server that stops answering without closing its connections (SIGSTOP: the kernel keeps the
// TCP connection up, but no bookmark comes): the watch is taken for dead after the idle timeout,
// and once a new server takes the port the reflector watches it and converges.
TEST_P(ReflectorTest, PausedServer_WatchTakenForDead_ThenConvergesOnTheReplacement) {
  // The channel has no keepalive (store_client_test covers that): only the watch's own liveness
  // timer can tell that the stream is dead.
  StartServer({});
  Put(kWidgets, "before");
  Reflector::Options options = FastOptions();
  options.watch_idle_timeout = absl::Seconds(2);  // ten of the server's bookmark intervals
  MakeReflector(kWidgets, options);
  reflector_->Start();
  ASSERT_TRUE(
      Eventually([&] { return sink_.Content().size() == 1; }, "sink_.Content().size() == 1"));
  // Bookmarks flow while the server runs: no watch is taken for dead.
  ASSERT_TRUE(Eventually([&] { return sink_.bookmarks() >= 3; }, "sink_.bookmarks() >= 3"));
  EXPECT_EQ(reflector_->watch_idle_restarts(), 0);

  ASSERT_TRUE(server_->Pause());
  ASSERT_TRUE(Eventually([&] { return reflector_->watch_idle_restarts() >= 1; }, absl::Seconds(30),
                         "reflector_->watch_idle_restarts() >= 1"))
      << "a watch on a paused server was never taken for dead";

  // Replace the paused server: a new one with the same data on the same port.
  server_->Signal(SIGKILL);
  server_->Wait(absl::Seconds(10));
  ASSERT_TRUE(server_->Start().ok());
  ASSERT_TRUE(channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + testing::kDefaultWait)));
  Put(kWidgets, "after");
  std::map<std::string, std::string> want = ServerContent(kWidgets);
  ASSERT_TRUE(Eventually([&] { return sink_.Content() == want; }, "sink_.Content() == want"))
      << ::testing::PrintToString(sink_.Log());
  EXPECT_EQ(reflector_->lists_started(), 1);
  EXPECT_FALSE(reflector_->IsStopped());
}

TEST_P(ReflectorTest, NotFound_WhenTheDefinitionIsDeleted_StopsTheReflector) {
  StartServer({"--role=shard"});
  const v1::GroupVersionResource definitions =
      Gvr("core.shardcache.io", "v1", "resourcedefinitions");
  v1::CreateRequest def;
  *def.mutable_resource() = definitions;
  def.mutable_object()->mutable_metadata()->set_name("widgets.example.com");
  auto& spec = *def.mutable_object()->mutable_spec()->mutable_fields();
  spec["group"].set_string_value("example.com");
  (*spec["names"].mutable_struct_value()->mutable_fields())["plural"].set_string_value("widgets");
  spec["scope"].set_string_value("Cluster");
  auto* version = spec["versions"].mutable_list_value()->add_values()->mutable_struct_value();
  (*version->mutable_fields())["name"].set_string_value("v1");
  (*version->mutable_fields())["served"].set_bool_value(true);
  v1::Object out;
  ASSERT_TRUE(stub_->Create(Context().get(), def, &out).ok());
  Put(kWidgets, "w0");

  MakeReflector(kWidgets, FastOptions());
  reflector_->Start();
  ASSERT_TRUE(Eventually([&] { return reflector_->HasSynced(); }, "reflector_->HasSynced()"));
  // A live event proves the watch is open: a watch that starts after the deletion gets
  // NOT_FOUND at once, without the DELETED events.
  Put(kWidgets, "w1");
  ASSERT_TRUE(Eventually([&] { return sink_.Content().count("w1") > 0; },
                         "sink_.Content().count(\"w1\") > 0"));
  v1::DeleteRequest del;
  *del.mutable_resource() = definitions;
  del.set_name("widgets.example.com");
  v1::DeleteResponse deleted;
  ASSERT_TRUE(stub_->Delete(Context().get(), del, &deleted).ok());

  ASSERT_TRUE(Eventually([&] { return reflector_->IsStopped(); }, "reflector_->IsStopped()"));
  EXPECT_THAT(reflector_->StopReason(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no longer served")));
  ASSERT_TRUE(Eventually([&] { return sink_.stopped_calls() == 1; }, "sink_.stopped_calls() == 1"));
  EXPECT_THAT(sink_.stop_reason(), StatusIs(absl::StatusCode::kNotFound));
  // The DELETED events come first.
  EXPECT_THAT(sink_.Log(),
              ElementsAre(HasSubstr("REPLACE 1@"), "ADD w1", "DELETE w0", "DELETE w1"));
  EXPECT_EQ(reflector_->lists_started(), 1);
  EXPECT_EQ(reflector_->backoff_waits(), 0);
}

TEST_P(ReflectorTest, NotFound_ForAnUndefinedResource_StopsWithoutRetrying) {
  StartServer({"--role=shard"});
  MakeReflector(kWidgets, FastOptions());
  reflector_->Start();
  ASSERT_TRUE(Eventually([&] { return reflector_->IsStopped(); }, "reflector_->IsStopped()"));
  EXPECT_THAT(reflector_->StopReason(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(reflector_->HasSynced());
  EXPECT_EQ(reflector_->lists_started(), 1);
  EXPECT_EQ(sink_.replaces(), 0);
}

// A SharedInformer whose last reference goes away in its stop callbacks is destroyed on the
// reflector's own thread or turn, inside Stopped(): the reflector must let its thread go, not
// abort, and its turn must touch nothing of it after Stopped().
TEST_P(ReflectorTest, DestroyedFromItsOwnStoppedCallback_ThreadEndsCleanly) {
  StartServer({"--role=shard"});
  class DestroyingSink : public ReflectorSink {
   public:
    void Replace(std::vector<ObjectRef>, const std::string&) override {}
    void Add(ObjectRef) override {}
    void Update(ObjectRef) override {}
    void Delete(ObjectRef) override {}
    void Bookmark(const std::string&) override {}
    void Stopped(const absl::Status&) override {
      owned.reset();  // the reflector's destructor runs here, on its loop thread or turn
      destroyed.Notify();
    }
    std::unique_ptr<Reflector> owned;
    absl::Notification destroyed;
  };
  DestroyingSink sink;
  auto lw = StoreListerWatcher::Create(stub_, kWidgets, {}, {});  // not served: NOT_FOUND
  ASSERT_TRUE(lw.ok()) << lw.status();
  auto r = Reflector::Create(*std::move(lw), &sink, Pooled(FastOptions()));
  ASSERT_TRUE(r.ok()) << r.status();
  sink.owned = *std::move(r);
  sink.owned->Start();
  EXPECT_TRUE(sink.destroyed.WaitForNotificationWithTimeout(absl::Seconds(20)));
}

// A sink that stops its reflector from inside Add: Stop() returns at once (it cannot wait for the
// call it is made from), the loop ends after Add returns, Stopped comes once, and the server sees
// the watch closed.
TEST_P(ReflectorTest, StopFromInsideASinkMethod_ReturnsAtOnce_ThenTheLoopEnds) {
  StartServer({});
  class StoppingSink : public RecordingSink {
   public:
    void Add(ObjectRef o) override {
      RecordingSink::Add(o);
      reflector->Stop();
      returned.Notify();
    }
    Reflector* reflector = nullptr;
    absl::Notification returned;
  };
  StoppingSink sink;
  std::unique_ptr<Reflector> reflector = NewReflector(&sink);
  ASSERT_NE(reflector, nullptr);
  sink.reflector = reflector.get();
  reflector->Start();
  ASSERT_TRUE(Eventually([&] { return reflector->HasSynced(); }, "reflector->HasSynced()"));
  Put(kWidgets, "w0");
  ASSERT_TRUE(sink.returned.WaitForNotificationWithTimeout(testing::kDefaultWait))
      << "Stop() from inside Add did not return";
  ASSERT_TRUE(Eventually([&] { return sink.stopped_calls() == 1; }, "sink.stopped_calls() == 1"));
  EXPECT_TRUE(reflector->IsStopped());
  EXPECT_THAT(sink.stop_reason(), StatusIs(absl::StatusCode::kCancelled));
  reflector->Stop();  // from outside now: it has ended already
  reflector.reset();
  EXPECT_EQ(sink.stopped_calls(), 1);
  EXPECT_THAT(sink.Log(), ElementsAre(HasSubstr("REPLACE 0@"), "ADD w0"));
  EXPECT_TRUE(Eventually(
      [&] { return testing::Metric(server_->http_port(), "shardcache_store_watchers") == 0; },
      "the server has no open watch"));
}

// Stop() while events pour in (gRPC's threads buffer messages and wake the reflector as it
// stops), and destruction with the watch open and no Stop(): no crash, Stopped once, and the
// server sees every watch closed.
TEST_P(ReflectorTest, StopOrDestroy_WhileEventsArrive_EndsCleanly) {
  StartServer({});
  std::atomic<bool> writing{true};
  std::atomic<int> writes{0};
  std::thread writer([&] {
    for (int i = 0; writing.load(); ++i) {
      Put(kWidgets, absl::StrCat("w", i % 20), absl::StrCat("color-", i));  // each a change
      writes.fetch_add(1);
      absl::SleepFor(absl::Milliseconds(2));  // a steady flow, not a flood the store falls behind
    }
  });
  absl::Cleanup join = [&] {
    writing = false;
    writer.join();
  };
  for (int round = 0; round < 20; ++round) {
    RecordingSink sink;
    {
      std::unique_ptr<Reflector> reflector = NewReflector(&sink);
      ASSERT_NE(reflector, nullptr);
      reflector->Start();
      ASSERT_TRUE(Eventually([&] { return sink.Log().size() > 3; }, "the watch delivers events",
                             [&] {
                               return absl::StrCat(sink.Log().size(), " calls of the sink, ",
                                                   writes.load(), " writes, resourceVersion ",
                                                   reflector->LastResourceVersion());
                             }));
      if (round % 2 == 0) {
        reflector->Stop();
        EXPECT_EQ(sink.stopped_calls(), 1) << "round " << round;
      }
    }  // destroyed; with its watch open on odd rounds
    EXPECT_EQ(sink.stopped_calls(), 1) << "round " << round;
    EXPECT_THAT(sink.stop_reason(), StatusIs(absl::StatusCode::kCancelled));
  }
  std::move(join).Invoke();
  EXPECT_TRUE(Eventually(
      [&] { return testing::Metric(server_->http_port(), "shardcache_store_watchers") == 0; },
      "the server has no open watch"));
}

TEST_P(ReflectorTest, Backoff_WaitsOnTheClock_AndStopInterruptsIt) {
  // Nothing listens on this address: every List fails with UNAVAILABLE.
  ServerProcess dead(testing::BinaryPath("cache_server/cache_server"), {});
  ASSERT_TRUE(dead.Start().ok());
  std::string address = dead.grpc_address();
  ASSERT_EQ(dead.Stop(), 0);
  Connect(address);

  FakeClock& clock = fake_clock_;
  Reflector::Options options = FastOptions();
  options.clock = &clock;
  options.backoff.initial = absl::Seconds(1);
  options.backoff.max = absl::Seconds(4);
  options.backoff.jitter = 0;
  MakeReflector(kWidgets, options);
  reflector_->Start();
  ASSERT_TRUE(Eventually([&] { return reflector_->backoff_waits() == 1; },
                         "reflector_->backoff_waits() == 1"));
  EXPECT_EQ(reflector_->lists_started(), 1);
  clock.Advance(absl::Seconds(1));  // the first delay: 1 s
  ASSERT_TRUE(Eventually([&] { return reflector_->backoff_waits() == 2; },
                         "reflector_->backoff_waits() == 2"));
  EXPECT_EQ(reflector_->lists_started(), 2);
  clock.Advance(absl::Seconds(2));  // then 2 s
  ASSERT_TRUE(Eventually([&] { return reflector_->backoff_waits() == 3; },
                         "reflector_->backoff_waits() == 3"));
  EXPECT_EQ(reflector_->lists_started(), 3);

  // Stop() ends the wait at once, although the clock does not move.
  absl::Time start = absl::Now();
  reflector_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(sink_.stopped_calls(), 1);
  EXPECT_THAT(sink_.stop_reason(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE(reflector_->HasSynced());
}

TEST_P(ReflectorTest, Create_RejectsBadOptions) {
  Connect("127.0.0.1:1");
  auto lw = StoreListerWatcher::Create(stub_, kWidgets, {}, {});
  ASSERT_TRUE(lw.ok());
  Reflector::Options options;
  options.backoff.initial = absl::ZeroDuration();
  EXPECT_THAT(Reflector::Create(*std::move(lw), &sink_, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("initial")));
  ListWatchFilters bad;
  bad.label_selector = "a in (";
  EXPECT_THAT(StoreListerWatcher::Create(stub_, kWidgets, bad, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labelSelector")));
  EXPECT_THAT(StoreListerWatcher::Create(stub_, Gvr("example.com", "", "widgets"), {}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resource.version")));
}

}  // namespace
}  // namespace shardcache
