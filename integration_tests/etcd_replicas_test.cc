// Process tests of cache_server replicas on one etcd cluster (--storage=etcd): a three-member
// etcd cluster and two cache_server replicas on loopback ports that they pick themselves. The
// replicas give the same resourceVersions, read consistently, decide racing writes and fences
// through etcd, survive an etcd member's and a replica's death without losing an acknowledged
// write or a watcher's event, say UNAVAILABLE while etcd has no quorum and recover by themselves,
// and refuse, writing nothing, endpoints they cannot reach and prefixes that hold someone else's
// data.
#include <signal.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cache_server/etcd_client.h"
#include "common/error_info.h"
#include "common/testing/etcd_cluster.h"
#include "common/testing/objects.h"
#include "common/testing/server_process.h"
#include "common/testing/wait.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration_tests/refuse_to_start.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

using ::testing::HasSubstr;

v1::GroupVersionResource Widgets() { return Gvr("example.com", "v1", "widgets"); }

v1::Object Widget(const std::string& name, const std::string& spec_json = "{}") {
  return FromJson<v1::Object>(
      absl::StrCat(R"({"metadata":{"cluster":"root","namespace":"default","name":")", name,
                   R"("},"spec":)", spec_json, "}"));
}

std::unique_ptr<grpc::ClientContext> Deadline(absl::Duration d = absl::Seconds(20)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
  return ctx;
}

// One cache_server replica and its stub.
struct Replica {
  std::unique_ptr<ServerProcess> process;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Store::Stub> stub;

  grpc::Status Create(const v1::Object& obj, v1::Object* out = nullptr,
                      const v1::Fence* fence = nullptr) {
    v1::CreateRequest req;
    *req.mutable_resource() = Widgets();
    *req.mutable_object() = obj;
    if (fence != nullptr) *req.mutable_fence() = *fence;
    v1::Object resp;
    grpc::Status s = stub->Create(Deadline().get(), req, &resp);
    if (out != nullptr) *out = resp;
    return s;
  }
  grpc::Status Update(const v1::Object& obj, v1::Object* out = nullptr,
                      const v1::Fence* fence = nullptr) {
    v1::UpdateRequest req;
    *req.mutable_resource() = Widgets();
    *req.mutable_object() = obj;
    if (fence != nullptr) *req.mutable_fence() = *fence;
    v1::Object resp;
    grpc::Status s = stub->Update(Deadline().get(), req, &resp);
    if (out != nullptr) *out = resp;
    return s;
  }
  grpc::Status Get(const std::string& name, v1::Object* out = nullptr) {
    v1::GetRequest req;
    *req.mutable_resource() = Widgets();
    req.set_cluster("root");
    req.set_namespace_("default");
    req.set_name(name);
    v1::Object resp;
    grpc::Status s = stub->Get(Deadline().get(), req, &resp);
    if (out != nullptr) *out = resp;
    return s;
  }
  grpc::Status List(v1::ListResponse* out) {
    v1::ListRequest req;
    *req.mutable_resource() = Widgets();
    return stub->List(Deadline().get(), req, out);
  }
  grpc::Status ClaimEpoch(const std::string& shard, int64_t epoch) {
    v1::ClaimEpochRequest req;
    req.mutable_fence()->set_shard(shard);
    req.mutable_fence()->set_epoch(epoch);
    v1::ClaimEpochResponse resp;
    return stub->ClaimEpoch(Deadline().get(), req, &resp);
  }
};

std::unique_ptr<EtcdCluster> Cluster(int members) {
  EtcdCluster::Options options;
  options.members = members;
  return std::make_unique<EtcdCluster>(options);
}

// How many keys etcd holds under `prefix` (every key when it is empty); -1 when it cannot say.
int64_t KeysIn(EtcdClient* client, const std::string& prefix = "") {
  etcdserverpb::RangeRequest range;
  range.set_key(prefix.empty() ? std::string(1, '\0') : prefix);
  range.set_range_end(prefix.empty() ? std::string(1, '\0') : EtcdClient::PrefixEnd(prefix));
  range.set_count_only(true);
  auto r = client->Range(range);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->count() : -1;
}

