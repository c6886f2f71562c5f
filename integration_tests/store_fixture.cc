#include "integration_tests/store_fixture.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/numbers.h"

namespace shardcache::testing {

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out);
  return out;
}

::testing::AssertionResult Ok(const grpc::Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "gRPC status " << s.error_code() << ": " << s.error_message();
}

int64_t Rv(const v1::Object& o) {
  int64_t rv = 0;
  EXPECT_TRUE(absl::SimpleAtoi(o.metadata().resource_version(), &rv))
      << "resourceVersion is not a number: " << ToJson(o);
  return rv;
}

v1::GroupVersionResource DefinitionGvr() {
  return Gvr("core.shardcache.io", "v1", "resourcedefinitions");
}

v1::Object Definition(const std::string& group, const std::string& plural, const std::string& scope,
                      const std::vector<std::string>& versions, bool status_subresource) {
  std::string vs;
  for (const auto& v : versions) {
    if (!vs.empty()) vs += ",";
    vs += "{\"name\":\"" + v + "\",\"served\":true}";
  }
  std::string json = "{\"metadata\":{\"name\":\"" + plural + "." + group +
                     "\"},\"spec\":{\"group\":\"" + group + "\",\"names\":{\"plural\":\"" + plural +
                     "\"},\"scope\":\"" + scope + "\",\"versions\":[" + vs + "]" +
                     (status_subresource ? ",\"subresources\":{\"status\":{}}" : "") + "}}";
  return FromJson<v1::Object>(json);
}

void StoreFixture::StartServer(std::vector<std::string> args) {
  server_ =
      std::make_unique<ServerProcess>(BinaryPath("cache_server/cache_server"), std::move(args));
  absl::Status started = server_->Start();
  ASSERT_TRUE(started.ok()) << started;
  channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
  stub_ = v1::Store::NewStub(channel_);
}

void StoreFixture::TearDown() {
  stub_.reset();
  channel_.reset();
  if (server_ != nullptr && server_->Running()) {
    int status = server_->Stop();
    EXPECT_EQ(status, 0) << "cache_server did not exit cleanly on SIGTERM";
  }
  server_.reset();
}

grpc::Status StoreFixture::Create(const v1::GroupVersionResource& gvr, const v1::Object& obj,
                                  v1::Object* out) {
  v1::CreateRequest req;
  *req.mutable_resource() = gvr;
  *req.mutable_object() = obj;
  v1::Object resp;
  grpc::Status s = stub_->Create(Context().get(), req, &resp);
  if (out) *out = resp;
  return s;
}

grpc::Status StoreFixture::Update(const v1::GroupVersionResource& gvr, const v1::Object& obj,
                                  v1::Object* out) {
  v1::UpdateRequest req;
  *req.mutable_resource() = gvr;
  *req.mutable_object() = obj;
  v1::Object resp;
  grpc::Status s = stub_->Update(Context().get(), req, &resp);
  if (out) *out = resp;
  return s;
}

grpc::Status StoreFixture::Get(const v1::GroupVersionResource& gvr, const std::string& cluster,
                               const std::string& ns, const std::string& name, v1::Object* out) {
  v1::GetRequest req;
  *req.mutable_resource() = gvr;
  req.set_cluster(cluster);
  req.set_namespace_(ns);
  req.set_name(name);
  v1::Object resp;
  grpc::Status s = stub_->Get(Context().get(), req, &resp);
  if (out) *out = resp;
  return s;
}

grpc::Status StoreFixture::Delete(const v1::GroupVersionResource& gvr, const std::string& cluster,
                                  const std::string& ns, const std::string& name,
                                  v1::DeleteResponse* out) {
  v1::DeleteRequest req;
  *req.mutable_resource() = gvr;
  req.set_cluster(cluster);
  req.set_namespace_(ns);
  req.set_name(name);
  v1::DeleteResponse resp;
  grpc::Status s = stub_->Delete(Context().get(), req, &resp);
  if (out) *out = resp;
  return s;
}

grpc::Status StoreFixture::List(const v1::ListRequest& req, v1::ListResponse* out) {
  return stub_->List(Context().get(), req, out);
}

void StoreFixture::Define(const std::string& group, const std::string& plural,
                          const std::string& scope, const std::vector<std::string>& versions,
                          bool status_subresource) {
  grpc::Status s =
      Create(DefinitionGvr(), Definition(group, plural, scope, versions, status_subresource));
  ASSERT_TRUE(s.ok()) << s.error_message();
}

}  // namespace shardcache::testing
