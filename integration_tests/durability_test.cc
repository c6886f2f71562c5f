// Process-level tests of what cache_server keeps across restarts (SIGTERM and SIGKILL) in its
// data directory: watches resume from a resourceVersion seen before the restart, the revision
// counter never goes back, the history window (by count and by age), resource definitions,
// fencing epochs, --sync=false; and that it refuses to start on a damaged data directory or one
// that another server holds.

#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/error_info.h"
#include "common/grpc_status.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "integration_tests/refuse_to_start.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);

// A namespaced object with spec {"n": n}.
v1::Object Obj(const std::string& name, int n = 0) {
  v1::Object o;
  o.mutable_metadata()->set_cluster("c1");
  o.mutable_metadata()->set_namespace_("ns1");
  o.mutable_metadata()->set_name(name);
  (*o.mutable_spec()->mutable_fields())["n"].set_number_value(n);
  return o;
}

double SpecN(const v1::Object& o) {
  auto it = o.spec().fields().find("n");
  return it == o.spec().fields().end() ? -1 : it->second.number_value();
}

// Writers of large objects of `gvr` on three threads, so that a sync is nearly always in
// progress: an answer given before its batch is written would be lost to a SIGKILL that follows
// it. Each writer stops at its first failed write (the server was killed) or at Stop.
class WriteLoad {
 public:
  WriteLoad(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr) {
    for (int t = 0; t < 3; ++t) {
      threads_.emplace_back([this, stub, gvr, t] { Run(stub, gvr, t); });
    }
  }
  ~WriteLoad() { Stop(); }

  // Waits until the writers have made `n` writes, for at most kWait.
  ::testing::AssertionResult WaitForWrites(int n) {
    return Eventually([&] { return written_.load() >= n; }, kWait,
                      absl::StrCat("the writers make ", n, " writes"),
                      [&] { return absl::StrCat(written_.load(), " writes"); });
  }

  void Stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Run(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr, int t) {
    const std::string padding(256 * 1024, 'x');
    for (int i = 0; !stop_.load(); ++i) {
      v1::Object o = Obj(absl::StrCat("load-", t, "-", i % 4), i);
      (*o.mutable_spec()->mutable_fields())["pad"].set_string_value(padding);
      v1::Object out;
      v1::UpdateRequest update;
      *update.mutable_resource() = gvr;
      *update.mutable_object() = o;
      grpc::Status s = stub->Update(FailFastContext().get(), update, &out);
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        v1::CreateRequest create;
        *create.mutable_resource() = gvr;
        *create.mutable_object() = o;
        s = stub->Create(FailFastContext().get(), create, &out);
      }
      if (!s.ok()) return;  // the server was killed
      ++written_;
    }
  }

  std::atomic<bool> stop_{false};
  std::atomic<int> written_{0};
  std::vector<std::thread> threads_;
};

class DurabilityTest : public StoreFixture {
 protected:
  const v1::GroupVersionResource widgets_ = Gvr("example.com", "v1", "widgets");

  // Stops the server, and removes its data directory unless the test failed (RocksDB
  // preallocates tens of megabytes per directory).
  void TearDown() override {
    std::string dir = server_ != nullptr ? server_->data_dir() : "";
    StoreFixture::TearDown();
    if (!dir.empty() && !HasFailure()) std::filesystem::remove_all(dir);
  }

