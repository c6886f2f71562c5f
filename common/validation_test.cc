// Tests for common/validation.h: every predicate's accept/reject edges, and the exact k8s-style
// messages of the Validate* functions and field errors.
#include "common/validation.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The message of a status that must be INVALID_ARGUMENT.
std::string InvalidMessage(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

std::string Repeat(char c, size_t n) { return std::string(n, c); }

google::protobuf::Map<std::string, std::string> MakeMap(
    std::initializer_list<std::pair<const std::string, std::string>> entries) {
  google::protobuf::Map<std::string, std::string> m;
  for (const auto& [k, v] : entries) m[k] = v;
  return m;
}

google::protobuf::RepeatedPtrField<std::string> MakeList(std::initializer_list<std::string> items) {
  google::protobuf::RepeatedPtrField<std::string> list;
  for (const std::string& s : items) *list.Add() = s;
  return list;
}

struct PredicateCase {
  std::string value;
  bool want;
};

class ValidationTest : public ::testing::Test {};

// ---- DNS-1123 label ----

TEST_F(ValidationTest, IsDNS1123Label_Table) {
  const std::vector<PredicateCase> cases = {
      {"a", true},
      {"0", true},
      {"a-b", true},
      {"a--b", true},
      {"123-abc", true},
      {Repeat('a', 63), true},
      {Repeat('a', 64), false},
      {"", false},
      {"A", false},
      {"my-Name", false},
      {"-a", false},
      {"a-", false},
      {"a.b", false},
      {"a_b", false},
      {"a b", false},
      {"a:b", false},
  };
  for (const PredicateCase& c : cases) {
    EXPECT_EQ(IsDNS1123Label(c.value), c.want) << "\"" << c.value << "\"";
    EXPECT_EQ(ValidateDNS1123Label("p", c.value).ok(), c.want) << "\"" << c.value << "\"";
  }
}

TEST_F(ValidationTest, ValidateDNS1123Label_Empty_IsRequired) {
  EXPECT_EQ(InvalidMessage(ValidateDNS1123Label("metadata.namespace", "")),
            "metadata.namespace: Required value");
}

TEST_F(ValidationTest, ValidateDNS1123Label_BadChars_SaysRule) {
  EXPECT_EQ(InvalidMessage(ValidateDNS1123Label("metadata.namespace", "My_ns")),
            "metadata.namespace: Invalid value: \"My_ns\": a lowercase RFC 1123 label must consist "
            "of lower case alphanumeric characters or '-', and must start and end with an "
            "alphanumeric character (e.g. 'my-name' or '123-abc')");
}

TEST_F(ValidationTest, ValidateDNS1123Label_Dots_SaysNoDots) {
  EXPECT_EQ(InvalidMessage(ValidateDNS1123Label("p", "a.b")),
            "p: Invalid value: \"a.b\": must not contain dots");
}

TEST_F(ValidationTest, ValidateDNS1123Label_TooLongAndBad_JoinsBothReasons) {
  const std::string value = Repeat('a', 63) + "_";
  const std::string msg = InvalidMessage(ValidateDNS1123Label("p", value));
  EXPECT_THAT(msg, StartsWith("p: Invalid value: \"" + value +
                              "\": must be no more than 63 characters; a lowercase RFC 1123 "
                              "label must consist"));
}

// ---- DNS-1123 subdomain ----

TEST_F(ValidationTest, IsDNS1123Subdomain_Table) {
  const std::vector<PredicateCase> cases = {
      {"a", true},
      {"example.com", true},
      {"a.b-c.d", true},
      {"0.1", true},
      {Repeat('a', 253), true},
      {Repeat('a', 100) + "." + Repeat('b', 100), true},
      // As in k8s, the parts of a subdomain have no length limit of their own.
      {Repeat('a', 64) + ".com", true},
      {Repeat('a', 254), false},
      {"", false},
      {"Foo_", false},
      {"Example.com", false},
      {"a..b", false},
      {".a", false},
      {"a.", false},
      {"-a.b", false},
      {"a-.b", false},
      {"a.-b", false},
      {"a_b.c", false},
      {"a/b", false},
  };
  for (const PredicateCase& c : cases) {
    EXPECT_EQ(IsDNS1123Subdomain(c.value), c.want) << "\"" << c.value << "\"";
    EXPECT_EQ(ValidateDNS1123Subdomain("p", c.value).ok(), c.want) << "\"" << c.value << "\"";
  }
}

TEST_F(ValidationTest, ValidateDNS1123Subdomain_BadChars_K8sMessage) {
  EXPECT_EQ(
      InvalidMessage(ValidateDNS1123Subdomain("metadata.name", "Foo_")),
      "metadata.name: Invalid value: \"Foo_\": a lowercase RFC 1123 subdomain must consist of "
      "lower case alphanumeric characters, '-' or '.', and must start and end with an "
      "alphanumeric character (e.g. 'example.com')");
}

TEST_F(ValidationTest, ValidateDNS1123Subdomain_Empty_IsRequired) {
  EXPECT_EQ(InvalidMessage(ValidateDNS1123Subdomain("metadata.name", "")),
            "metadata.name: Required value");
}

TEST_F(ValidationTest, ValidateDNS1123Subdomain_254Chars_TooLong) {
  const std::string value = Repeat('a', 254);
  EXPECT_EQ(InvalidMessage(ValidateDNS1123Subdomain("metadata.name", value)),
            "metadata.name: Invalid value: \"" + value + "\": must be no more than 253 characters");
}

TEST_F(ValidationTest, ValidateDNS1123Subdomain_EmptyPath_NoPrefix) {
  EXPECT_THAT(InvalidMessage(ValidateDNS1123Subdomain("", "A")),
              StartsWith("Invalid value: \"A\": a lowercase RFC 1123 subdomain"));
  EXPECT_EQ(InvalidMessage(ValidateDNS1123Subdomain("", "")), "Required value");
}

// ---- Logical cluster names ----

TEST_F(ValidationTest, IsClusterName_Table) {
  const std::string seg63 = Repeat('a', 63);
  const std::vector<PredicateCase> cases = {
      {"root", true},
      {"a", true},
      {"root:org:team-a", true},
      {"2x:y", true},
      {seg63, true},
      {seg63 + ":" + seg63 + ":" + seg63 + ":" + Repeat('a', 61), true},   // 253
      {seg63 + ":" + seg63 + ":" + seg63 + ":" + Repeat('a', 62), false},  // 254
      {Repeat('a', 64), false},
      {"root:" + Repeat('a', 64), false},
      {"", false},
      {"Root", false},
      {"root:", false},
      {":root", false},
      {"root::org", false},
      {"root/org", false},
      {"root.org", false},
      {"root:-org", false},
      {"root:org-", false},
  };
  for (const PredicateCase& c : cases) {
    EXPECT_EQ(IsClusterName(c.value), c.want) << "\"" << c.value << "\"";
    EXPECT_EQ(ValidateClusterName("metadata.cluster", c.value).ok(), c.want)
        << "\"" << c.value << "\"";
  }
}

TEST_F(ValidationTest, ValidateClusterName_Messages) {
  EXPECT_EQ(InvalidMessage(ValidateClusterName("metadata.cluster", "")),
            "metadata.cluster: Required value");
  EXPECT_EQ(
      InvalidMessage(ValidateClusterName("metadata.cluster", "root::org")),
      "metadata.cluster: Invalid value: \"root::org\": a logical cluster name must consist of "
      "one or more lowercase RFC 1123 labels (each at most 63 characters) separated by ':' "
      "(e.g. 'root' or 'root:org:team-a')");
  EXPECT_THAT(InvalidMessage(ValidateClusterName("c", Repeat('a', 254))),
              HasSubstr("must be no more than 253 characters"));
}

// ---- Qualified names ----

TEST_F(ValidationTest, IsQualifiedName_Table) {
  const std::string prefix253 = Repeat('a', 253);
  const std::vector<PredicateCase> cases = {
      {"a", true},
      {"A", true},
      {"MyName", true},
      {"my.name", true},
      {"123-abc", true},
      {"a_b.c-D", true},
      {Repeat('a', 63), true},
      {"example.com/MyName", true},
      {"example.com/" + Repeat('a', 63), true},
      {prefix253 + "/a", true},
      {"k8s.io/a", true},
      {"", false},
      {Repeat('a', 64), false},
      {"example.com/" + Repeat('a', 64), false},
      {Repeat('a', 254) + "/a", false},
      {"/a", false},
      {"a/", false},
      {"a/b/c", false},
      {"_a", false},
      {"a_", false},
      {"-a", false},
      {"a.", false},
      {"a b", false},
      {"a=b", false},
      {"Example.com/a", false},
      {"exa_mple.com/a", false},
  };
  for (const PredicateCase& c : cases) {
    EXPECT_EQ(IsQualifiedName(c.value), c.want) << "\"" << c.value << "\"";
    EXPECT_EQ(ValidateQualifiedName("p", c.value).ok(), c.want) << "\"" << c.value << "\"";
  }
}

TEST_F(ValidationTest, ValidateQualifiedName_Messages) {
  struct Case {
    std::string value;
    std::string want;
  };
  const std::string name_rule =
      "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
      "alphanumeric character (e.g. 'MyName', 'my.name' or '123-abc')";
  const std::vector<Case> cases = {
      {"Foo_", "k: Invalid value: \"Foo_\": name part " + name_rule},
      {"", "k: Invalid value: \"\": name part must be non-empty; name part " + name_rule},
      {"/a", "k: Invalid value: \"/a\": prefix part must be non-empty"},
      {"a/", "k: Invalid value: \"a/\": name part must be non-empty; name part " + name_rule},
      {Repeat('a', 64), "k: Invalid value: \"" + Repeat('a', 64) +
                            "\": name part must be no more than 63 characters"},
      {"Example.com/a",
       "k: Invalid value: \"Example.com/a\": prefix part a lowercase RFC 1123 subdomain must "
       "consist of lower case alphanumeric characters, '-' or '.', and must start and end with an "
       "alphanumeric character (e.g. 'example.com')"},
      {Repeat('a', 254) + "/a", "k: Invalid value: \"" + Repeat('a', 254) +
                                    "/a\": prefix part must be no more than 253 characters"},
      {"a/b/c", "k: Invalid value: \"a/b/c\": a qualified name " + name_rule +
                    " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(InvalidMessage(ValidateQualifiedName("k", c.value)), c.want);
  }
}

// ---- Label values ----

TEST_F(ValidationTest, IsValidLabelValue_Table) {
  const std::vector<PredicateCase> cases = {
      {"", true},      {"a", true},         {"MyValue", true},       {"my_value", true},
      {"12345", true}, {"A.b_c-D", true},   {Repeat('a', 63), true}, {Repeat('a', 64), false},
      {"-a", false},   {"a_", false},       {"a b", false},          {"a/b", false},
      {"a:b", false},  {"\xc3\xa4", false},
  };
  for (const PredicateCase& c : cases) {
    EXPECT_EQ(IsValidLabelValue(c.value), c.want) << "\"" << c.value << "\"";
    EXPECT_EQ(ValidateLabelValue("p", c.value).ok(), c.want) << "\"" << c.value << "\"";
  }
}

TEST_F(ValidationTest, ValidateLabelValue_Messages) {
  EXPECT_EQ(InvalidMessage(ValidateLabelValue("v", "b_")),
            "v: Invalid value: \"b_\": a valid label must be an empty string or consist of "
            "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character (e.g. 'MyValue', 'my_value' or '12345')");
  EXPECT_EQ(InvalidMessage(ValidateLabelValue("v", Repeat('a', 64))),
            "v: Invalid value: \"" + Repeat('a', 64) + "\": must be no more than 63 characters");
}

// ---- Labels ----

TEST_F(ValidationTest, ValidateLabels_Valid_Ok) {
  EXPECT_TRUE(ValidateLabels("metadata.labels", MakeMap({})).ok());
  EXPECT_TRUE(ValidateLabels("metadata.labels",
                             MakeMap({{"app", "web"}, {"example.com/tier", ""}, {"A_b", "C.d"}}))
                  .ok());
}

TEST_F(ValidationTest, ValidateLabels_BadKey_ErrorAtMapPath) {
  EXPECT_THAT(InvalidMessage(ValidateLabels("metadata.labels", MakeMap({{"Foo_", "x"}}))),
              StartsWith("metadata.labels: Invalid value: \"Foo_\": name part must consist"));
}

TEST_F(ValidationTest, ValidateLabels_BadValue_ErrorAtKeyPath) {
  EXPECT_THAT(InvalidMessage(ValidateLabels("metadata.labels", MakeMap({{"app", "b_"}}))),
              StartsWith("metadata.labels[app]: Invalid value: \"b_\": a valid label must"));
}

TEST_F(ValidationTest, ValidateLabels_SeveralBad_ReportsFirstKeyInOrder) {
  const auto labels = MakeMap({{"z", "z_"}, {"b", "b_"}, {"m", "m_"}});
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(InvalidMessage(ValidateLabels("l", labels)), StartsWith("l[b]: "));
  }
}

// ---- Annotations ----

TEST_F(ValidationTest, ValidateAnnotations_Valid_Ok) {
  EXPECT_TRUE(ValidateAnnotations(
                  "metadata.annotations",
                  MakeMap({{"note", "any text, even {\"json\": [1, 2]}\n"}, {"example.com/x", ""}}))
                  .ok());
}

TEST_F(ValidationTest, ValidateAnnotations_UpperCasePrefix_AllowedAsInK8s) {
  EXPECT_TRUE(ValidateAnnotations("a", MakeMap({{"Example.COM/Foo", "v"}})).ok());
  // The same key is not a valid label key.
  EXPECT_FALSE(ValidateLabels("l", MakeMap({{"Example.COM/Foo", "v"}})).ok());
}

TEST_F(ValidationTest, ValidateAnnotations_BadKey_ErrorAtMapPath) {
  EXPECT_THAT(InvalidMessage(ValidateAnnotations("metadata.annotations", MakeMap({{"a b", "v"}}))),
              StartsWith("metadata.annotations: Invalid value: \"a b\": name part must consist"));
  EXPECT_FALSE(ValidateAnnotations("a", MakeMap({{"", "v"}})).ok());
}

TEST_F(ValidationTest, ValidateAnnotations_TotalSizeAtLimit_Ok) {
  // Keys and values together: exactly 262144 bytes.
  const auto annotations =
      MakeMap({{"a", Repeat('x', 131072 - 1)}, {"b", Repeat('y', 131072 - 1)}});
  EXPECT_TRUE(ValidateAnnotations("metadata.annotations", annotations).ok());
}

TEST_F(ValidationTest, ValidateAnnotations_TotalSizeOverLimit_TooLong) {
  const auto annotations = MakeMap({{"a", Repeat('x', 131072 - 1)}, {"b", Repeat('y', 131072)}});
  EXPECT_EQ(InvalidMessage(ValidateAnnotations("metadata.annotations", annotations)),
            "metadata.annotations: Too long: must have at most 262144 bytes");
}

// ---- Finalizers ----

TEST_F(ValidationTest, ValidateFinalizers_Valid_Ok) {
  EXPECT_TRUE(ValidateFinalizers("metadata.finalizers", MakeList({})).ok());
  EXPECT_TRUE(
      ValidateFinalizers("metadata.finalizers", MakeList({"cache.shardcache.io/purge", "x"})).ok());
}

TEST_F(ValidationTest, ValidateFinalizers_BadName_ErrorAtIndex) {
  EXPECT_THAT(
      InvalidMessage(ValidateFinalizers("metadata.finalizers", MakeList({"a", "b/c", "bad name"}))),
      StartsWith("metadata.finalizers[2]: Invalid value: \"bad name\": name part must consist"));
  EXPECT_THAT(InvalidMessage(ValidateFinalizers("f", MakeList({""}))),
              StartsWith("f[0]: Invalid value: \"\": name part must be non-empty"));
}

TEST_F(ValidationTest, ValidateFinalizers_Duplicate_ErrorAtSecond) {
  EXPECT_EQ(
      InvalidMessage(ValidateFinalizers("metadata.finalizers", MakeList({"a/b", "c", "a/b"}))),
      "metadata.finalizers[2]: Duplicate value: \"a/b\"");
}

// ---- GroupVersionResource ----

shardcache::v1::GroupVersionResource Gvr(const std::string& g, const std::string& v,
                                         const std::string& r) {
  shardcache::v1::GroupVersionResource gvr;
  gvr.set_group(g);
  gvr.set_version(v);
  gvr.set_resource(r);
  return gvr;
}

TEST_F(ValidationTest, ValidateGroupVersionResource_Valid_Ok) {
  EXPECT_TRUE(ValidateGroupVersionResource("resource", Gvr("", "v1", "widgets")).ok());
  EXPECT_TRUE(
      ValidateGroupVersionResource("resource", Gvr("example.com", "v1alpha1", "widgets")).ok());
  EXPECT_TRUE(ValidateGroupVersionResource(
                  "resource", Gvr("cache.shardcache.io", "v1alpha1", "clustercachedresources"))
                  .ok());
}

TEST_F(ValidationTest, ValidateGroupVersionResource_Errors_NameSubField) {
  struct Case {
    shardcache::v1::GroupVersionResource gvr;
    std::string want_prefix;
  };
  const std::vector<Case> cases = {
      {Gvr("Example.com", "v1", "widgets"),
       "resource.group: Invalid value: \"Example.com\": a lowercase RFC 1123 subdomain"},
      {Gvr("example.com", "", "widgets"), "resource.version: Required value"},
      {Gvr("example.com", "V1", "widgets"),
       "resource.version: Invalid value: \"V1\": a lowercase RFC 1123 label"},
      {Gvr("example.com", "v1", ""), "resource.resource: Required value"},
      {Gvr("example.com", "v1", "my.widgets"),
       "resource.resource: Invalid value: \"my.widgets\": must not contain dots"},
      {Gvr("example.com", "v1", Repeat('w', 64)), "resource.resource: Invalid value: \"www"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(InvalidMessage(ValidateGroupVersionResource("resource", c.gvr)),
                StartsWith(c.want_prefix))
        << c.gvr.ShortDebugString();
  }
  EXPECT_EQ(InvalidMessage(ValidateGroupVersionResource("", Gvr("", "", "w"))),
            "version: Required value");
}

// ---- Field errors and quoting ----

TEST_F(ValidationTest, FieldErrors_K8sFormat) {
  EXPECT_EQ(InvalidMessage(FieldRequired("a.b")), "a.b: Required value");
  EXPECT_EQ(InvalidMessage(FieldRequired("a.b", "must be set")),
            "a.b: Required value: must be set");
  EXPECT_EQ(InvalidMessage(FieldForbidden("a", "no")), "a: Forbidden: no");
  EXPECT_EQ(InvalidMessage(FieldNotSupported("op", "X", {"In", "NotIn"})),
            "op: Unsupported value: \"X\": supported values: \"In\", \"NotIn\"");
  EXPECT_EQ(InvalidMessage(FieldDuplicate("f[1]", "x")), "f[1]: Duplicate value: \"x\"");
  EXPECT_EQ(InvalidMessage(FieldTooLong("a", 10)), "a: Too long: must have at most 10 bytes");
  EXPECT_EQ(InvalidMessage(FieldInvalid("a", "v", "bad")), "a: Invalid value: \"v\": bad");
  EXPECT_EQ(InvalidMessage(FieldInvalidRendered("a", "5", "must be a string")),
            "a: Invalid value: 5: must be a string");
}

TEST_F(ValidationTest, Paths_JoinAsK8s) {
  EXPECT_EQ(ChildPath("metadata", "name"), "metadata.name");
  EXPECT_EQ(ChildPath("", "name"), "name");
  EXPECT_EQ(KeyPath("metadata.labels", "app"), "metadata.labels[app]");
  EXPECT_EQ(IndexPath("metadata.finalizers", 2), "metadata.finalizers[2]");
}

TEST_F(ValidationTest, QuoteForMessage_EscapesToPrintableAscii) {
  EXPECT_EQ(QuoteForMessage("plain"), "\"plain\"");
  EXPECT_EQ(QuoteForMessage("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(QuoteForMessage("a\nb\t"), "\"a\\nb\\t\"");
  EXPECT_EQ(QuoteForMessage(std::string("\xc3\xa4\x00", 3)), "\"\\xc3\\xa4\\x00\"");
}

TEST_F(ValidationTest, QuoteForMessage_LongValue_Truncated) {
  EXPECT_EQ(QuoteForMessage(Repeat('a', 512)), "\"" + Repeat('a', 512) + "\"");
  EXPECT_EQ(QuoteForMessage(Repeat('a', 1000)), "\"" + Repeat('a', 512) + "\"... (488 more bytes)");
  // A huge invalid name gives a bounded message.
  EXPECT_LT(InvalidMessage(ValidateDNS1123Subdomain("metadata.name", Repeat('X', 1 << 20))).size(),
            1000u);
}

}  // namespace
}  // namespace shardcache
