// A table of bad requests against a real shard-role cache_server. Each must fail with its gRPC
// code and a message that names the problem (the field path for INVALID_ARGUMENT), and must change
// nothing: the store's revision, every stored object and shard "a"'s fencing epoch stay exactly
// as they were.
//
// The server holds one defined namespaced resource, widgets.example.com (v1 only, with a status
// subresource), and three objects; shard "a" has written at fence epoch 5; the history window (5
// events) has already moved past the first revisions.
#include <gmock/gmock.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/generic/generic_stub.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cache_server/testing/raw_write_stream.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

using ::testing::HasSubstr;

enum class Rpc {
  kCreate,
  kUpdate,
  kUpdateStatus,
  kDelete,
  kGet,
  kList,
  kWatch,
  kWrite,
  kClaimEpoch
};

const char* RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kCreate:
      return "Create";
    case Rpc::kUpdate:
      return "Update";
    case Rpc::kUpdateStatus:
      return "UpdateStatus";
    case Rpc::kDelete:
      return "Delete";
    case Rpc::kGet:
      return "Get";
    case Rpc::kList:
      return "List";
    case Rpc::kWatch:
      return "Watch";
    case Rpc::kWrite:
      return "Write";
    case Rpc::kClaimEpoch:
      return "ClaimEpoch";
  }
  return "?";
}

struct BadRequest {
  // The test's name (letters, digits and '_').
  std::string name;
  Rpc rpc;
  // The request, as proto3 JSON of the RPC's request message (WriteRequest for kWrite).
  std::string json;
  grpc::StatusCode code;
  // Substrings the error message must contain; the first is the field path for
  // INVALID_ARGUMENT.
  std::vector<std::string> message;
  // Changes the parsed request where JSON cannot say it (NaN, infinities).
  std::function<void(google::protobuf::Message*)> tweak = nullptr;
};

// Short, so that the names ctest lists stay readable; the request is traced on failure.
void PrintTo(const BadRequest& row, std::ostream* os) { *os << RpcName(row.rpc); }

// ---- Building the requests ----

constexpr char kWidgets[] =
    R"("resource":{"group":"example.com","version":"v1","resource":"widgets"})";

std::string Resource(const std::string& group, const std::string& version,
                     const std::string& resource) {
  return absl::StrCat(R"("resource":{"group":")", group, R"(","version":")", version,
                      R"(","resource":")", resource, R"("})");
}

// An object in cluster "root". `meta_extra` and `rest` are JSON members (with a leading ',').
std::string Obj(const std::string& ns, const std::string& name, const std::string& meta_extra = "",
                const std::string& rest = R"(,"spec":{"size":1})") {
  std::string ns_member = ns.empty() ? "" : absl::StrCat(R"("namespace":")", ns, R"(",)");
  return absl::StrCat(R"({"metadata":{"cluster":"root",)", ns_member, R"("name":")", name, R"(")",
                      meta_extra, "}", rest, "}");
}

// A request with a resource, an object and optional extra members (e.g. a fence).
std::string ObjectRequest(const std::string& resource, const std::string& object,
                          const std::string& extra = "") {
  return absl::StrCat("{", resource, R"(,"object":)", object, extra, "}");
}

// A Get or Delete request for a widget (or any resource), with optional extra members.
std::string KeyRequest(const std::string& resource, const std::string& ns, const std::string& name,
                       const std::string& extra = "") {
  return absl::StrCat("{", resource, R"(,"cluster":"root","namespace":")", ns, R"(","name":")",
                      name, R"(")", extra, "}");
}

std::string Definition(const std::string& name, const std::string& group, const std::string& plural,
                       const std::string& scope,
                       const std::string& versions = R"([{"name":"v1","served":true}])") {
  return absl::StrCat(R"({"resource":{"group":"core.shardcache.io","version":"v1",)",
                      R"("resource":"resourcedefinitions"},"object":{"metadata":{"name":")", name,
                      R"("},"spec":{"group":")", group, R"(","names":{"plural":")", plural,
                      R"("},"scope":")", scope, R"(","versions":)", versions,
                      R"(,"subresources":{"status":{}}}}})");
}

std::string Write(int64_t id, const std::string& op, const std::string& request) {
  return absl::StrCat(R"({"id":")", id, R"(",")", op, R"(":)", request, "}");
}

// Sets `field` of the request's object spec (or status) to `value`, for numbers JSON cannot carry.
std::function<void(google::protobuf::Message*)> SetNumber(bool status, const std::string& field,
                                                          double value) {
  return [status, field, value](google::protobuf::Message* m) {
    v1::Object* obj = nullptr;
    if (auto* c = dynamic_cast<v1::CreateRequest*>(m)) obj = c->mutable_object();
    if (auto* u = dynamic_cast<v1::UpdateRequest*>(m)) obj = u->mutable_object();
    ASSERT_NE(obj, nullptr) << "SetNumber needs a CreateRequest or UpdateRequest";
    google::protobuf::Struct* s = status ? obj->mutable_status() : obj->mutable_spec();
    (*s->mutable_fields())[field].set_number_value(value);
  };
}

// The object of a Create, Update or UpdateStatus request, or of a Write's create.
v1::Object* MutableObject(google::protobuf::Message* m) {
  if (auto* c = dynamic_cast<v1::CreateRequest*>(m)) return c->mutable_object();
  if (auto* u = dynamic_cast<v1::UpdateRequest*>(m)) return u->mutable_object();
  if (auto* w = dynamic_cast<v1::WriteRequest*>(m)) return w->mutable_create()->mutable_object();
  return nullptr;
}