  // Ends the server with `sig` (SIGTERM: a clean stop, which must exit 0; SIGKILL: a crash) and
  // starts it again on the same data directory, with a new channel.
  void Restart(int sig) {
    ASSERT_NO_FATAL_FAILURE(StopServer(sig));
    ASSERT_NO_FATAL_FAILURE(StartAgain());
  }
  void StopServer(int sig) {
    stub_.reset();
    channel_.reset();
    if (sig == SIGTERM) {
      int status = server_->Stop();
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "SIGTERM: " << DescribeWaitStatus(status);
    } else {
      server_->Signal(sig);
      int status = server_->Wait(kWait);
      ASSERT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == sig)
          << "signal " << sig << ": " << DescribeWaitStatus(status);
    }
  }
  // Starts the stopped server again, with its arguments and data directory, and a new channel.
  void StartAgain() {
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << "restart: " << started;
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Store::NewStub(channel_);
  }

  // The store's revision, as a List reports it.
  int64_t Revision() {
    v1::ListRequest req;
    *req.mutable_resource() = widgets_;
    v1::ListResponse resp;
    grpc::Status s = List(req, &resp);
    EXPECT_TRUE(Ok(s)) << "list";
    int64_t rv = -1;
    EXPECT_TRUE(absl::SimpleAtoi(resp.resource_version(), &rv));
    return rv;
  }

  // Each writes, fails the test on error, and returns the resourceVersion written.
  int64_t MustCreate(const v1::Object& o, const v1::GroupVersionResource* gvr = nullptr) {
    v1::Object out;
    grpc::Status s = Create(gvr ? *gvr : widgets_, o, &out);
    EXPECT_TRUE(Ok(s)) << "create " << o.metadata().name();
    return s.ok() ? Rv(out) : -1;
  }
  int64_t MustUpdate(const v1::Object& o) {
    v1::Object out;
    grpc::Status s = Update(widgets_, o, &out);
    EXPECT_TRUE(Ok(s)) << "update " << o.metadata().name();
    return s.ok() ? Rv(out) : -1;
  }
  int64_t MustDelete(const std::string& name) {
    v1::DeleteResponse out;
    grpc::Status s = Delete(widgets_, "c1", "ns1", name, &out);
    EXPECT_TRUE(Ok(s)) << "delete " << name;
    EXPECT_TRUE(out.deleted());
    return s.ok() ? Rv(out.object()) : -1;
  }

  // A watch connected before a restart resumes after it from the last resourceVersion it saw:
  // exactly the events after it, none twice, none missing, in order, without OUT_OF_RANGE.
  void WatchResumesAcrossRestart(int sig);
  // Events written after the watcher's last seen revision but before the server died are
  // delivered by the resumed watch.
  void UnreadEventsSurviveRestart(int sig);
  // The revision counter never goes back across restarts.
  void RevisionNeverGoesBack(int sig);
};

// ---- watches resume across restarts ----

void DurabilityTest::WatchResumesAcrossRestart(int sig) {
  StartServer({"--bookmark-interval=200ms"});
  int64_t old = MustCreate(Obj("old"));
  int64_t last_seen = 0;
  {
    auto w = std::make_unique<WatchReader>(stub_.get(), WatchReq(widgets_));
    // The watch is registered once its initial state has come: only then does it see the
    // writes below as events rather than as part of that state.
    std::vector<v1::WatchEvent> initial = w->TakeInitial();
    ASSERT_EQ(initial.size(), 1u);
    EXPECT_EQ(Summary(initial[0]), Summary("ADDED", "old", old));
    std::vector<std::string> want;
    want.push_back(Summary("ADDED", "a1", MustCreate(Obj("a1"))));
    want.push_back(Summary("ADDED", "a2", MustCreate(Obj("a2"))));
    want.push_back(Summary("MODIFIED", "a1", MustUpdate(Obj("a1", 1))));
    want.push_back(Summary("DELETED", "a2", MustDelete("a2")));
    last_seen = MustCreate(Obj("a3"));
    want.push_back(Summary("ADDED", "a3", last_seen));
    ASSERT_EQ(w->Take(want.size()), want);
  }
  Restart(sig);
  if (HasFatalFailure()) return;
  EXPECT_EQ(Revision(), last_seen) << "nothing was written across the restart";

  std::vector<std::string> want;
  want.push_back(Summary("ADDED", "b1", MustCreate(Obj("b1"))));
  want.push_back(Summary("MODIFIED", "a1", MustUpdate(Obj("a1", 2))));
  want.push_back(Summary("DELETED", "a3", MustDelete("a3")));
  want.push_back(Summary("MODIFIED", "b1", MustUpdate(Obj("b1", 1))));
  int64_t last = MustCreate(Obj("b2"));
  want.push_back(Summary("ADDED", "b2", last));

  WatchReader resumed(stub_.get(), WatchReq(widgets_, last_seen));
  EXPECT_EQ(resumed.Take(want.size()), want);
  EXPECT_TRUE(resumed.NothingMoreUpTo(last));
  auto ended = resumed.WaitForEnd(absl::ZeroDuration());
  EXPECT_FALSE(ended.has_value()) << "the resumed watch ended: " << ended->error_code() << " "
                                  << ended->error_message();
}

TEST_F(DurabilityTest, Watch_ResumedAfterSigtermRestart_GetsExactlyTheLaterEvents) {
  WatchResumesAcrossRestart(SIGTERM);
}

TEST_F(DurabilityTest, Watch_ResumedAfterSigkillRestart_GetsExactlyTheLaterEvents) {
  WatchResumesAcrossRestart(SIGKILL);
}

