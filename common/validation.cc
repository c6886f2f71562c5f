// Kubernetes-style validation: see validation.h. The character rules are written out by hand (no
// regular expressions): they are simple, and these checks run on every write.
#include "common/validation.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace shardcache {
namespace {

// How much of a value goes into an error message.
constexpr size_t kMaxQuotedBytes = 512;

// The explanations of k8s.io/apimachinery/pkg/util/validation, with their examples (k8s also
// prints the regular expression; we leave it out).
constexpr absl::string_view kDNS1123LabelErrMsg =
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name' or '123-abc')";
constexpr absl::string_view kDNS1123SubdomainErrMsg =
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com')";
constexpr absl::string_view kQualifiedNameErrMsg =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName', 'my.name' or '123-abc')";
constexpr absl::string_view kLabelValueErrMsg =
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue', 'my_value' or "
    "'12345')";
constexpr absl::string_view kClusterNameErrMsg =
    "a logical cluster name must consist of one or more lowercase RFC 1123 labels (each at most "
    "63 characters) separated by ':' (e.g. 'root' or 'root:org:team-a')";

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)); }

// [a-z0-9]([-a-z0-9]*[a-z0-9])? of any length.
bool HasDNS1123LabelShape(absl::string_view s) {
  if (s.empty() || !IsLowerAlnum(s.front()) || !IsLowerAlnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return IsLowerAlnum(c) || c == '-'; });
}

// Dot-separated DNS-1123 label shapes, of any length.
bool HasDNS1123SubdomainShape(absl::string_view s) {
  if (s.empty()) return false;
  for (absl::string_view part : absl::StrSplit(s, '.')) {
    if (!HasDNS1123LabelShape(part)) return false;
  }
  return true;
}

// ([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]
bool HasQualifiedNamePartShape(absl::string_view s) {
  if (s.empty() || !IsAlnum(s.front()) || !IsAlnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return IsAlnum(c) || c == '-' || c == '_' || c == '.'; });
}

std::string MaxLenError(size_t max) {
  return absl::StrCat("must be no more than ", max, " characters");
}

// The k8s Is* functions: the list of what is wrong, empty when valid.
std::vector<std::string> DNS1123LabelErrors(absl::string_view value) {
  std::vector<std::string> errs;
  if (value.size() > kDNS1123LabelMaxLength) errs.push_back(MaxLenError(kDNS1123LabelMaxLength));
  if (!HasDNS1123LabelShape(value)) {
    // A valid subdomain that is not a valid label can only have dots in it.
    errs.push_back(HasDNS1123SubdomainShape(value) ? std::string("must not contain dots")
                                                   : std::string(kDNS1123LabelErrMsg));
  }
  return errs;
}

std::vector<std::string> DNS1123SubdomainErrors(absl::string_view value) {
  std::vector<std::string> errs;
  if (value.size() > kDNS1123SubdomainMaxLength) {
    errs.push_back(MaxLenError(kDNS1123SubdomainMaxLength));
  }
  if (!HasDNS1123SubdomainShape(value)) errs.push_back(std::string(kDNS1123SubdomainErrMsg));
  return errs;
}

std::vector<std::string> QualifiedNameErrors(absl::string_view value) {
  std::vector<std::string> errs;
  std::vector<absl::string_view> parts = absl::StrSplit(value, '/');
  absl::string_view name;
  if (parts.size() == 1) {
    name = parts[0];
  } else if (parts.size() == 2) {
    absl::string_view prefix = parts[0];
    name = parts[1];
    if (prefix.empty()) {
      errs.push_back("prefix part must be non-empty");
    } else {
      for (const std::string& msg : DNS1123SubdomainErrors(prefix)) {
        errs.push_back(absl::StrCat("prefix part ", msg));
      }
    }
  } else {
    errs.push_back(absl::StrCat("a qualified name ", kQualifiedNameErrMsg,
                                " with an optional DNS subdomain prefix and '/' (e.g. "
                                "'example.com/MyName')"));
    return errs;
  }
  if (name.empty()) {
    errs.push_back("name part must be non-empty");
  } else if (name.size() > kQualifiedNameMaxLength) {
    errs.push_back(absl::StrCat("name part ", MaxLenError(kQualifiedNameMaxLength)));
  }
  if (!HasQualifiedNamePartShape(name)) {
    errs.push_back(absl::StrCat("name part ", kQualifiedNameErrMsg));
  }
  return errs;
}