std::unique_ptr<EtcdClient> ClientOf(const EtcdCluster& etcd) {
  EtcdClient::Options options;
  options.endpoints = absl::StrSplit(etcd.Endpoints(), ',');
  auto client = EtcdClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

v1::Fence Fence(const std::string& shard, int64_t epoch) {
  v1::Fence f;
  f.set_shard(shard);
  f.set_epoch(epoch);
  return f;
}

class EtcdReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = Cluster(3);
    absl::Status started = etcd_->Start();
    ASSERT_TRUE(started.ok()) << started;
    for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(StartReplica(i));
  }

  virtual std::vector<std::string> ReplicaArgs() const {
    return {"--storage=etcd", "--etcd-endpoints=" + etcd_->Endpoints(), "--etcd-prefix=/replicas",
            "--etcd-request-timeout=2s", "--consistent-read-timeout=2s"};
  }

  void StartReplica(int i) {
    Replica& r = replicas_[i];
    r.process =
        std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"), ReplicaArgs());
    absl::Status started = r.process->Start();
    ASSERT_TRUE(started.ok()) << started;
    r.channel = grpc::CreateChannel(r.process->grpc_address(), grpc::InsecureChannelCredentials());
    r.stub = v1::Store::NewStub(r.channel);
  }

  void TearDown() override {
    for (Replica& r : replicas_) {
      r.stub.reset();
      r.channel.reset();
      if (r.process != nullptr && r.process->Running()) {
        EXPECT_EQ(r.process->Stop(), 0) << "a replica did not exit cleanly on SIGTERM";
      }
      r.process.reset();
    }
    etcd_.reset();
  }

  std::unique_ptr<EtcdCluster> etcd_;
  Replica replicas_[2];
};

TEST_F(EtcdReplicasTest, AWriteThroughOneReplicaIsSeenByTheOtherWithTheSameResourceVersion) {
  Replica& a = replicas_[0];
  Replica& b = replicas_[1];
  WatchReader watch_b(b.stub.get(), WatchReq(Widgets()));
  ASSERT_TRUE(watch_b.SkipInitial());
  WatchReader watch_a(a.stub.get(), WatchReq(Widgets()));
  ASSERT_TRUE(watch_a.SkipInitial());

  std::vector<int64_t> written;
  for (int i = 0; i < 20; ++i) {
    Replica& writer = i % 2 == 0 ? a : b;
    Replica& other = i % 2 == 0 ? b : a;
    v1::Object created;
    ASSERT_TRUE(Ok(writer.Create(Widget(absl::StrCat("w", i)), &created)));
    written.push_back(Rv(created));
    // A consistent read on the other replica, right after the answer, includes the write.
    v1::Object got;
    ASSERT_TRUE(Ok(other.Get(absl::StrCat("w", i), &got)));
    EXPECT_EQ(Rv(got), Rv(created));
    v1::ListResponse list;
    ASSERT_TRUE(Ok(other.List(&list)));
    EXPECT_EQ(list.items_size(), i + 1);
    EXPECT_GE(std::stoll(list.resource_version()), Rv(created));
  }
  // Both watches see every write, in order, with the writer's resourceVersions.
  for (WatchReader* w : {&watch_a, &watch_b}) {
    std::vector<std::string> want;
    for (int i = 0; i < 20; ++i) want.push_back(Summary("ADDED", absl::StrCat("w", i), written[i]));
    EXPECT_EQ(w->Take(20), want);
  }
  // Both replicas name the same store.
  v1::ListResponse la, lb;
  ASSERT_TRUE(Ok(a.List(&la)));
  ASSERT_TRUE(Ok(b.List(&lb)));
  EXPECT_EQ(la.store_id(), lb.store_id());
  EXPECT_FALSE(la.store_id().empty());
  // The reads waited for the watch, and say how long.
  const std::string metrics = HttpGet(b.process->http_port(), "/metrics");
  EXPECT_THAT(metrics, ::testing::ContainsRegex(
                           "shardcache_store_etcd_read_wait_seconds_count [1-9][0-9]*\n"));
  EXPECT_THAT(metrics, HasSubstr("shardcache_store_etcd_progress_writes_total "));
}