void DurabilityTest::UnreadEventsSurviveRestart(int sig) {
  StartServer({"--bookmark-interval=200ms"});
  int64_t last_seen = 0;
  std::vector<std::string> want;
  {
    // The watch outlives the server it was connected to: keep its channel until it is gone.
    std::shared_ptr<grpc::Channel> old_channel = channel_;
    WatchReader w(stub_.get(), WatchReq(widgets_));
    ASSERT_TRUE(w.SkipInitial());
    std::vector<std::string> seen;
    seen.push_back(Summary("ADDED", "a1", MustCreate(Obj("a1"))));
    last_seen = MustCreate(Obj("a2"));
    seen.push_back(Summary("ADDED", "a2", last_seen));
    ASSERT_EQ(w.Take(seen.size()), seen);
    // Acknowledged, but the watcher does not read them before the server goes down.
    want.push_back(Summary("MODIFIED", "a1", MustUpdate(Obj("a1", 1))));
    want.push_back(Summary("ADDED", "a3", MustCreate(Obj("a3"))));
    want.push_back(Summary("DELETED", "a2", MustDelete("a2")));
    want.push_back(Summary("MODIFIED", "a3", MustUpdate(Obj("a3", 1))));
    Restart(sig);
    if (HasFatalFailure()) return;
  }
  want.push_back(Summary("ADDED", "b1", MustCreate(Obj("b1"))));
  int64_t last = MustUpdate(Obj("a1", 2));
  want.push_back(Summary("MODIFIED", "a1", last));

  WatchReader resumed(stub_.get(), WatchReq(widgets_, last_seen));
  EXPECT_EQ(resumed.Take(want.size()), want);
  EXPECT_TRUE(resumed.NothingMoreUpTo(last));
  auto ended = resumed.WaitForEnd(absl::ZeroDuration());
  EXPECT_FALSE(ended.has_value()) << "the resumed watch ended: " << ended->error_code() << " "
                                  << ended->error_message();
}

TEST_F(DurabilityTest, Watch_EventsUnreadWhenSigtermed_AreDeliveredAfterRestart) {
  UnreadEventsSurviveRestart(SIGTERM);
}

TEST_F(DurabilityTest, Watch_EventsUnreadWhenSigkilled_AreDeliveredAfterRestart) {
  UnreadEventsSurviveRestart(SIGKILL);
}

// ---- the revision counter ----

void DurabilityTest::RevisionNeverGoesBack(int sig) {
  StartServer({});
  int64_t last = 0;
  for (int cycle = 0; cycle < 3; ++cycle) {
    SCOPED_TRACE(absl::StrCat("cycle ", cycle));
    for (int i = 0; i < 5; ++i) {
      int64_t rv = MustCreate(Obj(absl::StrCat("c", cycle, "-", i)));
      EXPECT_GT(rv, last);
      last = rv;
    }
    // End with deletes, so that no live object carries the highest revision.
    for (int i = 2; i < 5; ++i) {
      int64_t rv = MustDelete(absl::StrCat("c", cycle, "-", i));
      EXPECT_GT(rv, last);
      last = rv;
    }
    EXPECT_EQ(Revision(), last);
    Restart(sig);
    if (HasFatalFailure()) return;
    EXPECT_GE(Revision(), last) << "the revision went back across the restart";
    int64_t next = MustCreate(Obj(absl::StrCat("after-", cycle)));
    EXPECT_GT(next, last) << "a write after the restart reused a revision";
    last = next;
  }
}

TEST_F(DurabilityTest, Revision_NeverGoesBackAcrossSigtermRestarts) {
  RevisionNeverGoesBack(SIGTERM);
}

TEST_F(DurabilityTest, Revision_NeverGoesBackAcrossSigkillRestarts) {
  RevisionNeverGoesBack(SIGKILL);
}

// ---- the history window ----

TEST_F(DurabilityTest, HistoryByCount_CompactionSurvivesRestart) {
  StartServer({"--history-events=10"});
  std::vector<int64_t> rvs;
  for (int i = 0; i < 30; ++i) rvs.push_back(MustCreate(Obj(absl::StrCat("w", i))));
  Restart(SIGTERM);
  if (HasFatalFailure()) return;

  WatchReader old(stub_.get(), WatchReq(widgets_, rvs[2]));
  auto s = old.WaitForEnd();
  ASSERT_TRUE(s.has_value()) << "a watch from a compacted revision did not end";
  EXPECT_THAT(FromGrpcStatus(*s),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("too old resource version")));

  // Inside the window: the last 10 events, exactly.
  WatchReader in_window(stub_.get(), WatchReq(widgets_, rvs[29] - 10));
  std::vector<std::string> want;
  for (int i = 20; i < 30; ++i) want.push_back(Summary("ADDED", absl::StrCat("w", i), rvs[i]));
  EXPECT_EQ(in_window.Take(10), want);
  EXPECT_FALSE(in_window.WaitForEnd(absl::ZeroDuration()).has_value());
}

