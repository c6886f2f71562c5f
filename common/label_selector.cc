// LabelSelector: see label_selector.h. The lexer and the recursive-descent parser follow
// k8s.io/apimachinery/pkg/labels/selector.go step by step, so that every string k8s accepts is
// accepted here with the same meaning, and every string it rejects is rejected.
#include "common/label_selector.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/struct_codec.h"
#include "common/validation.h"

namespace shardcache {
namespace {

// ---- Lexer ----

enum class TokenKind {
  kEnd,
  kClosedPar,
  kComma,
  kDoesNotExist,  // "!"
  kDoubleEquals,
  kEquals,
  kGreaterThan,
  kIdentifier,
  kIn,
  kLessThan,
  kNotEquals,
  kNotIn,
  kOpenPar,
};

struct Token {
  TokenKind kind;
  absl::string_view literal;
  size_t pos;  // byte offset in the selector string
};

bool IsWhitespace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

bool IsSpecialSymbol(char c) {
  switch (c) {
    case '=':
    case '!':
    case '(':
    case ')':
    case ',':
    case '>':
    case '<':
      return true;
    default:
      return false;
  }
}

// Splits the whole string into tokens; the last one is kEnd. Cannot fail: every byte that is not
// whitespace or a special symbol belongs to an identifier (k8s's lexer is the same, except that it
// stops at a NUL byte; here a NUL is part of an identifier, and so rejected by validation).
std::vector<Token> Lex(absl::string_view s) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (true) {
    while (i < s.size() && IsWhitespace(s[i])) ++i;
    if (i == s.size()) {
      tokens.push_back({TokenKind::kEnd, absl::string_view(), i});
      return tokens;
    }
    const size_t start = i;
    const char c = s[i];
    if (IsSpecialSymbol(c)) {
      // Longest match: the only two-character symbols are "!=" and "==".
      const bool next_is_eq = i + 1 < s.size() && s[i + 1] == '=';
      TokenKind kind;
      size_t len = 1;
      switch (c) {
        case '!':
          kind = next_is_eq ? TokenKind::kNotEquals : TokenKind::kDoesNotExist;
          len = next_is_eq ? 2 : 1;
          break;
        case '=':
          kind = next_is_eq ? TokenKind::kDoubleEquals : TokenKind::kEquals;
          len = next_is_eq ? 2 : 1;
          break;
        case '(':
          kind = TokenKind::kOpenPar;
          break;
        case ')':
          kind = TokenKind::kClosedPar;
          break;
        case ',':
          kind = TokenKind::kComma;
          break;
        case '>':
          kind = TokenKind::kGreaterThan;
          break;
        default:  // '<'
          kind = TokenKind::kLessThan;
          break;
      }
      i += len;
      tokens.push_back({kind, s.substr(start, len), start});
      continue;
    }
    while (i < s.size() && !IsWhitespace(s[i]) && !IsSpecialSymbol(s[i])) ++i;
    absl::string_view word = s.substr(start, i - start);
    TokenKind kind = TokenKind::kIdentifier;
    if (word == "in") kind = TokenKind::kIn;
    if (word == "notin") kind = TokenKind::kNotIn;
    tokens.push_back({kind, word, start});
  }
}

// Go's strconv.ParseInt(s, 10, 64): an optional sign, then one or more decimal digits, in range.
bool ParseInt64(absl::string_view s, int64_t* out) {
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty()) return false;
  // Accumulate as a negative number: its range is the larger one.
  int64_t v = 0;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const int digit = c - '0';
    if (v < (kMin + digit) / 10) return false;
    v = v * 10 - digit;
  }
  if (!negative) {
    if (v == kMin) return false;
    v = -v;
  }
  *out = v;
  return true;
}

// "'lit'" for an error message, or "end of string".
std::string Describe(const Token& t) {
  if (t.kind == TokenKind::kEnd) return "end of string";
  std::string quoted = QuoteForMessage(t.literal);  // "..." with escapes
  quoted.front() = '\'';
  // The closing quote is the last '"' (a truncation note may follow it).
  quoted[quoted.rfind('"')] = '\'';
  return quoted;
}

absl::Status SyntaxError(const Token& found, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("found ", Describe(found), " at position ",
                                                 found.pos, ", expected: ", expected));
}

absl::Status WrapRequirementError(const absl::Status& s) {
  return absl::InvalidArgumentError(absl::StrCat("unable to parse requirement: ", s.message()));
}

}  // namespace

// ---- Parser ----

// The parser of selector.go. In a "values" context the keywords "in" and "notin" are plain
// identifiers ("in in (in)" is a valid requirement on the key "in").
class LabelSelectorParser {
 public:
  using Operator = LabelSelector::Operator;
  using Requirement = LabelSelector::Requirement;

