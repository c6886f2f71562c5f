#include "integration_tests/replicator_fixture.h"

#include <google/protobuf/util/message_differencer.h>
#include <sys/wait.h>

#include <csignal>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "integration_tests/refuse_to_start.h"

namespace shardcache::testing {
namespace {

const google::protobuf::Value* Field(const google::protobuf::Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}

std::string StringField(const google::protobuf::Struct& s, const std::string& name) {
  const google::protobuf::Value* v = Field(s, name);
  return v != nullptr && v->has_string_value() ? v->string_value() : "";
}

std::string Key(const v1::Object& o) {
  return absl::StrCat(o.metadata().namespace_(), "/", o.metadata().name());
}

}  // namespace

v1::GroupVersionResource WidgetsGvr() { return Gvr("example.com", "v1", "widgets"); }
v1::GroupVersionResource CcrGvr() {
  return Gvr("cache.shardcache.io", "v1alpha1", "clustercachedresources");
}
v1::GroupVersionResource LeaseGvr() { return Gvr("coordination.shardcache.io", "v1", "leases"); }

v1::Object Widget(const std::string& name, const std::string& labels, const std::string& spec) {
  return FromJson<v1::Object>(absl::StrCat(R"({"metadata":{"cluster":")", kCluster,
                                           R"(","namespace":")", kNamespace, R"(","name":")", name,
                                           R"(","labels":)", labels, R"(},"spec":)", spec, "}"));
}

v1::Object Ccr(const std::string& name, const std::string& label_selector,
               const std::string& cluster, const v1::GroupVersionResource& gvr) {
  std::string spec = absl::StrCat(R"({"group":")", gvr.group(), R"(","version":")", gvr.version(),
                                  R"(","resource":")", gvr.resource(), "\"");
  if (!label_selector.empty()) absl::StrAppend(&spec, R"(,"labelSelector":)", label_selector);
  spec += "}";
  return FromJson<v1::Object>(absl::StrCat(R"({"metadata":{"cluster":")", cluster, R"(","name":")",
                                           name, R"("},"spec":)", spec, "}"));
}

std::string Phase(const v1::Object& ccr) { return StringField(ccr.status(), "phase"); }

ConditionView FindCondition(const v1::Object& ccr, const std::string& type) {
  const google::protobuf::Value* conditions = Field(ccr.status(), "conditions");
  if (conditions == nullptr || !conditions->has_list_value()) return {};
  for (const google::protobuf::Value& c : conditions->list_value().values()) {
    if (!c.has_struct_value() || StringField(c.struct_value(), "type") != type) continue;
    return {StringField(c.struct_value(), "status"), StringField(c.struct_value(), "reason"),
            StringField(c.struct_value(), "message")};
  }
  return {};
}

double ResourceCount(const v1::Object& ccr, const std::string& which) {
  const google::protobuf::Value* counts = Field(ccr.status(), "resourceCounts");
  if (counts == nullptr || !counts->has_struct_value()) return -1;
  const google::protobuf::Value* v = Field(counts->struct_value(), which);
  return v != nullptr && v->has_number_value() ? v->number_value() : -1;
}

std::string DescribeStatus(const v1::Object& ccr) {
  std::string out = absl::StrCat("phase=", Phase(ccr));
  for (const char* type : {"ResourceValid", "ReplicationStarted"}) {
    ConditionView c = FindCondition(ccr, type);
    absl::StrAppend(&out, " ", type, "=", c.status, "(", c.reason, ": ", c.message, ")");
  }
  absl::StrAppend(&out, " counts={local:", ResourceCount(ccr, "local"),
                  ", cache:", ResourceCount(ccr, "cache"), "}");
  absl::StrAppend(&out, " finalizers=[", absl::StrJoin(ccr.metadata().finalizers(), ","), "]");
  if (ccr.metadata().has_deletion_timestamp()) out += " deleting";
  return out;
}

