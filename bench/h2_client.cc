#include "bench/h2_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/http_server.h"

namespace shardcache::bench {
namespace {

// Bytes read from a connection at a time.
constexpr size_t kReadBytes = 256 << 10;
// Flow-control windows that the client opens: per stream, and for each connection.
constexpr int32_t kStreamWindow = 256 << 10;
constexpr int32_t kConnectionWindow = 16 << 20;
// The largest response message accepted.
constexpr uint32_t kMaxMessageBytes = 64 << 20;
// The gRPC message prefix: a compressed flag and a big-endian length.
constexpr size_t kPrefixBytes = 5;

uint32_t MessageLength(const uint8_t* prefix) {
  return (uint32_t{prefix[1]} << 24) | (uint32_t{prefix[2]} << 16) | (uint32_t{prefix[3]} << 8) |
         uint32_t{prefix[4]};
}

// grpc-message is percent-encoded.
std::string PercentDecode(absl::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    int hex = 0;
    if (in[i] == '%' && i + 2 < in.size() && absl::SimpleHexAtoi(in.substr(i + 1, 2), &hex)) {
      out.push_back(static_cast<char>(hex));
      i += 2;
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

std::string Errno(const char* what) { return absl::StrCat(what, ": ", strerror(errno)); }

}  // namespace

// One call on a connection: owned by the connection from Start until its OnClosed has returned.
// Touched only by the connection's loop thread.
struct CallState {
  uint64_t id = 0;
  H2Client::Call* call = nullptr;
  std::string path;
  std::string framed;  // the request message with its gRPC prefix
  size_t sent = 0;
  bool half_close = true;
  int32_t stream_id = -1;
  std::string partial;  // a message whose end has not come yet
  bool cancelled = false;
  bool broke = false;  // the response broke the protocol (`why`)
  std::string why;
  bool has_status = false;
  int status_code = 0;
  std::string status_message;
  std::string http_status;

  grpc::Status FinalStatus(uint32_t h2_error) const {
    if (broke) return grpc::Status(grpc::StatusCode::INTERNAL, why);
    if (cancelled) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    if (has_status) {
      return grpc::Status(static_cast<grpc::StatusCode>(status_code), status_message);
    }
    if (h2_error != NGHTTP2_NO_ERROR) {
      std::string message =
          absl::StrCat("the server reset the stream: ", nghttp2_http2_strerror(h2_error));
      switch (h2_error) {
        case NGHTTP2_CANCEL:
          return grpc::Status(grpc::StatusCode::CANCELLED, message);
        case NGHTTP2_REFUSED_STREAM:
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, message);
        default:
          return grpc::Status(grpc::StatusCode::INTERNAL, message);
      }
    }
    if (!http_status.empty() && http_status != "200") {
      return grpc::Status(grpc::StatusCode::UNKNOWN,
                          absl::StrCat("the server answered HTTP status ", http_status));
    }
    return grpc::Status(grpc::StatusCode::INTERNAL, "the stream ended without a grpc-status");
  }
};

namespace {

// The call of stream `stream_id`, or null (not ours, or over).
CallState* CallOf(nghttp2_session* session, int32_t stream_id) {
  return static_cast<CallState*>(nghttp2_session_get_stream_user_data(session, stream_id));
}

}  // namespace

class H2Client::Loop {
 public:
  Loop() : epoll_(epoll_create1(EPOLL_CLOEXEC)), wake_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~Loop() {
    Stop();
    if (wake_ >= 0) close(wake_);
    if (epoll_ >= 0) close(epoll_);
  }

  bool ok() const { return epoll_ >= 0 && wake_ >= 0; }
  int epoll() const { return epoll_; }
  // Before Run: the connections it serves.
  void Add(Connection* connection) { connections_.push_back(connection); }
  void Start();
  void Stop() {
    if (!thread_.joinable()) return;
    stopping_.store(true);
    Wake();
    thread_.join();
  }
  void Wake() {
    uint64_t one = 1;
    (void)!write(wake_, &one, sizeof(one));
  }

 private:
  void Run();

  const int epoll_;
  const int wake_;
  std::vector<Connection*> connections_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

class H2Client::Connection {
 public:
  Connection(int fd, std::string authority, Loop* loop)
      : fd_(fd), authority_(std::move(authority)), loop_(loop) {}
  ~Connection() {
    if (session_ != nullptr) nghttp2_session_del(session_);
    close(fd_);
  }