TEST_F(EtcdReplicasTest, RacingWritersThroughDifferentReplicasExactlyOneWins) {
  Replica& a = replicas_[0];
  Replica& b = replicas_[1];
  v1::Object current;
  ASSERT_TRUE(Ok(a.Create(Widget("race", R"({"n":0})"), &current)));
  for (int round = 1; round <= 20; ++round) {
    v1::Object mine = current;
    (*mine.mutable_spec()->mutable_fields())["n"].set_number_value(round);
    grpc::Status sa, sb;
    v1::Object oa, ob;
    std::thread ta([&] { sa = a.Update(mine, &oa); });
    std::thread tb([&] { sb = b.Update(mine, &ob); });
    ta.join();
    tb.join();
    ASSERT_NE(sa.ok(), sb.ok()) << "round " << round << ": " << sa.error_message() << " / "
                                << sb.error_message();
    const grpc::Status& lost = sa.ok() ? sb : sa;
    EXPECT_EQ(lost.error_code(), grpc::StatusCode::ABORTED) << lost.error_message();
    current = sa.ok() ? oa : ob;
  }
  v1::Object got;
  ASSERT_TRUE(Ok(b.Get("race", &got)));
  EXPECT_EQ(Rv(got), Rv(current));
  EXPECT_EQ(got.spec().fields().at("n").number_value(), 20);
}

