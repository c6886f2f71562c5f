#include "cache_server/group_committer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cache_server/testing/fake_watcher.h"
#include "cache_server/testing/in_process_server.h"
#include "common/logging.h"
#include "common/testing/wait.h"
#include "prometheus/registry.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::GatedStorage;
using ::shardcache::testing::RecordingWatcher;
using ::testing::ElementsAre;

// Records what the committer tells its owner, and what completes, in one sequence.
class Log : public GroupCommitter::Owner {
 public:
  void OnDurable(int64_t revision) override { Add(absl::StrCat("durable ", revision)); }
  void OnIdle() override {}
  absl::Mutex* OperationLock() override {
    operation_lock_asked_.fetch_add(1);
    return &operation_mu_;
  }
  // The owner's lock for one operation's changes, and how often the committer asked for it.
  absl::Mutex operation_mu_;
  std::atomic<int> operation_lock_asked_{0};

  void Add(const std::string& entry) {
    absl::MutexLock l(&mu_);
    entries_.push_back(entry);
  }
  std::vector<std::string> entries() const {
    absl::MutexLock l(&mu_);
    return entries_;
  }
  std::function<void()> Completion(const std::string& name) {
    return [this, name] { Add(name); };
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> entries_ ABSL_GUARDED_BY(mu_);
};

EventPtr MakeEvent(int64_t revision) {
  auto e = std::make_shared<Event>();
  e->revision = revision;
  e->type = v1::WatchEvent::ADDED;
  e->group_resource = "example.com/widgets";
  auto o = std::make_shared<v1::Object>();
  o->mutable_metadata()->set_name(absl::StrCat("w", revision));
  o->mutable_metadata()->set_resource_version(absl::StrCat(revision));
  e->object = std::move(o);
  return e;
}

class GroupCommitterTest : public ::testing::Test {
 protected:
  GroupCommitterTest()
      : metrics_(std::make_shared<prometheus::Registry>()),
        watch_cache_(WatchCache::Options(), &metrics_),
        committer_(&storage_, &watch_cache_, &metrics_, &log_, /*revision=*/1,
                   /*compacted_revision=*/1) {
    committer_.Start();
  }

  GatedStorage storage_;
  Log log_;
  StoreMetrics metrics_;
  WatchCache watch_cache_;
  GroupCommitter committer_;
};

TEST_F(GroupCommitterTest, CompletesOnlyOnceDurable) {
  storage_.Close();
  committer_.AddEvent(MakeEvent(2));
  committer_.CompleteWhenDurable(2, log_.Completion("write 2"));
  ASSERT_TRUE(Eventually([&] { return storage_.commits() == 1; }, "the batch is being written"));
  // The committer is inside Commit: nothing may be complete or visible before it returns.
  EXPECT_THAT(log_.entries(), ::testing::IsEmpty());
  EXPECT_EQ(committer_.durable_revision(), 1);
  storage_.Open();
  ASSERT_TRUE(Eventually([&] { return log_.entries().size() == 2; }, "the write completes"));
  // The owner learns of durability before the write is acknowledged.
  EXPECT_THAT(log_.entries(), ElementsAre("durable 2", "write 2"));
  EXPECT_EQ(committer_.durable_revision(), 2);
}

TEST_F(GroupCommitterTest, BatchesWhatArrivesDuringASync) {
  storage_.Close();
  committer_.AddEvent(MakeEvent(2));
  committer_.CompleteWhenDurable(2, log_.Completion("write 2"));
  ASSERT_TRUE(Eventually([&] { return storage_.commits() == 1; }, "the first batch is taken"));
  for (int64_t rev = 3; rev <= 6; ++rev) {
    committer_.AddEvent(MakeEvent(rev));
    committer_.CompleteWhenDurable(rev, log_.Completion(absl::StrCat("write ", rev)));
  }
  committer_.AddEpoch("a", 7);
  storage_.Open();
  ASSERT_TRUE(Eventually([&] { return log_.entries().size() == 7; }, "every write completes"));
  // Two syncs for five writes: the four that came during the first sync went as one batch, in
  // order, with the epoch.
  std::vector<CommitBatch> batches = storage_.batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].revision, 2);
  ASSERT_EQ(batches[0].events.size(), 1u);
  EXPECT_EQ(batches[1].revision, 6);
  std::vector<int64_t> revisions;
  for (const EventPtr& e : batches[1].events) revisions.push_back(e->revision);
  EXPECT_THAT(revisions, ElementsAre(3, 4, 5, 6));
  EXPECT_THAT(batches[1].epochs, ElementsAre(std::pair<const std::string, int64_t>("a", 7)));
  EXPECT_THAT(log_.entries(), ElementsAre("durable 2", "write 2", "durable 6", "write 3", "write 4",
                                          "write 5", "write 6"));
}

