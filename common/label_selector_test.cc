// Tests for common/label_selector.h: matching with every operator, the k8s grammar (whitespace,
// keywords, empty values), malformed input and its messages, FromStruct and its errors, and the
// canonical string form.
#include "common/label_selector.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace shardcache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using Labels = std::map<std::string, std::string>;

google::protobuf::Map<std::string, std::string> ToProtoMap(const Labels& labels) {
  google::protobuf::Map<std::string, std::string> m;
  for (const auto& [k, v] : labels) m[k] = v;
  return m;
}

google::protobuf::Struct JsonStruct(const std::string& json) {
  google::protobuf::Struct s;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &s).ok()) << json;
  return s;
}

class LabelSelectorTest : public ::testing::Test {
 protected:
  // Parses `text`, which must be valid.
  static LabelSelector MustParse(const std::string& text) {
    absl::StatusOr<LabelSelector> s = LabelSelector::Parse(text);
    EXPECT_TRUE(s.ok()) << "\"" << text << "\": " << s.status();
    return s.ok() ? *s : LabelSelector();
  }

  // The message of parsing `text`, which must fail with INVALID_ARGUMENT.
  static std::string ParseError(const std::string& text) {
    absl::StatusOr<LabelSelector> s = LabelSelector::Parse(text);
    if (s.ok()) {
      ADD_FAILURE() << "\"" << text << "\" parsed as \"" << s->ToString() << "\"";
      return "";
    }
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    return std::string(s.status().message());
  }

  static std::string FromStructError(const std::string& json) {
    absl::StatusOr<LabelSelector> s = LabelSelector::FromStruct(JsonStruct(json));
    if (s.ok()) {
      ADD_FAILURE() << json << " gave \"" << s->ToString() << "\"";
      return "";
    }
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    return std::string(s.status().message());
  }

  // Checks both Matches overloads agree with `want`.
  static void ExpectMatch(const LabelSelector& sel, const Labels& labels, bool want,
                          const std::string& what) {
    EXPECT_EQ(sel.Matches(labels), want) << what << " (std::map)";
    EXPECT_EQ(sel.Matches(ToProtoMap(labels)), want) << what << " (protobuf Map)";
  }
};

// ---- Matching ----

struct MatchCase {
  std::string selector;
  Labels labels;
  bool want;
};

