// EtcdClient and EtcdWatch against real etcd processes (Debian's etcd-server) on loopback: one
// member for the calls and the watch's contract, three for what happens when members die; and
// EtcdProgressWriter, which shares one progress write among the asks that come while one is on
// its way.
#include "cache_server/etcd_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cache_server/etcd_progress_writer.h"
#include "common/testing/etcd_cluster.h"
#include "common/testing/server_process.h"
#include "common/testing/status_matchers.h"
#include "common/testing/wait.h"

namespace shardcache {
namespace {

using ::shardcache::testing::Eventually;
using ::shardcache::testing::IsOk;
using ::shardcache::testing::StatusIs;
using ::testing::HasSubstr;

// A Txn that puts `key` = `value` if its mod_revision is `mod_revision` (0: the key is absent).
etcdserverpb::TxnRequest PutIf(const std::string& key, int64_t mod_revision,
                               const std::string& value) {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* cmp = txn.add_compare();
  cmp->set_key(key);
  cmp->set_target(etcdserverpb::Compare::MOD);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_mod_revision(mod_revision);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  return txn;
}

// A Txn that puts every key of `kvs` at once (one revision).
etcdserverpb::TxnRequest PutAll(const std::vector<std::pair<std::string, std::string>>& kvs) {
  etcdserverpb::TxnRequest txn;
  for (const auto& [key, value] : kvs) {
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
  }
  return txn;
}

// Records what a watch delivers, and checks the handler's contract as it goes: calls one at a
// time, revisions that never decrease, events in revision order, nothing after OnEnd or after
// the test says the watch was stopped.
class RecordingHandler : public EtcdClient::WatchHandler {
 public:
  struct Call {
    std::vector<mvccpb::Event> events;
    int64_t revision;
  };

  void OnEvents(const std::vector<mvccpb::Event>& events, int64_t revision) override {
    Enter();
    absl::SleepFor(delay_);
    {
      absl::MutexLock l(&mu_);
      if (ended_) Violation("OnEvents after OnEnd");
      if (revision < last_revision_) {
        Violation(absl::StrCat("revision ", revision, " after ", last_revision_));
      }
      for (const mvccpb::Event& e : events) {
        if (e.kv().mod_revision() < last_event_revision_) {
          Violation(absl::StrCat("event of revision ", e.kv().mod_revision(), " after one of ",
                                 last_event_revision_));
        }
        last_event_revision_ = e.kv().mod_revision();
        if (e.kv().mod_revision() > revision) {
          Violation(absl::StrCat("event of revision ", e.kv().mod_revision(),
                                 " delivered with revision ", revision));
        }
      }
      last_revision_ = revision;
      calls_.push_back({events, revision});
    }
    Leave();
  }

  void OnEnd(absl::Status status) override {
    Enter();
    {
      absl::MutexLock l(&mu_);
      if (ended_) Violation("a second OnEnd");
      ended_ = true;
      end_ = status;
    }
    Leave();
  }

  // The watch was stopped (Stop returned): any call from now on is a violation.
  void MarkStopped() {
    absl::MutexLock l(&mu_);
    stopped_ = true;
  }
  // Each handler call sleeps this long (to widen races).
  void set_delay(absl::Duration d) { delay_ = d; }

  std::vector<mvccpb::Event> Events() const {
    absl::MutexLock l(&mu_);
    std::vector<mvccpb::Event> all;
    for (const Call& c : calls_) all.insert(all.end(), c.events.begin(), c.events.end());
    return all;
  }
  std::vector<Call> Calls() const {
    absl::MutexLock l(&mu_);
    return calls_;
  }
  size_t EventCount() const { return Events().size(); }
  int64_t LastRevision() const {
    absl::MutexLock l(&mu_);
    return last_revision_;
  }
  std::optional<absl::Status> End() const {
    absl::MutexLock l(&mu_);
    if (!ended_) return std::nullopt;
    return end_;
  }
  // A progress notification (a call without events) with a revision >= `revision`.
  bool SawProgress(int64_t revision) const {
    absl::MutexLock l(&mu_);
    for (const Call& c : calls_) {
      if (c.events.empty() && c.revision >= revision) return true;
    }
    return false;
  }
  std::vector<std::string> Violations() const {
    absl::MutexLock l(&mu_);
    return violations_;
  }
  std::string Describe() const {
    absl::MutexLock l(&mu_);
    return absl::StrCat(calls_.size(), " calls, last revision ", last_revision_,
                        ended_ ? absl::StrCat(", ended: ", end_.ToString()) : "");
  }

 private:
  void Enter() {
    if (in_call_.exchange(true)) {
      absl::MutexLock l(&mu_);
      Violation("two handler calls at once");
    }
    absl::MutexLock l(&mu_);
    if (stopped_) Violation("a handler call after Stop returned");
  }
  void Leave() { in_call_.store(false); }
  void Violation(std::string what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    violations_.push_back(std::move(what));
  }

