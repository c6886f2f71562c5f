#include "common/struct_codec.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/testing/status_matchers.h"
#include "shardcache/types/v1/types.pb.h"

namespace shardcache {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;
using types::v1::ClusterCachedResourceSpec;
using types::v1::LeaseSpec;

google::protobuf::Struct JsonStruct(const std::string& json) {
  google::protobuf::Struct s;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &s).ok()) << json;
  return s;
}

// `s` equals the Struct of `json` (Struct's map has no order: compare the messages).
::testing::AssertionResult IsJson(const google::protobuf::Struct& s, const std::string& json) {
  if (google::protobuf::util::MessageDifferencer::Equals(s, JsonStruct(json))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << s.DebugString() << " is not " << json;
}

TEST(StructCodecTest, Int64AboveTwoToThe53_RoundTripsExactly) {
  const int64_t big = (int64_t{1} << 53) + 1;  // not a double
  LeaseSpec spec;
  spec.set_lease_transitions(big);
  google::protobuf::Struct s = MessageToStruct(spec);
  EXPECT_EQ(s.fields().at("leaseTransitions").string_value(), "9007199254740993");
  LeaseSpec back;
  ASSERT_THAT(StructToMessage(s, "spec", &back), IsOk());
  EXPECT_EQ(back.lease_transitions(), big);

  spec.set_lease_transitions(INT64_MAX);
  ASSERT_THAT(StructToMessage(MessageToStruct(spec), "spec", &back), IsOk());
  EXPECT_EQ(back.lease_transitions(), INT64_MAX);
  spec.set_lease_transitions(INT64_MIN);
  ASSERT_THAT(StructToMessage(MessageToStruct(spec), "spec", &back), IsOk());
  EXPECT_EQ(back.lease_transitions(), INT64_MIN);
}

TEST(StructCodecTest, Int64UpToTwoToThe53_IsAJsonNumberAsBefore) {
  LeaseSpec spec;
  spec.set_lease_transitions(int64_t{1} << 53);
  spec.set_holder_identity("a");
  EXPECT_TRUE(IsJson(MessageToStruct(spec),
                     R"({"holderIdentity":"a","leaseTransitions":9007199254740992})"));
  // Stored data in the numeric form reads as it always did.
  LeaseSpec back;
  ASSERT_THAT(StructToMessage(JsonStruct(R"({"leaseTransitions": 7})"), "spec", &back), IsOk());
  EXPECT_EQ(back.lease_transitions(), 7);
}

TEST(StructCodecTest, OptionalFields_WrittenWhenSetEvenIfEmpty) {
  LeaseSpec spec;
  EXPECT_TRUE(IsJson(MessageToStruct(spec), "{}"));
  spec.set_holder_identity("");
  spec.set_lease_transitions(0);
  EXPECT_TRUE(IsJson(MessageToStruct(spec), R"({"holderIdentity":"","leaseTransitions":0})"));
}

TEST(StructCodecTest, NestedMessagesMapsAndLists_RoundTrip) {
  ClusterCachedResourceSpec spec;
  ASSERT_THAT(StructToMessage(JsonStruct(R"({"group": "example.io", "version": "v1",
      "resource": "widgets", "labelSelector": {"matchLabels": {"tier": "gold"},
      "matchExpressions": [{"key": "env", "operator": "In", "values": ["a", "b"]}]}})"),
                              "spec", &spec),
              IsOk());
  EXPECT_EQ(spec.label_selector().match_labels().at("tier"), "gold");
  EXPECT_EQ(spec.label_selector().match_expressions(0).values(1), "b");
  EXPECT_TRUE(IsJson(MessageToStruct(spec),
                     R"({"group":"example.io","labelSelector":{"matchExpressions":[{"key":"env",)"
                     R"("operator":"In","values":["a","b"]}],"matchLabels":{"tier":"gold"}},)"
                     R"("resource":"widgets","version":"v1"})"));
}

TEST(StructCodecTest, NullIsAbsent) {
  LeaseSpec spec;
  ASSERT_THAT(StructToMessage(JsonStruct(R"({"holderIdentity": null})"), "spec", &spec), IsOk());
  EXPECT_FALSE(spec.has_holder_identity());
}

TEST(StructCodecTest, Errors_NameTheField) {
  struct Case {
    std::string json;
    std::string want;
  };
  const Case cases[] = {
      {R"({"holderIdentity": 1})", "spec.holderIdentity: Invalid value: 1: must be a string"},
      {R"({"leaseTransitions": 1.5})",
       "spec.leaseTransitions: Invalid value: 1.5: must be an integer"},
      {R"({"leaseTransitions": "1e3"})",
       "spec.leaseTransitions: Invalid value: \"1e3\": must be an integer"},
      {R"({"leaseTransitions": 1e19})",
       "spec.leaseTransitions: Invalid value: 1e+19: must be an integer"},
      {R"({"leaseDurationSeconds": "x"})",
       "spec.leaseDurationSeconds: Invalid value: \"x\": must be a number"},
      {R"({"nope": 1, "also": 2})",
       "spec.also: Forbidden: unknown field; the known fields are \"acquireTime\", "
       "\"holderIdentity\", \"leaseDurationSeconds\", \"leaseTransitions\", \"renewTime\""},
  };
  for (const Case& c : cases) {
    LeaseSpec spec;
    EXPECT_THAT(StructToMessage(JsonStruct(c.json), "spec", &spec),
                StatusIs(absl::StatusCode::kInvalidArgument, c.want))
        << c.json;
  }
  LeaseSpec spec;
  StructCodecOptions lenient;
  lenient.ignore_unknown_fields = true;
  EXPECT_THAT(StructToMessage(JsonStruct(R"({"nope": 1})"), "spec", &spec, lenient), IsOk());
  // Strict where asked, however lenient elsewhere.
  lenient.strict_messages = {types::v1::LabelSelectorSpec::descriptor()};
  ClusterCachedResourceSpec lenient_ccr;
  EXPECT_THAT(StructToMessage(JsonStruct(R"({"nope": 1, "labelSelector": {"matchLabel": {}}})"),
                              "spec", &lenient_ccr, lenient),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("spec.labelSelector.matchLabel: Forbidden: unknown field")));
  ClusterCachedResourceSpec ccr;
  EXPECT_THAT(
      StructToMessage(JsonStruct(R"({"labelSelector": {"matchExpressions": [{"key": 5}]}})"),
                      "spec", &ccr),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("spec.labelSelector.matchExpressions[0].key: Invalid value: 5: must be "
                         "a string")));
}

}  // namespace
}  // namespace shardcache