TEST_F(LabelSelectorTest, Matches_EveryOperator_Table) {
  const std::vector<MatchCase> cases = {
      // Equality.
      {"a=b", {{"a", "b"}}, true},
      {"a=b", {{"a", "c"}}, false},
      {"a=b", {}, false},
      {"a=b", {{"x", "b"}}, false},
      {"a==b", {{"a", "b"}}, true},
      {"a==b", {{"a", "c"}}, false},
      {"a==b", {}, false},
      // Inequality: matches when the key is absent.
      {"a!=b", {{"a", "b"}}, false},
      {"a!=b", {{"a", "c"}}, true},
      {"a!=b", {}, true},
      // Sets.
      {"a in (x,y)", {{"a", "x"}}, true},
      {"a in (x,y)", {{"a", "y"}}, true},
      {"a in (x,y)", {{"a", "z"}}, false},
      {"a in (x,y)", {}, false},
      {"a notin (x,y)", {{"a", "x"}}, false},
      {"a notin (x,y)", {{"a", "z"}}, true},
      {"a notin (x,y)", {}, true},
      // Existence.
      {"a", {{"a", ""}}, true},
      {"a", {{"a", "v"}}, true},
      {"a", {{"b", "v"}}, false},
      {"!a", {}, true},
      {"!a", {{"b", "v"}}, true},
      {"!a", {{"a", ""}}, false},
      // Empty values.
      {"a=", {{"a", ""}}, true},
      {"a=", {{"a", "x"}}, false},
      {"a=", {}, false},
      {"a!=", {}, true},
      {"a!=", {{"a", ""}}, false},
      {"a in ()", {{"a", ""}}, true},
      {"a in ()", {{"a", "x"}}, false},
      {"a notin ()", {}, true},
      {"a notin ()", {{"a", ""}}, false},
      {"a notin ()", {{"a", "x"}}, true},
      {"a in (,x)", {{"a", ""}}, true},
      {"a in (,x)", {{"a", "x"}}, true},
      {"a in (x,)", {{"a", ""}}, true},
      {"a in (x,,y)", {{"a", ""}}, true},
      // Greater / less than: integers only.
      {"a>5", {{"a", "6"}}, true},
      {"a>5", {{"a", "5"}}, false},
      {"a>5", {{"a", "50"}}, true},
      {"a>5", {{"a", "x"}}, false},
      {"a>5", {{"a", ""}}, false},
      {"a>5", {}, false},
      {"a>0", {{"a", "-1"}}, false},
      {"a>0", {{"a", "+1"}}, true},
      {"a<5", {{"a", "4"}}, true},
      {"a<5", {{"a", "5"}}, false},
      {"a<5", {{"a", "-3"}}, true},
      {"a<5", {}, false},
      {"a<5", {{"a", "99999999999999999999"}}, false},  // out of int64 range
      {"a<0", {{"a", "10000000000000000000"}}, false},
      {"a>0", {{"a", "-10000000000000000000"}}, false},
      {"a>9223372036854775806", {{"a", "9223372036854775807"}}, true},
      {"a<1", {{"a", "-9223372036854775808"}}, true},
      {"a<1", {{"a", "-9223372036854775809"}}, false},
      // AND of requirements, several on one key.
      {"a=b,c!=d", {{"a", "b"}}, true},
      {"a=b,c!=d", {{"a", "b"}, {"c", "d"}}, false},
      {"a>1,a<3", {{"a", "2"}}, true},
      {"a>1,a<3", {{"a", "3"}}, false},
      {"a,!b,c in (x)", {{"a", "1"}, {"c", "x"}}, true},
      {"a,!b,c in (x)", {{"a", "1"}, {"b", "1"}, {"c", "x"}}, false},
      // Everything.
      {"", {}, true},
      {"", {{"a", "b"}}, true},
      // Keys with a prefix.
      {"example.com/tier=web", {{"example.com/tier", "web"}}, true},
      {"example.com/tier=web", {{"tier", "web"}}, false},
  };
  for (const MatchCase& c : cases) {
    ExpectMatch(MustParse(c.selector), c.labels, c.want, "\"" + c.selector + "\"");
  }
}

TEST_F(LabelSelectorTest, Parse_NotIn_MatchesWhenKeyAbsent) {
  ExpectMatch(MustParse("env notin (prod)"), {{"app", "web"}}, true, "absent key");
}

TEST_F(LabelSelectorTest, Parse_NotEquals_MatchesWhenKeyAbsent) {
  ExpectMatch(MustParse("env!=prod"), {{"app", "web"}}, true, "absent key");
}

TEST_F(LabelSelectorTest, DefaultConstructed_SelectsEverything) {
  LabelSelector sel;
  EXPECT_TRUE(sel.Empty());
  EXPECT_EQ(sel.ToString(), "");
  ExpectMatch(sel, {}, true, "no labels");
  ExpectMatch(sel, {{"a", "b"}}, true, "some labels");
}

TEST_F(LabelSelectorTest, Empty_OnlyWithoutRequirements) {
  EXPECT_TRUE(MustParse("").Empty());
  EXPECT_TRUE(MustParse("   \t\n ").Empty());
  EXPECT_FALSE(MustParse("a").Empty());
  EXPECT_FALSE(MustParse("a in ()").Empty());
}

// ---- Grammar ----

TEST_F(LabelSelectorTest, Parse_Whitespace_ToleratedBetweenTokens) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"  a = b  ,  c in ( x , y ) ", "a=b,c in (x,y)"},
      {"a\t==\tb", "a==b"},
      {"a\n!=\r\nb", "a!=b"},
      {"! a", "!a"},
      {"a in(x)", "a in (x)"},
      {"a notin(x),b", "a notin (x),b"},
      {"a >  5", "a>5"},
      {" a , b ", "a,b"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(MustParse(in).ToString(), want) << in;
}