  absl::Duration delay_ = absl::ZeroDuration();
  std::atomic<bool> in_call_{false};
  mutable absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  int64_t last_revision_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_event_revision_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
};

class EtcdClientTest : public ::testing::Test {
 protected:
  // Starts a cluster of `members` and a client of all of them (over TLS with the certificates
  // in `tls_dir`, made by scripts/make-certs.sh, when it is set).
  void StartCluster(int members, absl::Duration request_timeout = absl::Seconds(5),
                    const std::string& tls_dir = "") {
    testing::EtcdCluster::Options options;
    options.members = members;
    options.tls_dir = tls_dir;
    cluster_ = std::make_unique<testing::EtcdCluster>(options);
    ASSERT_THAT(cluster_->Start(), IsOk());
    EtcdClient::Options client;
    client.endpoints = cluster_->EndpointList();
    client.request_timeout = request_timeout;
    if (!tls_dir.empty()) {
      client.ca_file = tls_dir + "/ca.crt";
      client.cert_file = tls_dir + "/admin.crt";
      client.key_file = tls_dir + "/admin.key";
    }
    absl::StatusOr<std::unique_ptr<EtcdClient>> created = EtcdClient::Create(client);
    ASSERT_THAT(created.status(), IsOk());
    client_ = *std::move(created);
  }

  void SetUp() override {
    // The watch logs each stream it reopens; the tests count those lines.
    log_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
    spdlog::default_logger()->sinks().push_back(log_);
  }
  void TearDown() override {
    client_.reset();
    if (!certs_.empty() && !HasFailure()) {
      std::error_code ignored;
      std::filesystem::remove_all(certs_, ignored);
    }
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), log_), sinks.end());
  }

  // Log lines so far that contain `text`.
  int LogLines(const std::string& text) const {
    int n = 0;
    for (const std::string& line : log_->last_formatted()) n += absl::StrContains(line, text);
    return n;
  }

  // Puts key = value; returns the revision of the put.
  int64_t Put(const std::string& key, const std::string& value) {
    absl::StatusOr<etcdserverpb::TxnResponse> r = client_->Txn(PutAll({{key, value}}));
    EXPECT_THAT(r.status(), IsOk());
    return r.ok() ? r->header().revision() : -1;
  }

  // Certificates made by scripts/make-certs.sh into a fresh directory (removed after the test).
  std::string MakeCerts() {
    certs_ = testing::MakeTempDir("etcd-certs");
    const std::string command = absl::StrCat(SHARDCACHE_SOURCE_DIR, "/scripts/make-certs.sh -o '",
                                             certs_, "' >'", certs_, "/.make-certs.log' 2>&1");
    if (std::system(command.c_str()) != 0) {
      ADD_FAILURE() << "failed: " << command;
      return "";
    }
    return certs_;
  }

  std::unique_ptr<testing::EtcdCluster> cluster_;
  std::unique_ptr<EtcdClient> client_;
  std::string certs_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> log_;
};

// ---- Options ----

