// Process tests of the store's write semantics against a real cache_server: the create, get,
// update, delete round trip, optimistic concurrency, finalizers, the status subresource, scope,
// identity in the cache and shard roles, the Write stream, fencing and ResourceDefinitions.
#include <google/protobuf/util/message_differencer.h>
#include <google/protobuf/util/time_util.h>

#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/error_info.h"
#include "common/grpc_status.h"
#include "common/testing/status_matchers.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

using google::protobuf::util::MessageDifferencer;
using google::protobuf::util::TimeUtil;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

constexpr char kUuidRegex[] = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";

// The resource most tests define: widgets.example.com.
v1::GroupVersionResource Widgets(const std::string& version = "v1") {
  return Gvr("example.com", version, "widgets");
}

// A namespaced widget in cluster "root".
v1::Object Widget(const std::string& ns, const std::string& name,
                  const std::string& spec_json = "{}") {
  return FromJson<v1::Object>(absl::StrCat(R"({"metadata":{"cluster":"root","namespace":")", ns,
                                           R"(","name":")", name, R"("},"spec":)", spec_json, "}"));
}

google::protobuf::Struct Struct(const std::string& json) {
  return FromJson<google::protobuf::Struct>(json);
}

absl::Time ToTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixNanos(TimeUtil::TimestampToNanoseconds(t));
}

