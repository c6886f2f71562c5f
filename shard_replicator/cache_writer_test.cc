// Tests of CacheWriter against a real cache_server process on loopback: many writers racing a
// reconnect share one stream (no write is cancelled while the writer runs); while the cache
// cannot be reached, writes fail at once with UNAVAILABLE and WhenAvailable callbacks run as soon
// as a new stream is open; Stop drops the callbacks not yet run.

#include "shard_replicator/cache_writer.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <csignal>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/server_process.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using testing::BinaryPath;
using testing::ServerProcess;
using testing::WaitFor;

class CacheWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"),
                                              std::vector<std::string>{"--role=cache"});
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    // As the replicator's channels: reconnect at least every second.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    channel_ = grpc::CreateCustomChannel(server_->grpc_address(),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Store::NewStub(channel_);
  }

  void Kill() {
    server_->Signal(SIGKILL);
    int status = server_->Wait(absl::Seconds(10));
    ASSERT_TRUE(status != -1 && WIFSIGNALED(status));
  }

  void Restart() {
    absl::Status started = server_->Start();  // same port, same data directory
    ASSERT_TRUE(started.ok()) << started;
  }

  static v1::WriteRequest Upsert(const std::string& name, int value) {
    v1::WriteRequest request;
    v1::UpdateRequest& upsert = *request.mutable_upsert();
    upsert.mutable_resource()->set_group("example.com");
    upsert.mutable_resource()->set_version("v1");
    upsert.mutable_resource()->set_resource("widgets");
    v1::ObjectMeta& m = *upsert.mutable_object()->mutable_metadata();
    m.set_shard("a");
    m.set_cluster("root");
    m.set_namespace_("default");
    m.set_name(name);
    (*upsert.mutable_object()->mutable_spec()->mutable_fields())["value"].set_number_value(value);
    return request;
  }

  static CacheWriter::Options WriterOptions() {
    CacheWriter::Options options;
    options.shard = "a";
    options.epoch = 1;
    return options;
  }

  // Writes once and waits for the answer's status.
  static absl::Status WriteAndWait(CacheWriter* writer, const std::string& name, int value) {
    auto done = std::make_shared<absl::Notification>();
    auto result = std::make_shared<absl::Status>();
    absl::Status sent = writer->Write(
        Upsert(name, value), [done, result](const absl::Status& s, const v1::WriteResponse&) {
          *result = s;
          done->Notify();
        });
    if (!sent.ok()) return sent;
    if (!done->WaitForNotificationWithTimeout(absl::Seconds(20))) {
      return absl::DeadlineExceededError("no answer");
    }
    return *result;
  }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::Store::StubInterface> stub_;
};

// Eight writers keep writing through a kill and restart of the cache. Every write is answered
// with the cache's answer or UNAVAILABLE (the cache could not be reached), never CANCELLED: no
// stream replaced another while the writer ran. After the restart every writer gets its writes
// acknowledged again.
TEST_F(CacheWriterTest, WritersRacingAReconnectShareOneStream) {
  CacheWriter writer(channel_, stub_, WriterOptions());
  ASSERT_TRUE(WriteAndWait(&writer, "warm", 0).ok());
  ASSERT_NO_FATAL_FAILURE(Kill());

  constexpr int kWriters = 8;
  std::atomic<bool> restarted{false};
  std::atomic<bool> finish{false};
  std::atomic<int> cancelled{0};
  std::atomic<int> other_errors{0};
  std::vector<std::atomic<int>> acked_after_restart(kWriters);
  std::vector<std::thread> threads;
  for (int t = 0; t < kWriters; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !finish.load(); ++i) {
        bool after = restarted.load();
        absl::Status sent =
            writer.Write(Upsert(absl::StrCat("w", t, "-", i % 20), i),
                         [&, t, after](const absl::Status& s, const v1::WriteResponse&) {
                           if (absl::IsCancelled(s)) {
                             ++cancelled;
                           } else if (s.ok()) {
                             if (after) ++acked_after_restart[t];
                           } else if (!absl::IsUnavailable(s)) {
                             ++other_errors;
                           }
                         });
        if (absl::IsCancelled(sent)) ++cancelled;
        if (!sent.ok()) absl::SleepFor(absl::Milliseconds(20));  // retry pacing
      }
    });
  }
  absl::SleepFor(absl::Seconds(2));  // the writers keep failing through the outage
  ASSERT_NO_FATAL_FAILURE(Restart());
  restarted = true;
  bool all_acked = WaitFor(
      [&] {
        for (auto& n : acked_after_restart) {
          if (n.load() == 0) return false;
        }
        return true;
      },
      absl::Seconds(20));
  finish = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(cancelled.load(), 0) << "writes were cancelled while the writer ran";
  EXPECT_EQ(other_errors.load(), 0);
  EXPECT_TRUE(all_acked) << "every writer's writes are acknowledged after the restart";
  writer.Stop();
}

// While the cache is down, a write fails at once with UNAVAILABLE and the writer says so;
// WhenAvailable callbacks run once a new stream is open after the cache's return, and a write
// is acknowledged again.
TEST_F(CacheWriterTest, WhenAvailableRunsOnceTheCacheIsBack) {
  CacheWriter writer(channel_, stub_, WriterOptions());
  ASSERT_TRUE(WriteAndWait(&writer, "warm", 0).ok());
  EXPECT_TRUE(writer.Available());
  ASSERT_NO_FATAL_FAILURE(Kill());

  absl::Status failed = WriteAndWait(&writer, "down", 1);
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_FALSE(writer.Available());
  EXPECT_NE(writer.UnavailableSince(), absl::InfinitePast());
  absl::Time start = absl::Now();
  absl::Status fast = writer.Write(Upsert("down", 2), nullptr);
  EXPECT_TRUE(absl::IsUnavailable(fast)) << fast;
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500)) << "a write waited for the cache";

  absl::Notification resumed;
  writer.WhenAvailable([&] { resumed.Notify(); });
  EXPECT_FALSE(resumed.HasBeenNotified());
  ASSERT_NO_FATAL_FAILURE(Restart());
  absl::Time back = absl::Now();
  ASSERT_TRUE(resumed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::cout << "writes resumed " << absl::Now() - back << " after the cache's return\n";
  EXPECT_TRUE(writer.Available());
  EXPECT_TRUE(WriteAndWait(&writer, "back", 3).ok());

  // Available now: a callback runs at once, on the caller's thread.
  bool ran = false;
  writer.WhenAvailable([&] { ran = true; });
  EXPECT_TRUE(ran);
  writer.Stop();
  EXPECT_TRUE(writer.Stopped());
  EXPECT_TRUE(absl::IsCancelled(writer.Write(Upsert("late", 4), nullptr)));
}

// Stop drops the WhenAvailable callbacks that have not run: once Stop returns, none runs.
TEST_F(CacheWriterTest, StopDropsPendingCallbacks) {
  CacheWriter writer(channel_, stub_, WriterOptions());
  ASSERT_TRUE(WriteAndWait(&writer, "warm", 0).ok());
  ASSERT_NO_FATAL_FAILURE(Kill());
  EXPECT_TRUE(absl::IsUnavailable(WriteAndWait(&writer, "down", 1)));
  std::atomic<bool> ran{false};
  writer.WhenAvailable([&] { ran = true; });
  writer.Stop();  // joins the writer's thread: nothing can run the callback after this
  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_FALSE(ran.load());
  bool later = false;
  writer.WhenAvailable([&] { later = true; });
  EXPECT_FALSE(later);
}

}  // namespace
}  // namespace shardcache