TEST_F(EtcdClientTest, Create_BadEndpoints_InvalidArgumentNamingTheEndpoint) {
  for (const std::string endpoint :
       {"nohost", "1.2.3.4:99999", "", "1.2.3.4:", "http://127.0.0.1:2379", "1.2.3:2379",
        "::1:2379", "[::1]2379", "[nothing]:2379", "bad_name:2379", "127.0.0.1:12ab"}) {
    EtcdClient::Options options;
    options.endpoints = {"127.0.0.1:2379", endpoint};
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
    EXPECT_THAT(client.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr(absl::StrCat("\"", endpoint, "\""))))
        << endpoint;
  }
  EtcdClient::Options none;
  EXPECT_THAT(EtcdClient::Create(none).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(EtcdClientTest, Create_GoodEndpoints) {
  for (const std::vector<std::string>& endpoints :
       std::vector<std::vector<std::string>>{{"127.0.0.1:2379"},
                                             {"127.0.0.1:2379", "127.0.0.2:22379"},
                                             {"[::1]:2379", "[::1]:22379"},
                                             {"etcd-0.example:2379"},
                                             {"localhost:2379", "127.0.0.1:22379"}}) {
    EtcdClient::Options options;
    options.endpoints = endpoints;
    EXPECT_THAT(EtcdClient::Create(options).status(), IsOk()) << absl::StrJoin(endpoints, ",");
  }
}

TEST_F(EtcdClientTest, Create_MissingTlsFile_NamesTheFile) {
  EtcdClient::Options options;
  options.endpoints = {"127.0.0.1:2379"};
  options.ca_file = "/nonexistent/etcd-ca.pem";
  EXPECT_THAT(EtcdClient::Create(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("/nonexistent/etcd-ca.pem")));

  const std::string dir = testing::MakeTempDir("etcd-tls");
  options.ca_file = dir + "/ca.pem";
  ASSERT_EQ(std::system(absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "
                                     "/CN=etcd-test -keyout ",
                                     dir, "/key.pem -out ", options.ca_file, " 2>/dev/null")
                            .c_str()),
            0);
  EXPECT_THAT(EtcdClient::Create(options).status(), IsOk());
  options.cert_file = dir + "/missing-cert.pem";
  options.key_file = dir + "/key.pem";
  EXPECT_THAT(EtcdClient::Create(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(options.cert_file)));
  options.cert_file = options.ca_file;
  options.key_file = dir + "/missing-key.pem";
  EXPECT_THAT(EtcdClient::Create(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(options.key_file)));
  options.key_file = dir + "/key.pem";
  EXPECT_THAT(EtcdClient::Create(options).status(), IsOk());
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST_F(EtcdClientTest, PrefixEnd) {
  EXPECT_EQ(EtcdClient::PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(EtcdClient::PrefixEnd("a\xff"), "b");
  EXPECT_EQ(EtcdClient::PrefixEnd("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(EtcdClient::PrefixEnd(""), std::string(1, '\0'));
}

// ---- Calls ----

TEST_F(EtcdClientTest, Txn_ModRevisionCompare_SucceedsOnlyWhenCurrent) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  absl::StatusOr<etcdserverpb::TxnResponse> created = client_->Txn(PutIf("/t/a", 0, "v1"));
  ASSERT_THAT(created.status(), IsOk());
  EXPECT_TRUE(created->succeeded());
  const int64_t rev1 = created->header().revision();

  // Absent no more: the same create fails the compare, and changes nothing.
  absl::StatusOr<etcdserverpb::TxnResponse> again = client_->Txn(PutIf("/t/a", 0, "v2"));
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_FALSE(again->succeeded());
  EXPECT_EQ(again->header().revision(), rev1);

  // An update at the current mod_revision succeeds; at the old one, it fails.
  absl::StatusOr<etcdserverpb::TxnResponse> updated = client_->Txn(PutIf("/t/a", rev1, "v3"));
  ASSERT_THAT(updated.status(), IsOk());
  EXPECT_TRUE(updated->succeeded());
  EXPECT_EQ(updated->header().revision(), rev1 + 1);
  absl::StatusOr<etcdserverpb::TxnResponse> stale = client_->Txn(PutIf("/t/a", rev1, "v4"));
  ASSERT_THAT(stale.status(), IsOk());
  EXPECT_FALSE(stale->succeeded());

  etcdserverpb::RangeRequest get;
  get.set_key("/t/a");
  absl::StatusOr<etcdserverpb::RangeResponse> r = client_->Range(get);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_EQ(r->kvs_size(), 1);
  EXPECT_EQ(r->kvs(0).value(), "v3");
  EXPECT_EQ(r->kvs(0).mod_revision(), rev1 + 1);
  EXPECT_EQ(r->kvs(0).create_revision(), rev1);
}

TEST_F(EtcdClientTest, Txn_EtcdError_CarriesCodeAndPrefix) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  // etcd refuses a transaction that puts one key twice.
  absl::StatusOr<etcdserverpb::TxnResponse> r =
      client_->Txn(PutAll({{"/t/d", "1"}, {"/t/d", "2"}}));
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("etcd: etcdserver: duplicate key given in txn")));
}

TEST_F(EtcdClientTest, TxnAsync_CallsBackOnceWithTheAnswer) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  constexpr int kCalls = 20;
  absl::Mutex mu;
  std::map<std::string, absl::StatusOr<etcdserverpb::TxnResponse>> answers;
  int callbacks = 0;
  auto callbacks_so_far = [&] {
    absl::MutexLock l(&mu);
    return callbacks;
  };
  for (int i = 0; i < kCalls; ++i) {
    std::string key = absl::StrCat("/async/", i);
    client_->TxnAsync(PutIf(key, 0, "v"), [&, key](absl::StatusOr<etcdserverpb::TxnResponse> r) {
      absl::MutexLock l(&mu);
      ++callbacks;
      answers.emplace(key, std::move(r));
    });
  }
  ASSERT_TRUE(Eventually([&] { return callbacks_so_far() >= kCalls; }, "every callback"));
  // No callback comes twice: the answer of a later call comes after every earlier one's.
  absl::Notification last;
  client_->TxnAsync(PutIf("/async/last", 0, "v"),
                    [&](absl::StatusOr<etcdserverpb::TxnResponse>) { last.Notify(); });
  ASSERT_TRUE(last.WaitForNotificationWithTimeout(absl::Seconds(20)));
  absl::MutexLock l(&mu);
  EXPECT_EQ(callbacks, kCalls);
  ASSERT_EQ(answers.size(), kCalls);
  std::set<int64_t> revisions;
  for (const auto& [key, r] : answers) {
    ASSERT_THAT(r.status(), IsOk()) << key;
    EXPECT_TRUE(r->succeeded()) << key;
    revisions.insert(r->header().revision());
  }
  EXPECT_EQ(revisions.size(), kCalls);  // each put its own revision
}

