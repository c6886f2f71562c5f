#include "common/endpoints.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace shardcache {
namespace {

enum class HostKind { kIpv4, kIpv6, kName };

struct Endpoint {
  std::string host;  // without brackets
  int port = 0;
  HostKind kind = HostKind::kName;
};

bool ValidName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
  }
  return true;
}

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view text, absl::string_view what) {
  auto bad = [text, what](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " \"", text, "\": ", why));
  };
  if (text.empty()) return bad("empty (want host:port)");
  if (absl::StrContains(text, "://")) return bad("want host:port, without a scheme");
  Endpoint e;
  absl::string_view port;
  if (text.front() == '[') {
    size_t close = text.find(']');
    if (close == absl::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("want [IPv6 address]:port");
    }
    e.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
    in6_addr addr;
    if (inet_pton(AF_INET6, e.host.c_str(), &addr) != 1) {
      return bad(absl::StrCat("\"", e.host, "\" is not an IPv6 address"));
    }
    e.kind = HostKind::kIpv6;
  } else {
    size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) return bad("no port (want host:port)");
    e.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
    if (absl::StrContains(e.host, ':'))
      return bad("an IPv6 address needs brackets: [address]:port");
    in_addr addr;
    if (inet_pton(AF_INET, e.host.c_str(), &addr) == 1) {
      e.kind = HostKind::kIpv4;
    } else if (!e.host.empty() && e.host.find_first_not_of("0123456789.") == std::string::npos) {
      return bad(absl::StrCat("\"", e.host, "\" is not an IPv4 address"));
    } else if (!ValidName(e.host)) {
      return bad(absl::StrCat("\"", e.host, "\" is not a host name or an IP address"));
    }
  }
  if (port.empty()) return bad("no port (want host:port)");
  if (port.find_first_not_of("0123456789") != port.npos || !absl::SimpleAtoi(port, &e.port) ||
      e.port < 1 || e.port > 65535) {
    return bad(absl::StrCat("port \"", port, "\" is not a number from 1 to 65535"));
  }
  return e;
}

std::string HostPort(const std::string& host, bool ipv6, int port) {
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// The addresses of one endpoint's name, by family (getaddrinfo).
absl::Status Resolve(const Endpoint& e, absl::string_view what, std::vector<std::string>* v4,
                     std::vector<std::string>* v6) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(e.host.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        what, " \"", e.host, ":", e.port, "\": cannot resolve ", e.host, ": ", gai_strerror(rc)));
  }
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (ai->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, buf, sizeof(buf));
      v4->push_back(HostPort(buf, false, e.port));
    } else if (ai->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, buf,
                sizeof(buf));
      v6->push_back(HostPort(buf, true, e.port));
    }
  }
  freeaddrinfo(result);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChannelTarget> MakeChannelTarget(const std::vector<std::string>& texts,
                                                absl::string_view what) {
  if (texts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no ", what, " (want host:port,...)"));
  }
  std::vector<Endpoint> endpoints;
  for (const std::string& text : texts) {
    absl::StatusOr<Endpoint> e = ParseEndpoint(text, what);
    if (!e.ok()) return e.status();
    endpoints.push_back(*std::move(e));
  }
  const Endpoint& first = endpoints.front();
  ChannelTarget target;
  if (endpoints.size() == 1 && first.kind == HostKind::kName) {
    target.uri = absl::StrCat("dns:///", first.host, ":", first.port);
    return target;
  }
  target.authority = HostPort(first.host, first.kind == HostKind::kIpv6, first.port);
  // Literal addresses as they are; names resolved now. One list holds one address family.
  std::vector<std::string> v4, v6;
  bool all_v4 = true, all_v6 = true;
  for (const Endpoint& e : endpoints) {
    std::vector<std::string> e4, e6;
    switch (e.kind) {
      case HostKind::kIpv4:
        e4.push_back(HostPort(e.host, false, e.port));
        break;
      case HostKind::kIpv6:
        e6.push_back(HostPort(e.host, true, e.port));
        break;
      case HostKind::kName: {
        absl::Status s = Resolve(e, what, &e4, &e6);
        if (!s.ok()) return s;
        break;
      }
    }
    all_v4 = all_v4 && !e4.empty();
    all_v6 = all_v6 && !e6.empty();
    v4.insert(v4.end(), e4.begin(), e4.end());
    v6.insert(v6.end(), e6.begin(), e6.end());
  }
  if (all_v4) {
    target.uri = absl::StrCat("ipv4:", absl::StrJoin(v4, ","));
  } else if (all_v6) {
    target.uri = absl::StrCat("ipv6:", absl::StrJoin(v6, ","));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "s \"", absl::StrJoin(texts, ","),
                     "\": some have IPv4 addresses only and some IPv6 only; give endpoints of "
                     "one address family"));
  }
  return target;
}

}  // namespace shardcache
