// Tests of ParseRequest: requests that protobuf's default limits would refuse parse up to
// kMaxRequestNesting, and bytes that do not parse get INVALID_ARGUMENT with the field path and
// the reason; WriteRequestId finds the id of an unparsable write.
#include "cache_server/request_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "shardcache/v1/store.pb.h"

namespace shardcache {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer Buffer(const google::protobuf::Message& m) {
  return Buffer(m.SerializeAsString());
}

// A Create of a widget whose spec is {"a":{"a":...{"a":1}}}, `depth` objects deep.
v1::CreateRequest NestedCreate(int depth) {
  v1::CreateRequest req;
  req.mutable_resource()->set_resource("widgets");
  req.mutable_object()->mutable_metadata()->set_name("w1");
  google::protobuf::Struct* s = req.mutable_object()->mutable_spec();
  for (int i = 1; i < depth; ++i) s = (*s->mutable_fields())["a"].mutable_struct_value();
  (*s->mutable_fields())["a"].set_number_value(1);
  return req;
}

std::string Path(const std::string& root, int keys) {
  std::string path = root;
  for (int i = 0; i < keys; ++i) path += ".a";
  return path;
}

TEST(ParseRequestTest, NestedBeyondProtobufsDefault_Parses) {
  v1::CreateRequest want = NestedCreate(40);  // about 120 messages deep: over protobuf's 100
  v1::CreateRequest got;
  ASSERT_TRUE(ParseRequest(Buffer(want), &got).ok());
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
}

TEST(ParseRequestTest, NestedTooDeeply_NamesTheFieldPath) {
  v1::CreateRequest req;
  absl::Status s = ParseRequest(Buffer(NestedCreate(100)), &req);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cannot be parsed as shardcache.v1.CreateRequest"));
  EXPECT_THAT(s.message(), HasSubstr(Path("object.spec", 60)));
  EXPECT_THAT(s.message(), HasSubstr("nested too deeply to be parsed (more than 200"));
}

// Wherever protobuf's parser gives up on nesting, the explanation says so.
TEST(ParseRequestTest, AtTheLimit_ParserAndExplanationAgree) {
  int parsed = 0;
  int refused = 0;
  for (int depth = 55; depth <= 75; ++depth) {
    v1::CreateRequest req;
    absl::Status s = ParseRequest(Buffer(NestedCreate(depth)), &req);
    if (s.ok()) {
      ++parsed;
      EXPECT_EQ(refused, 0) << "depth " << depth << " parsed after a shallower one failed";
    } else {
      ++refused;
      EXPECT_THAT(s.message(), HasSubstr("nested too deeply")) << "depth " << depth;
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 0);
}

TEST(ParseRequestTest, NestedLists_PathHasIndexes) {
  v1::CreateRequest req;
  req.mutable_resource()->set_resource("widgets");
  google::protobuf::Value* v = &(*req.mutable_object()->mutable_spec()->mutable_fields())["l"];
  for (int i = 0; i < 150; ++i) {
    google::protobuf::ListValue* l = v->mutable_list_value();
    l->add_values()->set_string_value("x");
    v = l->add_values();
  }
  v->set_number_value(1);
  v1::CreateRequest out;
  absl::Status s = ParseRequest(Buffer(req), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("object.spec.l[1][1][1][1]"));
  EXPECT_THAT(s.message(), HasSubstr("nested too deeply"));
}

TEST(ParseRequestTest, StringNotUtf8_NamesTheField) {
  v1::CreateRequest req;
  req.mutable_object()->mutable_metadata()->set_name("w\xff");
  v1::CreateRequest out;
  absl::Status s = ParseRequest(Buffer(req), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("object.metadata.name: Invalid value: not valid UTF-8"));
}

TEST(ParseRequestTest, MapValueNotUtf8_NamesTheKey) {
  v1::CreateRequest req;
  req.mutable_object()->mutable_metadata()->set_name("w1");
  (*req.mutable_object()->mutable_metadata()->mutable_labels())["app"] = "\xc3";
  v1::CreateRequest out;
  absl::Status s = ParseRequest(Buffer(req), &out);
  EXPECT_THAT(s.message(),
              HasSubstr("object.metadata.labels[app]: Invalid value: not valid UTF-8"));
}

TEST(ParseRequestTest, CutShort_IsMalformed) {
  std::string bytes = NestedCreate(3).SerializeAsString();
  bytes.pop_back();
  v1::CreateRequest out;
  absl::Status s = ParseRequest(Buffer(bytes), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("object"));
  EXPECT_THAT(s.message(), HasSubstr("malformed"));
}

TEST(WriteRequestIdTest, UnparsableOperation_IdIsFound) {
  v1::WriteRequest write;
  *write.mutable_create() = NestedCreate(100);
  write.set_id(42);
  grpc::ByteBuffer bytes = Buffer(write);
  v1::WriteRequest out;
  absl::Status s = ParseRequest(bytes, &out);
  EXPECT_THAT(s.message(), HasSubstr(Path("create.object.spec", 60)));
  EXPECT_EQ(WriteRequestId(bytes), 42);
}

TEST(WriteRequestIdTest, TopLevelCutShort_NoId) {
  v1::WriteRequest write;
  write.set_id(42);
  *write.mutable_create() = NestedCreate(2);
  std::string bytes = write.SerializeAsString();
  bytes.pop_back();
  EXPECT_EQ(WriteRequestId(Buffer(bytes)), std::nullopt);
}

}  // namespace
}  // namespace shardcache