TEST_F(LabelSelectorTest, Parse_Keywords_AreIdentifiersOutsideOperatorPosition) {
  // "in" and "notin" as keys and values.
  EXPECT_EQ(MustParse("in in (in,notin)").ToString(), "in in (in,notin)");
  EXPECT_EQ(MustParse("notin").ToString(), "notin");
  EXPECT_EQ(MustParse("!in").ToString(), "!in");
  EXPECT_EQ(MustParse("notin=in").ToString(), "notin=in");
  ExpectMatch(MustParse("in=notin"), {{"in", "notin"}}, true, "keyword key and value");
}

TEST_F(LabelSelectorTest, Parse_KeyWithoutSpaceBeforeKeyword_IsOneIdentifier) {
  // "ain" is a key, not "a in".
  EXPECT_THAT(ParseError("ain (x)"),
              HasSubstr("found '(' at position 4, expected: in, notin, =, ==, !=, >, <"));
}

// ---- Malformed input ----

struct ErrorCase {
  std::string selector;
  std::string want;  // the whole message
};

TEST_F(LabelSelectorTest, Parse_Malformed_ErrorSaysWhatAndWhere) {
  const std::string key_rule =
      "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
      "with an alphanumeric character (e.g. 'MyName', 'my.name' or '123-abc')";
  const std::string value_rule =
      "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
      "'.', and must start and end with an alphanumeric character (e.g. 'MyValue', 'my_value' or "
      "'12345')";
  const std::string req = "unable to parse requirement: ";
  const std::vector<ErrorCase> cases = {
      // Commas.
      {"a=b,", "found end of string at position 4, expected: identifier after ','"},
      {"a,", "found end of string at position 2, expected: identifier after ','"},
      {"a,,b", "found ',' at position 2, expected: identifier after ','"},
      {",a", "found ',' at position 0, expected: !, identifier, or 'end of string'"},
      {" , ", "found ',' at position 1, expected: !, identifier, or 'end of string'"},
      // Missing or stray operators and values.
      {"=b", "found '=' at position 0, expected: !, identifier, or 'end of string'"},
      {"x y", req + "found 'y' at position 2, expected: in, notin, =, ==, !=, >, <"},
      {"a!", req + "found '!' at position 1, expected: in, notin, =, ==, !=, >, <"},
      {"a=b c", "found 'c' at position 4, expected: ',' or 'end of string'"},
      {"a=b=c", "found '=' at position 3, expected: ',' or 'end of string'"},
      {"a===b", req + "found '=' at position 3, expected: identifier"},
      {"a==(b)", req + "found '(' at position 3, expected: identifier"},
      {"a>>1", req + "found '>' at position 2, expected: identifier"},
      // Negation.
      {"!", req + "found end of string at position 1, expected: identifier"},
      {"!!a", req + "found '!' at position 1, expected: identifier"},
      {"!a=b", "found '=' at position 2, expected: ',' or 'end of string'"},
      {"!=a", "found '!=' at position 0, expected: !, identifier, or 'end of string'"},
      // Parentheses.
      {"(a)", "found '(' at position 0, expected: !, identifier, or 'end of string'"},
      {"a in", req + "found end of string at position 4, expected: '('"},
      {"a in x", req + "found 'x' at position 5, expected: '('"},
      {"a notin x,y", req + "found 'x' at position 8, expected: '('"},
      {"a in (x", req + "found end of string at position 7, expected: ',' or ')'"},
      {"a in (x,", req + "found end of string at position 8, expected: ',', or identifier"},
      {"a in (", req + "found end of string at position 6, expected: ',', ')' or identifier"},
      {"a in (x y)", req + "found 'y' at position 8, expected: ',' or ')'"},
      {"a in (x))", "found ')' at position 8, expected: ',' or 'end of string'"},
      {"a in ((x))", req + "found '(' at position 6, expected: ',', ')' or identifier"},
      {"a in (x,=)", req + "found '=' at position 8, expected: ',', or identifier"},
      // As in k8s, ",," followed by ')' is an error (though "(,)" and "(x,,y)" are not).
      {"a in (,,)", req + "found ')' at position 8, expected: ',', or identifier"},
      {"a in (x,,)", req + "found ')' at position 9, expected: ',', or identifier"},
      {"a in (x)y", "found 'y' at position 8, expected: ',' or 'end of string'"},
      {"a=b)", "found ')' at position 3, expected: ',' or 'end of string'"},
      // Invalid keys.
      {"Foo_=b", req + "key at position 0: Invalid value: \"Foo_\": " + key_rule},
      {"a, c_=d", req + "key at position 3: Invalid value: \"c_\": " + key_rule},
      {"!-a", req + "key at position 1: Invalid value: \"-a\": " + key_rule},
      {"/a=b", req + "key at position 0: Invalid value: \"/a\": prefix part must be non-empty"},
      {std::string(64, 'k') + "=v", req + "key at position 0: Invalid value: \"" +
                                        std::string(64, 'k') +
                                        "\": name part must be no more than 63 characters"},
      {std::string("a\0b", 3), req + "key at position 0: Invalid value: \"a\\x00b\": " + key_rule},
      {"\xc3\xa4=b", req + "key at position 0: Invalid value: \"\\xc3\\xa4\": " + key_rule},
      // Invalid values.
      {"a=b_", req + "values[0] at position 2: Invalid value: \"b_\": " + value_rule},
      {"a in (x, Y_)", req + "values[1] at position 9: Invalid value: \"Y_\": " + value_rule},
      {"a=" + std::string(64, 'v'), req + "values[0] at position 2: Invalid value: \"" +
                                        std::string(64, 'v') +
                                        "\": must be no more than 63 characters"},
      {"a=b/c", req + "values[0] at position 2: Invalid value: \"b/c\": " + value_rule},
      // Gt / Lt need an integer.
      {"a>b", req + "values[0] at position 2: Invalid value: \"b\": for 'Gt', 'Lt' operators, the "
                    "value must be an integer"},
      {"a<", req + "values[0] at position 2: Invalid value: \"\": for 'Gt', 'Lt' operators, the "
                   "value must be an integer"},
      {"a>1.5", req + "values[0] at position 2: Invalid value: \"1.5\": for 'Gt', 'Lt' operators, "
                      "the value must be an integer"},
      {"a>9223372036854775808", req +
                                    "values[0] at position 2: Invalid value: "
                                    "\"9223372036854775808\": for 'Gt', 'Lt' operators, the value "
                                    "must be an integer"},
      {"a<10000000000000000000", req + "values[0] at position 2: Invalid value: "
                                       "\"10000000000000000000\": for 'Gt', 'Lt' operators, the "
                                       "value must be an integer"},
      // An integer, but not a label value (as in k8s).
      {"a>-1", req + "values[0] at position 2: Invalid value: \"-1\": " + value_rule},
  };
  for (const ErrorCase& c : cases) {
    EXPECT_EQ(ParseError(c.selector), c.want) << "selector: \"" << c.selector << "\"";
  }
}