// A client of an endpoint where nothing listens.
std::unique_ptr<EtcdClient> UnreachableClient() {
  EtcdClient::Options options;
  options.endpoints = {"127.0.0.1:1"};  // nothing listens there
  options.request_timeout = absl::Seconds(3);
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
  EXPECT_THAT(client.status(), IsOk());
  return client.ok() ? *std::move(client) : nullptr;
}

TEST_F(EtcdClientTest, TxnAsync_NoMember_CallsBackUnavailable) {
  std::unique_ptr<EtcdClient> client = UnreachableClient();
  ASSERT_NE(client, nullptr);
  absl::Notification done;
  absl::Status status;
  client->TxnAsync(PutIf("/x", 0, "v"), [&](absl::StatusOr<etcdserverpb::TxnResponse> r) {
    status = r.status();
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("etcd: ")));
}

TEST_F(EtcdClientTest, Range_ReturnsThePrefixInKeyOrder) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  ASSERT_THAT(
      client_->Txn(PutAll({{"/r/b", "2"}, {"/r/a", "1"}, {"/r/c", "3"}, {"/s", "x"}})).status(),
      IsOk());
  etcdserverpb::RangeRequest range;
  range.set_key("/r/");
  range.set_range_end(EtcdClient::PrefixEnd("/r/"));
  absl::StatusOr<etcdserverpb::RangeResponse> r = client_->Range(range);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_EQ(r->kvs_size(), 3);
  EXPECT_EQ(r->count(), 3);
  EXPECT_EQ(r->kvs(0).key(), "/r/a");
  EXPECT_EQ(r->kvs(1).key(), "/r/b");
  EXPECT_EQ(r->kvs(2).value(), "3");
}

TEST_F(EtcdClientTest, CurrentRevision_IncreasesAfterAPut) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  absl::StatusOr<int64_t> before = client_->CurrentRevision("/rev");
  ASSERT_THAT(before.status(), IsOk());
  const int64_t put = Put("/other", "v");  // not the key asked about: the store's revision
  absl::StatusOr<int64_t> after = client_->CurrentRevision("/rev");
  ASSERT_THAT(after.status(), IsOk());
  EXPECT_EQ(put, *before + 1);
  EXPECT_EQ(*after, put);
  absl::StatusOr<etcdserverpb::StatusResponse> status = client_->Status();
  ASSERT_THAT(status.status(), IsOk());
  EXPECT_EQ(status->header().revision(), put);
}

// ---- EtcdProgressWriter ----

TEST_F(EtcdClientTest, ProgressWriter_AsksDuringAWriteShareTheNextOne) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  std::atomic<int> failures{0};
  EtcdProgressWriter writer(client_.get(), "/p/m/progress",
                            [&](const absl::Status&) { ++failures; });
  absl::StatusOr<int64_t> before = client_->CurrentRevision("/p");
  ASSERT_THAT(before.status(), IsOk());
  for (int i = 0; i < 99; ++i) writer.Request();
  absl::StatusOr<int64_t> asked_at = client_->CurrentRevision("/p");
  ASSERT_THAT(asked_at.status(), IsOk());
  writer.Request();
  // A write that started after the last ask: the key's mod revision passes what was read before.
  auto key_revision = [&]() -> int64_t {
    etcdserverpb::RangeRequest get;
    get.set_key("/p/m/progress");
    absl::StatusOr<etcdserverpb::RangeResponse> r = client_->Range(get);
    return r.ok() && r->kvs_size() == 1 ? r->kvs(0).mod_revision() : 0;
  };
  ASSERT_TRUE(Eventually([&] { return key_revision() > *asked_at; }, absl::Seconds(10),
                         "a progress write after the last ask"));
  absl::SleepFor(absl::Milliseconds(200));  // nothing more is asked: no more writes
  writer.Stop();
  // 100 asks, a few writes: the first, then one for every ask that came while it was on its way.
  EXPECT_GE(writer.writes(), 2);
  EXPECT_LE(writer.writes(), 4);
  absl::StatusOr<int64_t> after = client_->CurrentRevision("/p");
  ASSERT_THAT(after.status(), IsOk());
  EXPECT_EQ(*after - *before, writer.writes());
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(EtcdClientTest, ProgressWriter_AFailedWriteIsReported) {
  std::unique_ptr<EtcdClient> client = UnreachableClient();
  ASSERT_NE(client, nullptr);
  absl::Notification failed;
  absl::Status status;
  EtcdProgressWriter writer(client.get(), "/p/m/progress", [&](const absl::Status& s) {
    status = s;
    failed.Notify();
  });
  writer.Request();
  ASSERT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("this replica cannot learn etcd's latest changes")));
  writer.Stop();
  EXPECT_EQ(writer.writes(), 1);
}

// ---- Watch ----