::testing::AssertionResult SameObject(const v1::Object& a, const v1::Object& b) {
  if (MessageDifferencer::Equals(a, b)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "objects differ:\n  " << ToJson(a) << "\n  " << ToJson(b);
}

v1::Fence Fence(const std::string& shard, int64_t epoch) {
  v1::Fence f;
  f.set_shard(shard);
  f.set_epoch(epoch);
  return f;
}

v1::UpdateRequest UpdateRequestFor(const v1::GroupVersionResource& gvr, const v1::Object& obj) {
  v1::UpdateRequest req;
  *req.mutable_resource() = gvr;
  *req.mutable_object() = obj;
  return req;
}

v1::DeleteRequest DeleteRequestFor(const v1::GroupVersionResource& gvr, const std::string& ns,
                                   const std::string& name) {
  v1::DeleteRequest req;
  *req.mutable_resource() = gvr;
  req.set_cluster("root");
  req.set_namespace_(ns);
  req.set_name(name);
  return req;
}

// Write-stream operations.
v1::WriteRequest CreateOp(int64_t id, const v1::GroupVersionResource& gvr, const v1::Object& obj) {
  v1::WriteRequest w;
  w.set_id(id);
  *w.mutable_create()->mutable_resource() = gvr;
  *w.mutable_create()->mutable_object() = obj;
  return w;
}
v1::WriteRequest UpdateOp(int64_t id, const v1::GroupVersionResource& gvr, const v1::Object& obj) {
  v1::WriteRequest w;
  w.set_id(id);
  *w.mutable_update() = UpdateRequestFor(gvr, obj);
  return w;
}
v1::WriteRequest UpsertOp(int64_t id, const v1::GroupVersionResource& gvr, const v1::Object& obj) {
  v1::WriteRequest w;
  w.set_id(id);
  *w.mutable_upsert() = UpdateRequestFor(gvr, obj);
  return w;
}
v1::WriteRequest UpdateStatusOp(int64_t id, const v1::GroupVersionResource& gvr,
                                const v1::Object& obj) {
  v1::WriteRequest w;
  w.set_id(id);
  *w.mutable_update_status() = UpdateRequestFor(gvr, obj);
  return w;
}
v1::WriteRequest DeleteOp(int64_t id, const v1::GroupVersionResource& gvr, const std::string& ns,
                          const std::string& name) {
  v1::WriteRequest w;
  w.set_id(id);
  *w.mutable_delete_() = DeleteRequestFor(gvr, ns, name);
  return w;
}

class StoreCrudTest : public StoreFixture {
 protected:
  // The store's current revision, as List reports it.
  int64_t Revision() {
    v1::ListRequest req;
    *req.mutable_resource() = DefinitionGvr();
    v1::ListResponse resp;
    grpc::Status s = List(req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    int64_t rv = 0;
    EXPECT_TRUE(absl::SimpleAtoi(resp.resource_version(), &rv)) << resp.resource_version();
    return rv;
  }

  v1::ListResponse ListAll(const v1::GroupVersionResource& gvr) {
    v1::ListRequest req;
    *req.mutable_resource() = gvr;
    v1::ListResponse resp;
    grpc::Status s = List(req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  absl::Status UpdateStatus(const v1::GroupVersionResource& gvr, const v1::Object& obj,
                            v1::Object* out = nullptr) {
    v1::Object resp;
    grpc::Status s = stub_->UpdateStatus(Context().get(), UpdateRequestFor(gvr, obj), &resp);
    if (out != nullptr) *out = resp;
    return FromGrpcStatus(s);
  }

  absl::Status DeleteWith(const v1::DeleteRequest& req, v1::DeleteResponse* out = nullptr) {
    v1::DeleteResponse resp;
    grpc::Status s = stub_->Delete(Context().get(), req, &resp);
    if (out != nullptr) *out = resp;
    return FromGrpcStatus(s);
  }

  absl::Status UpdateWith(const v1::UpdateRequest& req, v1::Object* out = nullptr) {
    v1::Object resp;
    grpc::Status s = stub_->Update(Context().get(), req, &resp);
    if (out != nullptr) *out = resp;
    return FromGrpcStatus(s);
  }

  absl::Status CreateWith(const v1::CreateRequest& req, v1::Object* out = nullptr) {
    v1::Object resp;
    grpc::Status s = stub_->Create(Context().get(), req, &resp);
    if (out != nullptr) *out = resp;
    return FromGrpcStatus(s);
  }

  // Sends every write on one Write stream (from a second thread, so that neither side's flow
  // control can stall the other) and collects every answer until the server ends the stream.
  struct StreamResult {
    std::vector<v1::WriteResponse> answers;
    grpc::Status status;
  };
  StreamResult WriteAll(const std::vector<v1::WriteRequest>& writes) {
    StreamResult result;
    auto ctx = Context(absl::Seconds(60));
    auto stream = stub_->Write(ctx.get());
    std::thread writer([&stream, &writes] {
      for (const v1::WriteRequest& w : writes) {
        if (!stream->Write(w)) break;
      }
      stream->WritesDone();
    });
    v1::WriteResponse answer;
    while (stream->Read(&answer)) result.answers.push_back(answer);
    writer.join();
    result.status = stream->Finish();
    return result;
  }
};

// ---- Create, get, update, delete ----

TEST_F(StoreCrudTest, RoundTrip_ServerSetsIdentityAndRevisions) {
  StartServer({"--role=shard"});
  const int64_t first = FirstRevision();
  EXPECT_EQ(Revision(), first) << "a new store starts at revision 1 (2 on etcd)";
  Define("example.com", "widgets", "Namespaced");
  ASSERT_EQ(Revision(), first + 1);

  absl::Time before = absl::Now();
  v1::Object created;
  v1::Object in = FromJson<v1::Object>(
      R"({"metadata":{"cluster":"root","namespace":"ns1","name":"w1","labels":{"app":"web"},
          "annotations":{"note":"x"}},"spec":{"size":1}})");
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), in, &created)), IsOk());
  absl::Time after = absl::Now();
  EXPECT_THAT(created.metadata().uid(), MatchesRegex(kUuidRegex));
  EXPECT_EQ(Rv(created), first + 2);
  EXPECT_EQ(created.metadata().generation(), 1);
  ASSERT_TRUE(created.metadata().has_creation_timestamp());
  EXPECT_GE(ToTime(created.metadata().creation_timestamp()), before - absl::Seconds(1));
  EXPECT_LE(ToTime(created.metadata().creation_timestamp()), after + absl::Seconds(1));
  EXPECT_FALSE(created.metadata().has_deletion_timestamp());
  EXPECT_EQ(created.metadata().labels().at("app"), "web");
  EXPECT_EQ(created.metadata().annotations().at("note"), "x");
  EXPECT_TRUE(MessageDifferencer::Equals(created.spec(), in.spec()));
  EXPECT_EQ(Revision(), first + 2);

  v1::Object got;
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, created));

  // A spec change: a new revision and a new generation; identity unchanged.
  v1::Object next = created;
  next.mutable_metadata()->clear_resource_version();
  *next.mutable_spec() = Struct(R"({"size":2})");
  v1::Object updated;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), next, &updated)), IsOk());
  EXPECT_EQ(Rv(updated), first + 3);
  EXPECT_EQ(updated.metadata().generation(), 2);
  EXPECT_EQ(updated.metadata().uid(), created.metadata().uid());
  EXPECT_TRUE(MessageDifferencer::Equals(updated.metadata().creation_timestamp(),
                                         created.metadata().creation_timestamp()));
  EXPECT_TRUE(MessageDifferencer::Equals(updated.spec(), next.spec()));

  // A metadata-only change: a new revision, the same generation.
  next = updated;
  (*next.mutable_metadata()->mutable_labels())["tier"] = "front";
  v1::Object relabeled;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), next, &relabeled)), IsOk());
  EXPECT_EQ(Rv(relabeled), first + 4);
  EXPECT_EQ(relabeled.metadata().generation(), 2);
  EXPECT_EQ(relabeled.metadata().labels().at("tier"), "front");

  // A no-op update: no new revision, the object as stored.
  v1::Object noop;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), relabeled, &noop)), IsOk());
  EXPECT_TRUE(SameObject(noop, relabeled));
  EXPECT_EQ(Revision(), first + 4);
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, relabeled));

  v1::DeleteResponse deleted;
  ASSERT_THAT(FromGrpcStatus(Delete(Widgets(), "root", "ns1", "w1", &deleted)), IsOk());
  EXPECT_TRUE(deleted.deleted());
  EXPECT_EQ(Rv(deleted.object()), first + 5);
  EXPECT_EQ(deleted.object().metadata().uid(), created.metadata().uid());
  EXPECT_EQ(Revision(), first + 5);
  EXPECT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("\"w1\" not found")));
  EXPECT_EQ(ListAll(Widgets()).items_size(), 0);

  // Created again: a new identity.
  v1::Object again;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), in, &again)), IsOk());
  EXPECT_NE(again.metadata().uid(), created.metadata().uid());
  EXPECT_EQ(again.metadata().generation(), 1);
  // On etcd a read with no write coming writes the progress key, which takes a revision too.
  if (StorageUnderTest() == "etcd") {
    EXPECT_GT(Rv(again), first + 5);
  } else {
    EXPECT_EQ(Rv(again), first + 6);
  }
}