// Replaces the request's object spec with {"a":{"a":...{"a":1}}}, `depth` objects deep.
std::function<void(google::protobuf::Message*)> NestSpec(int depth) {
  return [depth](google::protobuf::Message* m) {
    v1::Object* obj = MutableObject(m);
    ASSERT_NE(obj, nullptr) << "NestSpec needs a request with an object";
    google::protobuf::Struct* s = obj->mutable_spec();
    s->Clear();
    for (int i = 1; i < depth; ++i) {
      s = (*s->mutable_fields())["a"].mutable_struct_value();
    }
    (*s->mutable_fields())["a"].set_number_value(1);
  };
}

// Puts bytes that are not UTF-8 in a string field (which JSON cannot say): the name of a Get or
// Delete, the label selector of a List or Watch, the shard of a claim, the name of an object.
std::function<void(google::protobuf::Message*)> NotUtf8() {
  return [](google::protobuf::Message* m) {
    const std::string bad = "w\xff";
    if (auto* r = dynamic_cast<v1::GetRequest*>(m)) return r->set_name(bad);
    if (auto* r = dynamic_cast<v1::DeleteRequest*>(m)) return r->set_name(bad);
    if (auto* r = dynamic_cast<v1::ListRequest*>(m)) return r->set_label_selector(bad);
    if (auto* r = dynamic_cast<v1::WatchRequest*>(m)) return r->set_label_selector(bad);
    if (auto* r = dynamic_cast<v1::ClaimEpochRequest*>(m))
      return r->mutable_fence()->set_shard(bad);
    v1::Object* obj = MutableObject(m);
    ASSERT_NE(obj, nullptr) << "NotUtf8 does not know this request";
    obj->mutable_metadata()->set_name(bad);
  };
}

