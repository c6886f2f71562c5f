// KubePath parsing: see kube_path.h.
#include "cache_server/kube_path.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shardcache {
namespace {

absl::Status NotServed(absl::string_view path) {
  return absl::NotFoundError(absl::StrCat("the server could not find the requested resource (",
                                          path, " is not a path of the Kubernetes view)"));
}

std::string Every(absl::string_view segment) {
  return segment == "*" ? std::string() : std::string(segment);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

absl::StatusOr<std::string> Unescape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%') {
      int hi = i + 2 < text.size() ? HexValue(text[i + 1]) : -1;
      int lo = hi >= 0 ? HexValue(text[i + 2]) : -1;
      if (lo < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid URL escape \"",
                         text.substr(i, std::min<size_t>(3, text.size() - i)), "\" in the query"));
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseQuery(absl::string_view target) {
  std::map<std::string, std::string> params;
  size_t question = target.find('?');
  if (question == absl::string_view::npos) return params;
  for (absl::string_view pair : absl::StrSplit(target.substr(question + 1), '&')) {
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    auto name = Unescape(pair.substr(0, eq));
    if (!name.ok()) return name.status();
    auto value = Unescape(eq == absl::string_view::npos ? "" : pair.substr(eq + 1));
    if (!value.ok()) return value.status();
    params.emplace(*std::move(name), *std::move(value));  // the first one stays
  }
  return params;
}

absl::StatusOr<KubePath> ParseKubePath(absl::string_view path) {
  std::vector<absl::string_view> s = absl::StrSplit(path, '/', absl::SkipEmpty());
  KubePath p;
  size_t i = 0;
  if (s.size() >= 6 && s[0] == "services" && s[1] == "cache" && s[2] == "shards" &&
      s[4] == "clusters") {
    p.shard = Every(s[3]);
    p.cluster = Every(s[5]);
    i = 6;
  } else if (s.size() >= 2 && s[0] == "clusters") {
    p.cluster = Every(s[1]);
    i = 2;
  }
  size_t n = s.size() - i;
  if (n == 1 && s[i] == "version") {
    p.kind = KubePath::Kind::kVersion;
    return p;
  }
  if (n == 0) return NotServed(path);
  size_t rest;  // where the part after the group version begins
  if (s[i] == "api") {
    if (n == 1) {
      p.kind = KubePath::Kind::kCoreVersions;
      return p;
    }
    p.version = std::string(s[i + 1]);
    rest = i + 2;
  } else if (s[i] == "apis") {
    if (n == 1) {
      p.kind = KubePath::Kind::kGroups;
      return p;
    }
    if (n == 2) return NotServed(path);  // /apis/{group}: not served
    p.group = std::string(s[i + 1]);
    p.version = std::string(s[i + 2]);
    rest = i + 3;
  } else {
    return NotServed(path);
  }
  size_t m = s.size() - rest;
  if (m == 0) {
    p.kind = KubePath::Kind::kGroupVersion;
    return p;
  }
  p.kind = KubePath::Kind::kResource;
  if (s[rest] == "namespaces" && m >= 3) {
    p.namespace_ = std::string(s[rest + 1]);
    rest += 2;
    m -= 2;
  }
  if (m > 2) return NotServed(path);  // subresources are not served
  p.resource = std::string(s[rest]);
  if (m == 2) p.name = std::string(s[rest + 1]);
  return p;
}

}  // namespace shardcache
