// Process-level tests of the watch fan-out against a real cache_server under load: a watcher is
// ended as too slow only when its own client stops reading (its queue bounded in bytes), never
// for the server's own lag; a burst of writes with many reading watchers ends none of them, and
// every watcher sees every event once, in order; batched delivery (WatchRequest.batch_events)
// carries exactly the events a plain watch does, several to a message when they wait.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/testing/channels.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

using ::testing::HasSubstr;

v1::Object Obj(const std::string& name, size_t payload_bytes = 0) {
  v1::Object o;
  o.mutable_metadata()->set_cluster("c1");
  o.mutable_metadata()->set_namespace_("ns1");
  o.mutable_metadata()->set_name(name);
  (*o.mutable_spec()->mutable_fields())["data"].set_string_value(std::string(payload_bytes, 'x'));
  return o;
}

class WatchFanoutTest : public StoreFixture {
 protected:
  const v1::GroupVersionResource widgets_ = Gvr("example.com", "v1", "widgets");

  int64_t MustCreate(const v1::Object& o) {
    v1::Object out;
    grpc::Status s = Create(widgets_, o, &out);
    EXPECT_TRUE(Ok(s)) << "create " << o.metadata().name();
    return s.ok() ? Rv(out) : -1;
  }

  // Creates `n` objects named prefix0.. over one pipelined Write stream (as fast as the server
  // takes them); returns their resourceVersions in order.
  std::vector<int64_t> Burst(const std::string& prefix, int n, size_t payload_bytes) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    auto stream = stub_->Write(&ctx);
    std::thread writer([&] {
      for (int i = 0; i < n; ++i) {
        v1::WriteRequest w;
        w.set_id(i);
        *w.mutable_create()->mutable_resource() = widgets_;
        *w.mutable_create()->mutable_object() = Obj(absl::StrCat(prefix, i), payload_bytes);
        if (!stream->Write(w)) break;
      }
      stream->WritesDone();
    });
    std::vector<int64_t> rvs;
    v1::WriteResponse r;
    while (static_cast<int>(rvs.size()) < n && stream->Read(&r)) {
      EXPECT_EQ(r.code(), 0) << r.message();
      rvs.push_back(Rv(r.object()));
    }
    writer.join();
    EXPECT_TRUE(Ok(stream->Finish()));
    return rvs;
  }

  v1::WatchRequest From(int64_t rv, bool batch) {
    v1::WatchRequest req = WatchReq(widgets_, rv);
    req.set_batch_events(batch);
    return req;
  }

  double TooSlow() {
    return Metric(server_->http_port(), "shardcache_store_watchers_too_slow_total");
  }
};

// The summaries a watcher must see for objects written at `rvs`.
std::vector<std::string> Expected(const std::string& prefix, const std::vector<int64_t>& rvs) {
  std::vector<std::string> out;
  for (size_t i = 0; i < rvs.size(); ++i) {
    out.push_back(Summary("ADDED", absl::StrCat(prefix, i), rvs[i]));
  }
  return out;
}

// A client that stops reading is ended once its queue passes its bound in bytes and its stream
// stays blocked; watchers that read, plain and batched, keep going and miss nothing. The bound is
// in bytes: fewer events than the older bound in events (1,000) are enough when they are large.
TEST_F(WatchFanoutTest, StoppedReader_IsEnded_WhileReadersKeepGoing) {
  StartServer(
      {"--watch-queue-bytes=262144", "--watch-stall-timeout=1s", "--bookmark-interval=500ms"});
  double too_slow_before = TooSlow();
  ASSERT_GE(too_slow_before, 0);
  int64_t from = MustCreate(Obj("start"));

  // The stopped reader, on its own connection without BDP probing, so that HTTP/2 flow control
  // stops the server's writes after about 64 KiB.
  auto channel = testing::NonGrowingWindowChannel(server_->grpc_address());
  auto stopped_stub = v1::Store::NewStub(channel);
  grpc::ClientContext stopped_ctx;
  stopped_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto stopped = stopped_stub->Watch(&stopped_ctx, From(from, false));
  ASSERT_TRUE(
      Eventually([&] { return Metric(server_->http_port(), "shardcache_store_watchers") >= 1; },
                 "the stopped reader's watch is registered"));
  WatchReader plain(stub_.get(), From(from, false));
  WatchReader batched(stub_.get(), From(from, true));

  // 32 KiB events until the stopped reader is ended (far fewer than 1,000 of them), then a few
  // more, which the readers must get too.
  std::vector<int64_t> rvs;
  for (int i = 0; i < 300 && TooSlow() <= too_slow_before; ++i) {
    rvs.push_back(MustCreate(Obj(absl::StrCat("big", rvs.size()), 32 * 1024)));
  }
  ASSERT_TRUE(Eventually([&] { return TooSlow() > too_slow_before; },
                         "shardcache_store_watchers_too_slow_total rises"));
  for (int i = 0; i < 5; ++i) rvs.push_back(MustCreate(Obj(absl::StrCat("big", rvs.size()), 100)));
  EXPECT_LT(rvs.size(), 1000u);
  // Nothing else writes to this server: each create's revision follows the one before.
  for (size_t i = 0; i < rvs.size(); ++i) {
    EXPECT_EQ(rvs[i], (i == 0 ? from : rvs[i - 1]) + 1) << "the revision of big" << i;
  }

  // Once it reads again: what was sent before the end, then RESOURCE_EXHAUSTED.
  v1::WatchEvent e;
  size_t read = 0;
  while (stopped->Read(&e)) ++read;
  EXPECT_LT(read, rvs.size());
  EXPECT_THAT(FromGrpcStatus(stopped->Finish()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("too slow")));

  for (WatchReader* w : {&plain, &batched}) {
    // ElementsAreArray names the first element that differs (EXPECT_EQ prints only 32 of 300).
    EXPECT_THAT(w->Take(rvs.size(), absl::Seconds(60)),
                ::testing::ElementsAreArray(Expected("big", rvs)));
    EXPECT_TRUE(w->NothingMoreUpTo(rvs.back()));
    EXPECT_FALSE(w->WaitForEnd(absl::ZeroDuration()).has_value()) << "a reader was ended";
  }
}