std::string CopyDiff(const v1::Object& origin, const v1::Object& copy, const std::string& shard) {
  v1::Object want = origin;
  want.mutable_metadata()->set_shard(shard);
  want.mutable_metadata()->clear_resource_version();
  want.mutable_metadata()->clear_finalizers();
  want.mutable_metadata()->clear_deletion_timestamp();
  (*want.mutable_metadata()->mutable_annotations())[kOriginalRvAnnotation] =
      origin.metadata().resource_version();
  (*want.mutable_metadata()->mutable_annotations())[kOriginalUidAnnotation] =
      origin.metadata().uid();
  v1::Object got = copy;
  got.mutable_metadata()->clear_resource_version();
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  if (differ.Compare(want, got)) return "";
  return absl::StrCat("copy of ", Key(origin), " differs from its origin (want ", ToJson(want),
                      ", got ", ToJson(got), "): ", diff);
}

double StatusEpoch(const v1::Object& ccr) {
  const google::protobuf::Value* v = Field(ccr.status(), "epoch");
  return v != nullptr && v->has_number_value() ? v->number_value() : -1;
}

std::string WhyLastKnown(const v1::Object& ccr, const v1::Object& lease, absl::Time now) {
  double epoch = StatusEpoch(ccr);
  if (epoch < 0) return "the status names no epoch";
  const google::protobuf::Struct& spec = lease.spec();
  const google::protobuf::Value* transitions = Field(spec, "leaseTransitions");
  double term = transitions != nullptr ? transitions->number_value() : 0;
  if (term != epoch) {
    return absl::StrCat("the status was written in term ", epoch, ", the lease is in term ", term);
  }
  std::string holder = StringField(spec, "holderIdentity");
  if (holder.empty()) return absl::StrCat("nobody holds the lease of term ", term);
  absl::Time renewed;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, StringField(spec, "renewTime"), &renewed, &error)) {
    return "the lease has no renewTime";
  }
  const google::protobuf::Value* seconds = Field(spec, "leaseDurationSeconds");
  absl::Time expires = renewed + absl::Seconds(seconds != nullptr ? seconds->number_value() : 0);
  if (expires <= now) {
    return absl::StrCat("the lease of term ", term, " held by ", holder, " expired at ",
                        absl::FormatTime(expires));
  }
  return "";
}

// --- RunReplicatorToExit ---

RunResult RunReplicatorToExit(const std::vector<std::string>& args, absl::Duration timeout) {
  return RunToExit("shard_replicator/shard_replicator", {"--http-listen=127.0.0.1:0"}, args,
                   timeout);
}

// --- ReplicatorFixture: processes ---

void ReplicatorFixture::TearDown() {
  for (auto& r : replicators_) {
    if (r == nullptr || !r->Running()) continue;
    int status = r->Stop(absl::Seconds(15));
    EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "shard_replicator did not exit 0 on SIGTERM: " << DescribeWaitStatus(status);
  }
  replicators_.clear();
  for (Store* s : {&cache_}) {
    s->stub.reset();
    s->channel.reset();
    s->process.reset();
  }
  for (auto& [name, s] : shards_) {
    s.stub.reset();
    s.channel.reset();
    s.process.reset();
  }
}

void ReplicatorFixture::StartShardStore(const std::string& shard_name) {
  Store& s = shards_[shard_name];
  std::vector<std::string> args = {"--role=shard"};
  if (security_) {
    args = TestCertificates::Shared().ServerArgs();
    args.insert(args.end(), {"--role=shard", "--shard=" + shard_name});
  }
  s.process = std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"), args);
  RestartStore(&s);
  if (::testing::Test::HasFatalFailure()) return;
  DefineWidgets(shard_name);
}

void ReplicatorFixture::StartCache() {
  std::vector<std::string> args = {"--role=cache"};
  if (security_) {
    args = TestCertificates::Shared().ServerArgs();
    args.push_back("--role=cache");
  }
  cache_.process = std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"), args);
  RestartStore(&cache_);
}

void ReplicatorFixture::RestartStore(Store* store) {
  absl::Status started = store->process->Start();
  ASSERT_TRUE(started.ok()) << started;
  store->channel = grpc::CreateChannel(store->process->grpc_address(),
                                       security_ ? TestCertificates::Shared().Credentials("admin")
                                                 : grpc::InsecureChannelCredentials());
  store->stub = v1::Store::NewStub(store->channel);
}

void ReplicatorFixture::KillStore(Store* store) {
  store->process->Signal(SIGKILL);
  int status = store->process->Wait(absl::Seconds(10));
  ASSERT_TRUE(status != -1 && WIFSIGNALED(status)) << DescribeWaitStatus(status);
}