TEST_F(StoreCrudTest, Update_StaleResourceVersion_IsAbortedAndCurrentOneSucceeds) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  v1::Object v1obj;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns1", "w1", R"({"n":1})"), &v1obj)), IsOk());
  v1::Object v2obj = v1obj;
  *v2obj.mutable_spec() = Struct(R"({"n":2})");
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), v2obj, &v2obj)), IsOk());
  ASSERT_EQ(Rv(v2obj), Rv(v1obj) + 1);

  // v1obj carries the stale resourceVersion.
  v1::Object stale = v1obj;
  *stale.mutable_spec() = Struct(R"({"n":3})");
  EXPECT_THAT(FromGrpcStatus(Update(Widgets(), stale)),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr(absl::StrCat("resourceVersion ", Rv(v1obj),
                                              " is not the current one (", Rv(v2obj), ")"))));
  v1::Object got;
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, v2obj)) << "a conflicting update changed the object";
  EXPECT_EQ(Revision(), Rv(v2obj));

  v1::Object current = v2obj;
  *current.mutable_spec() = Struct(R"({"n":3})");
  v1::Object v3obj;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), current, &v3obj)), IsOk());
  EXPECT_EQ(Rv(v3obj), Rv(v2obj) + 1);
  EXPECT_EQ(v3obj.metadata().generation(), 3);
}

TEST_F(StoreCrudTest, Delete_PreconditionsNotCurrent_AreAbortedAndCurrentOnesSucceed) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  v1::Object first;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns1", "w1", R"({"n":1})"), &first)), IsOk());
  v1::Object current = first;
  *current.mutable_spec() = Struct(R"({"n":2})");
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), current, &current)), IsOk());
  int64_t rev = Revision();

  v1::DeleteRequest stale_rv = DeleteRequestFor(Widgets(), "ns1", "w1");
  stale_rv.mutable_preconditions()->set_resource_version(first.metadata().resource_version());
  EXPECT_THAT(DeleteWith(stale_rv),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr(absl::StrCat("precondition resourceVersion ", Rv(first)))));

  v1::DeleteRequest wrong_uid = DeleteRequestFor(Widgets(), "ns1", "w1");
  wrong_uid.mutable_preconditions()->set_uid("00000000-0000-4000-8000-000000000000");
  EXPECT_THAT(DeleteWith(wrong_uid),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("precondition uid 00000000-0000-4000-8000-000000000000")));

  v1::Object got;
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, current));
  EXPECT_EQ(Revision(), rev);

  v1::DeleteRequest ok = DeleteRequestFor(Widgets(), "ns1", "w1");
  ok.mutable_preconditions()->set_resource_version(current.metadata().resource_version());
  ok.mutable_preconditions()->set_uid(current.metadata().uid());
  v1::DeleteResponse resp;
  ASSERT_THAT(DeleteWith(ok, &resp), IsOk());
  EXPECT_TRUE(resp.deleted());
  EXPECT_EQ(Revision(), rev + 1);
  EXPECT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound));
}

// ---- Finalizers ----

TEST_F(StoreCrudTest, Finalizers_HoldDeletedObjectUntilUpdateRemovesThem) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  v1::Object in = Widget("ns1", "w1", R"({"n":1})");
  in.mutable_metadata()->add_finalizers("example.com/a");
  in.mutable_metadata()->add_finalizers("example.com/b");
  v1::Object created;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), in, &created)), IsOk());

  absl::Time before = absl::Now();
  v1::DeleteResponse first;
  ASSERT_THAT(FromGrpcStatus(Delete(Widgets(), "root", "ns1", "w1", &first)), IsOk());
  EXPECT_FALSE(first.deleted());
  ASSERT_TRUE(first.object().metadata().has_deletion_timestamp());
  EXPECT_GE(ToTime(first.object().metadata().deletion_timestamp()), before - absl::Seconds(1));
  EXPECT_EQ(Rv(first.object()), Rv(created) + 1);
  EXPECT_EQ(first.object().metadata().finalizers_size(), 2);
  EXPECT_EQ(Revision(), Rv(created) + 1);

  v1::Object held;
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1", &held)), IsOk());
  EXPECT_TRUE(SameObject(held, first.object()));
  EXPECT_EQ(ListAll(Widgets()).items_size(), 1);

  // A second delete changes nothing.
  v1::DeleteResponse second;
  ASSERT_THAT(FromGrpcStatus(Delete(Widgets(), "root", "ns1", "w1", &second)), IsOk());
  EXPECT_FALSE(second.deleted());
  EXPECT_TRUE(SameObject(second.object(), held));
  EXPECT_EQ(Revision(), Rv(held));

  // No new finalizer while deleting.
  v1::Object more = held;
  more.mutable_metadata()->add_finalizers("example.com/c");
  EXPECT_THAT(
      FromGrpcStatus(Update(Widgets(), more)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("metadata.finalizers[2]: Forbidden")));
  EXPECT_EQ(Revision(), Rv(held));

  // Removing one finalizer keeps it; the deletionTimestamp cannot be cleared by an update.
  v1::Object fewer = held;
  fewer.mutable_metadata()->clear_finalizers();
  fewer.mutable_metadata()->add_finalizers("example.com/b");
  fewer.mutable_metadata()->clear_deletion_timestamp();
  v1::Object one_left;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), fewer, &one_left)), IsOk());
  EXPECT_EQ(Rv(one_left), Rv(held) + 1);
  EXPECT_TRUE(MessageDifferencer::Equals(one_left.metadata().deletion_timestamp(),
                                         held.metadata().deletion_timestamp()));
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1")), IsOk());

  // Removing the last one deletes it.
  v1::Object none = one_left;
  none.mutable_metadata()->clear_finalizers();
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), none)), IsOk());
  EXPECT_EQ(Revision(), Rv(one_left) + 1);
  EXPECT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_EQ(ListAll(Widgets()).items_size(), 0);
  EXPECT_THAT(FromGrpcStatus(Delete(Widgets(), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound));
}

