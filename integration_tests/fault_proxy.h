// FaultProxy: a loopback TCP proxy in front of one server address, for tests that put real network
// faults between two processes. It listens on 127.0.0.1 (a port it picks) and forwards each
// accepted connection to the target host:port, both directions, on the connection's own thread.
// The client is pointed at address() instead of the server's.
//
// Faults, switchable at any time from any thread; each applies to every connection, current and
// later, until the next switch:
//   Heal()       pass: bytes are forwarded as they come (the initial mode).
//   Cut()        every connection is reset (RST on both sides); connections accepted meanwhile are
//                reset at once: the client sees "connection reset", never a refused connect.
//   BlackHole()  a half-open partition: connections stay open on both sides but nothing moves in
//                either direction, and nothing tells either side (no FIN, no RST); connections
//                accepted meanwhile are accepted and never answered. On Heal, bytes flow again.
//                A server side that ended while the partition lasted (the server restarted) is
//                forgotten, with what it sent meanwhile, and not passed on as a close: as after a
//                real partition that outlasted the server host's retransmissions, the client
//                learns of it only when it next sends, and then gets a reset.
//   Delay(d)     every chunk of bytes read, in either direction, is sent on `d` after it was read.
// One-shot:
//   ResetAll()   resets the connections open now; the mode does not change (for flapping).
//
// Besides faults it can hold what clients send (Hold/Release: client -> server bytes wait in the
// proxy, server -> client bytes keep flowing) and record what servers answer, for tests that
// must let a request reach its server at a moment they pick (see TcpRelay).
//
// Timing: a switch applies to every byte that the proxy sends on after the switch returns (a
// Delay to every chunk read after it); each connection thread polls with a 10 ms timeout, so
// connections are reset within about 10 ms of Cut or ResetAll. A connection's thread connects to
// the target when the connection is first allowed to pass (waiting at most 2 s); a target that
// refuses makes the proxy reset the client.
//
// The destructor closes every socket and joins every thread. Thread-safe.
#ifndef SHARDCACHE_INTEGRATION_TESTS_FAULT_PROXY_H_
#define SHARDCACHE_INTEGRATION_TESTS_FAULT_PROXY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardcache::testing {

class FaultProxy {
 public:
  enum class Mode { kPass, kCut, kBlackHole, kDelay };

  // Listens on 127.0.0.1:0 and forwards to target_host:target_port (an IPv4 address).
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(const std::string& target_host,
                                                           int target_port);
  // Closes the listener and every connection, and joins every thread.
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // The modes (see above).
  void Heal();
  void Cut();
  void BlackHole();
  void Delay(absl::Duration per_chunk);
  Mode mode() const;
  static const char* ModeName(Mode mode);
  // Resets every connection open now; later ones pass as the mode says.
  void ResetAll();

  // Client -> server bytes from now on wait in the proxy (connections accepted meanwhile too).
  void Hold();
  // Sends them on, in order, and resumes forwarding.
  void Release();
  // Client -> server bytes read but not yet written to the target, over every open connection.
  size_t held_bytes() const;
  // Whether those bytes contain `needle` (within one connection's buffer).
  bool HeldContains(std::string_view needle) const;
  // From now on a copy of every server -> client byte read is kept (up to 16 MiB a connection).
  void RecordServerToClient();
  // Whether the recorded bytes contain `needle` (within one connection's stream).
  bool RecordedContains(std::string_view needle) const;

  // Counters since Start.
  int connections_accepted() const;
  // Connections whose thread still runs.
  int connections_open() const;
  // Connections the proxy reset (Cut, ResetAll, a target that refused or failed, a client that
  // sent to a server that ended during a black hole).
  int connections_reset() const;
  // Bytes written to targets and to clients.
  int64_t bytes_to_server() const;
  int64_t bytes_to_client() const;

 private:
  // Bytes read from one side, due to be written to the other side at `due`.
  struct Chunk {
    absl::Time due;
    std::string bytes;
  };
  struct Conn {
    int client_fd = -1;
    uint64_t reset_generation = 0;  // ResetAll resets connections from older generations
    std::deque<Chunk> to_server;
    std::deque<Chunk> to_client;
    std::string recorded;
    bool finished = false;  // the connection's thread has ended
    std::thread thread;
  };

  FaultProxy(int listen_fd, int port, std::string target_host, int target_port);

  void AcceptLoop();
  void Relay(Conn* conn);
  // The delay of a chunk read now.
  absl::Duration DelayLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `conn` may forward bytes now (pass or delay, and not reset since).
  bool FlowingLocked(const Conn& conn) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins the threads of finished connections and forgets them.
  void Reap();

  // Constant after construction.
  const int listen_fd_;
  const int port_;
  const std::string target_host_;
  const int target_port_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kPass;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  uint64_t reset_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool recording_ ABSL_GUARDED_BY(mu_) = false;
  int accepted_ ABSL_GUARDED_BY(mu_) = 0;
  int reset_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_to_server_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_to_client_ ABSL_GUARDED_BY(mu_) = 0;
  // Every connection whose thread has not been joined (the fds are the connection thread's
  // alone; the buffers are shared under mu_).
  std::vector<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_INTEGRATION_TESTS_FAULT_PROXY_H_