// The window's edge is where it was: a revision that was too old before the restart is still
// too old after it (the window does not grow back from what the data directory kept).
TEST_F(DurabilityTest, HistoryByCount_RevisionTooOldBeforeRestart_IsTooOldAfterIt) {
  StartServer({"--history-events=10"});
  std::vector<int64_t> rvs;
  for (int i = 0; i < 30; ++i) rvs.push_back(MustCreate(Obj(absl::StrCat("w", i))));
  const int64_t edge = rvs[29] - 11;  // one revision before the 10 kept events
  {
    WatchReader before(stub_.get(), WatchReq(widgets_, edge));
    auto s = before.WaitForEnd();
    ASSERT_TRUE(s.has_value()) << "before the restart, a watch from " << edge << " did not end";
    ASSERT_EQ(s->error_code(), grpc::StatusCode::OUT_OF_RANGE) << s->error_message();
  }
  for (int sig : {SIGTERM, SIGKILL}) {
    SCOPED_TRACE(absl::StrCat("after a restart by signal ", sig));
    Restart(sig);
    if (HasFatalFailure()) return;
    WatchReader after(stub_.get(), WatchReq(widgets_, edge));
    auto s = after.WaitForEnd();
    ASSERT_TRUE(s.has_value()) << "a watch from " << edge << " (too old before the restart) is "
                               << "served after it: got "
                               << absl::StrJoin(after.Take(20, absl::ZeroDuration()), ", ");
    EXPECT_EQ(s->error_code(), grpc::StatusCode::OUT_OF_RANGE) << s->error_message();
  }
}

TEST_F(DurabilityTest, HistoryByAge_OldRevisionIsTooOldAfterRestart) {
  StartServer({"--history-age=1s"});
  const absl::Time written = absl::Now();
  int64_t first = MustCreate(Obj("a1"));
  MustCreate(Obj("a2"));
  MustUpdate(Obj("a1", 1));
  Restart(SIGTERM);
  if (HasFatalFailure()) return;

  // Once more than twice the age limit has passed, the first revision has left the window.
  absl::Time deadline = written + absl::Seconds(15);
  std::optional<grpc::Status> s;
  while (true) {
    WatchReader old(stub_.get(), WatchReq(widgets_, first));
    s = old.WaitForEnd(absl::Milliseconds(200));
    if (absl::Now() - written > absl::Seconds(2) && s.has_value() &&
        s->error_code() == grpc::StatusCode::OUT_OF_RANGE) {
      break;
    }
    if (absl::Now() > deadline) break;
  }
  ASSERT_TRUE(s.has_value()) << "a watch from revision " << first << " is still open after "
                             << (absl::Now() - written);
  EXPECT_THAT(FromGrpcStatus(*s),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("too old resource version")));

  // A recent revision is still inside the window.
  int64_t recent = MustCreate(Obj("a3"));
  int64_t last = MustCreate(Obj("a4"));
  WatchReader fresh(stub_.get(), WatchReq(widgets_, recent));
  EXPECT_EQ(fresh.Take(1), std::vector<std::string>{Summary("ADDED", "a4", last)});
}

// ---- state that must persist ----

