// TLS, client certificates and the authorization policy of cache_server, end to end: real
// servers on loopback with certificates made by scripts/make-certs.sh, and clients that present
// them.
//
// Each denial test compares every store's full state (a List of every resource, with the
// store's revision) before and after, so a write that was refused but still applied fails it;
// each ends with the allowed counterpart, which shows that the refusals were the policy's.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/wait.h"
#include "integration_tests/refuse_to_start.h"
#include "integration_tests/replicator_fixture.h"
#include "integration_tests/security_certs.h"
#include "integration_tests/store_fixture.h"
#include "integration_tests/watch_reader.h"

namespace shardcache::testing {
namespace {

v1::Object CopyOf(const std::string& name, const std::string& shard) {
  v1::Object o = Widget(name);
  o.mutable_metadata()->set_shard(shard);
  return o;
}

v1::Object Lease(const std::string& holder) {
  return FromJson<v1::Object>(absl::StrCat(R"({"metadata":{"cluster":")", kLeaseCluster,
                                           R"(","namespace":")", kLeaseNamespace, R"(","name":")",
                                           kLeaseName, R"("},"spec":{"holderIdentity":")", holder,
                                           R"(","leaseDurationSeconds":15}})"));
}

v1::Fence Fence(const std::string& shard, int64_t epoch) {
  v1::Fence f;
  f.set_shard(shard);
  f.set_epoch(epoch);
  return f;
}

// The certificate an HTTPS server on 127.0.0.1:port presents, as PEM ("" when none), read with
// openssl s_client.
std::string HttpsCertificate(int port) {
  std::string command = absl::StrCat("openssl s_client -connect 127.0.0.1:", port,
                                     " </dev/null 2>/dev/null | openssl x509 2>/dev/null");
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The call was refused by the policy: PERMISSION_DENIED naming the user, the verb and the
// resource.
::testing::AssertionResult Denied(const grpc::Status& s, const std::string& user,
                                  const std::string& verb, const std::string& resource) {
  if (s.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
    return ::testing::AssertionFailure()
           << "want PERMISSION_DENIED, got " << s.error_code() << " " << s.error_message();
  }
  for (const std::string& part :
       {absl::StrCat("user \"", user, "\""), absl::StrCat(" cannot ", verb, " "), resource}) {
    if (s.error_message().find(part) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "the message does not mention " << part << ": " << s.error_message();
    }
  }
  return ::testing::AssertionSuccess();
}

class SecurityTest : public ReplicatorFixture {
 protected:
  void SetUp() override { security_ = true; }

  const TestCertificates& certs() { return TestCertificates::Shared(); }

  // A stub on a channel of its own to `store`, presenting `who`'s certificate ("" for none).
  std::unique_ptr<v1::Store::Stub> StubAs(const Store& store, const std::string& who,
                                          const TestCertificates* from = nullptr) {
    const TestCertificates& c = from != nullptr ? *from : certs();
    return v1::Store::NewStub(grpc::CreateChannel(store.address(), c.Credentials(who)));
  }

  // A store's whole state, read as the admin: every object of the resources these tests touch,
  // and the store's revision, in deterministic bytes.
  std::string Snapshot(v1::Store::Stub* stub) {
    std::string out;
    for (const v1::GroupVersionResource& gvr :
         {WidgetsGvr(), CcrGvr(), LeaseGvr(), DefinitionGvr()}) {
      v1::ListRequest req;
      *req.mutable_resource() = gvr;
      v1::ListResponse resp;
      grpc::Status s = stub->List(Context().get(), req, &resp);
      if (!s.ok()) ADD_FAILURE() << "List " << gvr.resource() << ": " << s.error_message();
      google::protobuf::io::StringOutputStream bytes(&out);
      google::protobuf::io::CodedOutputStream coded(&bytes);
      coded.SetSerializationDeterministic(true);
      resp.SerializeToCodedStream(&coded);
    }
    return out;
  }

  // Sends `writes` on one Write stream and returns the answers.
  std::vector<v1::WriteResponse> WriteAll(v1::Store::Stub* stub,
                                          const std::vector<v1::WriteRequest>& writes) {
    auto ctx = Context();
    auto stream = stub->Write(ctx.get());
    for (const v1::WriteRequest& w : writes) stream->Write(w);
    stream->WritesDone();
    std::vector<v1::WriteResponse> answers;
    v1::WriteResponse answer;
    while (stream->Read(&answer)) answers.push_back(answer);
    grpc::Status s = stream->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    return answers;
  }

  // The certificate the server presented on the connection a call of `stub` went over.
  static std::string ServedCertificate(v1::Store::Stub* stub) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ListRequest req;
    *req.mutable_resource() = WidgetsGvr();
    v1::ListResponse resp;
    if (!stub->List(&ctx, req, &resp).ok() || ctx.auth_context() == nullptr) return "";
    auto pem = ctx.auth_context()->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
    return pem.empty() ? "" : std::string(pem[0].data(), pem[0].size());
  }
};

