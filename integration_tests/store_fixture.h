// StoreFixture: a GoogleTest fixture that runs a real cache_server on loopback ports it picks
// itself, with a Store stub connected to it, plus small helpers to build requests from JSON.
//
// Thread-compatible: use a fixture from its test's thread (stubs are thread-safe and may be
// shared with threads the test starts).
#ifndef SHARDCACHE_INTEGRATION_TESTS_STORE_FIXTURE_H_
#define SHARDCACHE_INTEGRATION_TESTS_STORE_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/testing/objects.h"
#include "common/testing/server_process.h"
#include "common/testing/wait.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::testing {

// Parses JSON (proto3 JSON mapping) into a message; fails the test on malformed input.
template <typename M>
M FromJson(absl::string_view json);
// Renders a message as one-line JSON.
std::string ToJson(const google::protobuf::Message& m);

// Success, or a failure that shows the gRPC status: EXPECT_TRUE(Ok(stub->Create(...))).
::testing::AssertionResult Ok(const grpc::Status& s);
// An object's resourceVersion as a number (a test failure when it is not one).
int64_t Rv(const v1::Object& o);
// The built-in ResourceDefinition resource, core.shardcache.io/v1 resourcedefinitions.
v1::GroupVersionResource DefinitionGvr();
// A ResourceDefinition for `plural`.`group`, served in `versions`.
v1::Object Definition(const std::string& group, const std::string& plural, const std::string& scope,
                      const std::vector<std::string>& versions, bool status_subresource);

class StoreFixture : public ::testing::Test {
 protected:
  // Starts cache_server with `args` (e.g. {"--role=shard"}) and connects stub_.
  void StartServer(std::vector<std::string> args);
  void TearDown() override;

  // Convenience wrappers: each returns the call's status and fills `out` when given.
  grpc::Status Create(const v1::GroupVersionResource& gvr, const v1::Object& obj,
                      v1::Object* out = nullptr);
  grpc::Status Update(const v1::GroupVersionResource& gvr, const v1::Object& obj,
                      v1::Object* out = nullptr);
  grpc::Status Get(const v1::GroupVersionResource& gvr, const std::string& cluster,
                   const std::string& ns, const std::string& name, v1::Object* out = nullptr);
  grpc::Status Delete(const v1::GroupVersionResource& gvr, const std::string& cluster,
                      const std::string& ns, const std::string& name,
                      v1::DeleteResponse* out = nullptr);
  grpc::Status List(const v1::ListRequest& req, v1::ListResponse* out);
  // Defines a resource on a shard store and fails the test if that fails.
  void Define(const std::string& group, const std::string& plural, const std::string& scope,
              const std::vector<std::string>& versions = {"v1"}, bool status_subresource = false);

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Store::Stub> stub_;
};

}  // namespace shardcache::testing

#include "integration_tests/store_fixture_inl.h"

#endif  // SHARDCACHE_INTEGRATION_TESTS_STORE_FIXTURE_H_