std::vector<std::string> LabelValueErrors(absl::string_view value) {
  std::vector<std::string> errs;
  if (value.size() > kLabelValueMaxLength) errs.push_back(MaxLenError(kLabelValueMaxLength));
  if (!value.empty() && !HasQualifiedNamePartShape(value)) {
    errs.push_back(std::string(kLabelValueErrMsg));
  }
  return errs;
}

std::vector<std::string> ClusterNameErrors(absl::string_view value) {
  std::vector<std::string> errs;
  if (value.size() > kClusterNameMaxLength) errs.push_back(MaxLenError(kClusterNameMaxLength));
  bool ok = !value.empty();
  for (absl::string_view part : absl::StrSplit(value, ':')) {
    if (part.size() > kDNS1123LabelMaxLength || !HasDNS1123LabelShape(part)) ok = false;
  }
  if (!ok) errs.push_back(std::string(kClusterNameErrMsg));
  return errs;
}

absl::Status InvalidIfErrors(absl::string_view path, absl::string_view value,
                             const std::vector<std::string>& errs) {
  if (errs.empty()) return absl::OkStatus();
  return FieldInvalid(path, value, absl::StrJoin(errs, "; "));
}

absl::Status FieldError(absl::string_view path, absl::string_view body) {
  if (path.empty()) return absl::InvalidArgumentError(body);
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", body));
}

// Printable ASCII as is, except '"' and '\', which are escaped, as are all other bytes.
void AppendEscaped(absl::string_view value, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char c : value.substr(0, kMaxQuotedBytes)) {
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default:
        if (u >= 0x20 && u < 0x7f) {
          out->push_back(c);
        } else {
          out->append("\\x");
          out->push_back(kHex[u >> 4]);
          out->push_back(kHex[u & 0xf]);
        }
    }
  }
}

void AppendTruncationNote(absl::string_view value, std::string* out) {
  if (value.size() > kMaxQuotedBytes) {
    absl::StrAppend(out, "... (", value.size() - kMaxQuotedBytes, " more bytes)");
  }
}

// A map's entries, sorted by key, so that the first error reported does not depend on hash order.
std::vector<std::pair<absl::string_view, absl::string_view>> SortedEntries(
    const google::protobuf::Map<std::string, std::string>& map) {
  std::vector<std::pair<absl::string_view, absl::string_view>> entries(map.begin(), map.end());
  std::sort(entries.begin(), entries.end());
  return entries;
}

}  // namespace

bool IsDNS1123Label(absl::string_view value) {
  return value.size() <= kDNS1123LabelMaxLength && HasDNS1123LabelShape(value);
}

bool IsDNS1123Subdomain(absl::string_view value) {
  return value.size() <= kDNS1123SubdomainMaxLength && HasDNS1123SubdomainShape(value);
}

bool IsQualifiedName(absl::string_view value) { return QualifiedNameErrors(value).empty(); }

bool IsValidLabelValue(absl::string_view value) {
  return value.size() <= kLabelValueMaxLength &&
         (value.empty() || HasQualifiedNamePartShape(value));
}

bool IsClusterName(absl::string_view value) { return ClusterNameErrors(value).empty(); }

absl::Status ValidateDNS1123Subdomain(absl::string_view path, absl::string_view value) {
  if (value.empty()) return FieldRequired(path);
  return InvalidIfErrors(path, value, DNS1123SubdomainErrors(value));
}

absl::Status ValidateDNS1123Label(absl::string_view path, absl::string_view value) {
  if (value.empty()) return FieldRequired(path);
  return InvalidIfErrors(path, value, DNS1123LabelErrors(value));
}

absl::Status ValidateClusterName(absl::string_view path, absl::string_view value) {
  if (value.empty()) return FieldRequired(path);
  return InvalidIfErrors(path, value, ClusterNameErrors(value));
}

absl::Status ValidateQualifiedName(absl::string_view path, absl::string_view value) {
  return InvalidIfErrors(path, value, QualifiedNameErrors(value));
}

absl::Status ValidateLabelValue(absl::string_view path, absl::string_view value) {
  return InvalidIfErrors(path, value, LabelValueErrors(value));
}

