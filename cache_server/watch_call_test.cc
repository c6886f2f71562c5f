// Unit tests of WatchCall: a real gRPC server in this process (InProcessServer) and real
// client channels, read with the process tests' WatchReader.
#include "cache_server/watch_call.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache_server/testing/in_process_server.h"
#include "common/clock.h"
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

class WatchCallTest : public ::testing::Test {
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

  // A watch on a connection of its own whose client does not read: once HTTP/2 flow control
  // stops the server's writes, its live events pile up on the server.
  struct StalledWatch {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Store::Stub> stub;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader;
  };
  std::unique_ptr<StalledWatch> OpenStalledWatch(const v1::WatchRequest& request) {
    auto w = std::make_unique<StalledWatch>();
    w->channel = testing::NonGrowingWindowChannel(server_->target());
    w->stub = v1::Store::NewStub(w->channel);
    w->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(90)));
    w->reader = w->stub->Watch(&w->ctx, request);
    return w;
  }

  // For tests that run the WatchCache on a fake clock; outlives server_.
  FakeClock fake_clock_;
  std::unique_ptr<InProcessServer> server_;
};

TEST_F(WatchCallTest, SendsTheInitialStateThenABookmarkThenEveryChangeInOrder) {
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

TEST_F(WatchCallTest, BatchedEventsArriveInOrder) {
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

// A watch read message by message, as they come off the wire.
class RawWatch {
 public:
  RawWatch(v1::Store::Stub* stub, const v1::WatchRequest& request) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    reader_ = stub->Watch(&ctx_, request);
  }
  ~RawWatch() {
    ctx_.TryCancel();
    (void)reader_->Finish();
  }

  // Reads until the initial-events-end bookmark; false if the stream ended first.
  bool SkipInitial() {
    v1::WatchEvent m;
    while (reader_->Read(&m)) {
      if (m.type() == v1::WatchEvent::BOOKMARK &&
          m.object().metadata().annotations().contains(kInitialEventsEndAnnotation)) {
        return true;
      }
    }
    return false;
  }

  // Summaries of the next `n` events that are not bookmarks, whether they come one a message or
  // as the elements of batches (fewer if the stream ends first). messages() counts the messages
  // that carried them, not those of periodic bookmarks, which come whenever the watch is idle.
  std::vector<std::string> Take(size_t n) {
    std::vector<std::string> taken;
    v1::WatchEvent m;
    while (taken.size() < n && reader_->Read(&m)) {
      EXPECT_FALSE(m.store_id().empty()) << "a message without the store's identity";
      if (m.events_size() == 0 && m.type() == v1::WatchEvent::BOOKMARK) continue;
      ++messages_;
      if (m.events_size() > 1) ++batches_;
      std::vector<v1::WatchEvent> events(m.events().begin(), m.events().end());
      if (events.empty()) events.push_back(m);
      for (const v1::WatchEvent& e : events) {
        if (e.type() != v1::WatchEvent::BOOKMARK) taken.push_back(Summary(e));
      }
    }
    return taken;
  }

  int messages() const { return messages_; }
  int batches() const { return batches_; }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader_;
  int messages_ = 0;
  int batches_ = 0;
};

// Live events that pile up for a watcher (the store's commits held back, then let go at once)
// go out as batches of the runs it holds: every event once, in order, in a few messages. A
// watcher with a label selector, whose events are not side by side in the cache's chunks (it
// skips some, and sees others as a different type), and one that asked for no batches, get
// theirs exactly too.
TEST_F(WatchCallTest, EventsThatPileUp_GoOutInOrderInFewMessages) {
  Start();
  v1::WatchRequest all = WatchReq(Widgets());
  all.set_batch_events(true);
  v1::WatchRequest kept = all;
  kept.set_label_selector("keep=yes");
  RawWatch batched(server_->stub(), all);
  RawWatch filtered(server_->stub(), kept);
  RawWatch single(server_->stub(), WatchReq(Widgets()));
  ASSERT_TRUE(batched.SkipInitial());
  ASSERT_TRUE(filtered.SkipInitial());
  ASSERT_TRUE(single.SkipInitial());

  auto labelled = [](const std::string& name, bool keep) {
    v1::Object o = Widget(name, "some data");
    (*o.mutable_metadata()->mutable_labels())["keep"] = keep ? "yes" : "no";
    return o;
  };
  // Each change as every watcher without a selector sees it, and as the filtered one does.
  struct Change {
    std::string type, name, filtered_type;
  };
  std::vector<Change> changes;
  for (int i = 0; i < 40; ++i)
    changes.push_back({"ADDED", absl::StrCat("w", i), i % 2 == 0 ? "ADDED" : ""});
  for (int i = 0; i < 10; ++i) {  // the label flips: out of the selector, or into it
    changes.push_back({"MODIFIED", absl::StrCat("w", i), i % 2 == 0 ? "DELETED" : "ADDED"});
  }
  for (int i = 10; i < 15; ++i)
    changes.push_back({"DELETED", absl::StrCat("w", i), i % 2 == 0 ? "DELETED" : ""});

  server_->storage().Close();
  absl::Mutex mu;
  std::vector<int64_t> revisions(changes.size(), 0);
  int answered = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    auto done = [&, i](int64_t rv) {
      absl::MutexLock l(&mu);
      revisions[i] = rv;
      ++answered;
    };
    auto object_done = [done](absl::StatusOr<ObjectRef> r) {
      EXPECT_TRUE(r.ok()) << r.status();
      done(r.ok() ? std::stoll((*r)->metadata().resource_version()) : -1);
    };
    const int n = std::stoi(changes[i].name.substr(1));
    if (changes[i].type == "ADDED") {
      v1::CreateRequest req;
      *req.mutable_resource() = Widgets();
      *req.mutable_object() = labelled(changes[i].name, n % 2 == 0);
      server_->store().CreateAsync(req, object_done);
    } else if (changes[i].type == "MODIFIED") {
      v1::UpdateRequest req;
      *req.mutable_resource() = Widgets();
      *req.mutable_object() = labelled(changes[i].name, n % 2 != 0);
      server_->store().UpdateAsync(req, object_done);
    } else {
      v1::DeleteRequest req;
      *req.mutable_resource() = Widgets();
      req.set_namespace_("ns");
      req.set_name(changes[i].name);
      server_->store().DeleteAsync(req, [done](absl::StatusOr<ObjectStore::DeleteResult> r) {
        EXPECT_TRUE(r.ok()) << r.status();
        done(r.ok() ? std::stoll(r->object->metadata().resource_version()) : -1);
      });
    }
  }
  server_->storage().Open();
  ASSERT_TRUE(Eventually(
      [&] {
        absl::MutexLock l(&mu);
        return answered == static_cast<int>(changes.size());
      },
      "every change is answered"));

  std::vector<std::string> expected_all, expected_filtered;
  for (size_t i = 0; i < changes.size(); ++i) {
    expected_all.push_back(Summary(changes[i].type, changes[i].name, revisions[i]));
    if (!changes[i].filtered_type.empty()) {
      expected_filtered.push_back(Summary(changes[i].filtered_type, changes[i].name, revisions[i]));
    }
  }
  EXPECT_EQ(batched.Take(expected_all.size()), expected_all);
  EXPECT_GE(batched.batches(), 1);
  EXPECT_LE(batched.messages(), 10) << "the events that piled up did not go out together";
  EXPECT_EQ(filtered.Take(expected_filtered.size()), expected_filtered);
  EXPECT_LT(filtered.messages(), static_cast<int>(expected_filtered.size()));
  EXPECT_EQ(single.Take(expected_all.size()), expected_all);
  EXPECT_EQ(single.batches(), 0);
}

