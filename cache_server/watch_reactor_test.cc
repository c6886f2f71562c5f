// Unit tests of WatchReactor: a real gRPC server in this process (InProcessServer) and real
// client channels, read with the process tests' WatchReader.
#include "cache_server/watch_reactor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache_server/testing/in_process_server.h"
#include "common/testing/channels.h"
#include "common/testing/objects.h"
#include "common/testing/wait.h"
#include "integration_tests/watch_reader.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::Gvr;
using ::shardcache::testing::InProcessServer;
using ::shardcache::testing::Summary;
using ::shardcache::testing::WatchReader;
using ::shardcache::testing::WatchReq;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::GroupVersionResource Widgets() { return Gvr("example.com", "v1", "widgets"); }

v1::Object Widget(const std::string& name, const std::string& data = "") {
  v1::Object o;
  o.mutable_metadata()->set_namespace_("ns");
  o.mutable_metadata()->set_name(name);
  if (!data.empty()) (*o.mutable_spec()->mutable_fields())["data"].set_string_value(data);
  return o;
}

class WatchReactorTest : public ::testing::Test {
 protected:
  // Starts the server, with bookmarks every 100 ms (so that WatchReader::NothingMoreUpTo
  // returns soon) and `options` as the test needs them.
  void Start(InProcessServer::Options options = InProcessServer::Options()) {
    options.watch.bookmark_interval = absl::Milliseconds(100);
    server_ = std::make_unique<InProcessServer>(std::move(options));
  }

  int64_t Create(const v1::Object& object) {
    v1::CreateRequest req;
    *req.mutable_resource() = Widgets();
    *req.mutable_object() = object;
    absl::StatusOr<ObjectRef> created = server_->store().Create(req);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? std::stoll((*created)->metadata().resource_version()) : 0;
  }
  int64_t Update(const v1::Object& object) {
    v1::UpdateRequest req;
    *req.mutable_resource() = Widgets();
    *req.mutable_object() = object;
    absl::StatusOr<ObjectRef> updated = server_->store().Update(req);
    EXPECT_TRUE(updated.ok()) << updated.status();
    return updated.ok() ? std::stoll((*updated)->metadata().resource_version()) : 0;
  }
  int64_t Delete(const std::string& name) {
    v1::DeleteRequest req;
    *req.mutable_resource() = Widgets();
    req.set_namespace_("ns");
    req.set_name(name);
    absl::StatusOr<ObjectStore::DeleteResult> deleted = server_->store().Delete(req);
    EXPECT_TRUE(deleted.ok()) << deleted.status();
    return deleted.ok() ? std::stoll(deleted->object->metadata().resource_version()) : 0;
  }

  std::unique_ptr<InProcessServer> server_;
};

TEST_F(WatchReactorTest, SendsTheInitialStateThenABookmarkThenEveryChangeInOrder) {
  Start();
  int64_t rv1 = Create(Widget("w1"));
  int64_t rv2 = Create(Widget("w2"));
  WatchReader reader(server_->stub(), WatchReq(Widgets()));
  v1::WatchEvent bookmark;
  std::vector<v1::WatchEvent> initial = reader.TakeInitial(&bookmark);
  ASSERT_EQ(initial.size(), 2u);
  EXPECT_EQ(Summary(initial[0]), Summary("ADDED", "w1", rv1));
  EXPECT_EQ(Summary(initial[1]), Summary("ADDED", "w2", rv2));
  EXPECT_EQ(bookmark.object().metadata().resource_version(), absl::StrCat(rv2));
  EXPECT_EQ(bookmark.object().metadata().annotations().at(kInitialEventsEndAnnotation), "true");
  // Every message carries the store's identity.
  EXPECT_EQ(initial[0].store_id(), server_->store().store_id());
  EXPECT_EQ(bookmark.store_id(), server_->store().store_id());

  v1::Object changed = Widget("w1");
  (*changed.mutable_spec()->mutable_fields())["size"].set_number_value(3);
  int64_t rv3 = Update(changed);
  int64_t rv4 = Delete("w2");
  int64_t rv5 = Create(Widget("w3"));
  EXPECT_THAT(reader.Take(3),
              ElementsAre(Summary("MODIFIED", "w1", rv3), Summary("DELETED", "w2", rv4),
                          Summary("ADDED", "w3", rv5)));
  EXPECT_TRUE(reader.NothingMoreUpTo(rv5));
}

TEST_F(WatchReactorTest, BatchedEventsArriveInOrder) {
  Start();
  v1::WatchRequest req = WatchReq(Widgets(), int64_t{1});
  req.set_batch_events(true);
  // Many events at once: the watcher sends those that wait as one message.
  std::vector<std::string> expected;
  for (int i = 0; i < 50; ++i) {
    std::string name = absl::StrCat("w", i);
    expected.push_back(Summary("ADDED", name, Create(Widget(name))));
  }
  WatchReader reader(server_->stub(), req);
  EXPECT_EQ(reader.Take(50), expected);
  EXPECT_TRUE(reader.NothingMoreUpTo(51));
}