TEST_F(GroupCommitterTest, ABatchHoldsWholeOperationsOnly) {
  // One operation of the owner (as a ResourceDefinition's deletion and its objects' deletions):
  // its changes are added under the owner's operation lock.
  {
    absl::MutexLock operation(&log_.operation_mu_);
    committer_.AddEvent(MakeEvent(2));
    // The committer has woken for the first change and waits for the operation to end.
    ASSERT_TRUE(Eventually([&] { return log_.operation_lock_asked_.load() >= 1; },
                           "the committer takes its batch under the operation lock"));
    committer_.AddEvent(MakeEvent(3));
    committer_.AddEvent(MakeEvent(4));
  }
  committer_.CompleteWhenDurable(4, log_.Completion("operation"));
  ASSERT_TRUE(Eventually([&] { return log_.entries().size() == 2; }, "the operation completes"));
  EXPECT_THAT(log_.entries(), ElementsAre("durable 4", "operation"));
  std::vector<CommitBatch> batches = storage_.batches();
  ASSERT_EQ(batches.size(), 1u) << "the operation was split over two syncs";
  EXPECT_EQ(batches[0].events.size(), 3u);
  EXPECT_EQ(batches[0].revision, 4);
}

TEST_F(GroupCommitterTest, WaitsForEpochsClaimedBefore) {
  // Nothing to wait for: completes at once, in the caller.
  committer_.CompleteWhenDurable(1, log_.Completion("read 1"));
  EXPECT_THAT(log_.entries(), ElementsAre("read 1"));

  storage_.Close();
  committer_.AddEpoch("a", 3);
  // No revision to wait for, but an epoch raised before: waits for the batch of epochs alone.
  committer_.CompleteWhenDurable(0, log_.Completion("claim"));
  ASSERT_TRUE(Eventually([&] { return storage_.commits() == 1; }, "the epoch is being written"));
  EXPECT_THAT(log_.entries(), ElementsAre("read 1"));
  storage_.Open();
  ASSERT_TRUE(Eventually([&] { return log_.entries().size() == 3; }, "the claim completes"));
  EXPECT_THAT(log_.entries(), ElementsAre("read 1", "durable 1", "claim"));
  std::vector<CommitBatch> batches = storage_.batches();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_TRUE(batches[0].events.empty());
  EXPECT_EQ(batches[0].revision, 1);
  EXPECT_THAT(batches[0].epochs, ElementsAre(std::pair<const std::string, int64_t>("a", 3)));
}

TEST_F(GroupCommitterTest, CarriesTheCompactedRevision) {
  // Set first: the committer may take the event into a batch as soon as it is added.
  committer_.SetCompactedRevision(2);
  committer_.AddEvent(MakeEvent(2));
  committer_.CompleteWhenDurable(2, log_.Completion("write 2"));
  ASSERT_TRUE(Eventually([&] { return log_.entries().size() == 2; }, "the write completes"));
  ASSERT_EQ(storage_.batches().size(), 1u);
  EXPECT_EQ(storage_.batches()[0].compacted_revision, 2);
}

TEST_F(GroupCommitterTest, StopCommitsAndCompletesWhatWasAdded) {
  storage_.Close();
  committer_.AddEvent(MakeEvent(2));
  committer_.CompleteWhenDurable(2, log_.Completion("write 2"));
  ASSERT_TRUE(Eventually([&] { return storage_.commits() == 1; }, "the first batch is taken"));
  committer_.AddEvent(MakeEvent(3));
  committer_.CompleteWhenDurable(3, log_.Completion("write 3"));
  storage_.Open();
  committer_.Stop();
  EXPECT_THAT(log_.entries(), ElementsAre("durable 2", "write 2", "durable 3", "write 3"));
  EXPECT_EQ(storage_.batches().size(), 2u);
}

