#include "cache_server/list_token.h"

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardcache {

std::string EncodeContinueToken(int64_t revision, const std::string& last_key) {
  return absl::WebSafeBase64Escape(absl::StrCat(revision, "\n", last_key));
}

absl::StatusOr<ListPosition> DecodeContinueToken(const std::string& token) {
  std::string raw;
  if (absl::WebSafeBase64Unescape(token, &raw)) {
    size_t nl = raw.find('\n');
    ListPosition position;
    if (nl != std::string::npos && absl::SimpleAtoi(raw.substr(0, nl), &position.revision) &&
        position.revision > 0) {
      position.last_key = raw.substr(nl + 1);
      return position;
    }
  }
  return absl::InvalidArgumentError(
      "continue_token: Invalid value: malformed (pass the token of the previous page as is)");
}

}  // namespace shardcache