TEST_F(WatchCallTest, AnIdleWatcherGetsPeriodicBookmarks) {
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

TEST_F(WatchCallTest, AClientThatStopsReadingIsEndedWhileAnotherGoesOn) {
  InProcessServer::Options options;
  options.watch.watcher_queue_bytes = 1024;
  // The healthy watcher is past the bound too during the burst: a write of it that a busy
  // machine (or a sanitizer) holds up must not look like a stall.
  options.watch.stall_timeout = absl::Seconds(2);
  Start(options);
  const int64_t from = Create(Widget("w0"));

  auto slow = OpenStalledWatch(WatchReq(Widgets(), from));
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
  if (!ended) slow->ctx.TryCancel();  // so that the reads below end
  // The healthy watcher got every event and goes on.
  EXPECT_EQ(healthy.Take(kObjects, absl::Seconds(30)), expected);
  int64_t rv = Create(Widget("after"));
  EXPECT_THAT(healthy.Take(1), ElementsAre(Summary("ADDED", "after", rv)));
  EXPECT_FALSE(healthy.WaitForEnd(absl::ZeroDuration()).has_value());

  // The slow one reads what was sent before its end, then RESOURCE_EXHAUSTED.
  v1::WatchEvent e;
  int read = 0;
  while (read <= kObjects && slow->reader->Read(&e)) ++read;
  grpc::Status status = slow->reader->Finish();
  EXPECT_LT(read, kObjects) << "the slow watcher got every event";
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("watcher too slow"));
  EXPECT_TRUE(Eventually([&] { return server_->watch_cache().watcher_count() == 1; },
                         "the slow watcher is unregistered"));
}

// The stall that ends a watcher is measured on the WatchCache's clock: with nothing more
// delivered (no writes), the sweeps alone end a batched watcher whose client stopped reading, as
// soon as that clock has passed the stall timeout.
TEST_F(WatchCallTest, AStalledClientIsEndedByTheSweepsOnTheCachesClock) {
  InProcessServer::Options options;
  options.watch.clock = &fake_clock_;
  options.watch.watcher_queue_bytes = 1024;
  options.watch.stall_timeout = absl::Seconds(5);
  Start(options);
  const int64_t from = Create(Widget("w0"));
  v1::WatchRequest req = WatchReq(Widgets(), from);
  req.set_batch_events(true);
  auto slow = OpenStalledWatch(req);
  ASSERT_TRUE(Eventually([&] { return server_->watch_cache().watcher_count() == 1; },
                         "the slow watch is registered"));
  const std::string big(100 * 1024, 'x');
  for (int i = 0; i < 20; ++i) Create(Widget(absl::StrCat("big", i), big));
  EXPECT_EQ(server_->metrics().watchers_too_slow.Value(), 0) << "ended before its stall timeout";
  bool ended = Eventually(
      [&] {
        fake_clock_.Advance(absl::Seconds(1));
        return server_->metrics().watchers_too_slow.Value() == 1;
      },
      "the sweeps end the slow watcher");
  EXPECT_TRUE(ended);
  if (!ended) slow->ctx.TryCancel();
  v1::WatchEvent e;
  while (slow->reader->Read(&e)) {
  }
  grpc::Status status = slow->reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("watcher too slow"));
}