// ---- Status subresource ----

TEST_F(StoreCrudTest, StatusSubresource_UpdateIgnoresStatusAndUpdateStatusChangesOnlyStatus) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced", {"v1"}, /*status_subresource=*/true);
  v1::Object created;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns1", "w1", R"({"n":1})"), &created)),
              IsOk());

  v1::Object with_status;
  v1::Object in = created;
  *in.mutable_status() = Struct(R"({"phase":"Ready"})");
  ASSERT_THAT(UpdateStatus(Widgets(), in, &with_status), IsOk());
  EXPECT_EQ(Rv(with_status), Rv(created) + 1);
  EXPECT_EQ(with_status.status().fields().at("phase").string_value(), "Ready");
  EXPECT_EQ(with_status.metadata().generation(), 1) << "a status change is not a spec change";

  // Update: the spec change is taken, the status change is not.
  in = with_status;
  *in.mutable_spec() = Struct(R"({"n":2})");
  *in.mutable_status() = Struct(R"({"phase":"Broken"})");
  v1::Object updated;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), in, &updated)), IsOk());
  EXPECT_EQ(updated.spec().fields().at("n").number_value(), 2);
  EXPECT_EQ(updated.status().fields().at("phase").string_value(), "Ready");
  EXPECT_EQ(updated.metadata().generation(), 2);

  // Update with only a status change is a no-op.
  in = updated;
  *in.mutable_status() = Struct(R"({"phase":"Broken"})");
  v1::Object noop;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), in, &noop)), IsOk());
  EXPECT_TRUE(SameObject(noop, updated));
  EXPECT_EQ(Revision(), Rv(updated));

  // UpdateStatus: the status change is taken; spec and metadata changes are not.
  in = updated;
  *in.mutable_spec() = Struct(R"({"n":99})");
  (*in.mutable_metadata()->mutable_labels())["sneaky"] = "yes";
  *in.mutable_status() = Struct(R"({"phase":"Done"})");
  v1::Object status_updated;
  ASSERT_THAT(UpdateStatus(Widgets(), in, &status_updated), IsOk());
  EXPECT_EQ(Rv(status_updated), Rv(updated) + 1);
  EXPECT_EQ(status_updated.status().fields().at("phase").string_value(), "Done");
  EXPECT_EQ(status_updated.spec().fields().at("n").number_value(), 2);
  EXPECT_EQ(status_updated.metadata().labels().count("sneaky"), 0u);
  EXPECT_EQ(status_updated.metadata().generation(), 2);
  v1::Object got;
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, status_updated));

  // UpdateStatus honours the resourceVersion precondition too.
  in = updated;  // stale
  *in.mutable_status() = Struct(R"({"phase":"Stale"})");
  EXPECT_THAT(UpdateStatus(Widgets(), in), StatusIs(absl::StatusCode::kAborted));
}

TEST_F(StoreCrudTest, StatusSubresource_Absent_UpdateStatusIsNotFoundAndUpdateWritesStatus) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced", {"v1"}, /*status_subresource=*/false);
  v1::Object created;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns1", "w1", R"({"n":1})"), &created)),
              IsOk());
  int64_t rev = Revision();
  v1::Object in = created;
  *in.mutable_status() = Struct(R"({"phase":"Ready"})");
  EXPECT_THAT(UpdateStatus(Widgets(), in),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no status subresource")));
  EXPECT_EQ(Revision(), rev);

  v1::Object updated;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), in, &updated)), IsOk());
  EXPECT_EQ(updated.status().fields().at("phase").string_value(), "Ready");
  EXPECT_EQ(updated.metadata().generation(), 1);
  EXPECT_EQ(Rv(updated), rev + 1);
}

// ---- Scope ----

TEST_F(StoreCrudTest, Scope_NamespacedResourceRequiresNamespace) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  int64_t rev = Revision();
  EXPECT_THAT(FromGrpcStatus(Create(Widgets(), Widget("", "w1"))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("metadata.namespace: Required value")));
  EXPECT_THAT(FromGrpcStatus(Get(Widgets(), "root", "", "w1")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("namespace: Required value")));
  EXPECT_EQ(Revision(), rev);
  v1::Object created;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns1", "w1"), &created)), IsOk());
  EXPECT_EQ(created.metadata().namespace_(), "ns1");
}

TEST_F(StoreCrudTest, Scope_ClusterScopedResourceRefusesNamespace) {
  StartServer({"--role=shard"});
  Define("example.com", "gizmos", "Cluster");
  v1::GroupVersionResource gizmos = Gvr("example.com", "v1", "gizmos");
  int64_t rev = Revision();
  EXPECT_THAT(
      FromGrpcStatus(Create(gizmos, Widget("ns1", "g1"))),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("metadata.namespace: Forbidden")));
  EXPECT_EQ(Revision(), rev);
  v1::Object created;
  ASSERT_THAT(FromGrpcStatus(Create(gizmos, Widget("", "g1"), &created)), IsOk());
  EXPECT_EQ(created.metadata().namespace_(), "");
  ASSERT_THAT(FromGrpcStatus(Get(gizmos, "root", "", "g1")), IsOk());
  EXPECT_THAT(FromGrpcStatus(Get(gizmos, "root", "ns1", "g1")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("namespace: Forbidden")));
}