std::vector<BadRequest> Rows() {
  using grpc::StatusCode;
  const std::string w = kWidgets;
  const std::string name254(254, 'a');
  const std::string value64(64, 'v');
  const std::string annotation(256 * 1024, 'x');  // plus its key: over the limit
  const std::string blob(5000, 'b');
  const std::string fence_a1 = R"(,"fence":{"shard":"a","epoch":"1"})";
  std::vector<BadRequest> rows = {
      // Names.
      {"Create_NameUppercase",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "Widget-1")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.name: Invalid value: \"Widget-1\""}},
      {"Create_NameTooLong254",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", name254)),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.name: Invalid value", "must be no more than 253 characters"}},
      {"Create_NameLeadingDash",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "-widget")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.name: Invalid value: \"-widget\""}},
      {"Create_NameEmpty",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.name: Required value"}},
      {"Get_NameInvalid",
       Rpc::kGet,
       KeyRequest(w, "ns1", "W1"),
       StatusCode::INVALID_ARGUMENT,
       {"name: Invalid value: \"W1\""}},
      // Namespaces and scope.
      {"Create_NamespaceInvalid",
       Rpc::kCreate,
       ObjectRequest(w, Obj("NS_1", "w9")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.namespace: Invalid value: \"NS_1\""}},
      {"Create_NamespaceMissingOnNamespacedResource",
       Rpc::kCreate,
       ObjectRequest(w, Obj("", "w9")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.namespace: Required value"}},
      {"Delete_NamespaceMissingOnNamespacedResource",
       Rpc::kDelete,
       KeyRequest(w, "", "w1"),
       StatusCode::INVALID_ARGUMENT,
       {"namespace: Required value"}},
      {"Create_NamespaceOnClusterScopedResource",
       Rpc::kCreate,
       ObjectRequest(Resource("cache.shardcache.io", "v1alpha1", "clustercachedresources"),
                     Obj("ns1", "ccr1", "",
                         R"(,"spec":{"group":"example.com","version":"v1","resource":"widgets"})")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.namespace: Forbidden"}},
      // Cluster, shard.
      {"Create_ClusterNameInvalid",
       Rpc::kCreate,
       ObjectRequest(w, R"({"metadata":{"cluster":"Root:Org","namespace":"ns1","name":"w9"}})"),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.cluster: Invalid value: \"Root:Org\""}},
      {"List_ShardInvalid",
       Rpc::kList,
       absl::StrCat("{", w, R"(,"shard":"Shard_A"})"),
       StatusCode::INVALID_ARGUMENT,
       {"shard: Invalid value: \"Shard_A\""}},
      // Labels, annotations, finalizers.
      {"Create_LabelKeyInvalid",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", R"(,"labels":{"-app":"web"})")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.labels: Invalid value: \"-app\""}},
      {"Create_LabelValueTooLong64",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", absl::StrCat(R"(,"labels":{"app":")", value64, R"("})"))),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.labels[app]: Invalid value", "must be no more than 63 characters"}},
      {"Create_AnnotationKeyInvalid",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", R"(,"annotations":{"a/b/c":"x"})")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.annotations: Invalid value: \"a/b/c\""}},
      {"Create_AnnotationsOver256KiB",
       Rpc::kCreate,
       ObjectRequest(
           w, Obj("ns1", "w9", absl::StrCat(R"(,"annotations":{"a":")", annotation, R"("})"))),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.annotations: Too long: must have at most 262144 bytes"}},
      {"Create_FinalizerInvalid",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", R"(,"finalizers":["example.com/bad finalizer"])")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.finalizers[0]: Invalid value"}},
      {"Create_FinalizerDuplicate",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", R"(,"finalizers":["example.com/a","example.com/a"])")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.finalizers[1]: Duplicate value"}},
      {"Update_NewFinalizerWhileDeleting",
       Rpc::kUpdate,
       ObjectRequest(w,
                     Obj("ns2", "w3", R"(,"finalizers":["example.com/hold","example.com/new"])")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.finalizers[1]: Forbidden", "no new finalizers can be added"}},
      // Other metadata.
      {"Create_ResourceVersionSet",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", R"(,"resourceVersion":"3")")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.resourceVersion: Invalid value"}},
      {"Create_DeletionTimestampSet",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", R"(,"deletionTimestamp":"2024-01-01T00:00:00Z")")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.deletionTimestamp: Forbidden"}},
      {"Create_GenerationNegative",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", R"(,"generation":"-1")")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.generation: Invalid value"}},
      {"Update_ResourceVersionNotNumeric",
       Rpc::kUpdate,
       ObjectRequest(w, Obj("ns1", "w1", R"(,"resourceVersion":"abc")")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.resourceVersion: Invalid value: \"abc\""}},
      // Spec and status content.
      {"Create_SpecNaN",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9")),
       StatusCode::INVALID_ARGUMENT,
       {"spec.ratio: Invalid value", "finite"},
       SetNumber(false, "ratio", std::nan(""))},
      {"UpdateStatus_StatusInfinity",
       Rpc::kUpdateStatus,
       ObjectRequest(w, Obj("ns1", "w2", "", R"(,"status":{"phase":"Ready"})")),
       StatusCode::INVALID_ARGUMENT,
       {"status.load: Invalid value", "finite"},
       SetNumber(true, "load", std::numeric_limits<double>::infinity())},
      // The server allows 24 levels of JSON nesting; deeper is a clear INVALID_ARGUMENT.
      {"Create_SpecNestedTooDeep",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9")),
       StatusCode::INVALID_ARGUMENT,
       {"spec.a.a.a", "nested deeper than 24 levels"},
       NestSpec(28)},
      // Deeper than gRPC's own parser allows (about 32 levels): parsed by the server, which
      // names the field; far deeper, the server's parser refuses it, naming the field too.
      {"Create_SpecNested40Deep",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9")),
       StatusCode::INVALID_ARGUMENT,
       {"spec.a.a.a", "nested deeper than 24 levels"},
       NestSpec(40)},
      {"Create_SpecNested100Deep",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9")),
       StatusCode::INVALID_ARGUMENT,
       {"object.spec.a.a.a", "nested too deeply to be parsed"},
       NestSpec(100)},
      {"Update_SpecNested100Deep",
       Rpc::kUpdate,
       ObjectRequest(w, Obj("ns1", "w1")),
       StatusCode::INVALID_ARGUMENT,
       {"object.spec.a.a.a", "nested too deeply to be parsed"},
       NestSpec(100)},
      {"UpdateStatus_SpecNested100Deep",
       Rpc::kUpdateStatus,
       ObjectRequest(w, Obj("ns1", "w2")),
       StatusCode::INVALID_ARGUMENT,
       {"object.spec.a.a.a", "nested too deeply to be parsed"},
       NestSpec(100)},
      {"Write_CreateSpecNested40Deep",
       Rpc::kWrite,
       Write(17, "create", ObjectRequest(w, Obj("ns1", "w9"))),
       StatusCode::INVALID_ARGUMENT,
       {"spec.a.a.a", "nested deeper than 24 levels"},
       NestSpec(40)},
      {"Write_CreateSpecNested100Deep",
       Rpc::kWrite,
       Write(18, "create", ObjectRequest(w, Obj("ns1", "w9"))),
       StatusCode::INVALID_ARGUMENT,
       {"create.object.spec.a.a.a", "nested too deeply to be parsed"},
       NestSpec(100)},
      // Strings that are not UTF-8 (gRPC's parser refuses them too).
      {"Create_NameNotUtf8",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9")),
       StatusCode::INVALID_ARGUMENT,
       {"object.metadata.name: Invalid value: not valid UTF-8"},
       NotUtf8()},
      {"Get_NameNotUtf8",
       Rpc::kGet,
       KeyRequest(w, "ns1", "w1"),
       StatusCode::INVALID_ARGUMENT,
       {"name: Invalid value: not valid UTF-8"},
       NotUtf8()},
      {"Delete_NameNotUtf8",
       Rpc::kDelete,
       KeyRequest(w, "ns1", "w1"),
       StatusCode::INVALID_ARGUMENT,
       {"name: Invalid value: not valid UTF-8"},
       NotUtf8()},
      {"List_SelectorNotUtf8",
       Rpc::kList,
       absl::StrCat("{", w, "}"),
       StatusCode::INVALID_ARGUMENT,
       {"label_selector: Invalid value: not valid UTF-8"},
       NotUtf8()},
      {"Watch_SelectorNotUtf8",
       Rpc::kWatch,
       absl::StrCat("{", w, "}"),
       StatusCode::INVALID_ARGUMENT,
       {"label_selector: Invalid value: not valid UTF-8"},
       NotUtf8()},
      {"ClaimEpoch_ShardNotUtf8",
       Rpc::kClaimEpoch,
       R"({"fence":{"shard":"a","epoch":"9"}})",
       StatusCode::INVALID_ARGUMENT,
       {"fence.shard: Invalid value: not valid UTF-8"},
       NotUtf8()},
      {"Write_CreateNameNotUtf8",
       Rpc::kWrite,
       Write(19, "create", ObjectRequest(w, Obj("ns1", "w9"))),
       StatusCode::INVALID_ARGUMENT,
       {"create.object.metadata.name: Invalid value: not valid UTF-8"},
       NotUtf8()},
      {"Create_ObjectOverSizeLimit",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", "", absl::StrCat(R"(,"spec":{"blob":")", blob, R"("})"))),
       StatusCode::RESOURCE_EXHAUSTED,
       {"more than the limit of 4096 bytes"}},
      {"Update_ObjectOverSizeLimit",
       Rpc::kUpdate,
       ObjectRequest(w, Obj("ns1", "w1", "", absl::StrCat(R"(,"spec":{"blob":")", blob, R"("})"))),
       StatusCode::RESOURCE_EXHAUSTED,
       {"more than the limit of 4096 bytes"}},
      // Resources.
      {"Create_UnknownResource",
       Rpc::kCreate,
       ObjectRequest(Resource("example.com", "v1", "gadgets"), Obj("ns1", "g1")),
       StatusCode::NOT_FOUND,
       {"gadgets.example.com/v1", "no ResourceDefinition defines it"}},
      {"Watch_UnknownResource",
       Rpc::kWatch,
       absl::StrCat("{", Resource("example.com", "v1", "gadgets"), "}"),
       StatusCode::NOT_FOUND,
       {"no ResourceDefinition defines it"}},
      {"Get_UnservedVersion",
       Rpc::kGet,
       KeyRequest(Resource("example.com", "v2", "widgets"), "ns1", "w1"),
       StatusCode::NOT_FOUND,
       {"version v2 is not served"}},
      {"List_UnservedVersion",
       Rpc::kList,
       absl::StrCat("{", Resource("example.com", "v1beta1", "widgets"), "}"),
       StatusCode::NOT_FOUND,
       {"version v1beta1 is not served"}},
      {"Create_EmptyResourceName",
       Rpc::kCreate,
       ObjectRequest(Resource("example.com", "v1", ""), Obj("ns1", "w9")),
       StatusCode::INVALID_ARGUMENT,
       {"resource.resource: Required value"}},
      {"Get_GroupInvalid",
       Rpc::kGet,
       KeyRequest(Resource("Example.COM", "v1", "widgets"), "ns1", "w1"),
       StatusCode::INVALID_ARGUMENT,
       {"resource.group: Invalid value"}},
      {"UpdateStatus_ResourceWithoutStatusSubresource",
       Rpc::kUpdateStatus,
       ObjectRequest(Resource("coordination.shardcache.io", "v1", "leases"),
                     Obj("ns1", "lease-a", "", R"(,"status":{"x":1})")),
       StatusCode::NOT_FOUND,
       {"no status subresource"}},
      // Existence.
      {"Create_AlreadyExists",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w1")),
       StatusCode::ALREADY_EXISTS,
       {"widgets.example.com \"w1\" already exists"}},
      {"Update_Missing",
       Rpc::kUpdate,
       ObjectRequest(w, Obj("ns1", "missing")),
       StatusCode::NOT_FOUND,
       {"\"missing\" not found"}},
      {"UpdateStatus_Missing",
       Rpc::kUpdateStatus,
       ObjectRequest(w, Obj("ns1", "missing", "", R"(,"status":{"phase":"x"})")),
       StatusCode::NOT_FOUND,
       {"\"missing\" not found"}},
      {"Delete_Missing",
       Rpc::kDelete,
       KeyRequest(w, "ns1", "missing"),
       StatusCode::NOT_FOUND,
       {"\"missing\" not found"}},
      {"Get_Missing",
       Rpc::kGet,
       KeyRequest(w, "ns1", "missing"),
       StatusCode::NOT_FOUND,
       {"\"missing\" not found"}},
      // Conflicts.
      {"Update_StaleResourceVersion",
       Rpc::kUpdate,
       ObjectRequest(w, Obj("ns1", "w1", R"(,"resourceVersion":"3")")),
       StatusCode::ABORTED,
       {"resourceVersion 3 is not the current one ("}},
      {"UpdateStatus_StaleResourceVersion",
       Rpc::kUpdateStatus,
       ObjectRequest(w, Obj("ns1", "w2", R"(,"resourceVersion":"4")", R"(,"status":{"p":"q"})")),
       StatusCode::ABORTED,
       {"resourceVersion 4 is not the current one ("}},
      {"Update_UidNotCurrent",
       Rpc::kUpdate,
       ObjectRequest(w, Obj("ns1", "w1", R"(,"uid":"00000000-0000-4000-8000-000000000000")")),
       StatusCode::ABORTED,
       {"uid 00000000-0000-4000-8000-000000000000 is not the current one"}},
      {"Delete_UidPreconditionNotCurrent",
       Rpc::kDelete,
       KeyRequest(w, "ns1", "w1",
                  R"(,"preconditions":{"uid":"00000000-0000-4000-8000-000000000000"})"),
       StatusCode::ABORTED,
       {"precondition uid 00000000-0000-4000-8000-000000000000"}},
      {"Delete_ResourceVersionPreconditionStale",
       Rpc::kDelete,
       KeyRequest(w, "ns1", "w1", R"(,"preconditions":{"resourceVersion":"3"})"),
       StatusCode::ABORTED,
       {"precondition resourceVersion 3 is not the current one ("}},
      {"Delete_ResourceVersionPreconditionNotNumeric",
       Rpc::kDelete,
       KeyRequest(w, "ns1", "w1", R"(,"preconditions":{"resourceVersion":"latest"})"),
       StatusCode::INVALID_ARGUMENT,
       {"preconditions.resourceVersion: Invalid value"}},
      // Selectors, lists and watches.
      {"List_SelectorMalformed",
       Rpc::kList,
       absl::StrCat("{", w, R"(,"labelSelector":"app in (web"})"),
       StatusCode::INVALID_ARGUMENT,
       {"label_selector: Invalid value"}},
      {"Watch_SelectorMalformed",
       Rpc::kWatch,
       absl::StrCat("{", w, R"(,"labelSelector":"app=web,,tier"})"),
       StatusCode::INVALID_ARGUMENT,
       {"label_selector: Invalid value"}},
      {"List_ContinueTokenMalformed",
       Rpc::kList,
       absl::StrCat("{", w, R"(,"limit":"1","continueToken":"not a token!"})"),
       StatusCode::INVALID_ARGUMENT,
       {"continue_token: Invalid value"}},
      {"List_NegativeLimit",
       Rpc::kList,
       absl::StrCat("{", w, R"(,"limit":"-1"})"),
       StatusCode::INVALID_ARGUMENT,
       {"limit: Invalid value"}},
      {"Watch_TooOldResourceVersion",
       Rpc::kWatch,
       absl::StrCat("{", w, R"(,"resourceVersion":"2"})"),
       StatusCode::OUT_OF_RANGE,
       {"too old resource version"}},
      {"Watch_ResourceVersionNotNumeric",
       Rpc::kWatch,
       absl::StrCat("{", w, R"(,"resourceVersion":"now"})"),
       StatusCode::INVALID_ARGUMENT,
       {"resource_version: Invalid value"}},
      // Fencing.
      {"Update_FencedOut",
       Rpc::kUpdate,
       ObjectRequest(w, Obj("ns1", "w1", "", R"(,"spec":{"size":3})"), fence_a1),
       StatusCode::FAILED_PRECONDITION,
       {"fenced", "at epoch 5", "carries epoch 1"}},
      {"Create_FencedOut",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9"), fence_a1),
       StatusCode::FAILED_PRECONDITION,
       {"fenced"}},
      {"Delete_FencedOut",
       Rpc::kDelete,
       KeyRequest(w, "ns1", "w1", R"(,"fence":{"shard":"a","epoch":"4"})"),
       StatusCode::FAILED_PRECONDITION,
       {"fenced"}},
      {"Create_FenceEpochNotPositive",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9"), R"(,"fence":{"shard":"b","epoch":"-2"})"),
       StatusCode::INVALID_ARGUMENT,
       {"fence.epoch: Invalid value"}},
      {"Create_InvalidWithNewerFence_ClaimsNothing",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "W9"), R"(,"fence":{"shard":"a","epoch":"9"})"),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.name: Invalid value"}},
      // ClaimEpoch: the fence is the whole request, so both of its fields are required.
      {"ClaimEpoch_FenceMissing",
       Rpc::kClaimEpoch,
       "{}",
       StatusCode::INVALID_ARGUMENT,
       {"fence.shard: Required value"}},
      {"ClaimEpoch_ShardMissing",
       Rpc::kClaimEpoch,
       R"({"fence":{"epoch":"9"}})",
       StatusCode::INVALID_ARGUMENT,
       {"fence.shard: Required value"}},
      {"ClaimEpoch_ShardInvalid",
       Rpc::kClaimEpoch,
       R"({"fence":{"shard":"Shard_A","epoch":"9"}})",
       StatusCode::INVALID_ARGUMENT,
       {"fence.shard: Invalid value: \"Shard_A\""}},
      {"ClaimEpoch_EpochMissing",
       Rpc::kClaimEpoch,
       R"({"fence":{"shard":"a"}})",
       StatusCode::INVALID_ARGUMENT,
       {"fence.epoch: Required value"}},
      {"ClaimEpoch_EpochNegative",
       Rpc::kClaimEpoch,
       R"({"fence":{"shard":"a","epoch":"-9"}})",
       StatusCode::INVALID_ARGUMENT,
       {"fence.epoch: Invalid value", "must be positive"}},
      {"ClaimEpoch_FencedOut",
       Rpc::kClaimEpoch,
       R"({"fence":{"shard":"a","epoch":"4"}})",
       StatusCode::FAILED_PRECONDITION,
       {"fenced: shard \"a\" is at epoch 5", "this claim carries epoch 4",
        "a newer leader holds the shard"}},
      {"Create_FenceShardInvalid",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9"), R"(,"fence":{"shard":"Shard_B","epoch":"1"})"),
       StatusCode::INVALID_ARGUMENT,
       {"fence.shard: Invalid value"}},
      // The Write stream.
      {"Write_NoOperation",
       Rpc::kWrite,
       R"({"id":"7"})",
       StatusCode::INVALID_ARGUMENT,
       {"operation: Required value"}},
      {"Write_CreateNameInvalid",
       Rpc::kWrite,
       Write(8, "create", ObjectRequest(w, Obj("ns1", "W_9"))),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.name: Invalid value"}},
      {"Write_UpdateStale",
       Rpc::kWrite,
       Write(9, "update", ObjectRequest(w, Obj("ns1", "w1", R"(,"resourceVersion":"3")"))),
       StatusCode::ABORTED,
       {"resourceVersion 3 is not the current one"}},
      {"Write_UpsertFencedOut",
       Rpc::kWrite,
       Write(10, "upsert", ObjectRequest(w, Obj("ns1", "w9"), fence_a1)),
       StatusCode::FAILED_PRECONDITION,
       {"fenced"}},
      {"Write_UpdateStatusNoSubresource",
       Rpc::kWrite,
       Write(11, "updateStatus",
             ObjectRequest(Resource("coordination.shardcache.io", "v1", "leases"),
                           Obj("ns1", "lease-a"))),
       StatusCode::NOT_FOUND,
       {"no status subresource"}},
      {"Write_DeleteMissing",
       Rpc::kWrite,
       Write(12, "delete", KeyRequest(w, "ns1", "missing")),
       StatusCode::NOT_FOUND,
       {"\"missing\" not found"}},
      {"Write_CreateOverSizeLimit",
       Rpc::kWrite,
       Write(13, "create",
             ObjectRequest(
                 w, Obj("ns1", "w9", "", absl::StrCat(R"(,"spec":{"blob":")", blob, R"("})")))),
       StatusCode::RESOURCE_EXHAUSTED,
       {"more than the limit of 4096 bytes"}},
      // metadata.shard names the origin of a copy in the cache; a shard store refuses it (it
      // would make a second object beside the one of the same name).
      {"Create_MetadataShardInShardStore",
       Rpc::kCreate,
       ObjectRequest(w, Obj("ns1", "w9", R"(,"shard":"zz")")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.shard: Forbidden"}},
      {"Update_MetadataShardInShardStore",
       Rpc::kUpdate,
       ObjectRequest(w, Obj("ns1", "w1", R"(,"shard":"zz")")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.shard: Forbidden"}},
      {"UpdateStatus_MetadataShardInShardStore",
       Rpc::kUpdateStatus,
       ObjectRequest(w, Obj("ns1", "w2", R"(,"shard":"zz")", R"(,"status":{"phase":"x"})")),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.shard: Forbidden"}},
      {"Delete_ShardInShardStore",
       Rpc::kDelete,
       KeyRequest(w, "ns1", "w1", R"(,"shard":"zz")"),
       StatusCode::INVALID_ARGUMENT,
       {"shard: Forbidden"}},
      {"Write_UpsertMetadataShardInShardStore",
       Rpc::kWrite,
       Write(14, "upsert", ObjectRequest(w, Obj("ns1", "w9", R"(,"shard":"zz")"))),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.shard: Forbidden"}},
      {"Write_CreateMetadataShardInShardStore",
       Rpc::kWrite,
       Write(15, "create", ObjectRequest(w, Obj("ns1", "w9", R"(,"shard":"zz")"))),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.shard: Forbidden"}},
      {"Write_DeleteShardInShardStore",
       Rpc::kWrite,
       Write(16, "delete", KeyRequest(w, "ns1", "w1", R"(,"shard":"zz")")),
       StatusCode::INVALID_ARGUMENT,
       {"shard: Forbidden"}},
      // Resource definitions.
      {"Definition_ScopeUnsupported",
       Rpc::kCreate,
       Definition("gadgets.example.com", "example.com", "gadgets", "Global"),
       StatusCode::INVALID_ARGUMENT,
       {"spec.scope: Unsupported value: \"Global\""}},
      {"Definition_NameNotPluralDotGroup",
       Rpc::kCreate,
       Definition("gadgets", "example.com", "gadgets", "Namespaced"),
       StatusCode::INVALID_ARGUMENT,
       {"metadata.name: Invalid value: \"gadgets\""}},
      {"Definition_ReservedGroup",
       Rpc::kCreate,
       Definition("gadgets.core.shardcache.io", "core.shardcache.io", "gadgets", "Cluster"),
       StatusCode::INVALID_ARGUMENT,
       {"spec.group: Forbidden", "reserved"}},
      {"Definition_NoVersions",
       Rpc::kCreate,
       Definition("gadgets.example.com", "example.com", "gadgets", "Namespaced", "[]"),
       StatusCode::INVALID_ARGUMENT,
       {"spec.versions: Invalid value"}},
      {"Definition_VersionNameInvalid",
       Rpc::kCreate,
       Definition("gadgets.example.com", "example.com", "gadgets", "Namespaced",
                  R"([{"name":"V1"}])"),
       StatusCode::INVALID_ARGUMENT,
       {"spec.versions[0].name: Invalid value"}},
      {"Definition_ScopeChangedOnUpdate",
       Rpc::kUpdate,
       Definition("widgets.example.com", "example.com", "widgets", "Cluster"),
       StatusCode::INVALID_ARGUMENT,
       {"spec.scope: Invalid value: field is immutable"}},
      {"Definition_AlreadyExists",
       Rpc::kCreate,
       Definition("widgets.example.com", "example.com", "widgets", "Namespaced"),
       StatusCode::ALREADY_EXISTS,
       {"already exists"}},
  };
  return rows;
}

// ---- The fixture ----

// Deterministic bytes of a message (map entries in key order), to compare snapshots exactly.
std::string Bytes(const google::protobuf::Message& m) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream sos(&out);
    google::protobuf::io::CodedOutputStream cos(&sos);
    cos.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&cos);
  }
  return out;
}

class BadRequestTest : public StoreFixture, public ::testing::WithParamInterface<BadRequest> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        StartServer({"--role=shard", "--max-object-bytes=4096", "--history-events=5"}));
    // Revision 2: the definition.
    ASSERT_NO_FATAL_FAILURE(Define("example.com", "widgets", "Namespaced", {"v1"}, true));
    const v1::GroupVersionResource w = Gvr("example.com", "v1", "widgets");
    // 3, 4, 5: three objects; w3 has a finalizer.
    Must(Create(w, FromJson<v1::Object>(Obj("ns1", "w1", R"(,"labels":{"app":"web"})"))));
    Must(Create(w, FromJson<v1::Object>(Obj("ns1", "w2"))));
    Must(
        Create(w, FromJson<v1::Object>(Obj("ns2", "w3", R"(,"finalizers":["example.com/hold"])"))));
    // 6: shard "a" writes at epoch 5.
    v1::UpdateRequest fenced = FromJson<v1::UpdateRequest>(ObjectRequest(
        kWidgets, Obj("ns1", "w1", R"(,"labels":{"app":"web"})", R"(,"spec":{"size":2})"),
        R"(,"fence":{"shard":"a","epoch":"5"})"));
    v1::Object out;
    Must(stub_->Update(Context().get(), fenced, &out));
    // 7: w2 gets a status.
    Must(stub_->UpdateStatus(Context().get(),
                             FromJson<v1::UpdateRequest>(ObjectRequest(
                                 kWidgets, Obj("ns1", "w2", "", R"(,"status":{"phase":"Ready"})"))),
                             &out));
    // 8: w3 is deleted, and held by its finalizer.
    v1::DeleteResponse deleted;
    Must(Delete(w, "root", "ns2", "w3", &deleted));
    ASSERT_FALSE(deleted.deleted());
    // The window of 5 events now starts after revision 3.
  }

  static void Must(const grpc::Status& s) {
    ASSERT_TRUE(s.ok()) << "setup: " << s.error_code() << ": " << s.error_message();
  }

  struct Snapshot {
    std::string revision;
    std::string bytes;
  };
  // Every object of every resource the table touches, the store's revision, and whether shard
  // "a" is still at epoch 5 (a claim of the same epoch changes nothing; it fails if a bad request
  // recorded a higher one).
  Snapshot Take() {
    Snapshot snap;
    for (const v1::GroupVersionResource& gvr :
         {Gvr("example.com", "v1", "widgets"), DefinitionGvr(),
          Gvr("cache.shardcache.io", "v1alpha1", "clustercachedresources"),
          Gvr("coordination.shardcache.io", "v1", "leases")}) {
      v1::ListRequest req;
      *req.mutable_resource() = gvr;
      v1::ListResponse resp;
      grpc::Status s = List(req, &resp);
      EXPECT_TRUE(s.ok()) << "snapshot: " << s.error_message();
      if (snap.revision.empty()) snap.revision = resp.resource_version();
      EXPECT_EQ(resp.resource_version(), snap.revision) << "lists at different revisions";
      snap.bytes += Bytes(resp);
    }
    v1::ClaimEpochResponse claimed;
    grpc::Status s = stub_->ClaimEpoch(
        Context().get(), FromJson<v1::ClaimEpochRequest>(R"({"fence":{"shard":"a","epoch":"5"}})"),
        &claimed);
    EXPECT_TRUE(s.ok()) << "snapshot: shard \"a\" is no longer at epoch 5: " << s.error_message();
    snap.bytes +=
        absl::StrCat("\nfence a/5: ", s.error_code(), " ", s.error_message(), " ", claimed.epoch());
    return snap;
  }

  template <typename Req>
  Req Parse(const BadRequest& row) {
    Req req = FromJson<Req>(row.json);
    if (row.tweak) row.tweak(&req);
    return req;
  }

  // Sends the row's request and returns the status it got (for a Write-stream operation, the
  // answer's code and message).
  grpc::Status Call(const BadRequest& row) {
    switch (row.rpc) {
      case Rpc::kCreate: {
        v1::Object out;
        return stub_->Create(Context().get(), Parse<v1::CreateRequest>(row), &out);
      }
      case Rpc::kUpdate: {
        v1::Object out;
        return stub_->Update(Context().get(), Parse<v1::UpdateRequest>(row), &out);
      }
      case Rpc::kUpdateStatus: {
        v1::Object out;
        return stub_->UpdateStatus(Context().get(), Parse<v1::UpdateRequest>(row), &out);
      }
      case Rpc::kDelete: {
        v1::DeleteResponse out;
        return stub_->Delete(Context().get(), Parse<v1::DeleteRequest>(row), &out);
      }
      case Rpc::kGet: {
        v1::Object out;
        return stub_->Get(Context().get(), Parse<v1::GetRequest>(row), &out);
      }
      case Rpc::kList: {
        v1::ListResponse out;
        return stub_->List(Context().get(), Parse<v1::ListRequest>(row), &out);
      }
      case Rpc::kWatch:
        return CallWatch(Parse<v1::WatchRequest>(row));
      case Rpc::kWrite:
        return CallWrite(Parse<v1::WriteRequest>(row));
      case Rpc::kClaimEpoch: {
        v1::ClaimEpochResponse out;
        return stub_->ClaimEpoch(Context().get(), Parse<v1::ClaimEpochRequest>(row), &out);
      }
    }
    return grpc::Status(grpc::StatusCode::INTERNAL, "unknown rpc in the table");
  }

  grpc::Status CallWatch(const v1::WatchRequest& req) {
    auto ctx = Context(absl::Seconds(10));
    auto reader = stub_->Watch(ctx.get(), req);
    v1::WatchEvent event;
    if (reader->Read(&event)) {
      // The watch started: that is the failure; end it.
      std::string first = ToJson(event);
      ctx->TryCancel();
      while (reader->Read(&event)) {
      }
      (void)reader->Finish();
      return grpc::Status(grpc::StatusCode::OK, "the watch started; first event: " + first);
    }
    return reader->Finish();
  }

  grpc::Status CallWrite(const v1::WriteRequest& req) {
    auto ctx = Context(absl::Seconds(10));
    auto stream = stub_->Write(ctx.get());
    EXPECT_TRUE(stream->Write(req));
    EXPECT_TRUE(stream->WritesDone());
    v1::WriteResponse answer;
    bool got = stream->Read(&answer);
    v1::WriteResponse extra;
    EXPECT_FALSE(stream->Read(&extra)) << "a second answer to one write: " << ToJson(extra);
    grpc::Status finished = stream->Finish();
    EXPECT_TRUE(finished.ok()) << "a failed write ended the stream: " << finished.error_message();
    if (!got) return grpc::Status(grpc::StatusCode::INTERNAL, "no answer on the Write stream");
    EXPECT_EQ(answer.id(), req.id()) << "the answer does not echo the write's id";
    EXPECT_FALSE(answer.has_object()) << "a failed write answered with an object";
    EXPECT_FALSE(answer.deleted());
    return grpc::Status(static_cast<grpc::StatusCode>(answer.code()), answer.message());
  }
};

