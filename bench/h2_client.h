// H2Client: streaming gRPC calls over plain HTTP/2 (h2c), read by nghttp2 on loop threads of the
// client's own, for store_bench's watchers.
//
// store_bench's watch load reads a hundred thousand small messages a second and more, on the same
// machine as the server it measures. Read through gRPC C++, each message costs the client a
// completion, a callback and a new read, about 9 us of CPU: on a 2-core machine 1,000 watchers
// of 100 writes/s take the client most of a core, and the server under test waits for a core
// behind its own load tool. This client reads a connection's bytes in large reads, lets nghttp2
// (Debian's libnghttp2) do the HTTP/2 (frames, HPACK, flow control, SETTINGS and PING
// acknowledgements) and splits the gRPC messages out of the DATA frames itself. Both servers
// receive the same requests from it and send it the same bytes as to a gRPC client.
//
// It speaks gRPC's HTTP/2 mapping as far as store_bench's watches need: a POST with the gRPC
// headers and one request message, the request stream then half-closed (a server-streaming call)
// or left open (a bidirectional one, such as etcd's Watch); uncompressed response messages (a
// compressed one ends the call with INTERNAL); the status from the trailers, or from a
// trailers-only response. No TLS, no deadlines, no retries, no reconnection: a connection that
// breaks ends its calls with UNAVAILABLE.
//
// Thread-safety: Start and Cancel may be called from any thread. Each connection belongs to one
// loop thread, and the callbacks of its calls run there, one at a time.
#ifndef SHARDCACHE_BENCH_H2_CLIENT_H_
#define SHARDCACHE_BENCH_H2_CLIENT_H_

#include <grpcpp/support/status.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardcache::bench {

class H2Client {
 public:
  // The receiving end of one call. Its callbacks run on its connection's loop thread.
  class Call {
   public:
    virtual ~Call() = default;
    // The response headers have come (not called for a trailers-only response).
    virtual void OnHeaders() {}
    // One response message. Returning false cancels the call.
    virtual bool OnMessage(const uint8_t* data, size_t size) = 0;
    // The call is over: the server's status; CANCELLED after Cancel or a false OnMessage;
    // UNAVAILABLE when the connection broke; INTERNAL when the response broke the protocol. The
    // last callback: the call may be destroyed once it has returned.
    virtual void OnClosed(const grpc::Status& status) = 0;
  };

  // Connects `connections` HTTP/2 connections to `address` (host:port), served by `threads` loop
  // threads (connection i by thread i % threads).
  static absl::StatusOr<std::unique_ptr<H2Client>> Connect(const std::string& address,
                                                           int connections, int threads);
  // Stops the loop threads and closes the connections. The calls still open get no callback any
  // more. Not from a callback (a loop thread cannot wait for itself).
  ~H2Client();
  H2Client(const H2Client&) = delete;
  H2Client& operator=(const H2Client&) = delete;

  int connections() const { return static_cast<int>(connections_.size()); }

  // Starts a call of method `path` ("/package.Service/Method") on connection
  // `slot % connections()`, sending `request` (one serialized message) and then, with
  // `half_close`, ending the request stream. Returns the call's id, for Cancel.
  uint64_t Start(int slot, const std::string& path, std::string request, bool half_close,
                 Call* call);
  // Ends call `id` from the client's side (RST_STREAM CANCEL); its OnClosed follows, with
  // CANCELLED, unless it was over already.
  void Cancel(uint64_t id);

 private:
  class Connection;
  class Loop;

  H2Client() = default;

  std::atomic<uint64_t> next_call_{0};
  std::vector<std::unique_ptr<Loop>> loops_;
  std::vector<std::unique_ptr<Connection>> connections_;
};

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_H2_CLIENT_H_