  // Sets up the HTTP/2 session and sends the connection preface. Before the loop runs.
  absl::Status Init();

  // From any thread.
  void PostStart(std::unique_ptr<CallState> call) {
    {
      absl::MutexLock l(&mu_);
      starts_.push_back(std::move(call));
    }
    loop_->Wake();
  }
  void PostCancel(uint64_t id) {
    {
      absl::MutexLock l(&mu_);
      cancels_.push_back(id);
    }
    loop_->Wake();
  }

  // On the loop thread.
  void OnWake();
  void OnReadable();
  void OnWritable() { Flush(); }

 private:
  // Sends what the session has to send, and watches for writability only while the socket is
  // full.
  void Flush();
  // The connection broke: every call ends with UNAVAILABLE.
  void Fail(const std::string& why);
  void Submit(std::unique_ptr<CallState> call);
  void Reset(CallState* call);
  // Splits the messages out of a DATA frame's bytes and hands them over.
  void Receive(CallState* call, const uint8_t* data, size_t size);
  void Deliver(CallState* call, const uint8_t* message, size_t size, bool compressed);

  static ssize_t SendCallback(nghttp2_session*, const uint8_t* data, size_t length, int flags,
                              void* user_data);
  static ssize_t ReadRequest(nghttp2_session*, int32_t stream_id, uint8_t* buf, size_t length,
                             uint32_t* data_flags, nghttp2_data_source* source, void* user_data);
  static int OnHeader(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                      void* user_data);
  static int OnFrameRecv(nghttp2_session* session, const nghttp2_frame* frame, void* user_data);
  static int OnDataChunk(nghttp2_session* session, uint8_t flags, int32_t stream_id,
                         const uint8_t* data, size_t len, void* user_data);
  static int OnStreamClose(nghttp2_session* session, int32_t stream_id, uint32_t error_code,
                           void* user_data);

  const int fd_;
  const std::string authority_;
  Loop* const loop_;

  absl::Mutex mu_;
  std::vector<std::unique_ptr<CallState>> starts_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);

  // The loop thread's.
  nghttp2_session* session_ = nullptr;
  std::map<uint64_t, std::unique_ptr<CallState>> calls_;
  bool broken_ = false;
  std::string broken_why_;
  bool write_blocked_ = false;
  bool watching_writes_ = false;
  std::vector<uint8_t> read_buffer_;
};

absl::Status H2Client::Connection::Init() {
  nghttp2_session_callbacks* callbacks = nullptr;
  if (nghttp2_session_callbacks_new(&callbacks) != 0) {
    return absl::ResourceExhaustedError("nghttp2: out of memory");
  }
  nghttp2_session_callbacks_set_send_callback(callbacks, &SendCallback);
  nghttp2_session_callbacks_set_on_header_callback(callbacks, &OnHeader);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, &OnFrameRecv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, &OnDataChunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &OnStreamClose);
  int rv = nghttp2_session_client_new(&session_, callbacks, this);
  nghttp2_session_callbacks_del(callbacks);
  if (rv != 0) return absl::InternalError(absl::StrCat("nghttp2: ", nghttp2_strerror(rv)));
  nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                       {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kStreamWindow}};
  rv = nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  if (rv == 0) {
    rv = nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, kConnectionWindow);
  }
  if (rv != 0) return absl::InternalError(absl::StrCat("nghttp2: ", nghttp2_strerror(rv)));
  read_buffer_.resize(kReadBytes);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = this;
  if (epoll_ctl(loop_->epoll(), EPOLL_CTL_ADD, fd_, &ev) != 0) {
    return absl::InternalError(Errno("epoll_ctl"));
  }
  Flush();
  if (broken_) return absl::UnavailableError(broken_why_);
  return absl::OkStatus();
}

void H2Client::Connection::OnWake() {
  std::vector<std::unique_ptr<CallState>> starts;
  std::vector<uint64_t> cancels;
  {
    absl::MutexLock l(&mu_);
    starts.swap(starts_);
    cancels.swap(cancels_);
  }
  if (starts.empty() && cancels.empty()) return;
  for (auto& call : starts) Submit(std::move(call));
  for (uint64_t id : cancels) {
    auto it = calls_.find(id);
    if (it != calls_.end()) Reset(it->second.get());
  }
  Flush();
}