TEST_F(WatchCallTest, ACancelledWatchIsUnregistered) {
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

TEST_F(WatchCallTest, AWatchThatCannotStartIsRejectedAndNotRegistered) {
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

TEST_F(WatchCallTest, AWatchThatCannotBeRegistered_GetsOnlyItsError) {
  Start();
  Create(Widget("w0"));
  Create(Widget("w1"));
  // The store initializes the watcher (with the two objects) before the cache, shutting down,
  // refuses to register it: none of them is sent.
  EXPECT_EQ(server_->watch_cache().Shutdown(absl::Seconds(1)), 0u);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader =
      server_->stub()->Watch(&ctx, WatchReq(Widgets()));
  v1::WatchEvent event;
  int received = 0;
  while (reader->Read(&event)) ++received;
  grpc::Status status = reader->Finish();
  EXPECT_EQ(received, 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("server shutting down"));
  EXPECT_EQ(server_->watch_cache().watcher_count(), 0u);
}

TEST_F(WatchCallTest, ShutdownEndsWatchesUnavailable) {
  Start();
  WatchReader reader(server_->stub(), WatchReq(Widgets()));
  ASSERT_TRUE(reader.SkipInitial());
  EXPECT_TRUE(server_->Shutdown(absl::Seconds(5))) << "the watch was not ended";
  std::optional<grpc::Status> status = reader.WaitForEnd();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAVAILABLE) << status->error_message();
  EXPECT_THAT(status->error_message(), HasSubstr("server shutting down"));
}

TEST_F(WatchCallTest, WatchesCancelledAsSoonAsOpened_AreAllUnregistered) {
  Start();
  int64_t rv0 = Create(Widget("w0"));
  // From several threads at once, each watch cancelled right after its request goes out: calls
  // wait for the server to start them, and the end of many reaches the server before it has
  // (their start and their end complete on different threads); some end before they reach it.
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([this] {
      for (int i = 0; i < 40; ++i) {
        grpc::ClientContext ctx;
        std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader =
            server_->stub()->Watch(&ctx, WatchReq(Widgets()));
        ctx.TryCancel();
        reader->Finish();
      }
    });
  }
  for (std::thread& c : clients) c.join();
  EXPECT_TRUE(Eventually([&] { return server_->watch_cache().watcher_count() == 0; },
                         "every cancelled watch is unregistered"));
  // The server goes on serving watches.
  int64_t rv1 = Create(Widget("w1"));
  WatchReader reader(server_->stub(), WatchReq(Widgets()));
  std::vector<v1::WatchEvent> initial = reader.TakeInitial();
  ASSERT_EQ(initial.size(), 2u);
  EXPECT_EQ(Summary(initial[0]), Summary("ADDED", "w0", rv0));
  EXPECT_EQ(Summary(initial[1]), Summary("ADDED", "w1", rv1));
  int64_t rv2 = Create(Widget("w2"));
  EXPECT_THAT(reader.Take(1), ElementsAre(Summary("ADDED", "w2", rv2)));
}

TEST_F(WatchCallTest, ShutdownWithAWatchWhoseClientStoppedReading_EndsItAndStops) {
  InProcessServer::Options options;
  options.watch.watcher_queue_bytes = size_t{1} << 30;  // never ended as too slow here
  Start(options);
  const int64_t from = Create(Widget("w0"));
  auto stalled = OpenStalledWatch(WatchReq(Widgets(), from));
  ASSERT_TRUE(Eventually([&] { return server_->watch_cache().watcher_count() == 1; },
                         "the watch is registered"));
  const std::string big(100 * 1024, 'x');
  for (int i = 0; i < 30; ++i) Create(Widget(absl::StrCat("big", i), big));
  // Events keep coming while the server stops.
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) {
      v1::CreateRequest req;
      *req.mutable_resource() = Widgets();
      *req.mutable_object() = Widget(absl::StrCat("late", i));
      (void)server_->store().Create(req);
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  // Its write is held by flow control, so it cannot end before the server cancels it; then it
  // does, and the server stops.
  EXPECT_FALSE(server_->Shutdown(absl::Milliseconds(300)));
  stop = true;
  writer.join();
  EXPECT_EQ(server_->watch_cache().watcher_count(), 0u);
  stalled->ctx.TryCancel();
}

}  // namespace
}  // namespace shardcache