TEST_F(EtcdClientTest, Watch_DeliversEventsInOrderWithTheirRevisions) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  absl::StatusOr<int64_t> start = client_->CurrentRevision("/w/");
  ASSERT_THAT(start.status(), IsOk());
  RecordingHandler handler;
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("/w/", EtcdClient::PrefixEnd("/w/"), *start + 1, &handler);
  EXPECT_EQ(watch->revision(), *start);

  // Puts, one transaction of three puts, a put outside the range, and a delete.
  std::vector<int64_t> revisions;
  for (int i = 0; i < 5; ++i) revisions.push_back(Put(absl::StrCat("/w/", i), "v"));
  absl::StatusOr<etcdserverpb::TxnResponse> txn =
      client_->Txn(PutAll({{"/w/t1", "a"}, {"/w/t2", "b"}, {"/w/t3", "c"}}));
  ASSERT_THAT(txn.status(), IsOk());
  Put("/x/outside", "v");
  etcdserverpb::TxnRequest del;
  del.add_success()->mutable_request_delete_range()->set_key("/w/0");
  absl::StatusOr<etcdserverpb::TxnResponse> deleted = client_->Txn(del);
  ASSERT_THAT(deleted.status(), IsOk());

  ASSERT_TRUE(Eventually([&] { return handler.EventCount() >= 9; }, "9 events",
                         [&] { return handler.Describe(); }));
  std::vector<mvccpb::Event> events = handler.Events();
  ASSERT_EQ(events.size(), 9);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(events[i].type(), mvccpb::Event::PUT);
    EXPECT_EQ(events[i].kv().key(), absl::StrCat("/w/", i));
    EXPECT_EQ(events[i].kv().mod_revision(), revisions[i]);
  }
  for (int i = 5; i < 8; ++i) {
    EXPECT_EQ(events[i].kv().key(), absl::StrCat("/w/t", i - 4));
    EXPECT_EQ(events[i].kv().mod_revision(), txn->header().revision());
  }
  EXPECT_EQ(events[8].type(), mvccpb::Event::DELETE);
  EXPECT_EQ(events[8].kv().key(), "/w/0");
  EXPECT_EQ(events[8].kv().mod_revision(), deleted->header().revision());
  // The transaction's three events came together, with their revision.
  bool together = false;
  for (const RecordingHandler::Call& call : handler.Calls()) {
    if (!call.events.empty() && call.events.front().kv().key() == "/w/t1") {
      together = call.events.size() == 3 && call.revision == txn->header().revision();
    }
  }
  EXPECT_TRUE(together);
  EXPECT_EQ(handler.LastRevision(), deleted->header().revision());
  EXPECT_EQ(watch->revision(), deleted->header().revision());
  watch->Stop();
  EXPECT_THAT(handler.Violations(), ::testing::IsEmpty());
  EXPECT_FALSE(handler.End().has_value());
}

TEST_F(EtcdClientTest, Watch_FromThePast_ReplaysHistory) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  const int64_t first = Put("/h/a", "1");
  Put("/h/b", "2");
  const int64_t last = Put("/h/a", "3");
  RecordingHandler handler;
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("/h/", EtcdClient::PrefixEnd("/h/"), first, &handler);
  ASSERT_TRUE(Eventually([&] { return handler.EventCount() >= 3; }, "3 events",
                         [&] { return handler.Describe(); }));
  std::vector<mvccpb::Event> events = handler.Events();
  ASSERT_EQ(events.size(), 3);
  EXPECT_EQ(events[0].kv().mod_revision(), first);
  EXPECT_EQ(events[2].kv().mod_revision(), last);
  EXPECT_EQ(events[2].kv().value(), "3");
  watch.reset();
  EXPECT_THAT(handler.Violations(), ::testing::IsEmpty());
}

TEST_F(EtcdClientTest, Compact_ThenWatchFromACompactedRevision_EndsOutOfRange) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  const int64_t r1 = Put("/c/a", "1");
  Put("/c/a", "2");
  const int64_t r3 = Put("/c/a", "3");
  auto compact = [&](int64_t revision) {
    absl::Notification done;
    absl::Status status = absl::UnknownError("no answer");
    client_->CompactAsync(revision, [&](absl::Status s) {
      status = std::move(s);
      done.Notify();
    });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return status;
  };
  ASSERT_THAT(compact(r3), IsOk());
  // Compacted already: not an error.
  EXPECT_THAT(compact(r1), IsOk());
  EXPECT_THAT(compact(r3), IsOk());
  // A future revision is.
  EXPECT_THAT(compact(r3 + 100), StatusIs(absl::StatusCode::kOutOfRange));

  RecordingHandler handler;
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("/c/", EtcdClient::PrefixEnd("/c/"), r1, &handler);
  ASSERT_TRUE(Eventually([&] { return handler.End().has_value(); }, "the watch ends",
                         [&] { return handler.Describe(); }));
  EXPECT_THAT(*handler.End(), StatusIs(absl::StatusCode::kOutOfRange,
                                       HasSubstr(absl::StrCat("compacted revision ", r3))));
  EXPECT_EQ(handler.EventCount(), 0);
  // From the compacted revision on, the history is there.
  RecordingHandler after;
  std::unique_ptr<EtcdWatch> watch2 =
      client_->Watch("/c/", EtcdClient::PrefixEnd("/c/"), r3, &after);
  ASSERT_TRUE(Eventually([&] { return after.EventCount() >= 1; }, "the last put",
                         [&] { return after.Describe(); }));
  EXPECT_EQ(after.Events()[0].kv().mod_revision(), r3);
  watch.reset();
  watch2.reset();
  EXPECT_THAT(handler.Violations(), ::testing::IsEmpty());
  EXPECT_THAT(after.Violations(), ::testing::IsEmpty());
}

