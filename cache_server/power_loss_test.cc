// Power loss, a full disk and failing syncs, with the store on a file system that knows which
// bytes are durable (testing/fault_injection_fs.h).
//
// Power loss: writers write concurrently while a watcher follows; at a random instant the test
// takes what a power loss would leave of the data directory, lets the writers go on for a moment
// and stops the store; the next round opens the store from that image. Each round checks:
// - the store opens (RocksDbStorage::Load checks its own invariants: the format, contiguous
//   history, objects not newer than the revision) and is a prefix of what was written: every
//   object is as the last write at or below the recovered revision left it;
// - with --sync=true, every write acknowledged before the power loss is there (the recovered
//   revision is at least the highest one acknowledged), so the revision never goes back;
// - the history agrees with the objects, and a watch resumes from the last revision the old
//   store's watcher had seen, with every event after it, once and in order.
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <rocksdb/env.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cache_server/object_store.h"
#include "cache_server/rocksdb_storage.h"
#include "cache_server/testing/fake_watcher.h"
#include "cache_server/testing/fault_injection_fs.h"
#include "common/error_info.h"
#include "common/logging.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"

namespace shardcache {
namespace {

using ::shardcache::testing::FaultInjectionFs;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::RecordingWatcher;
using ::shardcache::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kWidgets[] = "example.com/widgets";
constexpr int kWriters = 4;
constexpr int kKeysPerWriter = 8;

v1::GroupVersionResource Gvr(const std::string& group, const std::string& resource) {
  v1::GroupVersionResource g;
  g.set_group(group);
  g.set_version("v1");
  g.set_resource(resource);
  return g;
}

v1::Object Obj(const std::string& json) {
  v1::Object o;
  auto s = google::protobuf::util::JsonStringToMessage(json, &o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return o;
}

v1::Object Widget(const std::string& name, int64_t value) {
  return Obj(absl::StrCat(R"({"metadata":{"cluster":"root","namespace":"default","name":")", name,
                          R"("},"spec":{"value":)", value, "}}"));
}

int64_t Rv(const v1::Object& o) {
  int64_t rv = 0;
  EXPECT_TRUE(absl::SimpleAtoi(o.metadata().resource_version(), &rv));
  return rv;
}

int64_t ValueOf(const v1::Object& o) {
  return static_cast<int64_t>(o.spec().fields().at("value").number_value());
}

// One write's outcome: the key's value after it (nullopt: deleted) at revision `rv`.
struct Written {
  int64_t rv;
  std::optional<int64_t> value;
};

// A store opened from a data directory through the fault-injecting file system. Members go in
// reverse order: the store before the watch cache, the storage last.
struct OpenStore {
  std::unique_ptr<RocksDbStorage> storage;
  StoreMetrics metrics{std::make_shared<prometheus::Registry>()};
  WatchCache cache{WatchCache::Options{absl::Seconds(60)}, &metrics};
  std::unique_ptr<ObjectStore> store;
  std::vector<EventPtr> loaded_history;
};

class PowerLossTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { (void)InitLogging("power_loss_test", "warn"); }

  // Opens `dir` (created when absent); a failure is the test's.
  std::unique_ptr<OpenStore> Open(const std::string& dir, bool sync, Clock* clock,
                                  int64_t min_free_bytes = 0) {
    auto open = std::make_unique<OpenStore>();
    RocksDbStorage::Options so;
    so.data_dir = dir;
    so.sync = sync;
    so.min_free_bytes = min_free_bytes;
    // Small write buffers: flushes, new files and renames happen within a round.
    so.write_buffer_bytes = 64 << 10;
    so.env = env_.get();
    so.clock = clock;
    const int64_t files_before = fs_->files_created();
    auto storage = RocksDbStorage::Open(so);
    EXPECT_THAT(storage, IsOk()) << dir;
    if (!storage.ok()) return nullptr;
    open->storage = *std::move(storage);
    // Opening writes a new log and manifest: through the fault-injecting file system, or every
    // check below would pass on a store it never sees.
    EXPECT_GT(fs_->files_created(), files_before) << "the store does not write through it";
    absl::StatusOr<PersistedState> state = open->storage->Load();
    EXPECT_THAT(state, IsOk()) << dir;
    if (!state.ok()) return nullptr;
    open->loaded_history = state->history;
    ObjectStore::Options o;
    o.role = Role::kShard;
    o.history_events = 5000;
    o.clock = clock;
    o.storage = open->storage.get();
    open->store = std::make_unique<ObjectStore>(o, &open->cache, &open->metrics, *std::move(state));
    return open;
  }