TEST_F(LabelSelectorTest, Parse_Error_HasNoFieldPathPrefix) {
  EXPECT_THAT(ParseError("a in (x"), StartsWith("unable to parse requirement: found"));
  EXPECT_THAT(ParseError(","), StartsWith("found ','"));
}

TEST_F(LabelSelectorTest, Parse_HugeIdentifier_ErrorIsBounded) {
  const std::string huge(1 << 20, 'x');
  const std::string msg = ParseError("a " + huge);
  EXPECT_LT(msg.size(), 1000u);
  EXPECT_THAT(msg, HasSubstr("more bytes) at position 2, expected: in, notin"));
}

TEST_F(LabelSelectorTest, Parse_ValidEdgeCases_Accepted) {
  for (const std::string& s : {
           std::string("a=b,c==d,e!=f,g in (x,y),h notin (z),i,!j,k>3,l<4"),
           std::string("example.com/a-b_c.D=A-b_c.9"),
           std::string(253, 'p') + "/" + std::string(63, 'n') + "=" + std::string(63, 'v'),
           std::string("a in (,)"),
           std::string("a>0,a<9223372036854775807"),
           std::string("a>007"),
       }) {
    EXPECT_TRUE(LabelSelector::Parse(s).ok()) << s << ": " << LabelSelector::Parse(s).status();
  }
}