// A burst far beyond what the server sends in real time, with many watchers that read: none is
// ended (the writers are held back instead), and each sees every event once, in order.
TEST_F(WatchFanoutTest, Burst_WithManyReadingWatchers_EndsNone_EachSeesEveryEventInOrder) {
  // Bounds so small that every reader is past them during the burst (the older bound in events
  // ended such a watcher at once).
  StartServer({"--watch-queue-events=5", "--watch-queue-bytes=1024", "--bookmark-interval=500ms",
               "--sync=false"});
  int64_t from = MustCreate(Obj("start"));
  constexpr int kWatchers = 100;
  std::vector<std::unique_ptr<WatchReader>> readers;
  for (int i = 0; i < kWatchers; ++i) {
    readers.push_back(std::make_unique<WatchReader>(stub_.get(), From(from, i % 2 == 1)));
  }
  ASSERT_TRUE(Eventually(
      [&] { return Metric(server_->http_port(), "shardcache_store_watchers") >= kWatchers; },
      "every watch is registered"));

  constexpr int kWrites = 3000;
  std::vector<int64_t> rvs = Burst("w", kWrites, 512);
  ASSERT_EQ(rvs.size(), static_cast<size_t>(kWrites));
  std::vector<std::string> want = Expected("w", rvs);
  for (int i = 0; i < kWatchers; ++i) {
    ASSERT_EQ(readers[i]->Take(kWrites, absl::Seconds(60)), want) << "watcher " << i;
    EXPECT_TRUE(readers[i]->NothingMoreUpTo(rvs.back())) << "watcher " << i;
    std::optional<grpc::Status> end = readers[i]->WaitForEnd(absl::ZeroDuration());
    EXPECT_FALSE(end.has_value()) << "watcher " << i << " ended: " << end->error_message();
  }
  EXPECT_EQ(TooSlow(), 0);
}

// With batch_events, a watcher that is behind (here: a watch from a revision, whose history
// waits in full) gets several events per message, and exactly the events, in the order, that a
// plain watcher gets one per message; every message names the store.
TEST_F(WatchFanoutTest, BatchEvents_CarryTheSameEventsAsPlain_SeveralToAMessage) {
  StartServer({});
  int64_t from = MustCreate(Obj("start"));
  constexpr int kWrites = 500;
  std::vector<int64_t> rvs = Burst("w", kWrites, 64);
  ASSERT_EQ(rvs.size(), static_cast<size_t>(kWrites));

  auto read = [&](bool batch, int* messages) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = stub_->Watch(&ctx, From(from, batch));
    std::vector<std::string> events;
    v1::WatchEvent m;
    *messages = 0;
    while (events.size() < rvs.size() && reader->Read(&m)) {
      ++*messages;
      EXPECT_FALSE(m.store_id().empty()) << "message " << *messages << " names no store";
      if (m.events_size() == 0) {
        events.push_back(Summary(m));
        continue;
      }
      EXPECT_TRUE(batch) << "a batch to a watch that did not ask for one";
      EXPECT_GE(m.events_size(), 2) << "a batch of one";
      EXPECT_EQ(m.type(), v1::WatchEvent::TYPE_UNSPECIFIED);
      EXPECT_FALSE(m.has_object());
      for (const v1::WatchEvent& one : m.events()) events.push_back(Summary(one));
    }
    ctx.TryCancel();
    return events;
  };
  int plain_messages = 0, batch_messages = 0;
  EXPECT_EQ(read(false, &plain_messages), Expected("w", rvs));
  EXPECT_EQ(read(true, &batch_messages), Expected("w", rvs));
  EXPECT_EQ(plain_messages, kWrites);
  EXPECT_LT(batch_messages, kWrites / 10) << "the waiting history did not go out in batches";
}

}  // namespace
}  // namespace shardcache::testing
