// WatchStream against a real cache_server: batched messages are unpacked into single events, in
// order, each once, with the store's identity; a watch without batch_events (what a grpcurl user
// opens) still gets one event per message; and a Reflector over a StoreListerWatcher that falls
// behind a burst of writes receives batches and delivers every event once and in order.

#include "common/client/watch_stream.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/client/lister_watcher.h"
#include "common/client/reflector.h"
#include "common/client/write_stream.h"
#include "common/testing/objects.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::BinaryPath;
using ::shardcache::testing::Eventually;
using ::shardcache::testing::Gvr;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::ServerProcess;
using ::shardcache::testing::StatusIs;

const v1::GroupVersionResource kWidgets = Gvr("example.com", "v1", "widgets");

int64_t Revision(const v1::WatchEvent& e) {
  int64_t rv = 0;
  EXPECT_TRUE(absl::SimpleAtoi(e.object().metadata().resource_version(), &rv))
      << e.ShortDebugString();
  return rv;
}

// What a watch delivered, checked against a burst of creates w0..w(n-1): every one once, in
// order, at increasing revisions, each from `store_id`. Bookmarks are skipped.
void ExpectBurstInOrder(const std::vector<v1::WatchEvent>& events, int n,
                        const std::string& store_id) {
  std::vector<v1::WatchEvent> changes;
  for (const v1::WatchEvent& e : events) {
    if (e.type() != v1::WatchEvent::BOOKMARK) changes.push_back(e);
  }
  ASSERT_EQ(changes.size(), static_cast<size_t>(n));
  int64_t last = 0;
  for (int i = 0; i < n; ++i) {
    const v1::WatchEvent& e = changes[i];
    EXPECT_EQ(e.type(), v1::WatchEvent::ADDED) << i << ": " << e.ShortDebugString();
    EXPECT_EQ(e.events_size(), 0) << i;
    EXPECT_EQ(e.object().metadata().name(), absl::StrCat("w", i));
    EXPECT_GT(Revision(e), last) << i;
    last = Revision(e);
    EXPECT_EQ(e.store_id(), store_id) << i;
  }
}

class WatchStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"),
                                              std::vector<std::string>{"--role=cache"});
    ASSERT_THAT(server_->Start(), IsOk());
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = std::shared_ptr<v1::Store::StubInterface>(v1::Store::NewStub(channel_));
  }

  void TearDown() override {
    stub_.reset();
    channel_.reset();
    if (server_ != nullptr && server_->Running()) {
      EXPECT_EQ(server_->Stop(), 0) << "cache_server did not exit cleanly on SIGTERM";
    }
  }

  static WriteStream::Options BurstOptions() {
    WriteStream::Options options;
    options.window = 256;
    return options;
  }

  // Creates w<first>..w<first+n-1> through one pipelined Write stream; returns once all are
  // acknowledged.
  void CreateBurst(int first, int n) {
    absl::StatusOr<std::unique_ptr<WriteStream>> stream = WriteStream::Open(stub_, BurstOptions());
    ASSERT_THAT(stream, IsOk());
    absl::Mutex mu;
    int failed = 0;
    for (int i = first; i < first + n; ++i) {
      v1::WriteRequest req;
      *req.mutable_create()->mutable_resource() = kWidgets;
      v1::Object* o = req.mutable_create()->mutable_object();
      o->mutable_metadata()->set_name(absl::StrCat("w", i));
      (*o->mutable_spec()->mutable_fields())["pad"].set_string_value(std::string(200, 'x'));
      ASSERT_THAT((*stream)->Send(std::move(req),
                                  [&](const v1::WriteResponse& a) {
                                    if (a.code() != 0) {
                                      absl::MutexLock l(&mu);
                                      ++failed;
                                    }
                                  }),
                  IsOk());
    }
    ASSERT_THAT((*stream)->Close(), IsOk());
    absl::MutexLock l(&mu);
    ASSERT_EQ(failed, 0);
  }

  // The store's revision and identity, from a List.
  std::pair<std::string, std::string> ListRevision() {
    v1::ListRequest req;
    *req.mutable_resource() = kWidgets;
    req.set_limit(1);
    v1::ListResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Status s = stub_->List(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {resp.resource_version(), resp.store_id()};
  }

  // Options of a stream bounded in time, asking for batches or not.
  static WatchStream::Options Bounded(bool batch_events = true) {
    WatchStream::Options options;
    options.deadline = absl::Now() + absl::Seconds(60);
    options.batch_events = batch_events;
    return options;
  }

  static v1::WatchRequest WatchFrom(const std::string& rv) {
    v1::WatchRequest req;
    *req.mutable_resource() = kWidgets;
    req.set_resource_version(rv);
    return req;
  }

  // Reads `stream` until `n` changes (bookmarks aside) have arrived or it ends.
  static std::vector<v1::WatchEvent> ReadChanges(WatchStream* stream, int n) {
    std::vector<v1::WatchEvent> seen;
    int changes = 0;
    v1::WatchEvent e;
    while (changes < n && stream->Next(&e)) {
      if (e.type() != v1::WatchEvent::BOOKMARK) ++changes;
      seen.push_back(e);
    }
    return seen;
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::Store::StubInterface> stub_;
};

constexpr int kBurst = 500;

// A watch from an old revision gets the history first, all waiting at once: the server batches
// it, and the stream returns the events one by one.
TEST_F(WatchStreamTest, Batches_HistoryReplay_UnpackedInOrderEachOnce) {
  auto [start, store_id] = ListRevision();
  CreateBurst(0, kBurst);
  WatchStream stream(stub_, WatchFrom(start), Bounded());
  std::vector<v1::WatchEvent> seen = ReadChanges(&stream, kBurst);
  ExpectBurstInOrder(seen, kBurst, store_id);

  WatchStreamStats stats = stream.stats();
  EXPECT_GT(stats.batched_messages, 0) << "no message held more than one event";
  EXPECT_LT(stats.messages, stats.events);
  EXPECT_EQ(stats.events, static_cast<int64_t>(seen.size()));
  stream.Cancel();
  EXPECT_FALSE(stream.Next(&seen.back()));
  EXPECT_THAT(stream.Finish(), StatusIs(absl::StatusCode::kCancelled));
}

// What a grpcurl user opens (batch_events unset): one event per message, with its type, even
// when the history is replayed all at once; and a WatchStream told not to ask for batches sees
// the same.
TEST_F(WatchStreamTest, NoBatchEvents_EveryMessageIsOneEvent) {
  auto [start, store_id] = ListRevision();
  CreateBurst(0, kBurst);

  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  std::unique_ptr<grpc::ClientReaderInterface<v1::WatchEvent>> plain =
      stub_->Watch(&ctx, WatchFrom(start));
  std::vector<v1::WatchEvent> seen;
  v1::WatchEvent e;
  int changes = 0;
  while (changes < kBurst && plain->Read(&e)) {
    ASSERT_EQ(e.events_size(), 0) << "a batch sent to a watch that did not ask for one";
    ASSERT_NE(e.type(), v1::WatchEvent::TYPE_UNSPECIFIED);
    if (e.type() != v1::WatchEvent::BOOKMARK) ++changes;
    seen.push_back(e);
  }
  ExpectBurstInOrder(seen, kBurst, store_id);
  ctx.TryCancel();
  while (plain->Read(&e)) {
  }
  EXPECT_EQ(plain->Finish().error_code(), grpc::StatusCode::CANCELLED);

  WatchStream unbatched(stub_, WatchFrom(start), Bounded(/*batch_events=*/false));
  ExpectBurstInOrder(ReadChanges(&unbatched, kBurst), kBurst, store_id);
  EXPECT_EQ(unbatched.stats().batched_messages, 0);
  EXPECT_EQ(unbatched.stats().messages, unbatched.stats().events);
}

// Cancel before the call has started: the stream never starts it, and ends CANCELLED.
TEST_F(WatchStreamTest, CancelBeforeStart_EndsCancelled) {
  WatchStream stream(stub_, WatchFrom(""), {});
  stream.Cancel();
  v1::WatchEvent e;
  EXPECT_FALSE(stream.Next(&e));
  EXPECT_THAT(stream.Finish(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(stream.stats().messages, 0);
}

// Records what a Reflector delivers. Its first Add blocks until `release` is notified, so that
// the watch falls behind and the server has many events waiting for it.
class GatedSink : public ReflectorSink {
 public:
  void Replace(std::vector<ObjectRef>, const std::string&) override {}
  void Add(ObjectRef o) override {
    if (!first_add_.HasBeenNotified()) first_add_.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
    Record(v1::WatchEvent::ADDED, std::move(o));
  }
  void Update(ObjectRef o) override { Record(v1::WatchEvent::MODIFIED, std::move(o)); }
  void Delete(ObjectRef o) override { Record(v1::WatchEvent::DELETED, std::move(o)); }
  void Bookmark(const std::string&) override {}
  void Stopped(const absl::Status&) override {}

  std::vector<v1::WatchEvent> Events() const {
    absl::MutexLock l(&mu_);
    return events_;
  }
  size_t size() const {
    absl::MutexLock l(&mu_);
    return events_.size();
  }
  bool first_add_seen() const { return first_add_.HasBeenNotified(); }

  absl::Notification release;

 private:
  void Record(v1::WatchEvent::Type type, ObjectRef o) {
    v1::WatchEvent e;
    e.set_type(type);
    *e.mutable_object() = *o;
    absl::MutexLock l(&mu_);
    events_.push_back(std::move(e));
  }

  absl::Notification first_add_;
  mutable absl::Mutex mu_;
  std::vector<v1::WatchEvent> events_ ABSL_GUARDED_BY(mu_);
};

// A Reflector that falls behind a burst of writes gets the backlog in batches (counted by its
// ListerWatcher) and hands its sink every event once, in order.
TEST_F(WatchStreamTest, Reflector_BehindABurst_GetsBatches_DeliversEveryEventOnceInOrder) {
  auto lw = StoreListerWatcher::Create(stub_, kWidgets, {}, {});
  ASSERT_THAT(lw, IsOk());
  StoreListerWatcher* watcher = lw->get();
  GatedSink sink;
  Reflector::Options options;
  options.watch_idle_timeout = absl::ZeroDuration();  // the gate must not pass for a dead watch
  auto created = Reflector::Create(*std::move(lw), &sink, options);
  ASSERT_THAT(created, IsOk());
  // Declared after the sink, so destroyed (stopped) before it.
  std::unique_ptr<Reflector> reflector = *std::move(created);
  reflector->Start();
  ASSERT_TRUE(Eventually([&] { return reflector->HasSynced(); }, "reflector synced"));

  // The first event blocks the reflector in its sink: the rest of the burst waits at the server.
  CreateBurst(0, 1);
  ASSERT_TRUE(Eventually([&] { return sink.first_add_seen(); }, "first event delivered"));
  CreateBurst(1, kBurst - 1);
  sink.release.Notify();
  ASSERT_TRUE(Eventually([&] { return sink.size() >= static_cast<size_t>(kBurst); },
                         absl::Seconds(60), "every event delivered"));
  // Once the reflector has reached the store's revision, everything of the burst has been
  // delivered: a duplicate would have been too.
  int64_t after = 0, reached = 0;
  ASSERT_TRUE(absl::SimpleAtoi(ListRevision().first, &after));
  ASSERT_TRUE(Eventually(
      [&] {
        return absl::SimpleAtoi(reflector->LastResourceVersion(), &reached) && reached >= after;
      },
      absl::Seconds(60), "the reflector caught up"));
  ExpectBurstInOrder(sink.Events(), kBurst, /*store_id=*/"");

  WatchStreamStats stats = watcher->watch_stats();
  EXPECT_GT(stats.batched_messages, 0) << "no message held more than one event";
  EXPECT_GE(stats.events, kBurst);
  EXPECT_EQ(reflector->watches_started(), 1) << "the burst was not read from one stream";
}

}  // namespace
}  // namespace shardcache