// A Storage whose Write returns at once and whose Sync waits until the test lets it through,
// one sync per Allow: a disk whose fsync takes as long as the test wants. Records each batch
// written, and how many had been written when each sync began.
class SyncGatedStorage : public Storage {
 public:
  absl::StatusOr<PersistedState> Load() override { return PersistedState(); }
  absl::Status Commit(const CommitBatch&) override {
    return absl::InternalError("the committer writes and syncs apart");
  }
  absl::Status Write(const CommitBatch& batch) override {
    absl::MutexLock l(&mu_);
    batches_.push_back(batch);
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    absl::MutexLock l(&mu_);
    syncs_.push_back(batches_.size());
    auto allowed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return allowed_ > 0; };
    mu_.Await(absl::Condition(&allowed));
    --allowed_;
    if (fail_) return absl::DataLossError("injected: fsync failed");
    return absl::OkStatus();
  }

  // Lets `n` more syncs return.
  void Allow(int n) {
    absl::MutexLock l(&mu_);
    allowed_ += n;
  }
  // Every sync from now on fails.
  void Fail() {
    absl::MutexLock l(&mu_);
    fail_ = true;
  }
  size_t writes() const {
    absl::MutexLock l(&mu_);
    return batches_.size();
  }
  std::vector<CommitBatch> batches() const {
    absl::MutexLock l(&mu_);
    return batches_;
  }
  // Per sync begun: how many batches had been written when it began.
  std::vector<size_t> syncs() const {
    absl::MutexLock l(&mu_);
    return syncs_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<CommitBatch> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> syncs_ ABSL_GUARDED_BY(mu_);
  int allowed_ ABSL_GUARDED_BY(mu_) = 0;
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
};

// The committer as a pipeline: batches are written while the one before is being synced.
class PipelinedCommitterTest : public ::testing::Test {
 protected:
  PipelinedCommitterTest()
      : metrics_(std::make_shared<prometheus::Registry>()),
        watch_cache_(WatchCache::Options(), &metrics_),
        committer_(&storage_, &watch_cache_, &metrics_, &log_, /*revision=*/1,
                   /*compacted_revision=*/1) {
    WatchSpec spec;
    spec.group_resource = "example.com/widgets";
    spec.start_revision = 1;
    watcher_.Init(spec, {});
    EXPECT_TRUE(watch_cache_.Register(&watcher_).ok());
    committer_.Start();
  }
  ~PipelinedCommitterTest() override {
    storage_.Allow(1000);
    committer_.Stop();
    watch_cache_.Unregister(&watcher_);
  }

  // Adds the event of revision `rev` and a completion that waits for it.
  void Write(int64_t rev) {
    committer_.AddEvent(MakeEvent(rev));
    committer_.CompleteWhenDurable(rev, log_.Completion(absl::StrCat("write ", rev)));
  }

  SyncGatedStorage storage_;
  Log log_;
  StoreMetrics metrics_;
  WatchCache watch_cache_;
  RecordingWatcher watcher_;
  GroupCommitter committer_;
};

TEST_F(PipelinedCommitterTest, WritesTheNextBatchWhileOneSyncs_CompletesItOnlyAfterItsOwnSync) {
  Write(2);
  ASSERT_TRUE(Eventually([&] { return storage_.syncs().size() == 1; }, "batch 2 is syncing"));
  Write(3);
  // Written while the sync of the batch before it runs.
  ASSERT_TRUE(Eventually([&] { return storage_.writes() == 2; }, "batch 3 is written"));
  EXPECT_THAT(log_.entries(), ::testing::IsEmpty());
  EXPECT_EQ(committer_.durable_revision(), 1);

  storage_.Allow(1);
  ASSERT_TRUE(Eventually([&] { return log_.entries().size() == 2; }, "write 2 completes"));
  ASSERT_TRUE(Eventually([&] { return storage_.syncs().size() == 2; }, "batch 3 is syncing"));
  // The first sync began before batch 3 was written: it does not cover it, and write 3 waits for
  // the second.
  EXPECT_THAT(storage_.syncs(), ElementsAre(1u, 2u));
  EXPECT_THAT(log_.entries(), ElementsAre("durable 2", "write 2"));
  EXPECT_EQ(committer_.durable_revision(), 2);

  storage_.Allow(1);
  ASSERT_TRUE(Eventually([&] { return log_.entries().size() == 4; }, "write 3 completes"));
  EXPECT_THAT(log_.entries(), ElementsAre("durable 2", "write 2", "durable 3", "write 3"));
  // Published once each, in order.
  EXPECT_THAT(watcher_.WaitFor(2), ElementsAre("ADDED w2 2", "ADDED w3 3"));
}