// ---- Canonical string form ----

TEST_F(LabelSelectorTest, ToString_Canonical_AndReparses) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", ""},
      {"b=1,a=2", "a=2,b=1"},
      {"x in (c,a,b,a)", "x in (a,b,c)"},
      {"x notin (b,a)", "x notin (a,b)"},
      {"a==b", "a==b"},
      {"a!=b", "a!=b"},
      {"!b,a", "a,!b"},
      {"b, !a", "!a,b"},
      {"a in (),b notin (x,)", "a in (),b notin (,x)"},
      {"a in (x,,y)", "a in (,x,y)"},
      {"a in (,)", "a in ()"},
      {"a=,b", "a=,b"},
      {"a>5,a<10", "a>5,a<10"},  // one key: kept in order
      {"a<10,a>5", "a<10,a>5"},
      {"a>007", "a>007"},
      {"z, y=1, x in (q), w notin (r), !v, u>1, t<2, s==3, r!=4",
       "r!=4,s==3,t<2,u>1,!v,w notin (r),x in (q),y=1,z"},
  };
  for (const auto& [in, want] : cases) {
    const std::string got = MustParse(in).ToString();
    EXPECT_EQ(got, want) << "\"" << in << "\"";
    EXPECT_EQ(MustParse(got).ToString(), got) << "reparse of \"" << got << "\"";
  }
}

TEST_F(LabelSelectorTest, ToString_Reparsed_MatchesTheSame) {
  const LabelSelector original = MustParse("a in (,x),b notin (y),!c,d>3,e=");
  const LabelSelector reparsed = MustParse(original.ToString());
  for (const Labels& labels : std::vector<Labels>{
           {},
           {{"a", ""}, {"d", "4"}, {"e", ""}},
           {{"a", "x"}, {"b", "z"}, {"d", "9"}, {"e", ""}},
           {{"a", "x"}, {"b", "y"}, {"d", "9"}, {"e", ""}},
           {{"a", "x"}, {"c", ""}, {"d", "9"}, {"e", ""}},
           {{"a", "x"}, {"d", "3"}, {"e", ""}},
       }) {
    EXPECT_EQ(original.Matches(labels), reparsed.Matches(labels));
  }
  ExpectMatch(original, {{"a", "x"}, {"d", "4"}, {"e", ""}}, true, "all hold");
}

TEST_F(LabelSelectorTest, Parse_RandomInput_NeverCrashesAndValidOnesRoundTrip) {
  // Deterministic pseudo-random strings over the grammar's alphabet.
  const std::vector<std::string> pieces = {"a", "b",  "k1", "=", "==",   "!",       "!=", "(",
                                           ")", ",",  "<",  ">", " in ", " notin ", " ",  "\t",
                                           "0", "12", "_",  "-", "x.y",  "p/",      "in", ""};
  std::mt19937 rng(12345);
  std::uniform_int_distribution<size_t> piece(0, pieces.size() - 1);
  std::uniform_int_distribution<int> length(0, 12);
  int valid = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text;
    for (int n = length(rng); n > 0; --n) text += pieces[piece(rng)];
    absl::StatusOr<LabelSelector> sel = LabelSelector::Parse(text);
    if (!sel.ok()) {
      EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument) << text;
      continue;
    }
    ++valid;
    const std::string canonical = sel->ToString();
    absl::StatusOr<LabelSelector> again = LabelSelector::Parse(canonical);
    ASSERT_TRUE(again.ok()) << "\"" << text << "\" -> \"" << canonical << "\": " << again.status();
    EXPECT_EQ(again->ToString(), canonical) << text;
  }
  EXPECT_GT(valid, 100);  // the generator does produce valid selectors
}

TEST_F(LabelSelectorTest, Copy_IsIndependentValue) {
  LabelSelector a = MustParse("x=1");
  LabelSelector b = a;
  a = MustParse("y=2");
  EXPECT_EQ(b.ToString(), "x=1");
  EXPECT_EQ(a.ToString(), "y=2");
}