v1::WriteRequest WriteOf(int64_t id, const v1::GroupVersionResource& gvr, const v1::Object& obj,
                         bool upsert) {
  v1::WriteRequest w;
  w.set_id(id);
  v1::UpdateRequest* u = upsert ? w.mutable_upsert() : w.mutable_update();
  *u->mutable_resource() = gvr;
  *u->mutable_object() = obj;
  return w;
}

TEST_F(SecurityTest, ReplicatorOfAnotherShardCannotTouchShardAsPart) {
  ASSERT_NO_FATAL_FAILURE(StartShardStore("a"));
  ASSERT_NO_FATAL_FAILURE(StartShardStore("b"));
  ASSERT_NO_FATAL_FAILURE(StartCache());
  v1::Object w1;
  ASSERT_TRUE(CreateIn(cache(), WidgetsGvr(), CopyOf("w1", "a"), &w1).ok());
  ASSERT_TRUE(CreateIn(shard("a"), LeaseGvr(), Lease("replica-a")).ok());
  ASSERT_TRUE(CreateIn(shard("a"), CcrGvr(), Ccr("widgets")).ok());
  const std::string cache_before = Snapshot(cache());
  const std::string shard_before = Snapshot(shard("a"));

  const std::string b = "shardcache:replicator:b";
  auto b_cache = StubAs(cache_, "replicator-b");
  auto b_shard_a = StubAs(shards_.at("a"), "replicator-b");
  v1::Object out;
  {
    SCOPED_TRACE("the cache: a's copies");
    v1::CreateRequest create;
    *create.mutable_resource() = WidgetsGvr();
    *create.mutable_object() = CopyOf("w2", "a");
    EXPECT_TRUE(
        Denied(b_cache->Create(Context().get(), create, &out), b, "create", "widgets.example.com"));
    v1::UpdateRequest update;
    *update.mutable_resource() = WidgetsGvr();
    *update.mutable_object() = w1;
    (*update.mutable_object()->mutable_spec()->mutable_fields())["size"].set_number_value(9);
    EXPECT_TRUE(
        Denied(b_cache->Update(Context().get(), update, &out), b, "update", "of shard \"a\""));
    EXPECT_TRUE(Denied(b_cache->UpdateStatus(Context().get(), update, &out), b, "update",
                       "widgets.example.com/status"));
    v1::DeleteRequest del;
    *del.mutable_resource() = WidgetsGvr();
    del.set_shard("a");
    del.set_cluster(kCluster);
    del.set_namespace_(kNamespace);
    del.set_name("w1");
    v1::DeleteResponse deleted;
    EXPECT_TRUE(
        Denied(b_cache->Delete(Context().get(), del, &deleted), b, "delete", "of shard \"a\""));
    // Through the Write stream: each write answered PERMISSION_DENIED, the stream goes on.
    v1::WriteRequest wdel;
    wdel.set_id(3);
    *wdel.mutable_delete_() = del;
    std::vector<v1::WriteResponse> answers = WriteAll(
        b_cache.get(), {WriteOf(1, WidgetsGvr(), CopyOf("w3", "a"), /*upsert=*/true),
                        WriteOf(2, WidgetsGvr(), update.object(), /*upsert=*/false), wdel});
    ASSERT_EQ(answers.size(), 3u);
    for (const v1::WriteResponse& a : answers) {
      EXPECT_EQ(a.code(), grpc::StatusCode::PERMISSION_DENIED) << ToJson(a);
      EXPECT_NE(a.message().find(b), std::string::npos) << a.message();
    }
  }
  {
    SCOPED_TRACE("the cache: a's epoch, directly and as a write's fence");
    v1::ClaimEpochRequest claim;
    *claim.mutable_fence() = Fence("a", 100);
    v1::ClaimEpochResponse claimed;
    EXPECT_TRUE(Denied(b_cache->ClaimEpoch(Context().get(), claim, &claimed), b, "claim",
                       "the epoch of shard \"a\""));
    v1::CreateRequest fenced;
    *fenced.mutable_resource() = WidgetsGvr();
    *fenced.mutable_object() = CopyOf("b1", "b");
    *fenced.mutable_fence() = Fence("a", 100);
    EXPECT_TRUE(
        Denied(b_cache->Create(Context().get(), fenced, &out), b, "create", "shard \"a\"'s"));
  }
  {
    SCOPED_TRACE("shard a's store: the lease and the CCRs");
    std::optional<v1::Object> lease = GetLease("a");
    ASSERT_TRUE(lease.has_value());
    lease->mutable_spec()->mutable_fields()->at("holderIdentity").set_string_value("replica-b");
    v1::UpdateRequest take;
    *take.mutable_resource() = LeaseGvr();
    *take.mutable_object() = *lease;
    EXPECT_TRUE(Denied(b_shard_a->Update(Context().get(), take, &out), b, "update",
                       "leases.coordination.shardcache.io"));
    v1::DeleteRequest drop;
    *drop.mutable_resource() = LeaseGvr();
    drop.set_cluster(kLeaseCluster);
    drop.set_namespace_(kLeaseNamespace);
    drop.set_name(kLeaseName);
    v1::DeleteResponse deleted;
    EXPECT_TRUE(Denied(b_shard_a->Delete(Context().get(), drop, &deleted), b, "delete",
                       "leases.coordination.shardcache.io"));
    v1::UpdateRequest status;
    *status.mutable_resource() = CcrGvr();
    std::optional<v1::Object> stored = GetCcr("widgets", "a");
    ASSERT_TRUE(stored.has_value());
    *status.mutable_object() = *stored;
    (*status.mutable_object()->mutable_status()->mutable_fields())["phase"].set_string_value(
        "Ready");
    EXPECT_TRUE(Denied(b_shard_a->UpdateStatus(Context().get(), status, &out), b, "update",
                       "clustercachedresources.cache.shardcache.io/status"));
  }
  EXPECT_EQ(Snapshot(cache()), cache_before);
  EXPECT_EQ(Snapshot(shard("a")), shard_before);

  // What each replicator may do: b its own copies; a its epoch (1: b's claim of 100 was not
  // recorded), its lease, its CCRs' status and finalizers, but not their spec.
  auto a_cache = StubAs(cache_, "replicator-a");
  auto a_shard_a = StubAs(shards_.at("a"), "replicator-a");
  v1::CreateRequest own;
  *own.mutable_resource() = WidgetsGvr();
  *own.mutable_object() = CopyOf("b1", "b");
  EXPECT_TRUE(Ok(b_cache->Create(Context().get(), own, &out)));
  v1::ClaimEpochRequest claim;
  *claim.mutable_fence() = Fence("a", 1);
  v1::ClaimEpochResponse claimed;
  EXPECT_TRUE(Ok(a_cache->ClaimEpoch(Context().get(), claim, &claimed)));
  EXPECT_EQ(claimed.epoch(), 1);
  v1::UpdateRequest take;
  *take.mutable_resource() = LeaseGvr();
  std::optional<v1::Object> lease = GetLease("a");
  ASSERT_TRUE(lease.has_value());
  *take.mutable_object() = *lease;
  take.mutable_object()
      ->mutable_spec()
      ->mutable_fields()
      ->at("holderIdentity")
      .set_string_value("replica-a2");
  EXPECT_TRUE(Ok(a_shard_a->Update(Context().get(), take, &out)));
  v1::UpdateRequest ccr;
  *ccr.mutable_resource() = CcrGvr();
  std::optional<v1::Object> stored = GetCcr("widgets", "a");
  ASSERT_TRUE(stored.has_value());
  *ccr.mutable_object() = *stored;
  (*ccr.mutable_object()->mutable_spec()->mutable_fields())["resource"].set_string_value("gadgets");
  EXPECT_TRUE(Denied(a_shard_a->Update(Context().get(), ccr, &out), "shardcache:replicator:a",
                     "update", "only the finalizers"));
  *ccr.mutable_object() = *stored;
  ccr.mutable_object()->mutable_metadata()->clear_resource_version();
  ccr.mutable_object()->mutable_metadata()->add_finalizers(kFinalizer);
  EXPECT_TRUE(Ok(a_shard_a->Update(Context().get(), ccr, &out)));
  EXPECT_EQ(out.metadata().finalizers_size(), 1);
  EXPECT_TRUE(Ok(a_shard_a->UpdateStatus(Context().get(), ccr, &out)));
  // b may not even read-modify-write in shard a's store what a may.
  EXPECT_TRUE(
      Denied(b_shard_a->Update(Context().get(), take, &out), b, "update", "shard \"a\"'s store"));
}