// ---- Identity in the two roles ----

constexpr char kForeignIdentity[] =
    R"({"metadata":{"shard":"a","cluster":"root","namespace":"ns1","name":"w1",
        "uid":"11111111-2222-4333-8444-555555555555","generation":"7",
        "creationTimestamp":"2020-01-02T03:04:05Z",
        "annotations":{"cache.shardcache.io/original-resource-version":"42"}},
        "spec":{"n":1}})";

TEST_F(StoreCrudTest, CacheRole_KeepsWriterSuppliedIdentity) {
  StartServer({"--role=cache"});
  v1::Object in = FromJson<v1::Object>(kForeignIdentity);
  v1::Object created;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), in, &created)), IsOk());
  EXPECT_EQ(created.metadata().uid(), in.metadata().uid());
  EXPECT_EQ(created.metadata().generation(), 7);
  EXPECT_EQ(TimeUtil::ToString(created.metadata().creation_timestamp()), "2020-01-02T03:04:05Z");
  EXPECT_EQ(created.metadata().shard(), "a");
  EXPECT_EQ(Rv(created), FirstRevision() + 1) << "the cache's own resourceVersion";

  // The origin changed (new generation, a spec change): the copy takes the origin's values.
  v1::Object next = in;
  next.mutable_metadata()->set_generation(8);
  *next.mutable_spec() = Struct(R"({"n":2})");
  v1::Object updated;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), next, &updated)), IsOk());
  EXPECT_EQ(updated.metadata().generation(), 8);
  EXPECT_EQ(updated.metadata().uid(), in.metadata().uid());
  EXPECT_EQ(TimeUtil::ToString(updated.metadata().creation_timestamp()), "2020-01-02T03:04:05Z");
  EXPECT_EQ(Rv(updated), FirstRevision() + 2);

  v1::GetRequest get;
  *get.mutable_resource() = Widgets();
  get.set_shard("a");
  get.set_cluster("root");
  get.set_namespace_("ns1");
  get.set_name("w1");
  v1::Object got;
  ASSERT_TRUE(stub_->Get(Context().get(), get, &got).ok());
  EXPECT_TRUE(SameObject(got, updated));

  // A copy without identity gets one from the cache.
  v1::Object bare;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns1", "w2"), &bare)), IsOk());
  EXPECT_THAT(bare.metadata().uid(), MatchesRegex(kUuidRegex));
  EXPECT_EQ(bare.metadata().generation(), 1);
  EXPECT_TRUE(bare.metadata().has_creation_timestamp());
}

TEST_F(StoreCrudTest, ShardRole_IgnoresWriterSuppliedIdentity) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  v1::Object in = FromJson<v1::Object>(kForeignIdentity);
  in.mutable_metadata()->clear_shard();
  absl::Time before = absl::Now();
  v1::Object created;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), in, &created)), IsOk());
  EXPECT_NE(created.metadata().uid(), in.metadata().uid());
  EXPECT_THAT(created.metadata().uid(), MatchesRegex(kUuidRegex));
  EXPECT_EQ(created.metadata().generation(), 1);
  EXPECT_GE(ToTime(created.metadata().creation_timestamp()), before - absl::Seconds(1));

  // On update: generation and creationTimestamp are the store's; a foreign uid is a conflict.
  v1::Object next = created;
  next.mutable_metadata()->set_generation(50);
  *next.mutable_metadata()->mutable_creation_timestamp() = in.metadata().creation_timestamp();
  *next.mutable_spec() = Struct(R"({"n":2})");
  v1::Object updated;
  ASSERT_THAT(FromGrpcStatus(Update(Widgets(), next, &updated)), IsOk());
  EXPECT_EQ(updated.metadata().generation(), 2);
  EXPECT_TRUE(MessageDifferencer::Equals(updated.metadata().creation_timestamp(),
                                         created.metadata().creation_timestamp()));

  next = updated;
  next.mutable_metadata()->set_uid(in.metadata().uid());
  *next.mutable_spec() = Struct(R"({"n":3})");
  EXPECT_THAT(FromGrpcStatus(Update(Widgets(), next)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("uid")));
  EXPECT_EQ(Revision(), Rv(updated));
}

// ---- The Write stream ----