void H2Client::Connection::Submit(std::unique_ptr<CallState> call) {
  if (broken_) {
    call->call->OnClosed(grpc::Status(grpc::StatusCode::UNAVAILABLE, broken_why_));
    return;
  }
  auto nv = [](const char* name, const std::string& value) {
    return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name)),
                      reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), strlen(name),
                      value.size(), NGHTTP2_NV_FLAG_NONE};
  };
  static const std::string kPost = "POST", kHttp = "http", kGrpc = "application/grpc",
                           kTrailers = "trailers", kAgent = "store_bench";
  nghttp2_nv headers[] = {nv(":method", kPost),      nv(":scheme", kHttp),
                          nv(":path", call->path),   nv(":authority", authority_),
                          nv("content-type", kGrpc), nv("te", kTrailers),
                          nv("user-agent", kAgent)};
  nghttp2_data_provider body{};
  body.source.ptr = call.get();
  body.read_callback = &ReadRequest;
  int32_t stream_id =
      nghttp2_submit_request(session_, nullptr, headers, std::size(headers), &body, call.get());
  if (stream_id < 0) {
    call->call->OnClosed(grpc::Status(grpc::StatusCode::INTERNAL,
                                      absl::StrCat("nghttp2: ", nghttp2_strerror(stream_id))));
    return;
  }
  call->stream_id = stream_id;
  uint64_t id = call->id;
  calls_.emplace(id, std::move(call));
}

void H2Client::Connection::Reset(CallState* call) {
  if (call->cancelled) return;
  call->cancelled = true;
  nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
}

void H2Client::Connection::OnReadable() {
  if (broken_) return;
  while (true) {
    ssize_t n = recv(fd_, read_buffer_.data(), read_buffer_.size(), 0);
    if (n > 0) {
      ssize_t used =
          nghttp2_session_mem_recv(session_, read_buffer_.data(), static_cast<size_t>(n));
      if (used < 0) {
        Fail(absl::StrCat("HTTP/2: ", nghttp2_strerror(static_cast<int>(used))));
        return;
      }
      if (static_cast<size_t>(n) < read_buffer_.size()) break;
      continue;
    }
    if (n == 0) {
      Fail("the server closed the connection");
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    Fail(Errno("recv"));
    return;
  }
  Flush();
}

void H2Client::Connection::Flush() {
  if (broken_) return;
  write_blocked_ = false;
  int rv = nghttp2_session_send(session_);
  if (rv != 0) {
    Fail(absl::StrCat("HTTP/2: ", nghttp2_strerror(rv)));
    return;
  }
  if (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_)) {
    Fail("the server ended the connection (GOAWAY)");
    return;
  }
  if (write_blocked_ != watching_writes_) {
    epoll_event ev{};
    ev.events = write_blocked_ ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
    ev.data.ptr = this;
    epoll_ctl(loop_->epoll(), EPOLL_CTL_MOD, fd_, &ev);
    watching_writes_ = write_blocked_;
  }
}

void H2Client::Connection::Fail(const std::string& why) {
  if (broken_) return;
  broken_ = true;
  broken_why_ = absl::StrCat("connection to ", authority_, " lost: ", why);
  epoll_ctl(loop_->epoll(), EPOLL_CTL_DEL, fd_, nullptr);
  std::map<uint64_t, std::unique_ptr<CallState>> calls;
  calls.swap(calls_);
  for (auto& [id, call] : calls) {
    nghttp2_session_set_stream_user_data(session_, call->stream_id, nullptr);
    call->call->OnClosed(grpc::Status(grpc::StatusCode::UNAVAILABLE, broken_why_));
  }
}