TEST_F(PipelinedCommitterTest, OneSyncCoversEveryBatchWrittenBeforeIt) {
  Write(2);
  ASSERT_TRUE(Eventually([&] { return storage_.syncs().size() == 1; }, "batch 2 is syncing"));
  Write(3);
  ASSERT_TRUE(Eventually([&] { return storage_.writes() == 2; }, "batch 3 is written"));
  {
    // One operation of the owner: an epoch claimed and a write, in one batch.
    absl::MutexLock operation(&log_.operation_mu_);
    committer_.AddEpoch("a", 7);
    committer_.CompleteWhenDurable(0, log_.Completion("claim"));
    Write(4);
  }
  ASSERT_TRUE(Eventually([&] { return storage_.writes() == 3; }, "batch 4 is written"));
  storage_.Allow(1);
  ASSERT_TRUE(Eventually([&] { return storage_.syncs().size() == 2; }, "the second sync began"));
  const size_t written = storage_.writes();
  EXPECT_THAT(storage_.syncs(), ElementsAre(1u, written));
  storage_.Allow(1);
  ASSERT_TRUE(Eventually([&] { return log_.entries().size() == 7; }, "everything completes"));
  // Batches synced together are still finished one by one, in order.
  EXPECT_THAT(log_.entries(), ElementsAre("durable 2", "write 2", "durable 3", "write 3",
                                          "durable 4", "claim", "write 4"));
  EXPECT_THAT(watcher_.WaitFor(3), ElementsAre("ADDED w2 2", "ADDED w3 3", "ADDED w4 4"));
  std::vector<CommitBatch> batches = storage_.batches();
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2].revision, 4);
  EXPECT_THAT(batches[2].epochs, ElementsAre(std::pair<const std::string, int64_t>("a", 7)));
}

TEST_F(PipelinedCommitterTest, StopWritesSyncsAndCompletesEverything) {
  Write(2);
  ASSERT_TRUE(Eventually([&] { return storage_.syncs().size() == 1; }, "batch 2 is syncing"));
  Write(3);
  Write(4);
  storage_.Allow(1000);
  committer_.Stop();
  // However 3 and 4 were batched, each write completes after its batch is durable, in order.
  std::vector<std::string> entries = log_.entries();
  ASSERT_GE(entries.size(), 5u);
  EXPECT_THAT(std::vector<std::string>(entries.begin(), entries.begin() + 2),
              ElementsAre("durable 2", "write 2"));
  EXPECT_EQ(entries.back(), "write 4");
  EXPECT_EQ(entries[entries.size() - 2] == "durable 4" || entries[entries.size() - 2] == "write 3",
            true);
  EXPECT_EQ(committer_.durable_revision(), 4);
  EXPECT_THAT(watcher_.WaitFor(3), ElementsAre("ADDED w2 2", "ADDED w3 3", "ADDED w4 4"));
}

// Dies (the test's death) when the sync fails; answers nothing that is not durable.
void WriteWithFailingSync() {
  SyncGatedStorage storage;
  storage.Fail();
  storage.Allow(1000);
  StoreMetrics metrics(std::make_shared<prometheus::Registry>());
  WatchCache watch_cache(WatchCache::Options(), &metrics);
  Log log;
  GroupCommitter committer(&storage, &watch_cache, &metrics, &log, 1, 1);
  committer.Start();
  committer.AddEvent(MakeEvent(2));
  committer.CompleteWhenDurable(2, [] {
    // An answer to a write that is not durable: not a death.
    std::fprintf(stderr, "answered\n");
    std::_Exit(0);
  });
  absl::SleepFor(absl::Seconds(30));
  std::_Exit(0);
}

TEST(GroupCommitterDeathTest, AFailedSyncStopsTheProcessWithoutAnswering) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  (void)InitLogging("group_committer_test", "warn");  // to stderr, where the death is read
  EXPECT_DEATH(WriteWithFailingSync(),
               "cannot make writes durable, stopping: .*injected: fsync failed");
}

TEST(GroupCommitterWithoutStorageTest, CompletesInOrder) {
  StoreMetrics metrics(std::make_shared<prometheus::Registry>());
  WatchCache watch_cache(WatchCache::Options(), &metrics);
  Log log;
  GroupCommitter committer(nullptr, &watch_cache, &metrics, &log, 5, 1);
  committer.Start();
  committer.AddEvent(MakeEvent(6));
  committer.CompleteWhenDurable(6, log.Completion("write 6"));
  ASSERT_TRUE(Eventually([&] { return log.entries().size() == 2; }, "the write completes"));
  EXPECT_THAT(log.entries(), ElementsAre("durable 6", "write 6"));
}

}  // namespace
}  // namespace shardcache