TEST_F(DurabilityTest, Definitions_PersistInShardRole) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  std::vector<int64_t> rvs;
  for (int i = 0; i < 3; ++i) rvs.push_back(MustCreate(Obj(absl::StrCat("w", i), i)));
  // An undefined resource is not served, before or after the restart.
  grpc::Status s = Create(Gvr("example.com", "v1", "gadgets"), Obj("g1"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  Restart(SIGKILL);
  if (HasFatalFailure()) return;

  for (int i = 0; i < 3; ++i) {
    v1::Object got;
    ASSERT_TRUE(Ok(Get(widgets_, "c1", "ns1", absl::StrCat("w", i), &got))) << "w" << i;
    EXPECT_EQ(Rv(got), rvs[i]);
    EXPECT_EQ(SpecN(got), i);
  }
  v1::ListRequest req;
  *req.mutable_resource() = widgets_;
  v1::ListResponse listed;
  ASSERT_TRUE(Ok(List(req, &listed)));
  EXPECT_EQ(listed.items_size(), 3);
  EXPECT_GT(MustCreate(Obj("w3")), rvs[2]) << "the resource is served again after the restart";
  s = Create(Gvr("example.com", "v1", "gadgets"), Obj("g1"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();

  // Its definition is still there, and deleting it still purges the resource.
  v1::DeleteResponse deleted;
  ASSERT_TRUE(Ok(Delete(DefinitionGvr(), "", "", "widgets.example.com", &deleted)));
  s = Get(widgets_, "c1", "ns1", "w0");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
}

// docs/operations.md, "Backup and restore": the data directory of a store stopped with SIGTERM,
// archived with tar and unpacked into an empty directory, serves the same objects at the same
// revision, as the same store (its store id), with its definitions.
TEST_F(DurabilityTest, Backup_ArchiveOfAStoppedStore_RestoresTheSameStore) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  for (int i = 0; i < 5; ++i) MustCreate(Obj(absl::StrCat("w", i), i));
  MustDelete("w4");
  v1::ListRequest req;
  *req.mutable_resource() = widgets_;
  v1::ListResponse before;
  ASSERT_TRUE(Ok(List(req, &before)));
  ASSERT_EQ(before.items_size(), 4);

  ASSERT_NO_FATAL_FAILURE(StopServer(SIGTERM));
  const std::string dir = server_->data_dir();
  const std::string archive = dir + "-backup.tar.gz";
  ASSERT_EQ(std::system(absl::StrCat("tar -C '", dir, "' -czf '", archive, "' .").c_str()), 0);
  // The directory is lost; the backup is unpacked into a new, empty one.
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_EQ(std::system(absl::StrCat("tar -C '", dir, "' -xzf '", archive, "'").c_str()), 0);
  std::filesystem::remove(archive);
  ASSERT_NO_FATAL_FAILURE(StartAgain());

  v1::ListResponse after;
  ASSERT_TRUE(Ok(List(req, &after)));
  EXPECT_EQ(after.store_id(), before.store_id());
  EXPECT_EQ(after.resource_version(), before.resource_version());
  ASSERT_EQ(after.items_size(), before.items_size());
  for (int i = 0; i < before.items_size(); ++i) {
    EXPECT_EQ(after.items(i).SerializeAsString(), before.items(i).SerializeAsString())
        << before.items(i).metadata().name();
  }
  int64_t rv = 0;
  ASSERT_TRUE(absl::SimpleAtoi(before.resource_version(), &rv));
  EXPECT_EQ(MustCreate(Obj("w5")), rv + 1) << "the resource is served, and revisions go on";
}

TEST_F(DurabilityTest, FencingEpochs_PersistAcrossRestart) {
  StartServer({});
  v1::CreateRequest req;
  *req.mutable_resource() = widgets_;
  *req.mutable_object() = Obj("f1");
  req.mutable_fence()->set_shard("a");
  req.mutable_fence()->set_epoch(5);
  v1::Object out;
  ASSERT_TRUE(Ok(stub_->Create(Context().get(), req, &out)));
  Restart(SIGKILL);
  if (HasFatalFailure()) return;

  v1::UpdateRequest stale;
  *stale.mutable_resource() = widgets_;
  *stale.mutable_object() = Obj("f1", 4);
  stale.mutable_fence()->set_shard("a");
  stale.mutable_fence()->set_epoch(4);
  grpc::Status s = stub_->Update(Context().get(), stale, &out);
  EXPECT_THAT(FromGrpcStatus(s),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("fenced")));
  v1::Object got;
  ASSERT_TRUE(Ok(Get(widgets_, "c1", "ns1", "f1", &got)));
  EXPECT_EQ(SpecN(got), 0) << "a fenced write changed the object";

  // The same epoch, or another shard's, still writes.
  v1::UpdateRequest current = stale;
  current.mutable_fence()->set_epoch(5);
  EXPECT_TRUE(Ok(stub_->Update(Context().get(), current, &out)));
  v1::UpdateRequest other = stale;
  other.mutable_fence()->set_shard("b");
  *other.mutable_object() = Obj("f1", 6);
  EXPECT_TRUE(Ok(stub_->Update(Context().get(), other, &out)));
}

// The real binary keeps --min-free-disk-bytes in reserve: with a reserve larger than any disk,
// creates are refused with RESOURCE_EXHAUSTED and reason NO_SPACE on the wire, while reads and
// deletes are still served.
TEST_F(DurabilityTest, DiskReserve_NotAvailable_RefusesCreatesAndServesReadsAndDeletes) {
  StartServer({"--min-free-disk-bytes=1152921504606846976"});
  v1::CreateRequest req;
  *req.mutable_resource() = widgets_;
  *req.mutable_object() = Obj("r1");
  v1::Object out;
  absl::Status refused = FromGrpcStatus(stub_->Create(Context().get(), req, &out));
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("kept in reserve (--min-free-disk-bytes)")));
  EXPECT_TRUE(HasReason(refused, kReasonNoSpace)) << refused;
  v1::ListRequest list;
  *list.mutable_resource() = widgets_;
  v1::ListResponse listed;
  ASSERT_TRUE(Ok(stub_->List(Context().get(), list, &listed)));
  EXPECT_EQ(listed.items_size(), 0);
  v1::DeleteRequest del;
  *del.mutable_resource() = widgets_;
  del.set_cluster("c1");
  del.set_namespace_("ns1");
  del.set_name("r1");
  v1::DeleteResponse deleted;
  EXPECT_EQ(stub_->Delete(Context().get(), del, &deleted).error_code(), grpc::StatusCode::NOT_FOUND)
      << "a delete is not refused for want of space";
}