  explicit LabelSelectorParser(absl::string_view text) : tokens_(Lex(text)) {}

  absl::StatusOr<std::vector<Requirement>> ParseAll() {
    std::vector<Requirement> requirements;
    while (true) {
      const Token t = Lookahead(kValues);
      switch (t.kind) {
        case TokenKind::kIdentifier:
        case TokenKind::kDoesNotExist: {
          absl::StatusOr<Requirement> r = ParseRequirement();
          if (!r.ok()) return WrapRequirementError(r.status());
          requirements.push_back(*std::move(r));
          const Token after = Consume(kValues);
          if (after.kind == TokenKind::kEnd) return requirements;
          if (after.kind != TokenKind::kComma) {
            return SyntaxError(after, "',' or 'end of string'");
          }
          const Token next = Lookahead(kValues);
          if (next.kind != TokenKind::kIdentifier && next.kind != TokenKind::kDoesNotExist) {
            return SyntaxError(next, "identifier after ','");
          }
          break;
        }
        case TokenKind::kEnd:
          return requirements;
        default:
          return SyntaxError(t, "!, identifier, or 'end of string'");
      }
    }
  }

 private:
  enum Context { kKeyAndOperator, kValues };

  // The current token, without moving on. kEnd is always last, and nothing consumes past it.
  Token Lookahead(Context context) const { return InContext(tokens_[pos_], context); }

  Token Consume(Context context) {
    Token t = tokens_[pos_];
    if (t.kind != TokenKind::kEnd) ++pos_;
    return InContext(t, context);
  }

  static Token InContext(Token t, Context context) {
    if (context == kValues && (t.kind == TokenKind::kIn || t.kind == TokenKind::kNotIn)) {
      t.kind = TokenKind::kIdentifier;
    }
    return t;
  }

  absl::StatusOr<Requirement> ParseRequirement() {
    Requirement r;
    // Key, and the operator when it is unary.
    Token t = Consume(kValues);
    bool does_not_exist = false;
    if (t.kind == TokenKind::kDoesNotExist) {
      does_not_exist = true;
      t = Consume(kValues);
    }
    if (t.kind != TokenKind::kIdentifier) return SyntaxError(t, "identifier");
    if (absl::Status s = ValidateQualifiedName("", t.literal); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("key at position ", t.pos, ": ", s.message()));
    }
    r.key = std::string(t.literal);
    if (does_not_exist) {
      // As in k8s, whatever follows "!key" is left to the caller (which expects ',' or the end).
      r.op = Operator::kDoesNotExist;
      return r;
    }
    const TokenKind next = Lookahead(kValues).kind;
    if (next == TokenKind::kEnd || next == TokenKind::kComma) {
      r.op = Operator::kExists;
      return r;
    }

    // A binary operator and its values.
    const Token op = Consume(kKeyAndOperator);
    switch (op.kind) {
      case TokenKind::kIn:
        r.op = Operator::kIn;
        break;
      case TokenKind::kNotIn:
        r.op = Operator::kNotIn;
        break;
      case TokenKind::kEquals:
        r.op = Operator::kEquals;
        break;
      case TokenKind::kDoubleEquals:
        r.op = Operator::kDoubleEquals;
        break;
      case TokenKind::kNotEquals:
        r.op = Operator::kNotEquals;
        break;
      case TokenKind::kGreaterThan:
        r.op = Operator::kGreaterThan;
        break;
      case TokenKind::kLessThan:
        r.op = Operator::kLessThan;
        break;
      default:
        return SyntaxError(op, "in, notin, =, ==, !=, >, <");
    }
    std::vector<Token> values;
    if (r.op == Operator::kIn || r.op == Operator::kNotIn) {
      absl::Status s = ParseValues(&values);
      if (!s.ok()) return s;
    } else {
      absl::Status s = ParseExactValue(&values);
      if (!s.ok()) return s;
    }