TEST_F(StoreCrudTest, WriteStream_PipelinedWrites_OneAnswerEachInOrder_FailureDoesNotEndStream) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced", {"v1"}, /*status_subresource=*/true);
  const int64_t r = Revision();
  v1::Object w1 = Widget("ns1", "w1", R"({"n":1})");
  v1::Object w1_spec2 = Widget("ns1", "w1", R"({"n":2})");
  v1::Object w1_status = Widget("ns1", "w1", R"({"n":2})");
  *w1_status.mutable_status() = Struct(R"({"phase":"Ready"})");
  v1::Object w1_stale = Widget("ns1", "w1", R"({"n":5})");
  w1_stale.mutable_metadata()->set_resource_version(absl::StrCat(r + 1));
  v1::Object w2 = Widget("ns1", "w2", R"({"n":1})");
  v1::Object w2_spec2 = Widget("ns1", "w2", R"({"n":2})");
  *w2_spec2.mutable_status() = Struct(R"({"phase":"Up"})");  // an upsert replaces status too
  v1::Object w2_labeled = w2_spec2;
  (*w2_labeled.mutable_metadata()->mutable_labels())["app"] = "web";

  std::vector<v1::WriteRequest> writes = {
      CreateOp(101, Widgets(), w1),               // r+1
      UpdateOp(102, Widgets(), w1_spec2),         // r+2
      UpsertOp(103, Widgets(), w2),               // r+3: creates
      UpsertOp(104, Widgets(), w2_spec2),         // r+4: replaces
      UpdateStatusOp(105, Widgets(), w1_status),  // r+5
      CreateOp(106, Widgets(), w1),               // ALREADY_EXISTS
      UpdateOp(107, Widgets(), w1_stale),         // ABORTED
      UpdateOp(108, Widgets(), w2_labeled),       // r+6
      DeleteOp(109, Widgets(), "ns1", "w1"),      // r+7
      DeleteOp(110, Widgets(), "ns1", "w1"),      // NOT_FOUND
      UpsertOp(111, Widgets(), w1),               // r+8: creates again
  };
  StreamResult result = WriteAll(writes);
  EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.answers.size(), writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    EXPECT_EQ(result.answers[i].id(), writes[i].id()) << "answer " << i;
  }
  const auto& a = result.answers;
  // On etcd only the writes of one object keep their order (docs/design.md, "Replicas on
  // etcd"): there each object's revisions rise, and the eight writes take r+1 to r+8 between them.
  const bool in_order = StorageUnderTest() != "etcd";
  std::map<std::string, int64_t> last_of;
  std::set<int64_t> taken;
  auto ok_at = [&](size_t i, int64_t rv) {
    EXPECT_EQ(a[i].code(), 0) << "write " << a[i].id() << ": " << a[i].message();
    EXPECT_EQ(a[i].message(), "");
    if (in_order) {
      EXPECT_EQ(Rv(a[i].object()), rv) << "write " << a[i].id();
    } else {
      EXPECT_GT(Rv(a[i].object()), r) << "write " << a[i].id();
      EXPECT_LE(Rv(a[i].object()), r + 8) << "write " << a[i].id();
      EXPECT_TRUE(taken.insert(Rv(a[i].object())).second) << "write " << a[i].id();
      int64_t& last = last_of[a[i].object().metadata().name()];
      EXPECT_GT(Rv(a[i].object()), last) << "write " << a[i].id();
      last = Rv(a[i].object());
    }
  };
  ok_at(0, r + 1);
  EXPECT_EQ(a[0].object().metadata().generation(), 1);
  ok_at(1, r + 2);
  EXPECT_EQ(a[1].object().metadata().generation(), 2);
  ok_at(2, r + 3);
  EXPECT_EQ(a[2].object().metadata().generation(), 1);
  ok_at(3, r + 4);
  EXPECT_EQ(a[3].object().metadata().generation(), 2);
  EXPECT_EQ(a[3].object().metadata().uid(), a[2].object().metadata().uid());
  EXPECT_EQ(a[3].object().status().fields().at("phase").string_value(), "Up");
  ok_at(4, r + 5);
  EXPECT_EQ(a[4].object().status().fields().at("phase").string_value(), "Ready");
  EXPECT_EQ(a[4].object().metadata().generation(), 2);
  EXPECT_EQ(a[5].code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(a[5].message(), HasSubstr("\"w1\" already exists"));
  EXPECT_FALSE(a[5].has_object());
  EXPECT_EQ(a[6].code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(a[6].message(), HasSubstr(absl::StrCat("resourceVersion ", r + 1)));
  ok_at(7, r + 6);
  EXPECT_EQ(a[7].object().metadata().labels().at("app"), "web");
  ok_at(8, r + 7);
  EXPECT_TRUE(a[8].deleted());
  EXPECT_EQ(a[9].code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_FALSE(a[9].deleted());
  ok_at(10, r + 8);
  EXPECT_NE(a[10].object().metadata().uid(), a[0].object().metadata().uid());

  EXPECT_EQ(Revision(), r + 8);
  v1::Object got;
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w2", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, a[7].object()));
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, a[10].object()));
}