void H2Client::Connection::Receive(CallState* call, const uint8_t* data, size_t size) {
  while (size > 0 && !call->cancelled) {
    if (call->partial.empty() && size >= kPrefixBytes) {
      // The common case: whole messages in one chunk, read where they lie.
      // (A message over the bound goes the other way, which reports it.)
      uint32_t length = MessageLength(data);
      if (length <= kMaxMessageBytes && size - kPrefixBytes >= length) {
        Deliver(call, data + kPrefixBytes, length, data[0] != 0);
        data += kPrefixBytes + length;
        size -= kPrefixBytes + length;
        continue;
      }
    }
    // A message split over chunks: gather it.
    std::string& partial = call->partial;
    if (partial.size() < kPrefixBytes) {
      size_t take = std::min(kPrefixBytes - partial.size(), size);
      partial.append(reinterpret_cast<const char*>(data), take);
      data += take;
      size -= take;
      if (partial.size() < kPrefixBytes) return;
    }
    uint32_t length = MessageLength(reinterpret_cast<const uint8_t*>(partial.data()));
    if (length > kMaxMessageBytes) {
      call->broke = true;
      call->why = absl::StrCat("a response message of ", length, " bytes (more than ",
                               kMaxMessageBytes, ")");
      Reset(call);
      return;
    }
    size_t take = std::min(kPrefixBytes + length - partial.size(), size);
    partial.append(reinterpret_cast<const char*>(data), take);
    data += take;
    size -= take;
    if (partial.size() < kPrefixBytes + length) return;
    Deliver(call, reinterpret_cast<const uint8_t*>(partial.data()) + kPrefixBytes, length,
            partial[0] != 0);
    partial.clear();
  }
}

void H2Client::Connection::Deliver(CallState* call, const uint8_t* message, size_t size,
                                   bool compressed) {
  if (compressed) {
    call->broke = true;
    call->why = "a compressed response message (the client asked for none)";
    Reset(call);
    return;
  }
  if (!call->call->OnMessage(message, size)) Reset(call);
}

ssize_t H2Client::Connection::SendCallback(nghttp2_session*, const uint8_t* data, size_t length,
                                           int /*flags*/, void* user_data) {
  auto* self = static_cast<Connection*>(user_data);
  while (true) {
    ssize_t n = send(self->fd_, data, length, MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      self->write_blocked_ = true;
      return NGHTTP2_ERR_WOULDBLOCK;
    }
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
}

ssize_t H2Client::Connection::ReadRequest(nghttp2_session*, int32_t /*stream_id*/, uint8_t* buf,
                                          size_t length, uint32_t* data_flags,
                                          nghttp2_data_source* source, void* /*user_data*/) {
  auto* call = static_cast<CallState*>(source->ptr);
  size_t n = std::min(length, call->framed.size() - call->sent);
  memcpy(buf, call->framed.data() + call->sent, n);
  call->sent += n;
  if (call->sent == call->framed.size()) {
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    if (!call->half_close) *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
  }
  return static_cast<ssize_t>(n);
}

int H2Client::Connection::OnHeader(nghttp2_session* session, const nghttp2_frame* frame,
                                   const uint8_t* name, size_t namelen, const uint8_t* value,
                                   size_t valuelen, uint8_t /*flags*/, void* /*user_data*/) {
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  auto* call = CallOf(session, frame->hd.stream_id);
  if (call == nullptr) return 0;
  absl::string_view n(reinterpret_cast<const char*>(name), namelen);
  absl::string_view v(reinterpret_cast<const char*>(value), valuelen);
  if (n == ":status") {
    call->http_status = std::string(v);
  } else if (n == "grpc-status") {
    int code = 0;
    if (absl::SimpleAtoi(v, &code) && code >= 0 && code <= 16) {
      call->has_status = true;
      call->status_code = code;
    } else {
      call->broke = true;
      call->why = absl::StrCat("a malformed grpc-status: ", v);
    }
  } else if (n == "grpc-message") {
    call->status_message = PercentDecode(v);
  }
  return 0;
}

int H2Client::Connection::OnFrameRecv(nghttp2_session* session, const nghttp2_frame* frame,
                                      void* /*user_data*/) {
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  auto* call = CallOf(session, frame->hd.stream_id);
  if (call == nullptr) return 0;
  bool end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  // The response headers (a trailers-only response carries the status alone).
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_RESPONSE && !end &&
      !call->cancelled) {
    call->call->OnHeaders();
  }
  // The server has ended a call whose request stream is still open: close it from this side too
  // (as gRPC clients do), so that the stream closes, whether or not the server resets it.
  if (end && !call->half_close && !call->cancelled) {
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
  }
  return 0;
}

int H2Client::Connection::OnDataChunk(nghttp2_session* session, uint8_t /*flags*/,
                                      int32_t stream_id, const uint8_t* data, size_t len,
                                      void* user_data) {
  auto* call = CallOf(session, stream_id);
  if (call != nullptr) static_cast<Connection*>(user_data)->Receive(call, data, len);
  return 0;
}