TEST_F(WatchReactorTest, AnIdleWatcherGetsPeriodicBookmarks) {
  Start();  // bookmarks every 100 ms
  int64_t rv = Create(Widget("w1"));
  WatchReader reader(server_->stub(), WatchReq(Widgets()));
  ASSERT_TRUE(reader.SkipInitial());
  for (int i = 0; i < 2; ++i) {
    std::optional<v1::WatchEvent> e = reader.Next();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->type(), v1::WatchEvent::BOOKMARK);
    EXPECT_EQ(e->object().metadata().resource_version(), absl::StrCat(rv));
    EXPECT_FALSE(e->object().metadata().annotations().contains(kInitialEventsEndAnnotation));
  }
}

TEST_F(WatchReactorTest, AClientThatStopsReadingIsEndedWhileAnotherGoesOn) {
  InProcessServer::Options options;
  options.watch.watcher_queue_bytes = 1024;
  options.watch.stall_timeout = absl::Milliseconds(200);
  Start(options);
  const int64_t from = Create(Widget("w0"));

  // A watcher on its own connection that does not read: once HTTP/2 flow control stops the
  // server's writes, its live events pile up on the server.
  auto slow_channel = testing::NonGrowingWindowChannel(server_->target());
  auto slow_stub = v1::Store::NewStub(slow_channel);
  grpc::ClientContext slow_ctx;
  slow_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(90)));
  auto slow = slow_stub->Watch(&slow_ctx, WatchReq(Widgets(), from));
  ASSERT_TRUE(Eventually([&] { return server_->watch_cache().watcher_count() == 1; },
                         "the slow watch is registered"));
  WatchReader healthy(server_->stub(), WatchReq(Widgets(), from));
  ASSERT_TRUE(Eventually([&] { return server_->watch_cache().watcher_count() == 2; },
                         "the healthy watch is registered"));

  const int kObjects = 60;
  const std::string big(100 * 1024, 'x');
  std::vector<std::string> expected;
  for (int i = 0; i < kObjects; ++i) {
    std::string name = absl::StrCat("big", i);
    expected.push_back(Summary("ADDED", name, Create(Widget(name, big))));
  }
  bool ended = Eventually([&] { return server_->metrics().watchers_too_slow.Value() == 1; },
                          "the slow watcher is ended");
  EXPECT_TRUE(ended);
  if (!ended) slow_ctx.TryCancel();  // so that the reads below end
  // The healthy watcher got every event and goes on.
  EXPECT_EQ(healthy.Take(kObjects, absl::Seconds(30)), expected);
  int64_t rv = Create(Widget("after"));
  EXPECT_THAT(healthy.Take(1), ElementsAre(Summary("ADDED", "after", rv)));
  EXPECT_FALSE(healthy.WaitForEnd(absl::ZeroDuration()).has_value());

  // The slow one reads what was sent before its end, then RESOURCE_EXHAUSTED.
  v1::WatchEvent e;
  int read = 0;
  while (read <= kObjects && slow->Read(&e)) ++read;
  grpc::Status status = slow->Finish();
  EXPECT_LT(read, kObjects) << "the slow watcher got every event";
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("watcher too slow"));
  EXPECT_TRUE(Eventually([&] { return server_->watch_cache().watcher_count() == 1; },
                         "the slow watcher is unregistered"));
}

TEST_F(WatchReactorTest, ACancelledWatchIsUnregistered) {
  Start();
  {
    WatchReader reader(server_->stub(), WatchReq(Widgets()));
    ASSERT_TRUE(reader.SkipInitial());
    EXPECT_EQ(server_->watch_cache().watcher_count(), 1u);
    EXPECT_EQ(server_->metrics().watchers.Value(), 1);
  }  // cancels the stream
  EXPECT_TRUE(Eventually([&] { return server_->watch_cache().watcher_count() == 0; },
                         "the watcher is unregistered"));
  EXPECT_TRUE(Eventually([&] { return server_->metrics().watchers.Value() == 0; },
                         "the watchers gauge falls"));
  // The store goes on without it.
  int64_t rv = Create(Widget("w1"));
  WatchReader reader(server_->stub(), WatchReq(Widgets()));
  std::vector<v1::WatchEvent> initial = reader.TakeInitial();
  ASSERT_EQ(initial.size(), 1u);
  EXPECT_EQ(Summary(initial[0]), Summary("ADDED", "w1", rv));
}

TEST_F(WatchReactorTest, AWatchThatCannotStartIsRejectedAndNotRegistered) {
  Start();
  v1::WatchRequest req = WatchReq(Widgets());
  req.set_label_selector("a in (b");
  WatchReader reader(server_->stub(), req);
  std::optional<grpc::Status> status = reader.WaitForEnd();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status->error_message(), HasSubstr("label_selector"));
  EXPECT_EQ(server_->watch_cache().watcher_count(), 0u);
}

TEST_F(WatchReactorTest, ShutdownEndsWatchesUnavailable) {
  Start();
  WatchReader reader(server_->stub(), WatchReq(Widgets()));
  ASSERT_TRUE(reader.SkipInitial());
  EXPECT_TRUE(server_->Shutdown(absl::Seconds(5))) << "the watch was not ended";
  std::optional<grpc::Status> status = reader.WaitForEnd();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAVAILABLE) << status->error_message();
  EXPECT_THAT(status->error_message(), HasSubstr("server shutting down"));
}

}  // namespace
}  // namespace shardcache