absl::Status ValidateLabels(absl::string_view path,
                            const google::protobuf::Map<std::string, std::string>& labels) {
  for (const auto& [key, value] : SortedEntries(labels)) {
    if (absl::Status s = ValidateQualifiedName(path, key); !s.ok()) return s;
    if (absl::Status s = ValidateLabelValue(KeyPath(path, key), value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ValidateAnnotations(
    absl::string_view path, const google::protobuf::Map<std::string, std::string>& annotations) {
  size_t total = 0;
  for (const auto& [key, value] : SortedEntries(annotations)) {
    // As k8s: case does not matter in annotation keys.
    if (absl::Status s =
            InvalidIfErrors(path, key, QualifiedNameErrors(absl::AsciiStrToLower(key)));
        !s.ok()) {
      return s;
    }
    total += key.size() + value.size();
  }
  if (total > kTotalAnnotationSizeLimitB) return FieldTooLong(path, kTotalAnnotationSizeLimitB);
  return absl::OkStatus();
}

absl::Status ValidateFinalizers(absl::string_view path,
                                const google::protobuf::RepeatedPtrField<std::string>& finalizers) {
  std::set<absl::string_view> seen;
  for (int i = 0; i < finalizers.size(); ++i) {
    const std::string& f = finalizers.Get(i);
    const std::string item_path = IndexPath(path, static_cast<size_t>(i));
    if (absl::Status s = ValidateQualifiedName(item_path, f); !s.ok()) return s;
    if (!seen.insert(f).second) return FieldDuplicate(item_path, f);
  }
  return absl::OkStatus();
}

absl::Status ValidateGroupVersionResource(absl::string_view path,
                                          const shardcache::v1::GroupVersionResource& gvr) {
  if (!gvr.group().empty()) {
    if (absl::Status s = InvalidIfErrors(ChildPath(path, "group"), gvr.group(),
                                         DNS1123SubdomainErrors(gvr.group()));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = ValidateDNS1123Label(ChildPath(path, "version"), gvr.version()); !s.ok()) {
    return s;
  }
  return ValidateDNS1123Label(ChildPath(path, "resource"), gvr.resource());
}

absl::Status FieldInvalid(absl::string_view path, absl::string_view value,
                          absl::string_view detail) {
  return FieldInvalidRendered(path, QuoteForMessage(value), detail);
}

absl::Status FieldInvalidRendered(absl::string_view path, absl::string_view rendered_value,
                                  absl::string_view detail) {
  std::string body = absl::StrCat("Invalid value: ", rendered_value);
  if (!detail.empty()) absl::StrAppend(&body, ": ", detail);
  return FieldError(path, body);
}

absl::Status FieldRequired(absl::string_view path, absl::string_view detail) {
  if (detail.empty()) return FieldError(path, "Required value");
  return FieldError(path, absl::StrCat("Required value: ", detail));
}

absl::Status FieldForbidden(absl::string_view path, absl::string_view detail) {
  return FieldError(path, absl::StrCat("Forbidden: ", detail));
}

absl::Status FieldNotSupported(absl::string_view path, absl::string_view value,
                               std::initializer_list<absl::string_view> supported) {
  std::string body = absl::StrCat("Unsupported value: ", QuoteForMessage(value));
  if (supported.size() > 0) {
    absl::StrAppend(&body, ": supported values: ",
                    absl::StrJoin(supported, ", ", [](std::string* out, absl::string_view s) {
                      out->append(QuoteForMessage(s));
                    }));
  }
  return FieldError(path, body);
}

absl::Status FieldDuplicate(absl::string_view path, absl::string_view value) {
  return FieldError(path, absl::StrCat("Duplicate value: ", QuoteForMessage(value)));
}

absl::Status FieldTooLong(absl::string_view path, size_t max_bytes) {
  return FieldError(path, absl::StrCat("Too long: must have at most ", max_bytes, " bytes"));
}

std::string QuoteForMessage(absl::string_view value) {
  std::string out = "\"";
  AppendEscaped(value, &out);
  out.push_back('"');
  AppendTruncationNote(value, &out);
  return out;
}

std::string ChildPath(absl::string_view parent, absl::string_view child) {
  if (parent.empty()) return std::string(child);
  return absl::StrCat(parent, ".", child);
}

std::string KeyPath(absl::string_view parent, absl::string_view key) {
  std::string out = absl::StrCat(parent, "[");
  AppendEscaped(key, &out);
  AppendTruncationNote(key, &out);
  out.push_back(']');
  return out;
}

std::string IndexPath(absl::string_view parent, size_t index) {
  return absl::StrCat(parent, "[", index, "]");
}

}  // namespace shardcache