// A leader may claim its epoch with a write that changes nothing (no new revision). Once that
// write is acknowledged the claim must be durable too: after a crash, the former leader's epoch
// is still fenced. The committer is kept busy with large writes so that a claim that is
// acknowledged before it is written would be lost to the SIGKILL that follows the answer.
TEST_F(DurabilityTest, FencingEpochs_ClaimedByANoOpWrite_SurviveSigkill) {
  StartServer({});
  v1::Object f1 = Obj("f1");
  const int64_t created = MustCreate(f1);
  for (int epoch = 2; epoch <= 6; ++epoch) {
    SCOPED_TRACE(absl::StrCat("claiming epoch ", epoch));
    WriteLoad load(stub_.get(), widgets_);
    EXPECT_TRUE(load.WaitForWrites(12)) << "the load did not get going";

    v1::UpdateRequest claim;
    *claim.mutable_resource() = widgets_;
    *claim.mutable_object() = f1;  // unchanged: no new revision
    claim.mutable_fence()->set_shard("a");
    claim.mutable_fence()->set_epoch(epoch);
    v1::Object out;
    grpc::Status s = stub_->Update(Context().get(), claim, &out);
    server_->Signal(SIGKILL);
    load.Stop();
    ASSERT_TRUE(Ok(s)) << "claiming epoch " << epoch;
    EXPECT_EQ(Rv(out), created) << "the claim was meant to change nothing";
    int status = server_->Wait(kWait);
    ASSERT_TRUE(status != -1 && WIFSIGNALED(status)) << DescribeWaitStatus(status);
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Store::NewStub(channel_);

    v1::UpdateRequest former = claim;
    former.mutable_fence()->set_epoch(epoch - 1);
    *former.mutable_object() = Obj("f1", 100 + epoch);
    s = stub_->Update(Context().get(), former, &out);
    ASSERT_THAT(FromGrpcStatus(s),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("fenced")))
        << "the acknowledged claim of epoch " << epoch << " was lost in the crash";
  }
}

// A new leader claims its epoch with ClaimEpoch before it writes anything. Once the claim is
// answered it is durable: after a SIGKILL sent right after the answer, a lower claim and a former
// leader's write of a lower epoch are still rejected. The first claim has nothing else to commit
// with it (a batch of epochs alone); the later ones are made while large writes keep the
// committer busy.
TEST_F(DurabilityTest, FencingEpochs_ClaimedByClaimEpoch_SurviveSigkill) {
  StartServer({});
  const int64_t revision = Revision();
  for (int epoch = 2; epoch <= 5; ++epoch) {
    SCOPED_TRACE(absl::StrCat("claiming epoch ", epoch));
    std::unique_ptr<WriteLoad> load;
    if (epoch > 2) {
      load = std::make_unique<WriteLoad>(stub_.get(), widgets_);
      EXPECT_TRUE(load->WaitForWrites(12)) << "the load did not get going";
    }
    v1::ClaimEpochRequest claim;
    claim.mutable_fence()->set_shard("a");
    claim.mutable_fence()->set_epoch(epoch);
    v1::ClaimEpochResponse claimed;
    grpc::Status s = stub_->ClaimEpoch(Context().get(), claim, &claimed);
    server_->Signal(SIGKILL);
    if (load != nullptr) load->Stop();
    ASSERT_TRUE(Ok(s)) << "claiming epoch " << epoch;
    EXPECT_EQ(claimed.epoch(), epoch);
    int status = server_->Wait(kWait);
    ASSERT_TRUE(status != -1 && WIFSIGNALED(status)) << DescribeWaitStatus(status);
    absl::Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started;
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Store::NewStub(channel_);
    if (load == nullptr) {
      EXPECT_EQ(Revision(), revision) << "a claim alone wrote an object";
    }

    v1::ClaimEpochRequest lower = claim;
    lower.mutable_fence()->set_epoch(epoch - 1);
    s = stub_->ClaimEpoch(Context().get(), lower, &claimed);
    ASSERT_THAT(FromGrpcStatus(s),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr(absl::StrCat("is at epoch ", epoch,
                                                " and this claim carries epoch ", epoch - 1))))
        << "the acknowledged claim of epoch " << epoch << " was lost in the crash";
    v1::CreateRequest former;
    *former.mutable_resource() = widgets_;
    *former.mutable_object() = Obj(absl::StrCat("former-", epoch));
    former.mutable_fence()->set_shard("a");
    former.mutable_fence()->set_epoch(epoch - 1);
    v1::Object out;
    s = stub_->Create(Context().get(), former, &out);
    EXPECT_THAT(FromGrpcStatus(s),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr(absl::StrCat("is at epoch ", epoch,
                                                " and this write carries epoch ", epoch - 1))));
    s = Get(widgets_, "c1", "ns1", absl::StrCat("former-", epoch));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << "a fenced write created its object";

    // The new leader's own epoch is still in force for it: claiming it again succeeds.
    s = stub_->ClaimEpoch(Context().get(), claim, &claimed);
    EXPECT_TRUE(Ok(s));
    EXPECT_EQ(claimed.epoch(), epoch);
  }
}

