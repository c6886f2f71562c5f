// Tests of the watch wire scanners (watch_wire.h) against messages that protobuf itself
// serializes: cache_server's single and batched WatchEvents, bookmarks, and etcd WatchResponses
// whose values are serialized v1::Objects, so that store_bench's watchers read what the servers
// send.
#include "bench/watch_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache::bench {
namespace {

struct Seen {
  int type = 0;
  bool created = false;
  int64_t revision = 0;
  ObjectFacts object;
};

v1::Object BenchObject(int64_t seq, int64_t sent_ns, const std::string& rv) {
  v1::Object object = MakeCreateRequest("run42", 0, seq, sent_ns).object();
  object.mutable_metadata()->set_resource_version(rv);
  (*object.mutable_metadata()->mutable_annotations())["note"] = "an annotation";
  return object;
}

std::vector<Seen> ScanStore(const std::string& bytes, bool* ok) {
  std::vector<Seen> seen;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  ObjectFacts facts;
  *ok = ScanStoreWatchEvent(&in, &facts, [&](int type, const ObjectFacts& object) {
    seen.push_back({type, false, object.resource_version, object});
  });
  return seen;
}

TEST(WatchWireTest, ReadsOneStoreEvent) {
  v1::WatchEvent event;
  event.set_type(v1::WatchEvent::ADDED);
  *event.mutable_object() = BenchObject(7, 123456789012345, "1001");
  event.set_store_id("store");
  bool ok = false;
  std::vector<Seen> seen = ScanStore(event.SerializeAsString(), &ok);
  ASSERT_TRUE(ok);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].type, v1::WatchEvent::ADDED);
  EXPECT_EQ(seen[0].revision, 1001);
  EXPECT_TRUE(seen[0].object.bench);
  EXPECT_EQ(seen[0].object.run, "run42");
  EXPECT_EQ(seen[0].object.seq, 7);
  EXPECT_EQ(seen[0].object.sent_ns, 123456789012345);
  EXPECT_FALSE(seen[0].object.initial_events_end);
}

TEST(WatchWireTest, ReadsABatchInOrder) {
  v1::WatchEvent batch;
  for (int i = 0; i < 3; ++i) {
    v1::WatchEvent* e = batch.add_events();
    e->set_type(i == 2 ? v1::WatchEvent::MODIFIED : v1::WatchEvent::ADDED);
    *e->mutable_object() = BenchObject(i, 1000 + i, std::to_string(50 + i));
  }
  bool ok = false;
  std::vector<Seen> seen = ScanStore(batch.SerializeAsString(), &ok);
  ASSERT_TRUE(ok);
  ASSERT_EQ(seen.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[i].type, i == 2 ? v1::WatchEvent::MODIFIED : v1::WatchEvent::ADDED);
    EXPECT_EQ(seen[i].revision, 50 + i);
    EXPECT_EQ(seen[i].object.seq, i);
    EXPECT_EQ(seen[i].object.sent_ns, 1000 + i);
  }
}

TEST(WatchWireTest, ReadsTheInitialEventsEndBookmark) {
  v1::WatchEvent event;
  event.set_type(v1::WatchEvent::BOOKMARK);
  event.mutable_object()->mutable_metadata()->set_resource_version("9");
  (*event.mutable_object()
        ->mutable_metadata()
        ->mutable_annotations())["k8s.io/initial-events-end"] = "true";
  bool ok = false;
  std::vector<Seen> seen = ScanStore(event.SerializeAsString(), &ok);
  ASSERT_TRUE(ok);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].type, v1::WatchEvent::BOOKMARK);
  EXPECT_TRUE(seen[0].object.initial_events_end);
  EXPECT_FALSE(seen[0].object.bench);

  // A plain bookmark is not the end of the initial events.
  (*event.mutable_object()
        ->mutable_metadata()
        ->mutable_annotations())["k8s.io/initial-events-end"] = "false";
  seen = ScanStore(event.SerializeAsString(), &ok);
  ASSERT_TRUE(ok);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_FALSE(seen[0].object.initial_events_end);
}

TEST(WatchWireTest, AnObjectWithoutTheBenchFieldsIsNotABenchObject) {
  v1::WatchEvent event;
  event.set_type(v1::WatchEvent::ADDED);
  *event.mutable_object() = BenchObject(1, 2, "3");
  event.mutable_object()->mutable_spec()->mutable_fields()->erase("sentNanos");
  bool ok = false;
  std::vector<Seen> seen = ScanStore(event.SerializeAsString(), &ok);
  ASSERT_TRUE(ok);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_FALSE(seen[0].object.bench);
}

TEST(WatchWireTest, RejectsATruncatedMessage) {
  v1::WatchEvent event;
  event.set_type(v1::WatchEvent::ADDED);
  *event.mutable_object() = BenchObject(1, 2, "3");
  std::string bytes = event.SerializeAsString();
  bool ok = true;
  std::vector<Seen> seen = ScanStore(bytes.substr(0, bytes.size() - 10), &ok);
  EXPECT_FALSE(ok);
  EXPECT_TRUE(seen.empty());
}

TEST(WatchWireTest, ReadsAnEtcdWatchResponse) {
  etcdserverpb::WatchResponse response;
  response.set_watch_id(1);
  for (int i = 0; i < 2; ++i) {
    mvccpb::Event* e = response.add_events();
    e->set_type(mvccpb::Event::PUT);
    mvccpb::KeyValue* kv = e->mutable_kv();
    kv->set_key("/registry/bench.shardcache.io/widgets/bench/default/w");
    kv->set_create_revision(70);
    kv->set_mod_revision(70 + i);
    kv->set_version(1 + i);  // the second is an update of an existing key
    kv->set_value(BenchObject(10 + i, 500 + i, "").SerializeAsString());
  }
  std::string bytes = response.SerializeAsString();
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  EtcdResponseFacts facts;
  ObjectFacts object_facts;
  std::vector<Seen> seen;
  ASSERT_TRUE(ScanEtcdWatchResponse(&in, &facts, &object_facts,
                                    [&](bool created, int64_t revision, const ObjectFacts& object) {
                                      seen.push_back({0, created, revision, object});
                                    }));
  EXPECT_FALSE(facts.created);
  EXPECT_FALSE(facts.canceled);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen[0].created);
  EXPECT_FALSE(seen[1].created);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(seen[i].revision, 70 + i);
    EXPECT_TRUE(seen[i].object.bench);
    EXPECT_EQ(seen[i].object.run, "run42");
    EXPECT_EQ(seen[i].object.seq, 10 + i);
    EXPECT_EQ(seen[i].object.sent_ns, 500 + i);
  }
}

TEST(WatchWireTest, ReadsEtcdCreatedAndCanceled) {
  etcdserverpb::WatchResponse response;
  response.set_created(true);
  response.set_canceled(true);
  response.set_compact_revision(12);
  response.set_cancel_reason("mvcc: required revision has been compacted");
  std::string bytes = response.SerializeAsString();
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  EtcdResponseFacts facts;
  ObjectFacts object_facts;
  int events = 0;
  ASSERT_TRUE(ScanEtcdWatchResponse(&in, &facts, &object_facts,
                                    [&](bool, int64_t, const ObjectFacts&) { ++events; }));
  EXPECT_EQ(events, 0);
  EXPECT_TRUE(facts.created);
  EXPECT_TRUE(facts.canceled);
  EXPECT_EQ(facts.compact_revision, 12);
  EXPECT_EQ(facts.cancel_reason, "mvcc: required revision has been compacted");
}

}  // namespace
}  // namespace shardcache::bench