TEST_F(EtcdClientTest, Watch_StartRevisionZero_EndsInvalidArgument) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  RecordingHandler handler;
  std::unique_ptr<EtcdWatch> watch = client_->Watch("/z", "", 0, &handler);
  ASSERT_TRUE(handler.End().has_value());
  EXPECT_THAT(*handler.End(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(EtcdClientTest, RequestProgress_DeliversTheCurrentRevision) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  absl::StatusOr<int64_t> start = client_->CurrentRevision("/p/");
  ASSERT_THAT(start.status(), IsOk());
  RecordingHandler handler;
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("/p/", EtcdClient::PrefixEnd("/p/"), *start + 1, &handler);
  // Writes outside the range raise the store's revision; the watch sees no event of them.
  Put("/q/1", "v");
  const int64_t current = Put("/q/2", "v");
  watch->RequestProgress();
  ASSERT_TRUE(Eventually([&] { return handler.SawProgress(current); },
                         absl::StrCat("a progress notification of revision >= ", current),
                         [&] { return handler.Describe(); }));
  EXPECT_EQ(handler.EventCount(), 0);
  EXPECT_GE(watch->revision(), current);
  // Again, after an event in the range.
  const int64_t in_range = Put("/p/1", "v");
  ASSERT_TRUE(Eventually([&] { return handler.EventCount() == 1; }, "the event"));
  const int64_t later = Put("/q/3", "v");
  watch->RequestProgress();
  watch->RequestProgress();  // may share the answer
  ASSERT_TRUE(Eventually([&] { return handler.SawProgress(later); }, "a later progress"));
  EXPECT_GT(later, in_range);
  watch->Stop();
  EXPECT_THAT(handler.Violations(), ::testing::IsEmpty());
}

TEST_F(EtcdClientTest, Stop_WhileEventsFlow_NoHandlerCallAfterItReturns) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  absl::StatusOr<int64_t> start = client_->CurrentRevision("/s/");
  ASSERT_THAT(start.status(), IsOk());
  RecordingHandler stopped;
  stopped.set_delay(absl::Milliseconds(2));  // a handler call is often under way
  RecordingHandler control;                  // the same range, left open
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("/s/", EtcdClient::PrefixEnd("/s/"), *start + 1, &stopped);
  std::unique_ptr<EtcdWatch> control_watch =
      client_->Watch("/s/", EtcdClient::PrefixEnd("/s/"), *start + 1, &control);

  // Writes, many at once, until told to stop.
  std::atomic<bool> writing{true};
  std::atomic<int64_t> written{0};
  std::thread writer([&] {
    for (int i = 0; writing.load(); ++i) {
      absl::StatusOr<etcdserverpb::TxnResponse> r =
          client_->Txn(PutAll({{absl::StrCat("/s/", i % 50), absl::StrCat(i)}}));
      if (r.ok()) written.store(r->header().revision());
    }
  });
  ASSERT_TRUE(Eventually([&] { return stopped.EventCount() >= 50; }, "events flow"));
  watch->Stop();
  stopped.MarkStopped();
  const int64_t stopped_at = written.load();
  // The control watch sees writes made well after Stop: the stopped one would have too.
  ASSERT_TRUE(Eventually([&] { return control.LastRevision() > stopped_at + 50; },
                         "the control watch goes on", [&] { return control.Describe(); }));
  writing.store(false);
  writer.join();
  watch->Stop();  // idempotent
  EXPECT_THAT(stopped.Violations(), ::testing::IsEmpty());
  EXPECT_THAT(control.Violations(), ::testing::IsEmpty());
  EXPECT_LE(stopped.LastRevision(), stopped_at + 1);
  watch.reset();
  control_watch.reset();
}

TEST_F(EtcdClientTest, Watch_OutlivesItsClient) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1));
  absl::StatusOr<int64_t> start = client_->CurrentRevision("/o/");
  ASSERT_THAT(start.status(), IsOk());
  RecordingHandler handler;
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("/o/", EtcdClient::PrefixEnd("/o/"), *start + 1, &handler);
  Put("/o/1", "v");
  ASSERT_TRUE(Eventually([&] { return handler.EventCount() == 1; }, "the event"));
  client_.reset();
  watch->RequestProgress();
  ASSERT_TRUE(Eventually([&] { return handler.SawProgress(*start + 1); }, "a progress"));
  watch->Stop();
}