TEST_F(SecurityTest, ReaderCanReadButNotWrite) {
  ASSERT_NO_FATAL_FAILURE(StartCache());
  v1::Object w1;
  ASSERT_TRUE(CreateIn(cache(), WidgetsGvr(), CopyOf("w1", "a"), &w1).ok());
  const std::string before = Snapshot(cache());
  auto reader = StubAs(cache_, "reader");
  const std::string user = "reader";

  v1::GetRequest get;
  *get.mutable_resource() = WidgetsGvr();
  get.set_shard("a");
  get.set_cluster(kCluster);
  get.set_namespace_(kNamespace);
  get.set_name("w1");
  v1::Object out;
  EXPECT_TRUE(Ok(reader->Get(Context().get(), get, &out)));
  v1::ListRequest list;
  *list.mutable_resource() = WidgetsGvr();
  v1::ListResponse listed;
  EXPECT_TRUE(Ok(reader->List(Context().get(), list, &listed)));
  EXPECT_EQ(listed.items_size(), 1);
  v1::WatchRequest watch;
  *watch.mutable_resource() = WidgetsGvr();
  WatchReader watcher(reader.get(), watch);
  EXPECT_EQ(watcher.TakeInitial().size(), 1u);

  v1::CreateRequest create;
  *create.mutable_resource() = WidgetsGvr();
  *create.mutable_object() = CopyOf("w2", "a");
  EXPECT_TRUE(
      Denied(reader->Create(Context().get(), create, &out), user, "create", "widgets.example.com"));
  v1::UpdateRequest update;
  *update.mutable_resource() = WidgetsGvr();
  *update.mutable_object() = w1;
  EXPECT_TRUE(
      Denied(reader->Update(Context().get(), update, &out), user, "update", "widgets.example.com"));
  v1::DeleteRequest del;
  *del.mutable_resource() = WidgetsGvr();
  del.set_shard("a");
  del.set_cluster(kCluster);
  del.set_namespace_(kNamespace);
  del.set_name("w1");
  v1::DeleteResponse deleted;
  EXPECT_TRUE(Denied(reader->Delete(Context().get(), del, &deleted), user, "delete",
                     "widgets.example.com"));
  v1::ClaimEpochRequest claim;
  *claim.mutable_fence() = Fence("a", 5);
  v1::ClaimEpochResponse claimed;
  EXPECT_TRUE(
      Denied(reader->ClaimEpoch(Context().get(), claim, &claimed), user, "claim", "shard \"a\""));
  std::vector<v1::WriteResponse> answers =
      WriteAll(reader.get(), {WriteOf(1, WidgetsGvr(), CopyOf("w3", "a"), /*upsert=*/true)});
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].code(), grpc::StatusCode::PERMISSION_DENIED) << ToJson(answers[0]);

  EXPECT_EQ(Snapshot(cache()), before);
  // The refusals changed nothing: the watch sees the admin's next write as its first event.
  ASSERT_TRUE(CreateIn(cache(), WidgetsGvr(), CopyOf("w4", "a")).ok());
  std::optional<v1::WatchEvent> next = watcher.NextObjectEvent();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->object().metadata().name(), "w4");
  EXPECT_GE(Metric(cache_.process->http_port(), "shardcache_authorization_decisions_total",
                   {"decision=\"deny\"", "verb=\"create\""}),
            1);
}

