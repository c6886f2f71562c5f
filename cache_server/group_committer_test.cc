#include "cache_server/group_committer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cache_server/testing/in_process_server.h"
#include "common/testing/wait.h"
#include "prometheus/registry.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::GatedStorage;
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