TEST_F(DurabilityTest, SyncFalse_WritesSurviveSigtermRestart) {
  StartServer({"--sync=false"});
  std::vector<int64_t> rvs;
  for (int i = 0; i < 20; ++i) rvs.push_back(MustCreate(Obj(absl::StrCat("w", i), i)));
  MustDelete("w0");
  int64_t updated = MustUpdate(Obj("w1", 100));
  Restart(SIGTERM);
  if (HasFatalFailure()) return;
  v1::ListRequest req;
  *req.mutable_resource() = widgets_;
  v1::ListResponse listed;
  ASSERT_TRUE(Ok(List(req, &listed)));
  ASSERT_EQ(listed.items_size(), 19);
  v1::Object got;
  ASSERT_TRUE(Ok(Get(widgets_, "c1", "ns1", "w1", &got)));
  EXPECT_EQ(Rv(got), updated);
  EXPECT_EQ(SpecN(got), 100);
  ASSERT_TRUE(Ok(Get(widgets_, "c1", "ns1", "w19", &got)));
  EXPECT_EQ(Rv(got), rvs[19]);
  EXPECT_EQ(Get(widgets_, "c1", "ns1", "w0").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_GT(MustCreate(Obj("w20")), updated);
}

// --sync=false promises that a process crash loses nothing (only a machine crash may).
TEST_F(DurabilityTest, SyncFalse_WritesSurviveSigkill) {
  StartServer({"--sync=false"});
  int64_t last = 0;
  for (int i = 0; i < 20; ++i) last = MustCreate(Obj(absl::StrCat("w", i), i));
  Restart(SIGKILL);
  if (HasFatalFailure()) return;
  v1::Object got;
  ASSERT_TRUE(Ok(Get(widgets_, "c1", "ns1", "w19", &got)));
  EXPECT_EQ(Rv(got), last);
  EXPECT_EQ(Revision(), last);
}

// ---- refusing a damaged or busy data directory ----

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> FilesEndingWith(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  for (const std::string& f : FilesIn(dir)) {
    if (absl::EndsWith(f, suffix)) out.push_back(f);
  }
  return out;
}

std::vector<std::string> FilesStartingWith(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const std::string& f : FilesIn(dir)) {
    if (absl::StartsWith(f, prefix)) out.push_back(f);
  }
  return out;
}

off_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

class DamagedDataDirTest : public DurabilityTest {
 protected:
  // Starts a server, writes enough objects for RocksDB tables, and stops it cleanly twice (the
  // second start replays the log into a table file), leaving a data directory with at least one
  // .sst file. Returns the directory.
  std::string PrepareDataDir() {
    StartServer({});
    std::string padding(2000, 'x');
    for (int i = 0; i < 300; ++i) {
      v1::Object o = Obj(absl::StrCat("w", i), i);
      (*o.mutable_spec()->mutable_fields())["pad"].set_string_value(padding);
      MustCreate(o);
    }
    Restart(SIGTERM);
    if (HasFatalFailure()) return "";
    EXPECT_EQ(Revision(), 301);
    stub_.reset();
    channel_.reset();
    int status = server_->Stop();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status);
    std::string dir = server_->data_dir();
    EXPECT_FALSE(FilesEndingWith(dir, ".sst").empty())
        << "no .sst file after two clean stops; files: " << absl::StrJoin(FilesIn(dir), " ");
    return dir;
  }

  // The damaged directory is refused, with a message that names it.
  void ExpectDirRefused(const std::string& dir) {
    absl::Time start = absl::Now();
    RunResult r = RunCacheServer({"--data-dir=" + dir});
    ExpectRefused(r, {dir});
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "refusing took too long";
  }
};

