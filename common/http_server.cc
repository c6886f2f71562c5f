#include "common/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "prometheus/text_serializer.h"

namespace shardcache {

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& flag,
                                                          const std::string& address) {
  size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": \"", address, "\" is not host:port (e.g. 127.0.0.1:7070, 0.0.0.0:0)"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

absl::StatusOr<int> ServeInBackground(httplib::Server* server, const std::string& flag,
                                      const std::string& address, std::thread* thread,
                                      std::atomic<bool>* listen_returned, int send_buffer_bytes) {
  auto host_port = SplitHostPort(flag, address);
  if (!host_port.ok()) return host_port.status();
  // SO_REUSEADDR only: without SO_REUSEPORT (httplib's default sets it) a second process cannot
  // bind a port this one serves.
  // Accepted sockets inherit the listening socket's buffer sizes.
  server->set_socket_options([send_buffer_bytes](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (send_buffer_bytes > 0) {
      setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &send_buffer_bytes, sizeof(send_buffer_bytes));
    }
  });
  const auto& [host, port] = *host_port;
  int bound = port;
  if (port == 0) {
    bound = server->bind_to_any_port(host);
  } else if (!server->bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound < 0) {
    return absl::UnavailableError(
        absl::StrCat(flag, ": cannot listen on ", address, " (address in use or not local?)"));
  }
  *listen_returned = false;
  *thread = std::thread([server, listen_returned] {
    server->listen_after_bind();
    *listen_returned = true;
  });
  while (!server->is_running() && !*listen_returned) absl::SleepFor(absl::Milliseconds(1));
  return bound;
}

HttpServer::HttpServer(std::shared_ptr<prometheus::Registry> registry, ReadinessCheck readiness)
    : registry_(std::move(registry)), readiness_(std::move(readiness)) {}

HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<int> HttpServer::Start(const std::string& address) {
  if (tls_ != nullptr) {
    std::shared_ptr<ReloadingKeyPair> keys = tls_;
    server_ = std::make_unique<httplib::SSLServer>([keys](SSL_CTX& ctx) {
      keys->Install(&ctx);
      return true;
    });
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    prometheus::TextSerializer serializer;
    res.set_content(serializer.Serialize(registry_->Collect()), "text/plain; version=0.0.4");
  });
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    absl::Status ready = readiness_ ? readiness_() : absl::OkStatus();
    if (ready.ok()) {
      res.set_content("ok\n", "text/plain");
    } else {
      res.status = 503;
      res.set_content(absl::StrCat("not ready: ", ready.message(), "\n"), "text/plain");
    }
  });
  return ServeInBackground(server_.get(), "--http-listen", address, &thread_, &listen_returned_);
}

void HttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace shardcache