// ---- FromStruct ----

TEST_F(LabelSelectorTest, FromStruct_AllOperators) {
  absl::StatusOr<LabelSelector> sel = LabelSelector::FromStruct(JsonStruct(R"json({
    "matchLabels": {"app": "web", "example.com/tier": "front"},
    "matchExpressions": [
      {"key": "env", "operator": "In", "values": ["prod", "staging", "prod"]},
      {"key": "track", "operator": "NotIn", "values": ["canary"]},
      {"key": "owner", "operator": "Exists"},
      {"key": "legacy", "operator": "DoesNotExist", "values": []}
    ]})json"));
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->ToString(),
            "app=web,env in (prod,staging),example.com/tier=front,!legacy,owner,"
            "track notin (canary)");
  const Labels base = {
      {"app", "web"}, {"example.com/tier", "front"}, {"env", "prod"}, {"owner", "me"}};
  ExpectMatch(*sel, base, true, "all hold; track absent");
  Labels l = base;
  l["track"] = "canary";
  ExpectMatch(*sel, l, false, "track=canary");
  l = base;
  l["legacy"] = "";
  ExpectMatch(*sel, l, false, "legacy present");
  l = base;
  l.erase("owner");
  ExpectMatch(*sel, l, false, "owner absent");
  l = base;
  l["env"] = "dev";
  ExpectMatch(*sel, l, false, "env=dev");
  l = base;
  l["app"] = "db";
  ExpectMatch(*sel, l, false, "app=db");
  // The string form parses back to the same selector.
  EXPECT_EQ(MustParse(sel->ToString()).ToString(), sel->ToString());
}

TEST_F(LabelSelectorTest, FromStruct_NotIn_MatchesWhenKeyAbsent) {
  absl::StatusOr<LabelSelector> sel = LabelSelector::FromStruct(
      JsonStruct(R"({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]})"));
  ASSERT_TRUE(sel.ok()) << sel.status();
  ExpectMatch(*sel, {}, true, "absent");
  ExpectMatch(*sel, {{"a", "x"}}, false, "a=x");
}

TEST_F(LabelSelectorTest, FromStruct_EmptyOrNull_SelectsEverything) {
  for (const std::string& json :
       {std::string("{}"), std::string(R"({"matchLabels": {}, "matchExpressions": []})"),
        std::string(R"({"matchLabels": null, "matchExpressions": null})")}) {
    absl::StatusOr<LabelSelector> sel = LabelSelector::FromStruct(JsonStruct(json));
    ASSERT_TRUE(sel.ok()) << json << ": " << sel.status();
    EXPECT_TRUE(sel->Empty()) << json;
    ExpectMatch(*sel, {{"a", "b"}}, true, json);
  }
}

TEST_F(LabelSelectorTest, FromStruct_EmptyLabelValue_Allowed) {
  absl::StatusOr<LabelSelector> sel =
      LabelSelector::FromStruct(JsonStruct(R"({"matchLabels": {"a": ""}})"));
  ASSERT_TRUE(sel.ok()) << sel.status();
  ExpectMatch(*sel, {{"a", ""}}, true, "a=\"\"");
  ExpectMatch(*sel, {}, false, "absent");
}