TEST_F(DamagedDataDirTest, Undamaged_StartsAgain) {
  std::string dir = PrepareDataDir();
  if (HasFailure()) return;
  absl::Status started = server_->Start();
  ASSERT_TRUE(started.ok()) << started;
  channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
  stub_ = v1::Store::NewStub(channel_);
  EXPECT_EQ(Revision(), 301);
}

TEST_F(DamagedDataDirTest, CurrentFileDeleted_IsRefused) {
  std::string dir = PrepareDataDir();
  if (HasFailure()) return;
  ASSERT_EQ(unlink((dir + "/CURRENT").c_str()), 0);
  ExpectDirRefused(dir);
}

TEST_F(DamagedDataDirTest, NewestSstTruncatedToHalf_IsRefused) {
  std::string dir = PrepareDataDir();
  if (HasFailure()) return;
  std::vector<std::string> ssts = FilesEndingWith(dir, ".sst");
  ASSERT_FALSE(ssts.empty());
  // Table files are numbered in the order they are made: the largest number is the newest.
  std::string newest =
      dir + "/" +
      *std::max_element(ssts.begin(), ssts.end(), [](const std::string& a, const std::string& b) {
        return a.size() != b.size() ? a.size() < b.size() : a < b;
      });
  off_t size = FileSize(newest);
  ASSERT_GT(size, 0);
  ASSERT_EQ(truncate(newest.c_str(), size / 2), 0);
  ExpectDirRefused(dir);
}

TEST_F(DamagedDataDirTest, SstBytesGarbled_IsRefused) {
  std::string dir = PrepareDataDir();
  if (HasFailure()) return;
  std::vector<std::string> ssts = FilesEndingWith(dir, ".sst");
  ASSERT_FALSE(ssts.empty());
  for (const std::string& name : ssts) {
    std::string path = dir + "/" + name;
    off_t size = FileSize(path);
    ASSERT_GT(size, 256) << path;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    // Flip every bit of 64 bytes in the middle of the file (a data block's contents).
    std::string bytes(64, '\0');
    f.seekg(size / 2);
    f.read(bytes.data(), bytes.size());
    for (char& c : bytes) c = static_cast<char>(~c);
    f.seekp(size / 2);
    f.write(bytes.data(), bytes.size());
    f.close();
    ASSERT_FALSE(f.fail()) << path;
  }
  ExpectDirRefused(dir);
}

TEST_F(DamagedDataDirTest, ManifestDeleted_IsRefused) {
  std::string dir = PrepareDataDir();
  if (HasFailure()) return;
  std::vector<std::string> manifests = FilesStartingWith(dir, "MANIFEST-");
  ASSERT_FALSE(manifests.empty()) << absl::StrJoin(FilesIn(dir), " ");
  for (const std::string& m : manifests) ASSERT_EQ(unlink((dir + "/" + m).c_str()), 0);
  ExpectDirRefused(dir);
}

TEST(DataDirTest, DirectoryWithOnlyAnUnrelatedFile_IsRefusedAndTheFileKept) {
  std::string dir = MakeTempDir("unrelated");
  ASSERT_FALSE(dir.empty());
  {
    std::ofstream out(dir + "/notes.txt");
    out << "my notes, not a database\n";
  }
  RunResult r = RunCacheServer({"--data-dir=" + dir});
  ExpectRefused(r, {dir});
  // The user's file is untouched (RocksDB may leave its LOCK and LOG files beside it).
  std::ifstream in(dir + "/notes.txt");
  std::stringstream notes;
  notes << in.rdbuf();
  EXPECT_EQ(notes.str(), "my notes, not a database\n");
}

TEST_F(DurabilityTest, SecondServerOnTheSameDataDir_RefusesToStart) {
  StartServer({});
  int64_t rv = MustCreate(Obj("w1"));
  RunResult r = RunCacheServer({"--data-dir=" + server_->data_dir()});
  ExpectRefused(r, {server_->data_dir(), "in use by another process"});
  // The first server is unharmed.
  v1::Object got;
  ASSERT_TRUE(Ok(Get(widgets_, "c1", "ns1", "w1", &got)));
  EXPECT_EQ(Rv(got), rv);
  EXPECT_GT(MustCreate(Obj("w2")), rv);
}

}  // namespace
}  // namespace shardcache::testing