TEST_P(BadRequestTest, FailsClearlyAndChangesNothing) {
  const BadRequest& row = GetParam();
  SCOPED_TRACE(absl::StrCat(RpcName(row.rpc), " ", row.json.substr(0, 400),
                            row.json.size() > 400 ? "..." : "",
                            row.tweak ? " (then changed in C++)" : ""));
  Snapshot before = Take();
  ASSERT_FALSE(before.revision.empty());
  ASSERT_EQ(before.revision, absl::StrCat(FirstRevision() + 7))
      << "the fixture's writes did not all happen";

  grpc::Status status = Call(row);
  EXPECT_EQ(status.error_code(), row.code) << "message: " << status.error_message();
  for (const std::string& part : row.message) {
    EXPECT_THAT(status.error_message(), HasSubstr(part));
  }

  Snapshot after = Take();
  EXPECT_EQ(after.revision, before.revision) << "a bad request raised the store's revision";
  EXPECT_TRUE(after.bytes == before.bytes)
      << "a bad request changed stored objects or shard \"a\"'s epoch";
}

INSTANTIATE_TEST_SUITE_P(Table, BadRequestTest, ::testing::ValuesIn(Rows()),
                         [](const ::testing::TestParamInfo<BadRequest>& info) {
                           return info.param.name;
                         });