TEST_F(StoreCrudTest, WriteStream_ManyWrites_AnsweredInOrderWithOneBadWriteInTheMiddle) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  const int64_t r = Revision();
  constexpr int kWrites = 1000;
  constexpr int kBad = 500;
  std::vector<v1::WriteRequest> writes;
  for (int i = 0; i < kWrites; ++i) {
    std::string name = i == kBad ? "Not_A_Name" : absl::StrCat("w-", i);
    writes.push_back(CreateOp(5000 + i, Widgets(), Widget("ns1", name, R"({"n":1})")));
  }
  StreamResult result = WriteAll(writes);
  EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.answers.size(), static_cast<size_t>(kWrites));
  // On etcd, writes of different objects may commit in another order than sent: each write
  // still takes one of r+1 .. r+kWrites-1.
  const bool in_order = StorageUnderTest() != "etcd";
  std::set<int64_t> taken;
  int64_t expected_rv = r;
  for (int i = 0; i < kWrites; ++i) {
    const v1::WriteResponse& a = result.answers[i];
    ASSERT_EQ(a.id(), 5000 + i);
    if (i == kBad) {
      EXPECT_EQ(a.code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_THAT(a.message(), HasSubstr("metadata.name: Invalid value"));
      continue;
    }
    ASSERT_EQ(a.code(), 0) << "write " << a.id() << ": " << a.message();
    ++expected_rv;
    if (in_order) {
      ASSERT_EQ(Rv(a.object()), expected_rv) << "write " << a.id();
    }
    ASSERT_TRUE(taken.insert(Rv(a.object())).second) << "write " << a.id();
  }
  if (!taken.empty()) {
    EXPECT_EQ(*taken.begin(), r + 1);
    EXPECT_EQ(*taken.rbegin(), expected_rv);
  }
  EXPECT_EQ(Revision(), r + kWrites - 1);
  EXPECT_EQ(ListAll(Widgets()).items_size(), kWrites - 1);
}

// ---- Fencing ----

TEST_F(StoreCrudTest, Fencing_LowerEpochIsRejectedAndChangesNothing) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");

  v1::CreateRequest create;
  *create.mutable_resource() = Widgets();
  *create.mutable_object() = Widget("ns1", "w1", R"({"n":1})");
  *create.mutable_fence() = Fence("a", 2);
  v1::Object w1;
  ASSERT_THAT(CreateWith(create, &w1), IsOk());
  const int64_t rev = Revision();

  // Epoch 1 is fenced out, whatever the write.
  v1::Object change = w1;
  change.mutable_metadata()->clear_resource_version();
  *change.mutable_spec() = Struct(R"({"n":666})");
  v1::UpdateRequest update = UpdateRequestFor(Widgets(), change);
  *update.mutable_fence() = Fence("a", 1);
  EXPECT_THAT(UpdateWith(update),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("fenced: shard \"a\" is at epoch 2 and this write carries "
                                 "epoch 1")));
  v1::DeleteRequest del = DeleteRequestFor(Widgets(), "ns1", "w1");
  *del.mutable_fence() = Fence("a", 1);
  EXPECT_THAT(DeleteWith(del), StatusIs(absl::StatusCode::kFailedPrecondition));
  v1::CreateRequest create2 = create;
  create2.mutable_object()->mutable_metadata()->set_name("w2");
  *create2.mutable_fence() = Fence("a", 1);
  EXPECT_THAT(CreateWith(create2), StatusIs(absl::StatusCode::kFailedPrecondition));
  StreamResult streamed = WriteAll({[&] {
    v1::WriteRequest w = UpsertOp(1, Widgets(), change);
    *w.mutable_upsert()->mutable_fence() = Fence("a", 1);
    return w;
  }()});
  ASSERT_EQ(streamed.answers.size(), 1u);
  EXPECT_EQ(streamed.answers[0].code(), grpc::StatusCode::FAILED_PRECONDITION);

  // Nothing changed.
  EXPECT_EQ(Revision(), rev);
  v1::Object got;
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, w1));
  EXPECT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w2")),
              StatusIs(absl::StatusCode::kNotFound));

  // The same epoch and a higher one pass; the higher one fences out the former.
  *update.mutable_fence() = Fence("a", 2);
  ASSERT_THAT(UpdateWith(update, &got), IsOk());
  EXPECT_EQ(Rv(got), rev + 1);
  *update.mutable_object()->mutable_spec() = Struct(R"({"n":3})");
  *update.mutable_fence() = Fence("a", 3);
  ASSERT_THAT(UpdateWith(update, &got), IsOk());
  EXPECT_EQ(got.spec().fields().at("n").number_value(), 3);
  *update.mutable_object()->mutable_spec() = Struct(R"({"n":4})");
  *update.mutable_fence() = Fence("a", 2);
  EXPECT_THAT(UpdateWith(update),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is at epoch 3")));

  // Epochs are per shard.
  *update.mutable_fence() = Fence("b", 1);
  ASSERT_THAT(UpdateWith(update, &got), IsOk());
  EXPECT_EQ(got.spec().fields().at("n").number_value(), 4);
  // A fenced-out write did not lower the epoch it was refused against.
  *update.mutable_fence() = Fence("a", 2);
  EXPECT_THAT(UpdateWith(update), StatusIs(absl::StatusCode::kFailedPrecondition));
}