TEST_F(LabelSelectorTest, FromStruct_Malformed_ErrorNamesSubField) {
  const std::string value_rule = "a valid label must be an empty string or consist of";
  const std::vector<ErrorCase> cases = {
      {R"({"matchLabel": {"a": "b"}})",
       "matchLabel: Forbidden: unknown field; the known fields are \"matchExpressions\", "
       "\"matchLabels\""},
      {R"({"matchLabels": ["a"]})",
       "matchLabels: Invalid value: [...]: must be an object of strings"},
      {R"({"matchLabels": "a=b"})",
       "matchLabels: Invalid value: \"a=b\": must be an object of strings"},
      {R"({"matchLabels": {"a": 1}})", "matchLabels[a]: Invalid value: 1: must be a string"},
      {R"({"matchLabels": {"a": true}})", "matchLabels[a]: Invalid value: true: must be a string"},
      {R"({"matchLabels": {"a": null}})", "matchLabels[a]: Invalid value: null: must be a string"},
      {R"({"matchLabels": {"Foo_": "x"}})", "matchLabels: Invalid value: \"Foo_\": name part must"},
      {R"({"matchLabels": {"a": "b_"}})", "matchLabels[a]: Invalid value: \"b_\": " + value_rule},
      {R"({"matchExpressions": {}})", "matchExpressions: Invalid value: {...}: must be a list"},
      {R"({"matchExpressions": ["a"]})",
       "matchExpressions[0]: Invalid value: \"a\": must be an object"},
      {R"({"matchExpressions": [{"key": "a", "operator": "Exists"}, 3]})",
       "matchExpressions[1]: Invalid value: 3: must be an object"},
      {R"({"matchExpressions": [{"key": "a", "operator": "Exists"},
                                {"key": "b", "operator": "Foo"}]})",
       "matchExpressions[1].operator: Unsupported value: \"Foo\": supported values: "
       "\"DoesNotExist\", \"Exists\", \"In\", \"NotIn\""},
      {R"({"matchExpressions": [{"key": "a", "operator": "in", "values": ["x"]}]})",
       "matchExpressions[0].operator: Unsupported value: \"in\": supported values: "
       "\"DoesNotExist\", \"Exists\", \"In\", \"NotIn\""},
      {R"({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]})",
       "matchExpressions[0].operator: Unsupported value: \"Gt\""},
      {R"({"matchExpressions": [{"key": "a"}]})", "matchExpressions[0].operator: Required value"},
      {R"({"matchExpressions": [{"key": "a", "operator": ""}]})",
       "matchExpressions[0].operator: Required value"},
      {R"({"matchExpressions": [{"key": "a", "operator": 1}]})",
       "matchExpressions[0].operator: Invalid value: 1: must be a string"},
      {R"({"matchExpressions": [{"operator": "Exists"}]})",
       "matchExpressions[0].key: Required value"},
      {R"({"matchExpressions": [{"key": null, "operator": "Exists"}]})",
       "matchExpressions[0].key: Required value"},
      {R"({"matchExpressions": [{"key": 5, "operator": "Exists"}]})",
       "matchExpressions[0].key: Invalid value: 5: must be a string"},
      {R"({"matchExpressions": [{"key": "Foo_", "operator": "Exists"}]})",
       "matchExpressions[0].key: Invalid value: \"Foo_\": name part must consist"},
      {R"({"matchExpressions": [{"key": "", "operator": "Exists"}]})",
       "matchExpressions[0].key: Invalid value: \"\": name part must be non-empty"},
      {R"({"matchExpressions": [{"key": "a", "operator": "In"}]})",
       "matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or "
       "'NotIn'"},
      {R"({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": []}]})",
       "matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or "
       "'NotIn'"},
      {R"({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]})",
       "matchExpressions[0].values: Forbidden: may not be specified when `operator` is 'Exists' "
       "or 'DoesNotExist'"},
      {R"({"matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": [""]}]})",
       "matchExpressions[0].values: Forbidden: may not be specified"},
      {R"({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]})",
       "matchExpressions[0].values: Invalid value: \"x\": must be a list of strings"},
      {R"({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", 2]}]})",
       "matchExpressions[0].values[1]: Invalid value: 2: must be a string"},
      {R"({"matchExpressions": [{"key": "a", "operator": "In", "values": ["ok", "b_"]}]})",
       "matchExpressions[0].values[1]: Invalid value: \"b_\": " + value_rule},
      {R"({"matchExpressions": [{"key": "a", "operator": "In", "value": ["x"]}]})",
       "matchExpressions[0].value: Forbidden: unknown field; the known fields are \"key\", "
       "\"operator\", \"values\""},
  };
  for (const ErrorCase& c : cases) {
    EXPECT_THAT(FromStructError(c.selector), StartsWith(c.want)) << c.selector;
  }
}

}  // namespace
}  // namespace shardcache
