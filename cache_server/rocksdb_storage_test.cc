#include "cache_server/rocksdb_storage.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"

namespace shardcache {
namespace {

using ::shardcache::testing::IsOk;
using ::shardcache::testing::MakeTempDir;
using ::shardcache::testing::StatusIs;
using ::testing::HasSubstr;

EventPtr MakeEvent(int64_t rev, v1::WatchEvent::Type type, const std::string& name,
                   ObjectRef prev = nullptr) {
  auto o = std::make_shared<v1::Object>();
  o->mutable_metadata()->set_name(name);
  o->mutable_metadata()->set_resource_version(std::to_string(rev));
  auto e = std::make_shared<Event>();
  e->revision = rev;
  e->type = type;
  e->group_resource = "example.com/widgets";
  e->object = o;
  e->prev = std::move(prev);
  e->time = absl::FromUnixSeconds(1000 + rev);
  return e;
}

TEST(RocksDbStorageTest, NewDirectory_LoadsEmptyStoreAtRevisionOne) {
  std::string dir = MakeTempDir("rocks") + "/data";
  auto storage = RocksDbStorage::Open({dir, true});
  ASSERT_THAT(storage, IsOk());
  auto state = (*storage)->Load();
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->revision, 1);
  EXPECT_EQ(state->compacted_revision, 1);
  EXPECT_TRUE(state->objects.empty());
  EXPECT_TRUE(state->history.empty());
}

TEST(RocksDbStorageTest, Commit_SurvivesReopen) {
  std::string dir = MakeTempDir("rocks");
  {
    auto storage = RocksDbStorage::Open({dir, true});
    ASSERT_THAT(storage, IsOk());
    ASSERT_THAT((*storage)->Load(), IsOk());
    EventPtr a = MakeEvent(2, v1::WatchEvent::ADDED, "a");
    CommitBatch b1;
    b1.events = {a, MakeEvent(3, v1::WatchEvent::ADDED, "b")};
    b1.revision = 3;
    b1.compacted_revision = 1;
    b1.epochs["s1"] = 4;
    ASSERT_THAT((*storage)->Commit(b1), IsOk());
    CommitBatch b2;
    b2.events = {MakeEvent(4, v1::WatchEvent::DELETED, "a", a->object)};
    b2.revision = 4;
    b2.compacted_revision = 2;  // event 2 leaves the window
    ASSERT_THAT((*storage)->Commit(b2), IsOk());
  }
  auto storage = RocksDbStorage::Open({dir, true});
  ASSERT_THAT(storage, IsOk());
  auto state = (*storage)->Load();
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->revision, 4);
  EXPECT_EQ(state->compacted_revision, 2);
  ASSERT_EQ(state->objects.size(), 1u);
  EXPECT_EQ(state->objects[0].second->metadata().name(), "b");
  ASSERT_EQ(state->history.size(), 2u);
  EXPECT_EQ(state->history[0]->revision, 3);
  EXPECT_EQ(state->history[1]->type, v1::WatchEvent::DELETED);
  ASSERT_NE(state->history[1]->prev, nullptr);
  EXPECT_EQ(state->history[1]->prev->metadata().resource_version(), "2");
  EXPECT_EQ(state->history[1]->time, absl::FromUnixSeconds(1004));
  EXPECT_EQ(state->epochs.at("s1"), 4);
}