TEST_F(EtcdReplicasTest, AFencedWriterIsRefusedThroughEitherReplica) {
  Replica& a = replicas_[0];
  Replica& b = replicas_[1];
  ASSERT_TRUE(Ok(a.ClaimEpoch("s1", 3)));
  v1::Fence old = Fence("s1", 2);
  grpc::Status fenced = b.Create(Widget("f1"), nullptr, &old);
  EXPECT_EQ(fenced.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << fenced.error_message();
  EXPECT_THAT(fenced.error_message(), HasSubstr("fenced"));
  v1::Fence current = Fence("s1", 3);
  v1::Object f1;
  ASSERT_TRUE(Ok(b.Create(Widget("f1"), &f1, &current)));
  // A newer leader claims through B; the old one is refused through A, for writes and claims.
  ASSERT_TRUE(Ok(b.ClaimEpoch("s1", 4)));
  grpc::Status refused = a.Update(f1, nullptr, &current);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  EXPECT_EQ(a.ClaimEpoch("s1", 3).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // A write that raises the epoch through A fences B's writers of the old one.
  v1::Fence newer = Fence("s1", 5);
  ASSERT_TRUE(Ok(a.Create(Widget("f2"), nullptr, &newer)));
  v1::Fence four = Fence("s1", 4);
  EXPECT_EQ(b.Create(Widget("f3"), nullptr, &four).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(EtcdReplicasTest, NoAcknowledgedWriteOrWatchedEventIsLostWhenAMemberAndAReplicaDie) {
  Replica& a = replicas_[0];
  Replica& b = replicas_[1];
  // A watcher of replica A, which will die.
  auto watch_a = std::make_unique<WatchReader>(a.stub.get(), WatchReq(Widgets()));
  ASSERT_TRUE(watch_a->SkipInitial());

  // Writers through both replicas; each remembers the writes acknowledged.
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  std::map<std::string, int64_t> acknowledged;  // name -> resourceVersion
  auto writer = [&](int w) {
    for (int i = 0; !stop.load(); ++i) {
      std::string name = absl::StrCat("w", w, "-", i);
      v1::Object created;
      // Alternate replicas; a write to a dead replica fails and is not acknowledged.
      Replica& r = (i % 2 == 0) ? b : a;
      if (r.Create(Widget(name), &created).ok()) {
        absl::MutexLock l(&mu);
        acknowledged[name] = Rv(created);
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  };
  std::thread w1([&] { writer(1); });
  std::thread w2([&] { writer(2); });
  // What A's watcher sees while an etcd member dies under the writes; then A dies too.
  std::vector<v1::WatchEvent> seen;
  auto read_for = [&](absl::Duration d) {
    absl::Time until = absl::Now() + d;
    while (absl::Now() < until) {
      std::optional<v1::WatchEvent> e = watch_a->Next(absl::Milliseconds(100));
      if (e.has_value() && e->type() != v1::WatchEvent::BOOKMARK) seen.push_back(*e);
    }
  };
  read_for(absl::Seconds(1));
  etcd_->Kill(0);
  read_for(absl::Seconds(3));
  a.process->Signal(SIGKILL);
  watch_a.reset();
  absl::SleepFor(absl::Seconds(1));
  stop = true;
  w1.join();
  w2.join();
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) {
    ASSERT_GT(Rv(seen[i].object()), Rv(seen[i - 1].object())) << "A's watcher, event " << i;
  }

  // The watcher resumes on B from the last revision it saw: no relist, and it gets every later
  // event in order, with none missed and none twice.
  const int64_t resume = Rv(seen.back().object());
  std::map<std::string, int64_t> ack;
  {
    absl::MutexLock l(&mu);
    ack = acknowledged;
  }
  std::set<std::string> got;
  for (const v1::WatchEvent& e : seen) got.insert(e.object().metadata().name());
  std::set<std::string> missing;
  for (const auto& [name, rv] : ack) {
    if (rv > resume) missing.insert(name);
  }
  WatchReader resumed(b.stub.get(), WatchReq(Widgets(), resume));
  int64_t last = resume;
  while (!missing.empty()) {
    std::optional<v1::WatchEvent> e = resumed.NextObjectEvent();
    ASSERT_TRUE(e.has_value()) << missing.size() << " acknowledged writes never came after " << last
                               << ", e.g. " << *missing.begin();
    EXPECT_EQ(e->type(), v1::WatchEvent::ADDED);
    EXPECT_GT(Rv(e->object()), last) << "out of order or repeated";
    last = Rv(e->object());
    EXPECT_TRUE(got.insert(e->object().metadata().name()).second)
        << e->object().metadata().name() << " twice";
    missing.erase(e->object().metadata().name());
  }
  // Every acknowledged write is in etcd with its resourceVersion, and the watcher saw it.
  v1::ListResponse list;
  ASSERT_TRUE(Ok(b.List(&list)));
  std::map<std::string, int64_t> listed;
  for (const v1::Object& o : list.items()) listed[o.metadata().name()] = Rv(o);
  EXPECT_GT(ack.size(), 10u);
  for (const auto& [name, rv] : ack) {
    ASSERT_EQ(listed.count(name), 1u) << "acknowledged write " << name << " lost";
    EXPECT_EQ(listed[name], rv);
    EXPECT_EQ(got.count(name), 1u) << name << " never reached the watcher";
  }
  a.stub.reset();
  a.process.reset();
}

TEST_F(EtcdReplicasTest, WithoutQuorumWritesAndReadsSayUnavailableAndRecoverByThemselves) {
  Replica& a = replicas_[0];
  Replica& b = replicas_[1];
  ASSERT_TRUE(Ok(a.Create(Widget("before"))));
  ASSERT_EQ(HttpGet(a.process->http_port(), "/readyz").substr(0, 3), "200");
  etcd_->Stop(1);
  etcd_->Stop(2);

  absl::Time start = absl::Now();
  grpc::Status write = a.Create(Widget("during"));
  EXPECT_EQ(write.error_code(), grpc::StatusCode::UNAVAILABLE) << write.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  grpc::Status read = b.Get("before");
  EXPECT_EQ(read.error_code(), grpc::StatusCode::UNAVAILABLE) << read.error_message();
  v1::ListResponse list;
  EXPECT_EQ(b.List(&list).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(HttpGet(a.process->http_port(), "/readyz").substr(0, 3), "200");

  ASSERT_TRUE(etcd_->Restart(1).ok());
  ASSERT_TRUE(etcd_->Restart(2).ok());
  // Recovery needs nothing from the client but retries.
  ASSERT_TRUE(WaitFor([&] { return a.Create(Widget("after")).ok(); }, absl::Seconds(60)));
  v1::Object got;
  ASSERT_TRUE(WaitFor([&] { return b.Get("after", &got).ok(); }, absl::Seconds(30)));
  ASSERT_TRUE(
      WaitFor([&] { return HttpGet(b.process->http_port(), "/readyz").substr(0, 3) == "200"; },
              absl::Seconds(30)));
}

TEST_F(EtcdReplicasTest, ARestartedReplicaLoadsTheStoreAndOthersWritesSinceIt) {
  Replica& a = replicas_[0];
  Replica& b = replicas_[1];
  v1::Object one;
  ASSERT_TRUE(Ok(a.Create(Widget("one"), &one)));
  ASSERT_EQ(a.process->Stop(), 0);
  v1::Object two;
  ASSERT_TRUE(Ok(b.Create(Widget("two"), &two)));
  ASSERT_TRUE(a.process->Start().ok());
  a.stub = v1::Store::NewStub(
      grpc::CreateChannel(a.process->grpc_address(), grpc::InsecureChannelCredentials()));
  v1::Object got;
  ASSERT_TRUE(Ok(a.Get("two", &got)));
  EXPECT_EQ(Rv(got), Rv(two));
  ASSERT_TRUE(Ok(a.Get("one", &got)));
  EXPECT_EQ(Rv(got), Rv(one));
}

// Two replicas of a shard store (--role=shard), where ResourceDefinitions say what is served.
class EtcdShardReplicasTest : public EtcdReplicasTest {
 protected:
  std::vector<std::string> ReplicaArgs() const override {
    std::vector<std::string> args = EtcdReplicasTest::ReplicaArgs();
    args.push_back("--role=shard");
    args.push_back("--shard=a");
    return args;
  }
};

// A create decided by one replica while the definition is there, whose transaction reaches etcd
// after the other replica deleted the definition (and its objects), must not land: it would leave
// an object of a resource that nothing serves. Each round races a stream of creates through one
// replica with the definition's deletion through the other.
TEST_F(EtcdShardReplicasTest, NoCreateLandsAfterItsDefinitionIsDeletedThroughTheOtherReplica) {
  Replica& a = replicas_[0];
  Replica& b = replicas_[1];
  std::unique_ptr<EtcdClient> etcd = ClientOf(*etcd_);
  ASSERT_NE(etcd, nullptr);
  const std::string widget_keys = "/replicas/o/example.com/widgets/";
  for (int round = 0; round < 12; ++round) {
    v1::CreateRequest define;
    *define.mutable_resource() = DefinitionGvr();
    *define.mutable_object() = Definition("example.com", "widgets", "Namespaced", {"v1"}, false);
    v1::Object definition;
    ASSERT_TRUE(Ok(a.stub->Create(Deadline().get(), define, &definition))) << "round " << round;
    // b serves widgets once its watch has brought the definition.
    ASSERT_TRUE(Eventually([&] { return b.Create(Widget(absl::StrCat("probe-", round))).ok(); },
                           absl::Seconds(10), "replica b serves widgets"));
    std::atomic<int> created{0};
    std::atomic<bool> stopped{false};
    grpc::Status last;
    std::thread writer([&] {
      for (int i = 0; i < 10000; ++i) {
        last = b.Create(Widget(absl::StrCat("r", round, "-", i)));
        if (!last.ok()) break;
        ++created;
      }
      stopped = true;
    });
    // Let some creates through first, a different number each round.
    while (created.load() < 3 + 2 * round && !stopped.load()) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    v1::DeleteRequest undefine;
    *undefine.mutable_resource() = DefinitionGvr();
    undefine.set_name("widgets.example.com");
    v1::DeleteResponse deleted;
    ASSERT_TRUE(Ok(a.stub->Delete(Deadline().get(), undefine, &deleted))) << "round " << round;
    writer.join();
    EXPECT_EQ(last.error_code(), grpc::StatusCode::NOT_FOUND)
        << "round " << round << ": " << last.error_message();
    EXPECT_EQ(KeysIn(etcd.get(), widget_keys), 0)
        << "round " << round << ": widgets left in etcd after their definition's deletion ("
        << created.load() << " created)";
  }
}

// Refusals, each with nothing written to etcd.
class EtcdRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = Cluster(1);
    absl::Status started = etcd_->Start();
    ASSERT_TRUE(started.ok()) << started;
    client_ = ClientOf(*etcd_);
    ASSERT_NE(client_, nullptr);
  }

  // The keys in etcd under `prefix` (every key when it is empty).
  int64_t Keys(const std::string& prefix = "") { return KeysIn(client_.get(), prefix); }

  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdRefusalTest, UnreachableEndpoints) {
  RunResult r = RunCacheServer(
      {"--storage=etcd", "--etcd-endpoints=127.0.0.1:1", "--etcd-request-timeout=1s"},
      absl::Seconds(30));
  EXPECT_NE(ExitCode(r), 0) << DescribeWaitStatus(r.wait_status);
  EXPECT_FALSE(r.wrote_port_file);
  EXPECT_THAT(r.stderr_text, HasSubstr("cannot load the store from etcd (127.0.0.1:1"));
}

TEST_F(EtcdRefusalTest, BadFlags) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {{"--storage=etcd"}, "--etcd-endpoints: required with --storage=etcd"},
      {{"--storage=etcd", "--etcd-endpoints=" + etcd_->Endpoints(), "--etcd-prefix=noslash"},
       "--etcd-prefix: etcd prefix \"noslash\": must start with '/'"},
      {{"--storage=etcd", "--etcd-endpoints=" + etcd_->Endpoints(), "--etcd-prefix=/a/"},
       "must not end with '/'"},
      {{"--storage=etcd", "--etcd-endpoints=nohost"}, "--etcd-endpoints: "},
      {{"--storage=etcd", "--etcd-endpoints=" + etcd_->Endpoints(), "--etcd-cert=/nonexistent"},
       "--etcd-cert and --etcd-key: give both or neither"},
      {{"--storage=disk"}, "--storage: \"disk\" is not a storage (want rocksdb or etcd)"},
      {{"--etcd-endpoints=" + etcd_->Endpoints()}, "--etcd-endpoints: only with --storage=etcd"},
  };
  for (const Case& c : cases) {
    RunResult r = RunCacheServer(c.args);
    EXPECT_NE(ExitCode(r), 0) << DescribeWaitStatus(r.wait_status);
    EXPECT_THAT(r.stderr_text, HasSubstr(c.says)) << absl::StrJoin(c.args, " ");
  }
  EXPECT_EQ(Keys(), 0);
}

TEST_F(EtcdRefusalTest, APrefixWithSomeoneElsesData) {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key("/theirs/config");
  put->set_value("not ours");
  ASSERT_TRUE(client_->Txn(txn).ok());
  RunResult r = RunCacheServer(
      {"--storage=etcd", "--etcd-endpoints=" + etcd_->Endpoints(), "--etcd-prefix=/theirs"});
  EXPECT_NE(ExitCode(r), 0) << DescribeWaitStatus(r.wait_status);
  EXPECT_THAT(r.stderr_text, HasSubstr("it is not a shardcache store's data"));
  EXPECT_EQ(Keys(), 1);
  // Another prefix of the same cluster is fine, and leaves the first alone.
  ServerProcess ours(
      BinaryPath("cache_server/cache_server"),
      {"--storage=etcd", "--etcd-endpoints=" + etcd_->Endpoints(), "--etcd-prefix=/theirs-not"});
  ASSERT_TRUE(ours.Start().ok()) << ours.Log();
  EXPECT_EQ(ours.Stop(), 0);
  EXPECT_EQ(Keys("/theirs/"), 1);
  EXPECT_EQ(Keys("/theirs-not/m/"), 2);  // our format marker and store id
}

}  // namespace
}  // namespace shardcache::testing
