// TcpRelay: a TCP relay for tests that need to delay what one process sends to another. It
// listens on 127.0.0.1 (a port it picks) and forwards each accepted connection to a target
// host:port, both directions, on the connection's own thread. Hold() stops forwarding client ->
// server bytes: they are buffered, while server -> client bytes keep flowing; Release() sends the
// buffered bytes on, in order, and resumes forwarding. So a client's request can be made to reach
// its server later, at a moment the test picks, exactly as the client sent it.
//
//   absl::StatusOr<std::unique_ptr<TcpRelay>> relay = TcpRelay::Start("127.0.0.1", port);
//   ... client connects to (*relay)->address() ...
//   (*relay)->Hold();   // what the client sends from now on waits in the relay
//   (*relay)->Release();
//
// It is a FaultProxy (fault_proxy.h) that is only ever held or released: the destructor closes
// every socket and joins every thread (within about a poll period, plus at most the connect
// timeout of a connection still connecting to the target).
//
// Thread-safe.
#ifndef SHARDCACHE_INTEGRATION_TESTS_TCP_RELAY_H_
#define SHARDCACHE_INTEGRATION_TESTS_TCP_RELAY_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "integration_tests/fault_proxy.h"

namespace shardcache::testing {

class TcpRelay {
 public:
  // Listens on 127.0.0.1:0 and relays to target_host:target_port (an IPv4 address).
  static absl::StatusOr<std::unique_ptr<TcpRelay>> Start(const std::string& target_host,
                                                         int target_port);
  // Closes the listener and every connection, and joins every thread.
  ~TcpRelay() = default;
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  int port() const { return proxy_->port(); }
  std::string address() const { return proxy_->address(); }

  // From now on, bytes from clients are buffered instead of sent to the target (connections
  // accepted meanwhile are held as well).
  void Hold();
  // Sends the buffered bytes on and resumes forwarding.
  void Release();
  // Client -> server bytes read but not yet written to the target, over every connection: while
  // held, what is held; after Release, 0 once they have been flushed.
  size_t held_bytes() const;
  // Whether the bytes counted by held_bytes() contain `needle` (within one connection's buffer).
  bool HeldContains(std::string_view needle) const;

  // From now on, a copy of every server -> client byte forwarded is kept (up to 16 MiB), e.g. to
  // check what a server answered to a client that cannot read it yet.
  void RecordServerToClient();
  // Whether the bytes recorded since RecordServerToClient() contain `needle` (within one
  // connection's stream).
  bool RecordedContains(std::string_view needle) const;

  // Connections accepted so far.
  int connections_accepted() const;

 private:
  explicit TcpRelay(std::unique_ptr<FaultProxy> proxy) : proxy_(std::move(proxy)) {}

  const std::unique_ptr<FaultProxy> proxy_;
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_INTEGRATION_TESTS_TCP_RELAY_H_