// The table is meant to stay broad.
TEST(BadRequestTableTest, HasAtLeastThirtyDistinctRows) {
  std::vector<BadRequest> rows = Rows();
  EXPECT_GE(rows.size(), 30u);
  std::set<std::string> names;
  for (const BadRequest& row : rows) EXPECT_TRUE(names.insert(row.name).second) << row.name;
}

// ---- Unparsable writes inside a Write stream ----

class WriteStreamBadInputTest : public StoreFixture {};

// [good, 40 levels deep, 100 levels deep, good]: one answer per write, in order, the bad ones
// refused with the reason, and the stream goes on to apply the last write and end OK.
TEST_F(WriteStreamBadInputTest, UnparsableWritesBetweenGoodOnes_AreAnsweredInTurn) {
  StartServer({});
  const v1::GroupVersionResource w = Gvr("example.com", "v1", "widgets");
  auto write = [&](int64_t id, const std::string& name, int depth) {
    v1::WriteRequest req;
    req.set_id(id);
    *req.mutable_create()->mutable_resource() = w;
    *req.mutable_create()->mutable_object() = FromJson<v1::Object>(Obj("ns1", name));
    if (depth > 0) NestSpec(depth)(&req);
    return req;
  };
  auto ctx = Context(absl::Seconds(30));
  auto stream = stub_->Write(ctx.get());
  ASSERT_TRUE(stream->Write(write(1, "w1", 0)));
  ASSERT_TRUE(stream->Write(write(2, "w2", 40)));
  ASSERT_TRUE(stream->Write(write(3, "w3", 100)));
  ASSERT_TRUE(stream->Write(write(4, "w4", 0)));
  ASSERT_TRUE(stream->WritesDone());
  std::vector<v1::WriteResponse> answers;
  v1::WriteResponse answer;
  while (stream->Read(&answer)) answers.push_back(answer);
  grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_code() << ": " << finished.error_message();
  ASSERT_EQ(answers.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(answers[i].id(), i + 1);
  EXPECT_EQ(answers[0].code(), 0) << answers[0].message();
  EXPECT_EQ(answers[1].code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(answers[1].message(), HasSubstr("nested deeper than 24 levels"));
  EXPECT_EQ(answers[2].code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(answers[2].message(), HasSubstr("create.object.spec.a.a.a"));
  EXPECT_THAT(answers[2].message(), HasSubstr("nested too deeply to be parsed"));
  EXPECT_EQ(answers[3].code(), 0) << answers[3].message();
  EXPECT_TRUE(Ok(Get(w, "root", "ns1", "w1")));
  EXPECT_TRUE(Ok(Get(w, "root", "ns1", "w4")));
  EXPECT_EQ(Get(w, "root", "ns1", "w2").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Get(w, "root", "ns1", "w3").error_code(), grpc::StatusCode::NOT_FOUND);
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// A write cut short (not even its id can be read) cannot be answered: the writes before it are
// answered, then the stream ends with INVALID_ARGUMENT, and nothing after it is applied.
TEST_F(WriteStreamBadInputTest, WriteWithoutAReadableId_EndsTheStreamWithInvalidArgument) {
  StartServer({});
  const v1::GroupVersionResource w = Gvr("example.com", "v1", "widgets");
  auto write = [&](int64_t id, const std::string& name) {
    v1::WriteRequest req;
    req.set_id(id);
    *req.mutable_create()->mutable_resource() = w;
    *req.mutable_create()->mutable_object() = FromJson<v1::Object>(Obj("ns1", name));
    return req.SerializeAsString();
  };
  std::string cut = write(2, "w2");
  cut.pop_back();
  RawWriteStream stream(channel_);
  ASSERT_TRUE(stream.started());
  ASSERT_TRUE(stream.Write(write(1, "w1")));
  std::optional<v1::WriteResponse> first = stream.Read();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->id(), 1);
  EXPECT_EQ(first->code(), 0) << first->message();
  (void)stream.Write(cut);
  (void)stream.Write(write(3, "w3"));  // may fail: the server may have ended the stream
  (void)stream.WritesDone();
  std::optional<v1::WriteResponse> extra = stream.Read();
  EXPECT_FALSE(extra.has_value()) << "an answer to an unreadable write: " << ToJson(*extra);
  grpc::Status finished = stream.Finish();
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << finished.error_message();
  EXPECT_THAT(finished.error_message(),
              HasSubstr("cannot be parsed as shardcache.v1.WriteRequest"));
  EXPECT_THAT(finished.error_message(), HasSubstr("id cannot be read"));
  EXPECT_TRUE(Ok(Get(w, "root", "ns1", "w1")));
  EXPECT_EQ(Get(w, "root", "ns1", "w2").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Get(w, "root", "ns1", "w3").error_code(), grpc::StatusCode::NOT_FOUND);
}

// A unary request cut short gets INVALID_ARGUMENT, not UNIMPLEMENTED.
TEST_F(WriteStreamBadInputTest, UnaryRequestCutShort_IsInvalidArgument) {
  StartServer({});
  v1::CreateRequest req;
  *req.mutable_resource() = Gvr("example.com", "v1", "widgets");
  *req.mutable_object() = FromJson<v1::Object>(Obj("ns1", "w1"));
  std::string cut = req.SerializeAsString();
  cut.pop_back();
  grpc::GenericStub stub(channel_);
  grpc::ByteBuffer request = Buffer(cut);
  grpc::ByteBuffer response;
  auto ctx = Context();
  absl::Mutex mu;
  std::optional<grpc::Status> status;
  stub.UnaryCall(ctx.get(), "/shardcache.v1.Store/Create", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   absl::MutexLock l(&mu);
                   status = std::move(s);
                 });
  absl::MutexLock l(&mu);
  auto done = [&]() { return status.has_value(); };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(20)));
  EXPECT_EQ(status->error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status->error_message();
  EXPECT_THAT(status->error_message(),
              HasSubstr("cannot be parsed as shardcache.v1.CreateRequest"));
  EXPECT_THAT(status->error_message(), HasSubstr("malformed"));
}

}  // namespace
}  // namespace shardcache::testing