    // Validate, as k8s's NewRequirement does.
    for (size_t i = 0; i < values.size(); ++i) {
      const Token& v = values[i];
      const std::string path = IndexPath("values", i);
      if (r.op == Operator::kGreaterThan || r.op == Operator::kLessThan) {
        if (!ParseInt64(v.literal, &r.bound)) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, " at position ", v.pos, ": ",
              FieldInvalid("", v.literal, "for 'Gt', 'Lt' operators, the value must be an integer")
                  .message()));
        }
      }
      if (absl::Status s = ValidateLabelValue("", v.literal); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, " at position ", v.pos, ": ", s.message()));
      }
      r.values.emplace_back(v.literal);
    }
    std::sort(r.values.begin(), r.values.end());
    r.values.erase(std::unique(r.values.begin(), r.values.end()), r.values.end());
    return r;
  }

  // "(" [values] ")" where values are comma-separated, possibly empty, identifiers. "()" and
  // "(,)" are the set {""}. Appends the values; an empty value has the position of what follows.
  absl::Status ParseValues(std::vector<Token>* values) {
    const Token open = Consume(kValues);
    if (open.kind != TokenKind::kOpenPar) return SyntaxError(open, "'('");
    const Token first = Lookahead(kValues);
    switch (first.kind) {
      case TokenKind::kIdentifier:
      case TokenKind::kComma: {
        if (absl::Status s = ParseIdentifiersList(values); !s.ok()) return s;
        const Token close = Consume(kValues);
        if (close.kind != TokenKind::kClosedPar) return SyntaxError(close, "')'");
        return absl::OkStatus();
      }
      case TokenKind::kClosedPar:
        Consume(kValues);
        values->push_back({TokenKind::kIdentifier, absl::string_view(), first.pos});
        return absl::OkStatus();
      default:
        return SyntaxError(first, "',', ')' or identifier");
    }
  }

  // Stops before the ')'.
  absl::Status ParseIdentifiersList(std::vector<Token>* values) {
    while (true) {
      const Token t = Consume(kValues);
      switch (t.kind) {
        case TokenKind::kIdentifier: {
          values->push_back(t);
          const Token next = Lookahead(kValues);
          if (next.kind == TokenKind::kComma) continue;
          if (next.kind == TokenKind::kClosedPar) return absl::OkStatus();
          return SyntaxError(next, "',' or ')'");
        }
        case TokenKind::kComma: {
          const Token empty{TokenKind::kIdentifier, absl::string_view(), t.pos};
          if (values->empty()) values->push_back(empty);  // "(,"
          const Token next = Lookahead(kValues);
          if (next.kind == TokenKind::kClosedPar) {  // ",)"
            values->push_back(empty);
            return absl::OkStatus();
          }
          if (next.kind == TokenKind::kComma) {  // ",,"
            Consume(kValues);
            values->push_back(empty);
          }
          break;
        }
        default:
          return SyntaxError(t, "',', or identifier");
      }
    }
  }

  // One identifier, or nothing (the empty value) before ',' or the end.
  absl::Status ParseExactValue(std::vector<Token>* values) {
    const Token next = Lookahead(kValues);
    if (next.kind == TokenKind::kEnd || next.kind == TokenKind::kComma) {
      values->push_back({TokenKind::kIdentifier, absl::string_view(), next.pos});
      return absl::OkStatus();
    }
    const Token t = Consume(kValues);
    if (t.kind != TokenKind::kIdentifier) return SyntaxError(t, "identifier");
    values->push_back(t);
    return absl::OkStatus();
  }

  const std::vector<Token> tokens_;
  size_t pos_ = 0;
};

// ---- LabelSelector ----

LabelSelector::LabelSelector(std::vector<Requirement> requirements)
    : requirements_(std::move(requirements)) {
  std::stable_sort(requirements_.begin(), requirements_.end(),
                   [](const Requirement& a, const Requirement& b) { return a.key < b.key; });
}

absl::StatusOr<LabelSelector> LabelSelector::Parse(absl::string_view text) {
  LabelSelectorParser parser(text);
  absl::StatusOr<std::vector<Requirement>> requirements = parser.ParseAll();
  if (!requirements.ok()) return requirements.status();
  return LabelSelector(*std::move(requirements));
}

absl::StatusOr<LabelSelector> LabelSelector::FromStruct(const google::protobuf::Struct& s) {
  types::v1::LabelSelectorSpec spec;
  RETURN_IF_ERROR(StructToMessage(s, "", &spec));
  return FromSpec(spec, "");
}