int H2Client::Connection::OnStreamClose(nghttp2_session* session, int32_t stream_id,
                                        uint32_t error_code, void* user_data) {
  auto* self = static_cast<Connection*>(user_data);
  auto* state = CallOf(session, stream_id);
  if (state == nullptr) return 0;
  auto it = self->calls_.find(state->id);
  if (it == self->calls_.end()) return 0;
  std::unique_ptr<CallState> call = std::move(it->second);
  self->calls_.erase(it);
  if (!call->partial.empty() && !call->broke && !call->cancelled) {
    call->broke = true;
    call->why = "the stream ended inside a message";
  }
  call->call->OnClosed(call->FinalStatus(error_code));
  return 0;
}

void H2Client::Loop::Start() {
  thread_ = std::thread([this] { Run(); });
}

void H2Client::Loop::Run() {
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.ptr = nullptr;
  epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &wake);
  epoll_event events[64];
  while (!stopping_.load()) {
    int n = epoll_wait(epoll_, events, static_cast<int>(std::size(events)), 1000);
    for (int i = 0; i < n; ++i) {
      auto* connection = static_cast<Connection*>(events[i].data.ptr);
      if (connection == nullptr) {
        uint64_t count;
        (void)!read(wake_, &count, sizeof(count));
        for (Connection* c : connections_) c->OnWake();
        continue;
      }
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) connection->OnReadable();
      if (events[i].events & EPOLLOUT) connection->OnWritable();
    }
  }
}

absl::StatusOr<std::unique_ptr<H2Client>> H2Client::Connect(const std::string& address,
                                                            int connections, int threads) {
  if (connections < 1 || threads < 1) {
    return absl::InvalidArgumentError("H2Client: want at least one connection and one thread");
  }
  absl::StatusOr<std::pair<std::string, int>> host_port = SplitHostPort("H2Client", address);
  if (!host_port.ok()) return host_port.status();
  const std::string& host = host_port->first;
  const std::string port = std::to_string(host_port->second);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rv = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("H2Client: cannot resolve ", address, ": ", gai_strerror(rv)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> free_found(found, freeaddrinfo);

  std::unique_ptr<H2Client> client(new H2Client());
  for (int i = 0; i < std::min(threads, connections); ++i) {
    client->loops_.push_back(std::make_unique<Loop>());
    if (!client->loops_.back()->ok()) return absl::InternalError(Errno("H2Client: epoll"));
  }
  for (int i = 0; i < connections; ++i) {
    int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError(Errno("H2Client: socket"));
    if (connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
      std::string why = Errno("connect");
      close(fd);
      return absl::UnavailableError(absl::StrCat("H2Client: ", address, ": ", why));
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    Loop* loop = client->loops_[i % client->loops_.size()].get();
    client->connections_.push_back(std::make_unique<Connection>(fd, address, loop));
    if (absl::Status s = client->connections_.back()->Init(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("H2Client: ", s.message()));
    }
    loop->Add(client->connections_.back().get());
  }
  for (auto& loop : client->loops_) loop->Start();
  return client;
}

H2Client::~H2Client() {
  // The loops first: the connections they serve go after.
  for (auto& loop : loops_) loop->Stop();
}

uint64_t H2Client::Start(int slot, const std::string& path, std::string request, bool half_close,
                         Call* call) {
  size_t index = static_cast<size_t>(slot) % connections_.size();
  auto state = std::make_unique<CallState>();
  state->id = next_call_.fetch_add(1) * connections_.size() + index;
  state->call = call;
  state->path = path;
  state->half_close = half_close;
  state->framed.resize(kPrefixBytes);
  uint32_t length = static_cast<uint32_t>(request.size());
  state->framed[1] = static_cast<char>(length >> 24);
  state->framed[2] = static_cast<char>(length >> 16);
  state->framed[3] = static_cast<char>(length >> 8);
  state->framed[4] = static_cast<char>(length);
  state->framed += request;
  uint64_t id = state->id;
  connections_[index]->PostStart(std::move(state));
  return id;
}

void H2Client::Cancel(uint64_t id) { connections_[id % connections_.size()]->PostCancel(id); }

}  // namespace shardcache::bench