// ---- TLS ----

TEST_F(EtcdClientTest, Tls_CallsAndWatchesGoOnWhenTheFirstMemberIsKilled) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  ASSERT_NO_FATAL_FAILURE(StartCluster(3, absl::Seconds(5), certs));
  absl::StatusOr<int64_t> start = client_->CurrentRevision("/tls/");
  ASSERT_THAT(start.status(), IsOk());
  RecordingHandler handler;
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("/tls/", EtcdClient::PrefixEnd("/tls/"), *start + 1, &handler);
  const int64_t first = Put("/tls/a", "1");
  ASSERT_TRUE(Eventually([&] { return handler.EventCount() == 1; }, "the first event"));
  // The channel checks every member's certificate against the first endpoint's host, which
  // all of them name; with that member gone, the others still answer.
  cluster_->Kill(0);
  absl::StatusOr<etcdserverpb::TxnResponse> second;
  ASSERT_TRUE(Eventually(
      [&] {
        second = client_->Txn(PutIf("/tls/b", 0, "2"));
        return second.ok();
      },
      "a put with the first member down", [&] { return second.status().ToString(); }));
  ASSERT_TRUE(Eventually([&] { return handler.EventCount() == 2; }, "the second event",
                         [&] { return handler.Describe(); }));
  std::vector<mvccpb::Event> events = handler.Events();
  EXPECT_EQ(events[0].kv().mod_revision(), first);
  EXPECT_EQ(events[1].kv().key(), "/tls/b");
  watch->Stop();
  EXPECT_THAT(handler.Violations(), ::testing::IsEmpty());
}

TEST_F(EtcdClientTest, Tls_ClientWithoutCertificateOrTls_IsRefused) {
  const std::string certs = MakeCerts();
  ASSERT_FALSE(certs.empty());
  ASSERT_NO_FATAL_FAILURE(StartCluster(1, absl::Seconds(5), certs));
  EtcdClient::Options no_certificate;
  no_certificate.endpoints = cluster_->EndpointList();
  no_certificate.ca_file = certs + "/ca.crt";
  no_certificate.request_timeout = absl::Seconds(3);
  EtcdClient::Options plaintext;
  plaintext.endpoints = cluster_->EndpointList();
  plaintext.request_timeout = absl::Seconds(3);
  for (const EtcdClient::Options& options : {no_certificate, plaintext}) {
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
    ASSERT_THAT(client.status(), IsOk());
    EXPECT_THAT((*client)->Txn(PutIf("/x", 0, "v")).status(),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("etcd: ")));
  }
}

// ---- Members that die ----