absl::StatusOr<LabelSelector> LabelSelector::FromSpec(const types::v1::LabelSelectorSpec& spec,
                                                      absl::string_view path) {
  std::vector<Requirement> requirements;
  const std::string labels_path = ChildPath(path, "matchLabels");
  std::vector<absl::string_view> keys;
  for (const auto& [key, value] : spec.match_labels()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  for (absl::string_view key : keys) {
    RETURN_IF_ERROR(ValidateQualifiedName(labels_path, key));
    const std::string& value = spec.match_labels().at(std::string(key));
    RETURN_IF_ERROR(ValidateLabelValue(KeyPath(labels_path, key), value));
    Requirement r;
    r.key = std::string(key);
    r.op = Operator::kEquals;
    r.values.push_back(value);
    requirements.push_back(std::move(r));
  }

  const std::string exprs_path = ChildPath(path, "matchExpressions");
  for (int i = 0; i < spec.match_expressions_size(); ++i) {
    const types::v1::LabelSelectorRequirement& expr = spec.match_expressions(i);
    const std::string expr_path = IndexPath(exprs_path, static_cast<size_t>(i));
    Requirement r;
    const std::string key_path = ChildPath(expr_path, "key");
    if (!expr.has_key()) return FieldRequired(key_path);
    RETURN_IF_ERROR(ValidateQualifiedName(key_path, expr.key()));
    r.key = expr.key();

    const std::string op_path = ChildPath(expr_path, "operator");
    const std::string& op_name = expr.operator_();
    if (op_name.empty()) return FieldRequired(op_path);
    if (op_name == "In") {
      r.op = Operator::kIn;
    } else if (op_name == "NotIn") {
      r.op = Operator::kNotIn;
    } else if (op_name == "Exists") {
      r.op = Operator::kExists;
    } else if (op_name == "DoesNotExist") {
      r.op = Operator::kDoesNotExist;
    } else {
      return FieldNotSupported(op_path, op_name, {"DoesNotExist", "Exists", "In", "NotIn"});
    }

    const std::string values_path = ChildPath(expr_path, "values");
    const int n = expr.values_size();
    const bool is_set_op = r.op == Operator::kIn || r.op == Operator::kNotIn;
    if (is_set_op && n == 0) {
      return FieldRequired(values_path, "must be specified when `operator` is 'In' or 'NotIn'");
    }
    if (!is_set_op && n > 0) {
      return FieldForbidden(values_path,
                            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'");
    }
    for (int j = 0; j < n; ++j) {
      RETURN_IF_ERROR(
          ValidateLabelValue(IndexPath(values_path, static_cast<size_t>(j)), expr.values(j)));
      r.values.push_back(expr.values(j));
    }
    std::sort(r.values.begin(), r.values.end());
    r.values.erase(std::unique(r.values.begin(), r.values.end()), r.values.end());
    requirements.push_back(std::move(r));
  }
  return LabelSelector(std::move(requirements));
}

bool LabelSelector::Requirement::Matches(const std::string* value) const {
  switch (op) {
    case Operator::kIn:
    case Operator::kEquals:
    case Operator::kDoubleEquals:
      return value != nullptr && std::binary_search(values.begin(), values.end(), *value);
    case Operator::kNotIn:
    case Operator::kNotEquals:
      return value == nullptr || !std::binary_search(values.begin(), values.end(), *value);
    case Operator::kExists:
      return value != nullptr;
    case Operator::kDoesNotExist:
      return value == nullptr;
    case Operator::kGreaterThan:
    case Operator::kLessThan: {
      int64_t n;
      if (value == nullptr || !ParseInt64(*value, &n)) return false;
      return op == Operator::kGreaterThan ? n > bound : n < bound;
    }
  }
  return false;
}

template <typename LabelMap>
bool LabelSelector::MatchesImpl(const LabelMap& labels) const {
  for (const Requirement& r : requirements_) {
    auto it = labels.find(r.key);
    if (!r.Matches(it == labels.end() ? nullptr : &it->second)) return false;
  }
  return true;
}

bool LabelSelector::Matches(const google::protobuf::Map<std::string, std::string>& labels) const {
  return MatchesImpl(labels);
}

bool LabelSelector::Matches(const std::map<std::string, std::string>& labels) const {
  return MatchesImpl(labels);
}

std::string LabelSelector::Requirement::ToString() const {
  switch (op) {
    case Operator::kExists:
      return key;
    case Operator::kDoesNotExist:
      return absl::StrCat("!", key);
    case Operator::kEquals:
      return absl::StrCat(key, "=", values.front());
    case Operator::kDoubleEquals:
      return absl::StrCat(key, "==", values.front());
    case Operator::kNotEquals:
      return absl::StrCat(key, "!=", values.front());
    case Operator::kGreaterThan:
      return absl::StrCat(key, ">", values.front());
    case Operator::kLessThan:
      return absl::StrCat(key, "<", values.front());
    case Operator::kIn:
      return absl::StrCat(key, " in (", absl::StrJoin(values, ","), ")");
    case Operator::kNotIn:
      return absl::StrCat(key, " notin (", absl::StrJoin(values, ","), ")");
  }
  return key;
}

std::string LabelSelector::ToString() const {
  return absl::StrJoin(requirements_, ",",
                       [](std::string* out, const Requirement& r) { out->append(r.ToString()); });
}

}  // namespace shardcache