// A fenced answer says so in a form a program reads: a google.rpc.ErrorInfo (reason FENCED) in
// the status details of a unary call and of a Write stream answer, while the message stays the
// human one; a refusal for another reason carries no such detail.
TEST_F(StoreCrudTest, Fencing_RejectionCarriesErrorInfoFenced) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  v1::ClaimEpochRequest claim;
  *claim.mutable_fence() = Fence("a", 5);
  v1::ClaimEpochResponse claimed;
  ASSERT_TRUE(stub_->ClaimEpoch(Context().get(), claim, &claimed).ok());

  v1::CreateRequest create;
  *create.mutable_resource() = Widgets();
  *create.mutable_object() = Widget("ns1", "w1", R"({"n":1})");
  *create.mutable_fence() = Fence("a", 4);
  v1::Object out;
  grpc::Status unary = stub_->Create(Context().get(), create, &out);
  EXPECT_EQ(unary.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(unary.error_message(), StartsWith("fenced: shard \"a\" is at epoch 5"));
  EXPECT_TRUE(IsFenced(unary)) << "no ErrorInfo FENCED in the status details";
  google::rpc::Status details;
  ASSERT_TRUE(details.ParseFromString(unary.error_details()));
  ASSERT_EQ(details.details_size(), 1);
  google::rpc::ErrorInfo info;
  ASSERT_TRUE(details.details(0).UnpackTo(&info));
  EXPECT_EQ(info.reason(), "FENCED");
  EXPECT_EQ(info.domain(), "shardcache.io");
  EXPECT_EQ(info.metadata().at("shard"), "a");
  EXPECT_EQ(info.metadata().at("epoch"), "5");
  EXPECT_EQ(info.metadata().at("requestEpoch"), "4");

  *claim.mutable_fence() = Fence("a", 3);
  EXPECT_TRUE(IsFenced(stub_->ClaimEpoch(Context().get(), claim, &claimed)));

  StreamResult streamed = WriteAll({[&] {
    v1::WriteRequest w;
    w.set_id(1);
    *w.mutable_create() = create;
    return w;
  }()});
  ASSERT_EQ(streamed.answers.size(), 1u);
  EXPECT_THAT(streamed.answers[0].message(), StartsWith("fenced:"));
  EXPECT_TRUE(IsFenced(WriteAnswerStatus(streamed.answers[0])));

  // Not fenced: another reason, no ErrorInfo.
  create.clear_fence();
  create.mutable_object()->mutable_metadata()->set_name("Not_A_Name");
  unary = stub_->Create(Context().get(), create, &out);
  EXPECT_EQ(unary.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(IsFenced(unary));
  EXPECT_TRUE(unary.error_details().empty());
}

// ---- Resource definitions ----

TEST_F(StoreCrudTest, Definitions_UnknownResourceIsNotFoundUntilDefined) {
  StartServer({"--role=shard"});
  EXPECT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns1", "w1"))),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("widgets.example.com/v1: no ResourceDefinition defines it")));
  EXPECT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no ResourceDefinition")));
  v1::ListRequest list;
  *list.mutable_resource() = Widgets();
  v1::ListResponse resp;
  EXPECT_THAT(FromGrpcStatus(List(list, &resp)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no ResourceDefinition")));
  EXPECT_EQ(Revision(), FirstRevision());

  Define("example.com", "widgets", "Namespaced");
  v1::Object created;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns1", "w1"), &created)), IsOk());
  v1::Object got;
  ASSERT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, created));
  EXPECT_THAT(FromGrpcStatus(Get(Widgets("v2"), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("version v2 is not served")));
}

TEST_F(StoreCrudTest, Definitions_SecondVersionIsServedAndSeesTheSameObjects) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced", {"v1"});
  v1::Object w1;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets("v1"), Widget("ns1", "w1", R"({"n":1})"), &w1)),
              IsOk());
  EXPECT_THAT(FromGrpcStatus(Get(Widgets("v2"), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("version v2 is not served")));

  v1::Object definition = Definition("example.com", "widgets", "Namespaced", {"v1", "v2"}, false);
  ASSERT_THAT(FromGrpcStatus(Update(DefinitionGvr(), definition)), IsOk());

  v1::Object got;
  ASSERT_THAT(FromGrpcStatus(Get(Widgets("v2"), "root", "ns1", "w1", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, w1));
  v1::Object w2;
  ASSERT_THAT(FromGrpcStatus(Create(Widgets("v2"), Widget("ns1", "w2"), &w2)), IsOk());
  ASSERT_THAT(FromGrpcStatus(Get(Widgets("v1"), "root", "ns1", "w2", &got)), IsOk());
  EXPECT_TRUE(SameObject(got, w2));
  v1::ListResponse l1 = ListAll(Widgets("v1"));
  v1::ListResponse l2 = ListAll(Widgets("v2"));
  EXPECT_EQ(l1.items_size(), 2);
  EXPECT_TRUE(MessageDifferencer::Equals(l1, l2)) << ToJson(l1) << "\n" << ToJson(l2);
  EXPECT_THAT(FromGrpcStatus(Get(Widgets("v3"), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("version v3 is not served")));
}

TEST_F(StoreCrudTest, Definitions_DeletedStopsServingAndRecreatedServesAnEmptyResource) {
  StartServer({"--role=shard"});
  Define("example.com", "widgets", "Namespaced");
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns1", "w1"))), IsOk());
  ASSERT_THAT(FromGrpcStatus(Create(Widgets(), Widget("ns2", "w2"))), IsOk());
  int64_t rev = Revision();

  v1::DeleteRequest del;
  *del.mutable_resource() = DefinitionGvr();
  del.set_name("widgets.example.com");
  v1::DeleteResponse resp;
  ASSERT_THAT(DeleteWith(del, &resp), IsOk());
  EXPECT_TRUE(resp.deleted());
  // The definition's deletion and one deletion per object (on etcd, all in one transaction).
  EXPECT_EQ(Revision(), StorageUnderTest() == "etcd" ? rev + 1 : rev + 3);
  EXPECT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no ResourceDefinition")));

  Define("example.com", "widgets", "Namespaced");
  EXPECT_EQ(ListAll(Widgets()).items_size(), 0);
  EXPECT_THAT(FromGrpcStatus(Get(Widgets(), "root", "ns1", "w1")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("\"w1\" not found")));
}

}  // namespace
}  // namespace shardcache::testing