// The identity headers with which the Kubernetes view hands its clients' identities to the Store
// service over its in-process channel are honoured only with the process's own secret token: a
// network client that sends them, with any token, is still the identity of its certificate.
TEST_F(SecurityTest, DelegationHeadersFromTheNetworkAreIgnored) {
  ASSERT_NO_FATAL_FAILURE(StartCache());
  const std::string before = Snapshot(cache());
  auto reader = StubAs(cache_, "reader");
  v1::CreateRequest create;
  *create.mutable_resource() = WidgetsGvr();
  *create.mutable_object() = CopyOf("w1", "a");
  for (const std::string& token : {std::string(32, '\0'), std::string("guess"), std::string()}) {
    auto ctx = Context();
    ctx->AddMetadata("shardcache-delegation-token-bin", token);
    ctx->AddMetadata("shardcache-delegated-user-bin", "admin");
    ctx->AddMetadata("shardcache-delegated-group-bin", "shardcache:admins");
    v1::Object out;
    EXPECT_TRUE(
        Denied(reader->Create(ctx.get(), create, &out), "reader", "create", "widgets.example.com"));
  }
  EXPECT_EQ(Snapshot(cache()), before);
}

TEST_F(SecurityTest, UntrustedClientsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(StartCache());
  const int http = cache_.process->http_port();
  v1::ListRequest list;
  *list.mutable_resource() = WidgetsGvr();
  v1::ListResponse out;

  // No certificate: the handshake succeeds (health and reflection stay reachable), the Store
  // service answers UNAUTHENTICATED.
  auto anonymous = StubAs(cache_, "");
  grpc::Status s = anonymous->List(Context().get(), list, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_EQ(Metric(http, "shardcache_unauthenticated_requests_total"), 1);

  // A certificate from another CA, and an expired one from the right CA: the handshake fails.
  absl::StatusOr<TestCertificates> other = TestCertificates::Make({"a"});
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<TestCertificates> expired = TestCertificates::Make({"a"}, -1, certs().dir());
  ASSERT_TRUE(expired.ok()) << expired.status();
  double failures = Metric(http, "shardcache_tls_handshake_failures_total");
  ASSERT_EQ(failures, 0);
  struct Case {
    const char* what;
    TlsFiles files;
  };
  TlsFiles other_ca = other->Client("admin");
  other_ca.ca_file = certs().Path("ca.crt");  // trusts the server; the server does not trust it
  TlsFiles expired_admin = expired->Client("admin");
  for (const Case& c : {Case{"another CA's certificate", other_ca},
                        Case{"an expired certificate", expired_admin}}) {
    SCOPED_TRACE(c.what);
    auto stub =
        v1::Store::NewStub(grpc::CreateChannel(cache_.address(), MakeChannelCredentials(c.files)));
    grpc::Status refused = stub->List(FailFastContext(absl::Seconds(5)).get(), list, &out);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    EXPECT_TRUE(Eventually(
        [&] { return Metric(http, "shardcache_tls_handshake_failures_total") > failures; },
        "the failed handshake is counted"));
    failures = Metric(http, "shardcache_tls_handshake_failures_total");
  }
  // A plaintext client gets no answer either.
  auto plaintext =
      v1::Store::NewStub(grpc::CreateChannel(cache_.address(), grpc::InsecureChannelCredentials()));
  EXPECT_FALSE(plaintext->List(FailFastContext(absl::Seconds(5)).get(), list, &out).ok());
  // The same calls with the admin's valid certificate succeed.
  EXPECT_TRUE(Ok(StubAs(cache_, "admin")->List(Context().get(), list, &out)));
  EXPECT_EQ(Metric(http, "shardcache_unauthenticated_requests_total"), 1);
}

TEST_F(SecurityTest, RotatedServerCertificateServedToNewConnectionsWhileOldStreamsGoOn) {
  // Leaf certificates of the shared CA in a directory of this test's own, to rotate them.
  absl::StatusOr<TestCertificates> mine = TestCertificates::Make({"a"}, 30, certs().dir());
  ASSERT_TRUE(mine.ok()) << mine.status();
  std::vector<std::string> args = mine->ServerArgs();
  args.push_back("--role=cache");
  cache_.process =
      std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"), std::move(args));
  ASSERT_NO_FATAL_FAILURE(RestartStore(&cache_));

  const std::string old_pem = ReadFile(mine->Path("server.crt"));
  EXPECT_EQ(ServedCertificate(cache()), old_pem);
  v1::WatchRequest watch;
  *watch.mutable_resource() = WidgetsGvr();
  WatchReader old_stream(cache(), watch);
  ASSERT_TRUE(old_stream.SkipInitial());

  ASSERT_TRUE(mine->Renew().ok());
  const std::string new_pem = ReadFile(mine->Path("server.crt"));
  ASSERT_NE(new_pem, old_pem);
  std::string served;
  EXPECT_TRUE(Eventually(
      [&] {
        served = ServedCertificate(StubAs(cache_, "admin").get());
        return served == new_pem;
      },
      "a new connection is served the new certificate",
      [&] { return served == old_pem ? "still the old one" : "another: " + served; }));
  // The connection made before goes on with the old one, and its watch with it.
  EXPECT_EQ(ServedCertificate(cache()), old_pem);
  ASSERT_TRUE(CreateIn(cache(), WidgetsGvr(), CopyOf("after-rotation", "a")).ok());
  std::optional<v1::WatchEvent> event = old_stream.NextObjectEvent();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->object().metadata().name(), "after-rotation");
  EXPECT_FALSE(old_stream.WaitForEnd(absl::ZeroDuration()).has_value());
}