  void Define(ObjectStore* store) {
    v1::CreateRequest req;
    *req.mutable_resource() = Gvr("core.shardcache.io", "resourcedefinitions");
    *req.mutable_object() =
        Obj(R"({"metadata":{"name":"widgets.example.com"},"spec":{"group":"example.com",)"
            R"("names":{"plural":"widgets"},"scope":"Namespaced","versions":[{"name":"v1"}]}})");
    ASSERT_THAT(store->Create(req), IsOk());
  }

  // Every widget, by name.
  static std::map<std::string, v1::Object> Widgets(ObjectStore* store) {
    v1::ListRequest req;
    *req.mutable_resource() = Gvr("example.com", "widgets");
    auto listed = store->List(req);
    EXPECT_THAT(listed, IsOk());
    std::map<std::string, v1::Object> out;
    if (listed.ok()) {
      for (const v1::Object& o : listed->items()) out[o.metadata().name()] = o;
    }
    return out;
  }

  void PowerLossRounds(bool sync, int rounds);

  std::shared_ptr<FaultInjectionFs> fs_ = std::make_shared<FaultInjectionFs>();
  std::unique_ptr<rocksdb::Env> env_ = rocksdb::NewCompositeEnv(fs_);
};

void PowerLossTest::PowerLossRounds(bool sync, int rounds) {
  const std::string root = shardcache::testing::MakeTempDir(sync ? "power-sync" : "power-nosync");
  const unsigned seed = static_cast<unsigned>(absl::ToUnixNanos(absl::Now()));
  std::mt19937 random(seed);
  std::cerr << "seed " << seed << " (rounds differ only in when the power goes)\n";
  // Every write of every round per key, in revision order.
  std::map<std::string, std::vector<Written>> history;
  int64_t resume_from = 0;
  int64_t lost_writes = 0;
  int64_t total_writes = 0;
  // With sync: the highest revision acknowledged before the last power loss.
  int64_t must_have = 0;
  std::string dir = root + "/round-0";
  {
    // The resource is defined durably (also without sync: losing it would end the test).
    std::unique_ptr<OpenStore> first = Open(dir, /*sync=*/true, RealClock::Get());
    ASSERT_NE(first, nullptr);
    ASSERT_NO_FATAL_FAILURE(Define(first->store.get()));
    resume_from = first->store->revision();
  }
  // Round `rounds` only checks what the last power loss left.
  for (int round = 0; round <= rounds && !HasFailure(); ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round, " of ", dir));
    std::unique_ptr<OpenStore> open = Open(dir, sync, RealClock::Get());
    ASSERT_NE(open, nullptr);
    ObjectStore* store = open->store.get();
    const int64_t recovered = store->revision();
    EXPECT_GE(recovered, must_have) << "a write acknowledged before the power went is lost";

    // A prefix: each key as its last write at or below the recovered revision left it.
    std::map<std::string, v1::Object> widgets = Widgets(store);
    for (const auto& [name, writes] : history) {
      std::optional<int64_t> want;
      for (const Written& w : writes) {
        if (w.rv <= recovered) want = w.value;
        if (w.rv > recovered) ++lost_writes;
      }
      auto it = widgets.find(name);
      std::optional<int64_t> got;
      if (it != widgets.end()) got = ValueOf(it->second);
      EXPECT_EQ(got, want) << name << " at recovered revision " << recovered;
    }
    // The history agrees with the objects: each key's last event in the window is its state.
    std::map<std::string, const Event*> last_event;
    for (const EventPtr& e : open->loaded_history) {
      if (e->group_resource == kWidgets) last_event[e->object->metadata().name()] = e.get();
    }
    for (const auto& [name, e] : last_event) {
      auto it = widgets.find(name);
      if (e->type == v1::WatchEvent::DELETED) {
        EXPECT_TRUE(it == widgets.end()) << name << " is deleted at revision " << e->revision;
      } else {
        ASSERT_TRUE(it != widgets.end()) << name << " was written at revision " << e->revision;
        EXPECT_EQ(Rv(it->second), e->revision) << name;
      }
    }
    // What the recovered store does not hold was never written, as far as later rounds go.
    for (auto& [name, writes] : history) {
      while (!writes.empty() && writes.back().rv > recovered) writes.pop_back();
    }
    if (round == rounds) break;

    // A watch resumes from what the old store's watcher had seen (with --sync=false that may be
    // past what survived: then from the recovered revision).
    resume_from = std::min(resume_from, store->revision());
    RecordingWatcher watcher;
    v1::WatchRequest wreq;
    *wreq.mutable_resource() = Gvr("example.com", "widgets");
    wreq.set_resource_version(absl::StrCat(resume_from));
    ASSERT_THAT(store->StartWatch(wreq, &watcher), IsOk());
    const size_t replayed = static_cast<size_t>(store->revision() - resume_from);
    std::vector<std::string> seen = watcher.WaitFor(replayed);
    ASSERT_EQ(seen.size(), replayed)
        << "a watch from " << resume_from << " at revision " << store->revision();

    // Writers, each on its own keys, from the state that survived.
    absl::Mutex mu;
    bool power_gone = false;
    int64_t acked_before_power = 0;
    std::map<std::string, std::vector<Written>> round_writes;  // guarded by mu
    std::atomic<bool> stop{false};
    std::vector<std::thread> writers;
    for (int t = 0; t < kWriters; ++t) {
      writers.emplace_back([&, t] {
        std::mt19937 r(seed + round * kWriters + t);
        std::map<std::string, bool> present;
        for (int k = 0; k < kKeysPerWriter; ++k) {
          std::string name = absl::StrCat("w", t, "-", k);
          present[name] = widgets.count(name) > 0;
        }
        int64_t n = 0;
        while (!stop.load()) {
          std::string name = absl::StrCat("w", t, "-", r() % kKeysPerWriter);
          int64_t value = (static_cast<int64_t>(round) * 1'000'000 + n++) * kWriters + t;
          absl::StatusOr<ObjectRef> written = absl::UnknownError("none");
          std::optional<int64_t> after = value;
          if (!present[name]) {
            v1::CreateRequest req;
            *req.mutable_resource() = Gvr("example.com", "widgets");
            *req.mutable_object() = Widget(name, value);
            written = store->Create(req);
          } else if (r() % 5 == 0) {
            v1::DeleteRequest req;
            *req.mutable_resource() = Gvr("example.com", "widgets");
            req.set_cluster("root");
            req.set_namespace_("default");
            req.set_name(name);
            auto deleted = store->Delete(req);
            if (deleted.ok()) {
              written = deleted->object;
            } else {
              written = deleted.status();
            }
            after = std::nullopt;
          } else {
            v1::UpdateRequest req;
            *req.mutable_resource() = Gvr("example.com", "widgets");
            *req.mutable_object() = Widget(name, value);
            written = store->Update(req);
          }
          ASSERT_THAT(written, IsOk()) << name;
          present[name] = after.has_value();
          absl::MutexLock l(&mu);
          int64_t rv = Rv(**written);
          round_writes[name].push_back({rv, after});
          if (!power_gone) acked_before_power = std::max(acked_before_power, rv);
        }
      });
    }

    // The power goes at a random instant; the writers go on for a moment, then the store stops.
    absl::SleepFor(absl::Milliseconds(5 + random() % 60));
    const std::string next = absl::StrCat(root, "/round-", round + 1);
    int64_t watched = 0;
    {
      absl::MutexLock l(&mu);
      std::vector<std::string> events = watcher.WaitFor(0);
      ASSERT_THAT(fs_->PowerLossImage(dir, next), IsOk());
      power_gone = true;
      // The last revision the watcher saw (events are "TYPE name rv").
      if (!events.empty()) {
        std::string last = events.back();
        ASSERT_TRUE(absl::SimpleAtoi(last.substr(last.rfind(' ') + 1), &watched)) << last;
      }
    }
    absl::SleepFor(absl::Milliseconds(random() % 10));
    stop = true;
    for (std::thread& w : writers) w.join();
    ASSERT_FALSE(HasFailure());

    // What the watcher saw in this store: every revision from where it resumed, once, in order.
    std::vector<std::string> events = watcher.WaitFor(0);
    int64_t expected = resume_from + 1;
    for (const std::string& e : events) {
      int64_t rv = 0;
      ASSERT_TRUE(absl::SimpleAtoi(e.substr(e.rfind(' ') + 1), &rv)) << e;
      ASSERT_EQ(rv, expected) << "the watch skipped or repeated a revision: " << e;
      ++expected;
    }
    open->cache.Unregister(&watcher);
    open.reset();

    for (auto& [name, writes] : round_writes) {
      total_writes += static_cast<int64_t>(writes.size());
      history[name].insert(history[name].end(), writes.begin(), writes.end());
    }
    if (sync) must_have = acked_before_power;
    resume_from = watched > 0 ? watched : resume_from;
    dir = next;
  }
  std::cerr << rounds << " rounds, " << total_writes << " writes, " << lost_writes
            << " of them lost to the power losses (with sync, none acknowledged before)\n";
}