// Write and Sync, the committer's two halves of Commit; an event record carries both objects
// whole, here larger than 127 bytes (a length of two bytes on the wire).
TEST(RocksDbStorageTest, WriteThenSync_SurvivesReopen_EveryFieldOfTheEvent) {
  std::string dir = MakeTempDir("rocks");
  EventPtr a = MakeEvent(2, v1::WatchEvent::ADDED, "a");
  auto changed = std::make_shared<v1::Object>(*a->object);
  changed->mutable_metadata()->set_resource_version("3");
  (*changed->mutable_metadata()->mutable_labels())["note"] = std::string(300, 'x');
  auto modified = std::make_shared<Event>(*MakeEvent(3, v1::WatchEvent::MODIFIED, "a", a->object));
  modified->object = changed;
  EventPtr m = modified;
  {
    auto storage = RocksDbStorage::Open({dir, true});
    ASSERT_THAT(storage, IsOk());
    ASSERT_THAT((*storage)->Load(), IsOk());
    CommitBatch b1;
    b1.events = {a};
    b1.revision = 2;
    ASSERT_THAT((*storage)->Write(b1), IsOk());
    CommitBatch b2;
    b2.events = {m};
    b2.revision = 3;
    ASSERT_THAT((*storage)->Write(b2), IsOk());
    ASSERT_THAT((*storage)->Sync(), IsOk());
  }
  auto storage = RocksDbStorage::Open({dir, true});
  ASSERT_THAT(storage, IsOk());
  auto state = (*storage)->Load();
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->revision, 3);
  ASSERT_EQ(state->objects.size(), 1u);
  EXPECT_EQ(state->objects[0].second->SerializeAsString(), changed->SerializeAsString());
  ASSERT_EQ(state->history.size(), 2u);
  EXPECT_EQ(state->history[0]->prev, nullptr);
  const Event& got = *state->history[1];
  EXPECT_EQ(got.revision, 3);
  EXPECT_EQ(got.type, v1::WatchEvent::MODIFIED);
  EXPECT_EQ(got.group_resource, "example.com/widgets");
  EXPECT_EQ(got.time, absl::FromUnixSeconds(1003));
  EXPECT_EQ(got.object->SerializeAsString(), changed->SerializeAsString());
  ASSERT_NE(got.prev, nullptr);
  EXPECT_EQ(got.prev->SerializeAsString(), a->object->SerializeAsString());
}

// The identity is made with the directory and read back unchanged; another directory has another.
// A directory from before identities existed gets one at its first Load and keeps it.
TEST(RocksDbStorageTest, StoreId_MadeWithTheDirectory_KeptAcrossReopens) {
  std::string dir = MakeTempDir("rocks") + "/data";
  std::string id;
  {
    auto storage = RocksDbStorage::Open({dir, true});
    ASSERT_THAT(storage, IsOk());
    auto state = (*storage)->Load();
    ASSERT_THAT(state, IsOk());
    id = state->store_id;
    EXPECT_THAT(id, ::testing::MatchesRegex(
                        "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"));
  }
  {
    auto storage = RocksDbStorage::Open({dir, true});
    ASSERT_THAT(storage, IsOk());
    auto state = (*storage)->Load();
    ASSERT_THAT(state, IsOk());
    EXPECT_EQ(state->store_id, id);
  }
  std::string other = MakeTempDir("rocks") + "/data";
  auto storage = RocksDbStorage::Open({other, true});
  ASSERT_THAT(storage, IsOk());
  auto state = (*storage)->Load();
  ASSERT_THAT(state, IsOk());
  EXPECT_NE(state->store_id, id);
}

TEST(RocksDbStorageTest, StoreId_GivenToADirectoryWithoutOne) {
  std::string dir = MakeTempDir("rocks") + "/data";
  {
    auto storage = RocksDbStorage::Open({dir, true});
    ASSERT_THAT(storage, IsOk());
  }
  {  // As written before stores had an identity.
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Delete(rocksdb::WriteOptions(), "m/store-id").ok());
    std::string ignored;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "m/store-id", &ignored).IsNotFound());
  }
  std::string id;
  {
    auto storage = RocksDbStorage::Open({dir, true});
    ASSERT_THAT(storage, IsOk());
    auto state = (*storage)->Load();
    ASSERT_THAT(state, IsOk());
    id = state->store_id;
    EXPECT_EQ(id.size(), 36u);
  }
  auto storage = RocksDbStorage::Open({dir, true});
  ASSERT_THAT(storage, IsOk());
  auto state = (*storage)->Load();
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(state->store_id, id);
}

TEST(RocksDbStorageTest, SecondOpen_IsRefusedAsInUse) {
  std::string dir = MakeTempDir("rocks");
  auto first = RocksDbStorage::Open({dir, true});
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(RocksDbStorage::Open({dir, true}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("in use")));
}

TEST(RocksDbStorageTest, ForeignDirectory_IsRefused) {
  std::string dir = MakeTempDir("rocks");
  std::ofstream(dir + "/notes.txt") << "not a store";
  EXPECT_THAT(RocksDbStorage::Open({dir, true}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("cannot be opened")));
}

TEST(RocksDbStorageTest, MissingCurrentFile_IsRefused) {
  std::string dir = MakeTempDir("rocks");
  { ASSERT_THAT(RocksDbStorage::Open({dir, true}), IsOk()); }
  std::filesystem::remove(dir + "/CURRENT");
  EXPECT_THAT(RocksDbStorage::Open({dir, true}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(dir)));
}

}  // namespace
}  // namespace shardcache