TEST_F(SecurityTest, ReplicatorPresentsARenewedClientCertificateOnItsNextConnections) {
  ASSERT_NO_FATAL_FAILURE(StartShardStore("a"));
  ASSERT_NO_FATAL_FAILURE(StartCache());
  // The replicator's certificate files hold the reader's certificate for now: valid, but the
  // stores refuse the reader's lease writes, so it cannot lead.
  absl::StatusOr<TestCertificates> mine = TestCertificates::Make({"a"}, 30, certs().dir());
  ASSERT_TRUE(mine.ok()) << mine.status();
  for (const char* ext : {".crt", ".key"}) {
    std::filesystem::copy_file(mine->Path(std::string("reader") + ext),
                               mine->Path(std::string("replicator-a") + ext),
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::vector<std::string> args = ReplicatorArgs("a", "replica-0");
  for (std::string& arg : args) {
    for (const char* flag : {"cert-file=", "key-file="}) {
      size_t at = arg.find(flag);
      if (at == std::string::npos) continue;
      std::string file = arg.substr(arg.rfind('/') + 1);
      arg = arg.substr(0, at + strlen(flag)) + mine->Path(file);
    }
  }
  auto replica =
      std::make_unique<ServerProcess>(BinaryPath("shard_replicator/shard_replicator"), args);
  ASSERT_TRUE(replica->Start().ok());
  replicators_.push_back(std::move(replica));
  ServerProcess* r = replicators_.back().get();
  EXPECT_TRUE(Eventually(
      [&] {
        return Metric(shards_.at("a").process->http_port(),
                      "shardcache_authorization_decisions_total",
                      {"decision=\"deny\"", "verb=\"create\""}) >= 1;
      },
      "the shard store denies the reader's lease write"));
  EXPECT_NE(Leading(r), 1);

  // Renewed in place (now the replicator's own certificate): gRPC rereads the files, and the
  // connections made after that present it. Open connections keep theirs, so the stores are
  // restarted (as a rotation's rolling restart would) until the replicator has reconnected
  // with the new certificate.
  ASSERT_TRUE(mine->Renew().ok());
  EXPECT_TRUE(Eventually(
      [&] {
        KillStore(&shards_.at("a"));
        RestartStore(&shards_.at("a"));
        KillStore(&cache_);
        RestartStore(&cache_);
        return static_cast<bool>(WaitForLeading(r, 1, absl::Seconds(5)));
      },
      absl::Seconds(60), "the replicator leads once it reconnects with its new certificate"));
  ASSERT_TRUE(CreateIn(shard("a"), CcrGvr(), Ccr("widgets")).ok());
  ASSERT_TRUE(CreateIn(shard("a"), WidgetsGvr(), Widget("w1")).ok());
  EXPECT_TRUE(WaitForReady("widgets", 1));
  EXPECT_TRUE(WaitForCacheInSync());
}

TEST_F(SecurityTest, HttpEndpointOverTlsWithRotation) {
  absl::StatusOr<TestCertificates> mine = TestCertificates::Make({"a"}, 30, certs().dir());
  ASSERT_TRUE(mine.ok()) << mine.status();
  std::vector<std::string> args = mine->ServerArgs();
  args.insert(args.end(), {"--role=cache", "--http-tls"});
  cache_.process =
      std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"), std::move(args));
  ASSERT_NO_FATAL_FAILURE(RestartStore(&cache_));
  const int port = cache_.process->http_port();

  httplib::SSLClient client("127.0.0.1", port);
  client.set_ca_cert_path(mine->Path("ca.crt").c_str());
  client.enable_server_certificate_verification(true);
  httplib::Result healthz = client.Get("/healthz");
  ASSERT_TRUE(healthz) << httplib::to_string(healthz.error());
  EXPECT_EQ(healthz->status, 200);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_NE(metrics->body.find("shardcache_tls_handshake_failures_total"), std::string::npos);
  // Plain HTTP gets no page.
  EXPECT_FALSE(absl::StartsWith(HttpGet(port, "/healthz"), "200"));

  const std::string old_pem = ReadFile(mine->Path("server.crt"));
  EXPECT_EQ(HttpsCertificate(port), old_pem);
  ASSERT_TRUE(mine->Renew().ok());
  const std::string new_pem = ReadFile(mine->Path("server.crt"));
  ASSERT_NE(new_pem, old_pem);
  EXPECT_TRUE(Eventually([&] { return HttpsCertificate(port) == new_pem; },
                         "the HTTPS endpoint serves the new certificate"));
}

TEST_F(SecurityTest, ServerWhoseCertificateDoesNotNameItIsRefused) {
  // A certificate of the right CA that names another host: "cache" only.
  absl::StatusOr<TestCertificates> other_name = TestCertificates::Make({"a"}, 30, certs().dir());
  ASSERT_TRUE(other_name.ok()) << other_name.status();
  std::string dir = other_name->dir();
  ASSERT_EQ(std::system(absl::StrCat("cd '", dir,
                                     "' && openssl req -new -key server.key -subj /CN=cache "
                                     "-out n.csr 2>/dev/null && printf "
                                     "'subjectAltName=DNS:cache\\nextendedKeyUsage=serverAuth\\n' "
                                     ">n.ext && openssl x509 -req -in n.csr -CA ca.crt -CAkey "
                                     "ca.key -CAcreateserial -days 30 -extfile n.ext -out "
                                     "server.crt 2>/dev/null")
                            .c_str()),
            0);
  std::vector<std::string> args = other_name->ServerArgs();
  args.push_back("--role=cache");
  ServerProcess server(BinaryPath("cache_server/cache_server"), args);
  ASSERT_TRUE(server.Start().ok());
  auto stub =
      v1::Store::NewStub(grpc::CreateChannel(server.grpc_address(), certs().Credentials("admin")));
  v1::ListRequest list;
  *list.mutable_resource() = WidgetsGvr();
  v1::ListResponse out;
  grpc::Status s = stub->List(FailFastContext(absl::Seconds(5)).get(), list, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // The same server, called by the name its certificate gives, is trusted.
  grpc::ChannelArguments by_name;
  by_name.SetSslTargetNameOverride("cache");
  auto named = v1::Store::NewStub(
      grpc::CreateCustomChannel(server.grpc_address(), certs().Credentials("admin"), by_name));
  EXPECT_TRUE(Ok(named->List(Context().get(), list, &out)));
}

TEST_F(SecurityTest, BadTlsFlagsAreRefused) {
  const TestCertificates& c = certs();
  ExpectRefused(RunCacheServer({"--client-ca-file=" + c.Path("ca.crt")}), "--client-ca-file");
  ExpectRefused(RunCacheServer({"--tls-cert-file=" + c.Path("server.crt"),
                                "--tls-key-file=" + c.Path("admin.key")}),
                "does not match");
  ExpectRefused(RunCacheServer({"--tls-cert-file=" + c.Path("server.crt")}), "--tls-key-file");
  std::vector<std::string> shard = c.ServerArgs();
  shard.push_back("--role=shard");
  ExpectRefused(RunCacheServer(shard), "--shard");
  ExpectRefused(RunCacheServer({"--authorization-mode=Policy"}), "--client-ca-file");
  ExpectRefused(
      RunReplicatorToExit({"--shard=a", "--shard-store=127.0.0.1:1", "--cache=127.0.0.1:2",
                           "--cache-cert-file=" + c.Path("replicator-a.crt")}),
      "--cache-key-file");
}

}  // namespace
}  // namespace shardcache::testing
