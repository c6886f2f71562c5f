#include "cache_server/etcd_layout.h"

#include <gtest/gtest.h>

namespace shardcache {
namespace {

v1::ObjectMeta Meta(const std::string& shard, const std::string& cluster, const std::string& ns,
                    const std::string& name) {
  v1::ObjectMeta m;
  m.set_shard(shard);
  m.set_cluster(cluster);
  m.set_namespace_(ns);
  m.set_name(name);
  return m;
}

ObjectRef Object(const v1::ObjectMeta& meta, const std::string& rv = "") {
  auto o = std::make_shared<v1::Object>();
  *o->mutable_metadata() = meta;
  o->mutable_metadata()->set_resource_version(rv);
  return o;
}

TEST(EtcdLayoutTest, PrefixesAreChecked) {
  EXPECT_TRUE(ValidateEtcdPrefix("/shardcache").ok());
  EXPECT_TRUE(ValidateEtcdPrefix("/a/b").ok());
  for (const char* bad : {"", "shardcache", "/", "/a/", "//a", "/a//b"}) {
    EXPECT_EQ(ValidateEtcdPrefix(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(EtcdLayoutTest, KeysNameWhatTheyHold) {
  v1::ObjectMeta m = Meta("", "root", "default", "w1");
  std::string key = EtcdObjectKey("/p", "example.com/widgets", m);
  EXPECT_EQ(key, "/p/o/example.com/widgets//root/default/w1");
  EtcdKey parsed = ParseEtcdKey("/p", key);
  EXPECT_EQ(parsed.kind, EtcdKey::kObject);
  EXPECT_EQ(parsed.group_resource, "example.com/widgets");
  EXPECT_EQ(parsed.object_key, ObjectKey(m));
  // The core group is empty, and so may be every field but the name.
  v1::ObjectMeta core = Meta("s1", "", "", "n");
  parsed = ParseEtcdKey("/p", EtcdObjectKey("/p", "/namespaces", core));
  EXPECT_EQ(parsed.kind, EtcdKey::kObject);
  EXPECT_EQ(parsed.group_resource, "/namespaces");
  EXPECT_EQ(parsed.object_key, ObjectKey(core));

  parsed = ParseEtcdKey("/p", EtcdEpochKey("/p", "shard-a"));
  EXPECT_EQ(parsed.kind, EtcdKey::kEpoch);
  EXPECT_EQ(parsed.shard, "shard-a");
  EXPECT_EQ(ParseEtcdKey("/p", EtcdFormatKey("/p")).kind, EtcdKey::kOther);
  EXPECT_EQ(ParseEtcdKey("/p", EtcdStoreIdKey("/p")).kind, EtcdKey::kOther);
  EXPECT_EQ(ParseEtcdKey("/p", "/q/o/a/b/c/d/e/f").kind, EtcdKey::kOther);
  EXPECT_EQ(ParseEtcdKey("/p", "/p/o/too/few").kind, EtcdKey::kOther);
  EXPECT_EQ(EtcdResourcePrefix("/p", "example.com/widgets"), "/p/o/example.com/widgets/");
}

TEST(EtcdLayoutTest, EpochsSortAsNumbers) {
  EXPECT_EQ(EtcdEpochValue(7), "0000000000000000007");
  EXPECT_LT(EtcdEpochValue(9), EtcdEpochValue(10));
  EXPECT_EQ(*ParseEtcdEpoch(EtcdEpochValue(12345)), 12345);
  EXPECT_FALSE(ParseEtcdEpoch("x").ok());
}

TEST(EtcdLayoutTest, ObjectsAreStoredWithoutTheirResourceVersion) {
  EtcdWrite w;
  w.has_change = true;
  w.group_resource = "example.com/widgets";
  w.object = Object(Meta("", "root", "default", "w1"), "41");
  w.expected_mod_revision = 0;
  bool changes = false;
  etcdserverpb::TxnRequest txn = MakeEtcdTxn("/p", w, &changes);
  EXPECT_TRUE(changes);
  ASSERT_EQ(txn.compare_size(), 1);
  EXPECT_EQ(txn.compare(0).target(), etcdserverpb::Compare::CREATE);
  EXPECT_EQ(txn.compare(0).create_revision(), 0);
  ASSERT_EQ(txn.success_size(), 1);
  const etcdserverpb::PutRequest& put = txn.success(0).request_put();
  EXPECT_EQ(put.key(), "/p/o/example.com/widgets//root/default/w1");
  absl::StatusOr<ObjectRef> back = ParseEtcdObject(put.value(), 57);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)->metadata().resource_version(), "57");
  EXPECT_EQ((*back)->metadata().name(), "w1");
  EXPECT_EQ(txn.failure_size(), 0);
}

TEST(EtcdLayoutTest, UpdatesAndDeletesCompareTheModRevision) {
  EtcdWrite w;
  w.has_change = true;
  w.group_resource = "example.com/widgets";
  w.object = Object(Meta("", "root", "default", "w1"));
  w.expected_mod_revision = 41;
  w.is_delete = true;
  bool changes = false;
  etcdserverpb::TxnRequest txn = MakeEtcdTxn("/p", w, &changes);
  EXPECT_TRUE(changes);
  ASSERT_EQ(txn.compare_size(), 1);
  EXPECT_EQ(txn.compare(0).target(), etcdserverpb::Compare::MOD);
  EXPECT_EQ(txn.compare(0).mod_revision(), 41);
  ASSERT_EQ(txn.success_size(), 1);
  EXPECT_EQ(txn.success(0).request_delete_range().key(),
            "/p/o/example.com/widgets//root/default/w1");
  EXPECT_TRUE(txn.success(0).request_delete_range().range_end().empty());
}

TEST(EtcdLayoutTest, AWriteOfADefinedResourceComparesItsDefinition) {
  EtcdWrite w;
  w.has_change = true;
  w.group_resource = "example.com/widgets";
  w.object = Object(Meta("", "", "default", "w1"));
  w.definition_key = "/p/o/shardcache.io/resourcedefinitions////widgets.example.com";
  w.definition_mod_revision = 7;
  etcdserverpb::TxnRequest txn = MakeEtcdTxn("/p", w);
  ASSERT_EQ(txn.compare_size(), 2);
  EXPECT_EQ(txn.compare(1).key(), w.definition_key);
  EXPECT_EQ(txn.compare(1).target(), etcdserverpb::Compare::MOD);
  EXPECT_EQ(txn.compare(1).result(), etcdserverpb::Compare::EQUAL);
  EXPECT_EQ(txn.compare(1).mod_revision(), 7);
  // A write that changes nothing compares the object alone.
  w.has_change = false;
  w.check_only = true;
  EXPECT_EQ(MakeEtcdTxn("/p", w).compare_size(), 1);
}

TEST(EtcdLayoutTest, ADefinitionsDeletionDeletesItsObjectsFirst) {
  EtcdWrite w;
  w.has_change = true;
  w.is_delete = true;
  w.group_resource = "core.shardcache.io/resourcedefinitions";
  w.object = Object(Meta("", "", "", "widgets.example.com"));
  w.expected_mod_revision = 5;
  w.purge_group_resource = "example.com/widgets";
  bool changes = false;
  etcdserverpb::TxnRequest txn = MakeEtcdTxn("/p", w, &changes);
  ASSERT_EQ(txn.success_size(), 2);
  EXPECT_EQ(txn.success(0).request_delete_range().key(), "/p/o/example.com/widgets/");
  EXPECT_EQ(txn.success(0).request_delete_range().range_end(), "/p/o/example.com/widgets0");
  EXPECT_EQ(txn.success(1).request_delete_range().key(),
            "/p/o/core.shardcache.io/resourcedefinitions////widgets.example.com");
}

TEST(EtcdLayoutTest, FencesCompareTheEpochSeenAndRaiseIt) {
  EtcdWrite w;
  w.fence_shard = "s1";
  w.fence_epoch = 4;
  w.seen_epoch = 0;
  bool changes = false;
  etcdserverpb::TxnRequest txn = MakeEtcdTxn("/p", w, &changes);
  EXPECT_TRUE(changes);
  ASSERT_EQ(txn.compare_size(), 1);
  EXPECT_EQ(txn.compare(0).key(), "/p/e/s1");
  EXPECT_EQ(txn.compare(0).target(), etcdserverpb::Compare::CREATE);
  ASSERT_EQ(txn.success_size(), 1);
  EXPECT_EQ(txn.success(0).request_put().value(), EtcdEpochValue(4));

  w.seen_epoch = 4;  // the same epoch again: compared, not written
  txn = MakeEtcdTxn("/p", w, &changes);
  EXPECT_FALSE(changes);
  ASSERT_EQ(txn.compare_size(), 1);
  EXPECT_EQ(txn.compare(0).target(), etcdserverpb::Compare::VALUE);
  EXPECT_EQ(txn.compare(0).value(), EtcdEpochValue(4));
  EXPECT_EQ(txn.success_size(), 0);
}

TEST(EtcdLayoutTest, AWriteThatChangesNothingOnlyCompares) {
  EtcdWrite w;
  w.check_only = true;
  w.group_resource = "example.com/widgets";
  w.object = Object(Meta("", "root", "default", "w1"), "9");
  w.expected_mod_revision = 9;
  bool changes = true;
  etcdserverpb::TxnRequest txn = MakeEtcdTxn("/p", w, &changes);
  EXPECT_FALSE(changes);
  ASSERT_EQ(txn.compare_size(), 1);
  EXPECT_EQ(txn.compare(0).mod_revision(), 9);
  EXPECT_EQ(txn.success_size(), 0);
}

}  // namespace
}  // namespace shardcache