// --sync=true: nothing acknowledged is lost, the store is consistent, watches resume.
TEST_F(PowerLossTest, SyncedStore_KeepsEveryAcknowledgedWrite_Over50PowerLosses) {
  PowerLossRounds(/*sync=*/true, 50);
}

// --sync=false: the store reopens consistent, a prefix of what was written (the unsynced tail
// may be lost), and watches resume.
TEST_F(PowerLossTest, UnsyncedStore_ReopensConsistent_LosingAtMostTheUnsyncedTail) {
  PowerLossRounds(/*sync=*/false, 20);
}

// A full disk: creates and updates are refused with NO_SPACE and change nothing; reads,
// watches, deletes and claims go on; writes resume once space is back.
TEST_F(PowerLossTest, FullDisk_RefusesWritesOnly_UntilSpaceReturns) {
  FakeClock clock;
  std::unique_ptr<OpenStore> open =
      Open(shardcache::testing::MakeTempDir("full") + "/data", true, &clock, 1 << 20);
  ASSERT_NE(open, nullptr);
  ObjectStore* store = open->store.get();
  ASSERT_NO_FATAL_FAILURE(Define(store));
  v1::CreateRequest create;
  *create.mutable_resource() = Gvr("example.com", "widgets");
  *create.mutable_object() = Widget("w1", 1);
  ASSERT_THAT(store->Create(create), IsOk());
  RecordingWatcher watcher;
  v1::WatchRequest wreq;
  *wreq.mutable_resource() = Gvr("example.com", "widgets");
  wreq.set_resource_version(absl::StrCat(store->revision()));
  ASSERT_THAT(store->StartWatch(wreq, &watcher), IsOk());

  fs_->SetFreeSpace(4096);
  clock.Advance(absl::Seconds(2));
  const int64_t before = store->revision();
  *create.mutable_object() = Widget("w2", 2);
  absl::StatusOr<ObjectRef> refused = store->Create(create);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("has 4096 bytes free, less than the 1048576")));
  EXPECT_TRUE(HasReason(refused.status(), kReasonNoSpace));
  EXPECT_EQ(open->metrics.writes_refused_no_space.Value(), 1);
  v1::UpdateRequest update;
  *update.mutable_resource() = Gvr("example.com", "widgets");
  *update.mutable_object() = Widget("w1", 3);
  EXPECT_THAT(store->Update(update), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(store->Upsert(update), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(store->revision(), before) << "a refused write changed the store";
  std::map<std::string, v1::Object> widgets = Widgets(store);
  ASSERT_EQ(widgets.size(), 1u);
  EXPECT_EQ(ValueOf(widgets.at("w1")), 1);

  // Deletes and claims go on, and the watch sees the delete.
  v1::ClaimEpochRequest claim;
  claim.mutable_fence()->set_shard("a");
  claim.mutable_fence()->set_epoch(2);
  EXPECT_THAT(store->ClaimEpoch(claim), IsOk());
  v1::DeleteRequest del;
  *del.mutable_resource() = Gvr("example.com", "widgets");
  del.set_cluster("root");
  del.set_namespace_("default");
  del.set_name("w1");
  ASSERT_THAT(store->Delete(del), IsOk());
  EXPECT_THAT(watcher.WaitFor(1), ::testing::ElementsAre(absl::StrCat("DELETED w1 ", before + 1)));

  // Space is back: within the next check, writes are accepted.
  fs_->SetFreeSpace(std::nullopt);
  clock.Advance(absl::Seconds(2));
  EXPECT_THAT(store->Create(create), IsOk());
  EXPECT_EQ(open->metrics.writes_refused_no_space.Value(), 0);
  open->cache.Unregister(&watcher);
}

// What a store does when the disk fails under a commit: it never acknowledges the write, and
// stops saying why (the process recovers what was synced when it starts again).
void WriteUntilDeath(FaultInjectionFs* fs, rocksdb::Env* env, bool fail_syncs) {
  RocksDbStorage::Options so;
  so.data_dir = shardcache::testing::MakeTempDir("dies") + "/data";
  so.env = env;
  so.min_free_bytes = 0;
  auto storage = RocksDbStorage::Open(so);
  if (!storage.ok()) std::_Exit(3);
  auto state = (*storage)->Load();
  if (!state.ok()) std::_Exit(3);
  StoreMetrics metrics(std::make_shared<prometheus::Registry>());
  WatchCache cache(WatchCache::Options{absl::Seconds(60)}, &metrics);
  ObjectStore::Options o;
  o.role = Role::kShard;
  o.storage = storage->get();
  ObjectStore store(o, &cache, &metrics, *std::move(state));
  v1::ClaimEpochRequest claim;
  claim.mutable_fence()->set_shard("a");
  claim.mutable_fence()->set_epoch(1);
  if (!store.ClaimEpoch(claim).ok()) std::_Exit(3);
  if (fail_syncs) {
    fs->FailSyncs(true);
  } else {
    fs->FailWrites(true);
  }
  claim.mutable_fence()->set_epoch(2);
  store.ClaimEpochAsync(claim, [](absl::StatusOr<int64_t> r) {
    std::fprintf(stderr, "answered: %s\n", r.status().ToString().c_str());
    // An acknowledgement (or any answer) of a write that is not durable: not a death.
    std::_Exit(0);
  });
  absl::SleepFor(absl::Seconds(30));
  std::_Exit(0);
}

TEST_F(PowerLossTest, FailedFsync_StopsWithoutAcknowledging) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(WriteUntilDeath(fs_.get(), env_.get(), /*fail_syncs=*/true),
               "cannot make writes durable, stopping: .*injected: fsync failed");
}

TEST_F(PowerLossTest, FailedWrite_StopsWithoutAcknowledging) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(WriteUntilDeath(fs_.get(), env_.get(), /*fail_syncs=*/false),
               "cannot make writes durable, stopping: .*injected: no space left on device");
}

}  // namespace
}  // namespace shardcache
