// SocketCork: gathers the small writes that a watch dispatcher starts on many streams of one TCP
// connection into a few segments (Linux TCP_CORK), and ConnectionSockets, which finds a call's
// socket.
//
// gRPC C++ (1.51) sends each stream message with a sendmsg of its own as soon as the write is
// started, and its HTTP/2 transport does not gather the messages of different streams of one
// connection into one write (Go's HTTP/2 server, etcd's, does). A dispatcher that sends one event
// to a thousand watchers over a few connections thus makes a thousand small TCP segments, and the
// client a thousand wake-ups to read them; on loopback the kernel also runs the receiver's TCP
// path inside each sendmsg. While a socket is corked, the kernel appends each message to the
// segment it is building and sends full segments only; uncorking sends the rest at once. A
// dispatcher corks each connection that it starts a write on during one pass of its loop (Hold,
// from the watch stream's write path) and uncorks them all before it waits again (Release): each
// connection then carries the pass's messages in a few segments.
//
// Nothing is held back longer than the dispatcher's pass, nor longer than kMaxHold when the
// pass is long: the dispatcher releases before it blocks, a Hold that comes kMaxHold after the
// first of the pass releases first, and the kernel sends corked data after 200 ms in any case.
// What other threads write on a corked connection meanwhile (gRPC's own frames, answers to
// other calls, the other dispatcher's messages) goes out with the release. A socket held after its
// connection closed and its number was reused only has its data delayed to the end of the pass.
//
// gRPC C++ does not give a call's file descriptor: ConnectionSockets finds it from the call's
// peer address (ServerContext::peer(), such as "ipv4:127.0.0.1:43298"), as the one of the
// process's open sockets (/proc/self/fd) that is connected to that address. Only TCP peers
// (ipv4:, ipv6:) are found; any other peer, or a socket not found, is simply never corked. (A
// remote address connected to two of the process's ports at once, say the gRPC port and the
// HTTP one, names one of the two sockets: the other may then be corked for a pass.)
//
// Thread-safety: ConnectionSockets is thread-safe. Hold and Release act on the calling thread's
// scope (SocketCork::Scope); without one, Hold does nothing.
#ifndef SHARDCACHE_CACHE_SERVER_SOCKET_CORK_H_
#define SHARDCACHE_CACHE_SERVER_SOCKET_CORK_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardcache {

class ConnectionSockets {
 public:
  // The file descriptor of the process's socket connected to `peer` (a gRPC peer string), or -1.
  // A hit costs one getpeername; a miss (a new connection) one look at every open descriptor.
  int Find(const std::string& peer);

  // The gRPC peer string of socket `fd`'s remote end ("ipv4:127.0.0.1:43298",
  // "ipv6:%5B::1%5D:43298"), or "" when `fd` is not a connected TCP socket.
  static std::string PeerOf(int fd);

 private:
  absl::Mutex mu_;
  // From the last look at every descriptor (so it holds no closed connection for long).
  absl::flat_hash_map<std::string, int> sockets_ ABSL_GUARDED_BY(mu_);
};

class SocketCork {
 public:
  // The longest a scope keeps a socket corked while its thread goes on writing.
  static constexpr absl::Duration kMaxHold = absl::Milliseconds(5);

  // Opens the calling thread's scope, for the scope's life (a dispatcher's loop). Not nested.
  class Scope {
   public:
    Scope();
    // Releases what is still held.
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  };

  // Corks socket `fd` until the scope's next Release, if the calling thread has a scope (and
  // `fd` is not negative).
  static void Hold(int fd);
  // Uncorks every socket held since the last Release, which sends what they hold.
  static void Release();
  // Sockets held on this thread now.
  static size_t held();
  // Corks done by every thread so far.
  static int64_t corks();
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_SOCKET_CORK_H_