// Puts /k/0, /k/1, ... one after the other, each once, until Finish (or for 120 s at most): a
// put that fails is tried again, and a key that a failed put created after all is left as it is
// (the create compares mod_revision 0, so a retry cannot put it twice).
class Writer {
 public:
  explicit Writer(EtcdClient* client) : client_(client) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Writer() { Finish(); }
  // Stops writing; returns how many keys were put.
  int Finish() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return written_.load();
  }
  int written() const { return written_.load(); }

 private:
  void Run() {
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    for (int i = 0; !stop_.load() && absl::Now() < deadline;) {
      absl::StatusOr<etcdserverpb::TxnResponse> r =
          client_->Txn(PutIf(absl::StrCat("/k/", i), 0, absl::StrCat(i)));
      if (!r.ok()) {
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      ++i;  // put now, or by an attempt that seemed to fail
      written_.store(i);
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  EtcdClient* const client_;
  std::atomic<bool> stop_{false};
  std::atomic<int> written_{0};
  std::thread thread_;
};

// Every key /k/0 .. /k/<n-1> once, in order, with the revision etcd has for it.
void ExpectEveryKeyOnceInOrder(EtcdClient* client, const RecordingHandler& handler, int n) {
  etcdserverpb::RangeRequest range;
  range.set_key("/k/");
  range.set_range_end(EtcdClient::PrefixEnd("/k/"));
  absl::StatusOr<etcdserverpb::RangeResponse> all = client->Range(range);
  ASSERT_THAT(all.status(), IsOk());
  ASSERT_EQ(all->kvs_size(), n);
  std::map<std::string, int64_t> revision_of;
  for (const mvccpb::KeyValue& kv : all->kvs()) revision_of[kv.key()] = kv.mod_revision();
  std::vector<mvccpb::Event> events = handler.Events();
  ASSERT_EQ(events.size(), n) << handler.Describe();
  for (int i = 0; i < n; ++i) {
    const std::string key = absl::StrCat("/k/", i);
    ASSERT_EQ(events[i].kv().key(), key) << "event " << i;
    EXPECT_EQ(events[i].kv().mod_revision(), revision_of[key]) << key;
  }
}

TEST_F(EtcdClientTest, Watch_MembersKilledInTurn_ReopensAndDeliversEveryEventOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  absl::StatusOr<int64_t> start = client_->CurrentRevision("/k/");
  ASSERT_THAT(start.status(), IsOk());
  RecordingHandler handler;
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("/k/", EtcdClient::PrefixEnd("/k/"), *start + 1, &handler);

  Writer writer(client_.get());
  // Each member in turn (so the one the watch reads from among them): killed while puts go on,
  // then restarted once the puts have gone on without it.
  for (int i = 0; i < cluster_->size(); ++i) {
    const size_t seen = handler.EventCount();
    ASSERT_TRUE(Eventually([&] { return handler.EventCount() >= seen + 30; },
                           absl::StrCat("events before killing member ", i),
                           [&] { return handler.Describe(); }));
    cluster_->Kill(i);
    const size_t at_kill = handler.EventCount();
    ASSERT_TRUE(Eventually([&] { return handler.EventCount() >= at_kill + 30; }, absl::Seconds(60),
                           absl::StrCat("events with member ", i, " down"),
                           [&] { return handler.Describe(); }));
    ASSERT_THAT(cluster_->Restart(i), IsOk());
  }
  const int written = writer.Finish();
  ASSERT_TRUE(Eventually([&] { return handler.EventCount() >= static_cast<size_t>(written); },
                         absl::Seconds(30), "every event", [&] { return handler.Describe(); }));
  // The watch's stream broke at least once (its member was killed) and was reopened.
  EXPECT_GE(LogLines("the stream ended"), 1);
  ExpectEveryKeyOnceInOrder(client_.get(), handler, written);
  watch->Stop();
  EXPECT_THAT(handler.Violations(), ::testing::IsEmpty());
  EXPECT_FALSE(handler.End().has_value());
}

TEST_F(EtcdClientTest, Watch_TwoOfThreeKilled_ResumesAfterRestart) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  absl::StatusOr<int64_t> start = client_->CurrentRevision("/k/");
  ASSERT_THAT(start.status(), IsOk());
  RecordingHandler handler;
  std::unique_ptr<EtcdWatch> watch =
      client_->Watch("/k/", EtcdClient::PrefixEnd("/k/"), *start + 1, &handler);
  Writer writer(client_.get());
  ASSERT_TRUE(Eventually([&] { return handler.EventCount() >= 30; }, "events",
                         [&] { return handler.Describe(); }));
  // No quorum: whichever member the watch was on, its stream ends (killed, or no leader).
  cluster_->Kill(0);
  cluster_->Kill(1);
  ASSERT_TRUE(Eventually([&] { return LogLines("the stream ended") >= 1; }, absl::Seconds(30),
                         "the watch's stream ends"));
  ASSERT_THAT(cluster_->Restart(0), IsOk());
  ASSERT_THAT(cluster_->Restart(1), IsOk());
  const size_t at_restart = handler.EventCount();
  ASSERT_TRUE(Eventually([&] { return handler.EventCount() >= at_restart + 30; }, absl::Seconds(30),
                         "events after the restart", [&] { return handler.Describe(); }));
  const int written = writer.Finish();
  ASSERT_TRUE(Eventually([&] { return handler.EventCount() >= static_cast<size_t>(written); },
                         absl::Seconds(30), "every event", [&] { return handler.Describe(); }));
  ExpectEveryKeyOnceInOrder(client_.get(), handler, written);
  watch->Stop();
  EXPECT_THAT(handler.Violations(), ::testing::IsEmpty());
}

TEST_F(EtcdClientTest, Txn_OneOfThreeAlive_FailsUnavailableInTime_ThenSucceedsAfterRestart) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3, /*request_timeout=*/absl::Seconds(3)));
  ASSERT_THAT(client_->Txn(PutIf("/q/a", 0, "1")).status(), IsOk());
  cluster_->Kill(0);
  cluster_->Kill(1);
  const absl::Time begin = absl::Now();
  absl::StatusOr<etcdserverpb::TxnResponse> r = client_->Txn(PutIf("/q/b", 0, "1"));
  const absl::Duration took = absl::Now() - begin;
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("etcd: ")));
  EXPECT_LT(took, absl::Seconds(3) + absl::Seconds(2));
  // Every member that is left says so too, at once or by the deadline.
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(client_->Txn(PutIf("/q/b", 0, "1")).status(),
                StatusIs(absl::StatusCode::kUnavailable));
  }

  ASSERT_THAT(cluster_->Restart(1), IsOk());
  absl::Status last;
  ASSERT_TRUE(Eventually(
      [&] {
        last = client_->Txn(PutIf("/q/c", 0, "1")).status();
        return last.ok();
      },
      absl::Seconds(30), "a Txn succeeds with two of three", [&] { return last.ToString(); }));
}

}  // namespace
}  // namespace shardcache