std::vector<std::string> ReplicatorFixture::ReplicatorArgs(const std::string& shard_name,
                                                           const std::string& identity,
                                                           const std::vector<std::string>& extra,
                                                           const std::string& cache_address) {
  std::vector<std::string> args = {
      "--shard=" + shard_name,
      "--shard-store=" + shards_.at(shard_name).address(),
      "--cache=" + (cache_address.empty() ? cache_.address() : cache_address),
      "--identity=" + identity,
      absl::StrCat("--lease-duration=", absl::FormatDuration(kLeaseDuration)),
      absl::StrCat("--renew-deadline=", absl::FormatDuration(kRenewDeadline)),
      absl::StrCat("--retry-period=", absl::FormatDuration(kRetryPeriod)),
  };
  if (security_) {
    std::vector<std::string> tls = TestCertificates::Shared().ReplicatorArgs(shard_name);
    args.insert(args.end(), tls.begin(), tls.end());
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

ServerProcess* ReplicatorFixture::StartReplicator(const std::string& shard_name,
                                                  const std::string& identity,
                                                  const std::vector<std::string>& extra,
                                                  const std::string& cache_address) {
  auto p =
      std::make_unique<ServerProcess>(BinaryPath("shard_replicator/shard_replicator"),
                                      ReplicatorArgs(shard_name, identity, extra, cache_address));
  absl::Status started = p->Start();
  EXPECT_TRUE(started.ok()) << started;
  EXPECT_EQ(p->grpc_port(), 0);
  replicators_.push_back(std::move(p));
  return replicators_.back().get();
}

// --- ReplicatorFixture: writes ---

grpc::Status ReplicatorFixture::CreateIn(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                                         const v1::Object& obj, v1::Object* out) {
  v1::CreateRequest req;
  *req.mutable_resource() = gvr;
  *req.mutable_object() = obj;
  v1::Object resp;
  grpc::Status s = stub->Create(Context().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << "Create " << ToJson(obj) << ": " << s.error_message();
  if (out != nullptr) *out = resp;
  return s;
}

grpc::Status ReplicatorFixture::Modify(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                                       const std::string& cluster, const std::string& ns,
                                       const std::string& name,
                                       const std::function<void(v1::Object*)>& mutate, bool status,
                                       v1::Object* out) {
  grpc::Status s;
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::optional<v1::Object> obj = GetFrom(stub, gvr, "", cluster, ns, name);
    if (!obj.has_value()) {
      s = grpc::Status(grpc::StatusCode::NOT_FOUND, "no " + ns + "/" + name + " to modify");
      break;
    }
    mutate(&*obj);
    v1::UpdateRequest req;
    *req.mutable_resource() = gvr;
    *req.mutable_object() = *obj;
    v1::Object resp;
    s = status ? stub->UpdateStatus(Context().get(), req, &resp)
               : stub->Update(Context().get(), req, &resp);
    if (s.error_code() == grpc::StatusCode::ABORTED) continue;  // a concurrent writer: retry
    if (out != nullptr) *out = resp;
    break;
  }
  EXPECT_TRUE(s.ok()) << "modify " << ns << "/" << name << ": " << s.error_message();
  return s;
}

grpc::Status ReplicatorFixture::DeleteIn(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                                         const std::string& shard_name, const std::string& cluster,
                                         const std::string& ns, const std::string& name) {
  v1::DeleteRequest req;
  *req.mutable_resource() = gvr;
  req.set_shard(shard_name);
  req.set_cluster(cluster);
  req.set_namespace_(ns);
  req.set_name(name);
  v1::DeleteResponse resp;
  grpc::Status s = stub->Delete(Context().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << "delete " << ns << "/" << name << ": " << s.error_message();
  return s;
}

void ReplicatorFixture::DefineWidgets(const std::string& shard_name) {
  grpc::Status s = CreateIn(shard(shard_name), DefinitionGvr(),
                            Definition("example.com", "widgets", "Namespaced", {"v1"}, true));
  ASSERT_TRUE(s.ok());
}

void ReplicatorFixture::UndefineWidgets(const std::string& shard_name) {
  ASSERT_TRUE(DeleteIn(shard(shard_name), DefinitionGvr(), "", "", "", "widgets.example.com").ok());
  ASSERT_TRUE(Eventually(
      [&] {
        return !GetFrom(shard(shard_name), DefinitionGvr(), "", "", "", "widgets.example.com")
                    .has_value();
      },
      absl::Seconds(10), "the widgets definition is gone"));
}

void ReplicatorFixture::SetWidgetsServed(bool served, const std::string& shard_name) {
  grpc::Status s = Modify(
      shard(shard_name), DefinitionGvr(), "", "", "widgets.example.com", [served](v1::Object* def) {
        auto* versions = (*def->mutable_spec()->mutable_fields())["versions"].mutable_list_value();
        for (auto& v : *versions->mutable_values()) {
          (*v.mutable_struct_value()->mutable_fields())["served"].set_bool_value(served);
        }
      });
  ASSERT_TRUE(s.ok());
}

void ReplicatorFixture::ReplicateWidgets() {
  ASSERT_TRUE(CreateIn(shard(), CcrGvr(), Ccr("widgets")).ok());
  for (const char* name : {"w1", "w2", "w3"}) {
    ASSERT_TRUE(CreateIn(shard(), WidgetsGvr(), Widget(name)).ok());
  }
  ASSERT_TRUE(WaitForReady("widgets", 3));
  ASSERT_TRUE(WaitForCacheInSync());
  ASSERT_TRUE(WaitForCcrCopy("widgets"));
}

// --- ReplicatorFixture: reads ---

std::optional<v1::Object> ReplicatorFixture::GetFrom(
    v1::Store::Stub* stub, const v1::GroupVersionResource& gvr, const std::string& shard_name,
    const std::string& cluster, const std::string& ns, const std::string& name) {
  v1::GetRequest req;
  *req.mutable_resource() = gvr;
  req.set_shard(shard_name);
  req.set_cluster(cluster);
  req.set_namespace_(ns);
  req.set_name(name);
  v1::Object resp;
  grpc::Status s = stub->Get(Context().get(), req, &resp);
  if (s.ok()) return resp;
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND)
      << "get " << ns << "/" << name << ": " << s.error_message();
  return std::nullopt;
}

std::optional<std::map<std::string, v1::Object>> ReplicatorFixture::ListFrom(
    v1::Store::Stub* stub, const v1::GroupVersionResource& gvr, const std::string& shard_name,
    const std::string& cluster, const std::string& label_selector) {
  v1::ListRequest req;
  *req.mutable_resource() = gvr;
  req.set_shard(shard_name);
  req.set_cluster(cluster);
  req.set_label_selector(label_selector);
  v1::ListResponse resp;
  grpc::Status s = stub->List(Context().get(), req, &resp);
  if (!s.ok()) {
    // A shard store that does not serve the resource (definition gone) holds none of it.
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) return std::map<std::string, v1::Object>{};
    ADD_FAILURE() << "list " << ToJson(gvr) << ": " << s.error_message();
    return std::nullopt;
  }
  std::map<std::string, v1::Object> out;
  for (const v1::Object& o : resp.items()) out[Key(o)] = o;
  return out;
}

std::optional<v1::Object> ReplicatorFixture::GetLease(const std::string& shard_name) {
  return GetFrom(shard(shard_name), LeaseGvr(), "", kLeaseCluster, kLeaseNamespace, kLeaseName);
}

std::optional<v1::Object> ReplicatorFixture::GetCcr(const std::string& name,
                                                    const std::string& shard_name,
                                                    const std::string& cluster) {
  return GetFrom(shard(shard_name), CcrGvr(), "", cluster, "", name);
}

// --- ReplicatorFixture: waits ---

::testing::AssertionResult ReplicatorFixture::WaitForCcr(
    const std::string& name, const std::function<bool(const v1::Object&)>& pred,
    const std::string& what, absl::Duration timeout, const std::string& shard_name,
    const std::string& cluster) {
  std::optional<v1::Object> last;
  return Eventually(
      [&] {
        last = GetCcr(name, shard_name, cluster);
        return last.has_value() && pred(*last);
      },
      timeout, absl::StrCat("CCR ", name, ": ", what),
      [&] { return last.has_value() ? DescribeStatus(*last) : std::string("no such CCR"); });
}

::testing::AssertionResult ReplicatorFixture::WaitForCcrState(
    const std::string& name, const std::string& phase, const std::string& started_status,
    const std::string& started_reason, double local, double cache, absl::Duration timeout,
    const std::string& shard_name) {
  return WaitForCcr(
      name,
      [&](const v1::Object& ccr) {
        ConditionView started = FindCondition(ccr, "ReplicationStarted");
        return Phase(ccr) == phase && started.status == started_status &&
               (started_reason.empty() || started.reason == started_reason) &&
               (local < 0 || ResourceCount(ccr, "local") == local) &&
               (cache < 0 || ResourceCount(ccr, "cache") == cache) &&
               ccr.status().fields().count("observedGeneration") > 0 &&
               ccr.status().fields().at("observedGeneration").number_value() ==
                   static_cast<double>(ccr.metadata().generation());
      },
      absl::StrCat("phase ", phase, ", ReplicationStarted=", started_status, " ", started_reason,
                   local >= 0 ? absl::StrCat(", local ", local) : "",
                   cache >= 0 ? absl::StrCat(", cache ", cache) : "",
                   ", observedGeneration current"),
      timeout, shard_name);
}

::testing::AssertionResult ReplicatorFixture::WaitForReady(const std::string& name, double n,
                                                           absl::Duration timeout,
                                                           const std::string& shard_name) {
  return WaitForCcrState(name, "Ready", "True", "Started", n, n, timeout, shard_name);
}

std::string ReplicatorFixture::CacheDiff(const std::string& shard_name,
                                         const std::string& label_selector,
                                         const v1::GroupVersionResource& gvr,
                                         const std::string& cluster) {
  auto local = ListFrom(shard(shard_name), gvr, "", cluster, label_selector);
  auto copies = ListFrom(cache(), gvr, shard_name, cluster);
  if (!local.has_value() || !copies.has_value()) return "a list failed";
  std::vector<std::string> diffs;
  for (const auto& [key, origin] : *local) {
    auto it = copies->find(key);
    if (it == copies->end()) {
      diffs.push_back("no copy of " + key);
      continue;
    }
    std::string d = CopyDiff(origin, it->second, shard_name);
    if (!d.empty()) diffs.push_back(d);
  }
  for (const auto& [key, copy] : *copies) {
    if (local->count(key) == 0) diffs.push_back("a copy of " + key + " with no (matching) origin");
  }
  return absl::StrJoin(diffs, "; ");
}

::testing::AssertionResult ReplicatorFixture::WaitForCacheInSync(
    const std::string& shard_name, const std::string& label_selector, absl::Duration timeout,
    const v1::GroupVersionResource& gvr, const std::string& cluster) {
  std::string last;
  return Eventually(
      [&] {
        last = CacheDiff(shard_name, label_selector, gvr, cluster);
        return last.empty();
      },
      timeout,
      absl::StrCat("the cache holds exactly the copies of shard ", shard_name, "'s ",
                   gvr.resource(), label_selector.empty() ? "" : " matching " + label_selector),
      [&] { return last; });
}

::testing::AssertionResult ReplicatorFixture::WaitForCcrCopy(const std::string& name,
                                                             const std::string& shard_name,
                                                             absl::Duration timeout) {
  std::string last;
  return Eventually(
      [&] {
        std::optional<v1::Object> origin = GetCcr(name, shard_name);
        std::optional<v1::Object> copy = GetFrom(cache(), CcrGvr(), shard_name, kCluster, "", name);
        if (!origin.has_value() || !copy.has_value()) {
          last = absl::StrCat("origin ", origin.has_value() ? "present" : "absent", ", copy ",
                              copy.has_value() ? "present" : "absent");
          return false;
        }
        last = CopyDiff(*origin, *copy, shard_name);
        return last.empty();
      },
      timeout, "the cache holds a copy of CCR " + name + " equal to it", [&] { return last; });
}

double ReplicatorFixture::Leading(ServerProcess* replica) {
  return Metric(replica->http_port(), "shardcache_leader_election_leading");
}

::testing::AssertionResult ReplicatorFixture::WaitForLeading(ServerProcess* replica, double leading,
                                                             absl::Duration timeout) {
  double last = -1;
  return Eventually(
      [&] {
        last = Leading(replica);
        return last == leading;
      },
      timeout, absl::StrCat("shardcache_leader_election_leading is ", leading),
      [&] { return absl::StrCat(last); });
}

}  // namespace shardcache::testing
