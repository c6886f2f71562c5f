#include "common/client/thread_safe_store.h"

#include <gtest/gtest.h>

namespace shardcache {
namespace {

ObjectRef Obj(const std::string& cluster, const std::string& name) {
  auto o = std::make_shared<v1::Object>();
  o->mutable_metadata()->set_cluster(cluster);
  o->mutable_metadata()->set_name(name);
  return o;
}

TEST(ThreadSafeStoreTest, UpsertGetDelete) {
  ThreadSafeStore s;
  s.Upsert(Obj("c1", "a"));
  ObjectRef a = s.Get(ObjectKey(Obj("c1", "a")->metadata()));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->metadata().name(), "a");
  s.Delete(ObjectKey(a->metadata()));
  EXPECT_EQ(s.Size(), 0u);
}

TEST(ThreadSafeStoreTest, Index_FollowsUpdatesAndReplace) {
  ThreadSafeStore s;
  ASSERT_TRUE(s.AddIndex("cluster", [](const v1::Object& o) {
                 return std::vector<std::string>{o.metadata().cluster()};
               }).ok());
  s.Upsert(Obj("c1", "a"));
  s.Upsert(Obj("c1", "b"));
  s.Upsert(Obj("c2", "c"));
  EXPECT_EQ(s.ByIndex("cluster", "c1").size(), 2u);
  s.Delete(ObjectKey(Obj("c1", "a")->metadata()));
  EXPECT_EQ(s.ByIndex("cluster", "c1").size(), 1u);
  s.Replace({Obj("c2", "x")});
  EXPECT_TRUE(s.ByIndex("cluster", "c1").empty());
  EXPECT_EQ(s.ByIndex("cluster", "c2").size(), 1u);
  EXPECT_EQ(s.AddIndex("late", nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace shardcache
