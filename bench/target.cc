#include "bench/target.h"

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_util.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace shardcache::bench {
namespace {

constexpr char kStoreWatchPath[] = "/shardcache.v1.Store/Watch";
constexpr char kEtcdWatchPath[] = "/etcdserverpb.Watch/Watch";

std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

// Starts one asynchronous unary call: `start(ctx, request, response, on_done)` is a stub's
// async() method; the context, the request and the response live until `finish(status,
// response)` has run, on a gRPC thread.
template <typename Response, typename Request, typename Start, typename Finish>
void CallAsync(Request request, absl::Duration timeout, Start start, Finish finish) {
  struct Call {
    grpc::ClientContext ctx;
    Request request;
    Response response;
    Finish finish;
  };
  auto* call = new Call{{}, std::move(request), {}, std::move(finish)};
  call->ctx.set_deadline(DeadlineIn(timeout));
  start(&call->ctx, &call->request, &call->response, [call](grpc::Status status) {
    call->finish(status, call->response);
    delete call;
  });
}

// ---- cache_server ----

// Reads the next message of `buffer` with `scan(CodedInputStream*)`, zero-copy over its slices.
template <typename Scan>
auto ScanBuffer(grpc::ByteBuffer* buffer, Scan scan) {
  size_t length = buffer->Length();
  grpc::ProtoBufferReader reader(buffer);
  google::protobuf::io::CodedInputStream in(&reader);
  google::protobuf::io::CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
  auto result = scan(&in);
  in.PopLimit(limit);
  return result;
}

// The status of a stream whose message could not be read.
grpc::Status Malformed(const char* what) {
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      absl::StrCat("store_bench could not read a ", what, " message"));
}

// Reads the messages of one watch, whichever client carries them: hands their events to the
// watch's handler, and says when the watch must end.
class WatchReader {
 public:
  virtual ~WatchReader() = default;
  // The response headers have come.
  virtual void OnHeaders() {}
  // Reads one message, received at `now` (NowNanos()); a status when the watch must end with it.
  virtual std::optional<grpc::Status> Read(google::protobuf::io::CodedInputStream* in,
                                           int64_t now) = 0;
};

// A cache_server Watch's messages (v1::WatchEvent).
class StoreWatchReader : public WatchReader {
 public:
  // `from_revision`: the watch asked for every change after a revision; it is synced once the
  // server has sent its headers (it sends them as it takes the watch; every change after the
  // revision comes, from its history if need be). Otherwise the current state comes first, and
  // it is synced at the initial-events-end bookmark.
  StoreWatchReader(WatchHandler* handler, bool from_revision)
      : handler_(handler), from_revision_(from_revision) {}

  void OnHeaders() override {
    if (from_revision_) handler_->OnSynced();
  }
  std::optional<grpc::Status> Read(google::protobuf::io::CodedInputStream* in,
                                   int64_t now) override {
    bool read = ScanStoreWatchEvent(in, &facts_, [&](int type, const ObjectFacts& object) {
      if (type == v1::WatchEvent::BOOKMARK) {
        if (!synced_ && object.initial_events_end) {
          synced_ = true;
          handler_->OnSynced();
        }
      } else {
        handler_->OnEvent(type == v1::WatchEvent::ADDED, object.resource_version, object, now);
      }
    });
    if (!read) return Malformed("cache_server WatchEvent");
    return std::nullopt;
  }

 private:
  WatchHandler* const handler_;
  const bool from_revision_;
  ObjectFacts facts_;
  bool synced_ = false;
};

// An etcd Watch stream's messages (etcdserverpb.WatchResponse), for a stream of one watch.
class EtcdWatchReader : public WatchReader {
 public:
  explicit EtcdWatchReader(WatchHandler* handler) : handler_(handler) {}

  std::optional<grpc::Status> Read(google::protobuf::io::CodedInputStream* in,
                                   int64_t now) override {
    bool read = ScanEtcdWatchResponse(
        in, &response_, &facts_, [&](bool created, int64_t revision, const ObjectFacts& object) {
          handler_->OnEvent(created, revision, object, now);
        });
    if (!read) return Malformed("etcd WatchResponse");
    if (response_.created && !synced_) {
      // etcd sends the created response before any event of the watch.
      synced_ = true;
      handler_->OnSynced();
    }
    if (response_.canceled) {
      // The server ended the watch but keeps the stream: end it, and report why.
      return grpc::Status(grpc::StatusCode::ABORTED,
                          absl::StrCat("etcd canceled the watch (compact_revision ",
                                       response_.compact_revision, "): ", response_.cancel_reason));
    }
    return std::nullopt;
  }

 private:
  WatchHandler* const handler_;
  EtcdResponseFacts response_;
  ObjectFacts facts_;
  bool synced_ = false;
};

// Why a watch ended from the client's side (its reader said so), when it did; set on the read
// chain, read when the stream is done.
class EndReason {
 public:
  void Set(grpc::Status status) {
    absl::MutexLock l(&mu_);
    reason_ = std::move(status);
  }
  // The reason, or else the stream's own status.
  grpc::Status Or(const grpc::Status& status) {
    absl::MutexLock l(&mu_);
    return reason_.has_value() ? *reason_ : status;
  }

 private:
  absl::Mutex mu_;
  std::optional<grpc::Status> reason_ ABSL_GUARDED_BY(mu_);
};

// Reads the message in `buffer`, just received through gRPC, with `reader`. When the watch must
// end, records why and cancels the call; returns whether to read on.
bool ReadMessage(grpc::ByteBuffer* buffer, WatchReader* reader, EndReason* end_reason,
                 grpc::ClientContext* ctx) {
  int64_t now = NowNanos();
  std::optional<grpc::Status> end =
      ScanBuffer(buffer, [&](auto* in) { return reader->Read(in, now); });
  buffer->Clear();
  if (!end.has_value()) return true;
  end_reason->Set(*std::move(end));
  ctx->TryCancel();
  return false;
}

// One Watch of cache_server through gRPC, read as raw bytes (see watch_wire.h): the call is made
// as the generated stub makes it (the same method, through gRPC's callback factory), but with
// grpc::ByteBuffer as the response type, so that gRPC hands over the message undecoded.
class StoreWatch : public WatchStream, public grpc::ClientReadReactor<grpc::ByteBuffer> {
 public:
  StoreWatch(WatchHandler* handler, bool from_revision)
      : handler_(handler), reader_(handler, from_revision) {}

  void Start(grpc::Channel* channel, const grpc::internal::RpcMethod& method,
             const v1::WatchRequest& request) {
    request_ = request;
    grpc::internal::ClientCallbackReaderFactory<grpc::ByteBuffer>::Create(channel, method, &ctx_,
                                                                          &request_, this);
    StartRead(&buffer_);
    StartCall();
  }
  void Cancel() override { ctx_.TryCancel(); }
  int64_t messages() const override { return messages_; }

  void OnReadInitialMetadataDone(bool ok) override {
    if (ok) reader_.OnHeaders();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    ++messages_;
    if (ReadMessage(&buffer_, &reader_, &end_reason_, &ctx_)) StartRead(&buffer_);
  }
  void OnDone(const grpc::Status& status) override { handler_->OnEnded(end_reason_.Or(status)); }

 private:
  WatchHandler* const handler_;
  grpc::ClientContext ctx_;
  v1::WatchRequest request_;
  EndReason end_reason_;
  // Owned by the read chain.
  StoreWatchReader reader_;
  grpc::ByteBuffer buffer_;
  int64_t messages_ = 0;
};

// One watch through an H2Client (see h2_client.h), of either server.
class H2Watch : public WatchStream, public H2Client::Call {
 public:
  H2Watch(WatchHandler* handler, std::unique_ptr<WatchReader> reader,
          std::shared_ptr<H2Client> client)
      : handler_(handler), reader_(std::move(reader)), client_(std::move(client)) {}

  // Calls `path` on the client's connection `slot` with `request`; `half_close`: the request
  // stream ends after it (a server-streaming call) or stays open (a bidirectional one).
  void Start(int slot, const std::string& path, const google::protobuf::Message& request,
             bool half_close) {
    id_ = client_->Start(slot, path, request.SerializeAsString(), half_close, this);
  }
  void Cancel() override { client_->Cancel(id_); }
  int64_t messages() const override { return messages_; }

  void OnHeaders() override { reader_->OnHeaders(); }
  bool OnMessage(const uint8_t* data, size_t size) override {
    int64_t now = NowNanos();
    ++messages_;
    google::protobuf::io::CodedInputStream in(data, static_cast<int>(size));
    end_ = reader_->Read(&in, now);
    return !end_.has_value();
  }
  void OnClosed(const grpc::Status& status) override {
    handler_->OnEnded(end_.has_value() ? *end_ : status);
  }

 private:
  WatchHandler* const handler_;
  // Owned by the client's loop thread once started.
  const std::unique_ptr<WatchReader> reader_;
  std::optional<grpc::Status> end_;
  int64_t messages_ = 0;
  // The client outlives its loops' callbacks: a watch is destroyed only after its OnEnded, by the
  // load's thread, never from a callback.
  const std::shared_ptr<H2Client> client_;
  uint64_t id_ = 0;
};

class StoreTarget : public Target {
 public:
  StoreTarget(std::vector<std::shared_ptr<grpc::Channel>> channels, bool watch_from_now,
              bool batch_events, std::shared_ptr<H2Client> watch_client)
      : watch_from_now_(watch_from_now),
        batch_events_(batch_events),
        watch_client_(std::move(watch_client)) {
    for (const auto& ch : channels) {
      stubs_.push_back(v1::Store::NewStub(ch));
      watch_methods_.emplace_back(kStoreWatchPath, grpc::internal::RpcMethod::SERVER_STREAMING, ch);
    }
    channels_ = std::move(channels);
  }
  Kind kind() const override { return Kind::kCacheServer; }
  int slots() const override { return static_cast<int>(stubs_.size()); }
  v1::Store::Stub* StoreStub(int slot) override { return stubs_[slot % stubs_.size()].get(); }

  void Create(int slot, v1::CreateRequest request, absl::Duration timeout, Done done) override {
    v1::Store::Stub* stub = StoreStub(slot);
    CallAsync<v1::Object>(
        std::move(request), timeout, [stub](auto... args) { stub->async()->Create(args...); },
        [done = std::move(done)](const grpc::Status& status, const v1::Object&) { done(status); });
  }

  void Get(int slot, const v1::ObjectMeta& key, absl::Duration timeout,
           std::function<void(const grpc::Status&, bool)> done) override {
    v1::GetRequest request;
    *request.mutable_resource() = BenchResource();
    request.set_cluster(key.cluster());
    request.set_namespace_(key.namespace_());
    request.set_name(key.name());
    v1::Store::Stub* stub = StoreStub(slot);
    CallAsync<v1::Object>(
        std::move(request), timeout, [stub](auto... args) { stub->async()->Get(args...); },
        [done = std::move(done)](const grpc::Status& status, const v1::Object&) {
          if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
            done(grpc::Status::OK, false);
          } else {
            done(status, status.ok());
          }
        });
  }

  void List(int slot, absl::Duration timeout,
            std::function<void(const grpc::Status&, int64_t)> done) override {
    v1::ListRequest request;
    *request.mutable_resource() = BenchResource();
    v1::Store::Stub* stub = StoreStub(slot);
    CallAsync<v1::ListResponse>(
        std::move(request), timeout, [stub](auto... args) { stub->async()->List(args...); },
        [done = std::move(done)](const grpc::Status& status, const v1::ListResponse& response) {
          done(status, response.items_size());
        });
  }

  std::unique_ptr<WatchStream> Watch(int slot, int resource, WatchHandler* handler) override {
    v1::WatchRequest request;
    *request.mutable_resource() = BenchResource(resource);
    request.set_batch_events(batch_events_);
    request.set_resource_version(watch_from_now_ ? CurrentRevision() : "");
    bool from_revision = !request.resource_version().empty();
    if (watch_client_ != nullptr) {
      auto w = std::make_unique<H2Watch>(
          handler, std::make_unique<StoreWatchReader>(handler, from_revision), watch_client_);
      w->Start(slot, kStoreWatchPath, request, /*half_close=*/true);
      return w;
    }
    auto w = std::make_unique<StoreWatch>(handler, from_revision);
    size_t i = static_cast<size_t>(slot) % channels_.size();
    w->Start(channels_[i].get(), watch_methods_[i], request);
    return w;
  }

 private:
  // The store's revision when the first watch opened (a List of one item); "" if it could not be
  // read (the watch then starts with the current state).
  std::string CurrentRevision() {
    absl::MutexLock l(&mu_);
    if (!revision_.empty()) return revision_;
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
    v1::ListRequest request;
    *request.mutable_resource() = BenchResource();
    request.set_limit(1);
    v1::ListResponse response;
    if (StoreStub(0)->List(&ctx, request, &response).ok()) revision_ = response.resource_version();
    return revision_;
  }

  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Store::Stub>> stubs_;
  // The Watch method of each channel, called with a raw-bytes reader (see StoreWatch).
  std::vector<grpc::internal::RpcMethod> watch_methods_;
  const bool watch_from_now_;
  const bool batch_events_;
  // Set: watches go through it instead of the channels.
  const std::shared_ptr<H2Client> watch_client_;
  absl::Mutex mu_;
  std::string revision_ ABSL_GUARDED_BY(mu_);
};

// ---- etcd ----

// The end of the range of keys that start with `prefix`, as etcd clients compute it.
std::string PrefixEnd(std::string prefix) {
  for (int i = static_cast<int>(prefix.size()) - 1; i >= 0; --i) {
    if (static_cast<unsigned char>(prefix[i]) < 0xff) {
      prefix[i] = static_cast<char>(prefix[i] + 1);
      prefix.resize(i + 1);
      return prefix;
    }
  }
  return std::string(1, '\0');
}

// One etcd Watch stream through gRPC, carrying one watch (a prefix from now), read as raw bytes
// (see watch_wire.h and StoreWatch). The create request is the only write; the read chain runs
// until the stream ends.
class EtcdWatch : public WatchStream,
                  public grpc::ClientBidiReactor<etcdserverpb::WatchRequest, grpc::ByteBuffer> {
 public:
  explicit EtcdWatch(WatchHandler* handler) : handler_(handler), reader_(handler) {}

  void Start(grpc::Channel* channel, const grpc::internal::RpcMethod& method,
             const etcdserverpb::WatchRequest& request) {
    request_ = request;
    grpc::internal::ClientCallbackReaderWriterFactory<etcdserverpb::WatchRequest,
                                                      grpc::ByteBuffer>::Create(channel, method,
                                                                                &ctx_, this);
    StartWrite(&request_);
    StartRead(&buffer_);
    StartCall();
  }
  void Cancel() override { ctx_.TryCancel(); }
  int64_t messages() const override { return messages_; }

  void OnWriteDone(bool /*ok*/) override {}

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    ++messages_;
    if (ReadMessage(&buffer_, &reader_, &end_reason_, &ctx_)) StartRead(&buffer_);
  }

  void OnDone(const grpc::Status& status) override { handler_->OnEnded(end_reason_.Or(status)); }

 private:
  WatchHandler* const handler_;
  grpc::ClientContext ctx_;
  etcdserverpb::WatchRequest request_;
  EndReason end_reason_;
  // Owned by the read chain.
  EtcdWatchReader reader_;
  grpc::ByteBuffer buffer_;
  int64_t messages_ = 0;
};

class EtcdTarget : public Target {
 public:
  EtcdTarget(std::vector<std::shared_ptr<grpc::Channel>> channels,
             std::shared_ptr<H2Client> watch_client)
      : watch_client_(std::move(watch_client)) {
    for (const auto& ch : channels) {
      kv_.push_back(etcdserverpb::KV::NewStub(ch));
      watch_methods_.emplace_back(kEtcdWatchPath, grpc::internal::RpcMethod::BIDI_STREAMING, ch);
    }
    channels_ = std::move(channels);
  }
  Kind kind() const override { return Kind::kEtcd; }
  int slots() const override { return static_cast<int>(kv_.size()); }

  void Create(int slot, v1::CreateRequest request, absl::Duration timeout, Done done) override {
    etcdserverpb::PutRequest put;
    put.set_key(EtcdKey(request.resource(), request.object().metadata()));
    put.set_value(request.object().SerializeAsString());
    etcdserverpb::KV::Stub* kv = Kv(slot);
    CallAsync<etcdserverpb::PutResponse>(
        std::move(put), timeout, [kv](auto... args) { kv->async()->Put(args...); },
        [done = std::move(done)](const grpc::Status& status, const etcdserverpb::PutResponse&) {
          done(status);
        });
  }

  void Get(int slot, const v1::ObjectMeta& key, absl::Duration timeout,
           std::function<void(const grpc::Status&, bool)> done) override {
    etcdserverpb::RangeRequest range;
    range.set_key(EtcdKey(BenchResource(), key));
    etcdserverpb::KV::Stub* kv = Kv(slot);
    CallAsync<etcdserverpb::RangeResponse>(
        std::move(range), timeout, [kv](auto... args) { kv->async()->Range(args...); },
        [done = std::move(done)](const grpc::Status& status,
                                 const etcdserverpb::RangeResponse& response) {
          bool found = false;
          if (status.ok() && response.kvs_size() == 1) {
            // Decode it, as a client of the Store API receives it decoded.
            v1::Object object;
            found = object.ParseFromString(response.kvs(0).value());
          }
          done(status, found);
        });
  }

  void List(int slot, absl::Duration timeout,
            std::function<void(const grpc::Status&, int64_t)> done) override {
    etcdserverpb::RangeRequest range;
    range.set_key(EtcdPrefix());
    range.set_range_end(PrefixEnd(EtcdPrefix()));
    etcdserverpb::KV::Stub* kv = Kv(slot);
    CallAsync<etcdserverpb::RangeResponse>(
        std::move(range), timeout, [kv](auto... args) { kv->async()->Range(args...); },
        [done = std::move(done)](const grpc::Status& status,
                                 const etcdserverpb::RangeResponse& response) {
          // Decode every item, as a client of the Store API receives them.
          int64_t items = 0;
          v1::Object object;
          for (const mvccpb::KeyValue& kv : response.kvs()) {
            if (object.ParseFromString(kv.value())) ++items;
          }
          done(status, items);
        });
  }

  std::unique_ptr<WatchStream> Watch(int slot, int resource, WatchHandler* handler) override {
    etcdserverpb::WatchRequest request;
    etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(EtcdPrefix(BenchResource(resource)));
    create->set_range_end(PrefixEnd(create->key()));
    if (watch_client_ != nullptr) {
      auto w = std::make_unique<H2Watch>(handler, std::make_unique<EtcdWatchReader>(handler),
                                         watch_client_);
      // The stream stays open: etcd ends a Watch stream whose client has half-closed it.
      w->Start(slot, kEtcdWatchPath, request, /*half_close=*/false);
      return w;
    }
    auto w = std::make_unique<EtcdWatch>(handler);
    size_t i = static_cast<size_t>(slot) % channels_.size();
    w->Start(channels_[i].get(), watch_methods_[i], request);
    return w;
  }

 private:
  etcdserverpb::KV::Stub* Kv(int slot) { return kv_[slot % kv_.size()].get(); }

  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> kv_;
  // The Watch method of each channel, called with a raw-bytes reader (see EtcdWatch).
  std::vector<grpc::internal::RpcMethod> watch_methods_;
  // Set: watches go through it instead of the channels.
  const std::shared_ptr<H2Client> watch_client_;
};

}  // namespace

std::string EtcdPrefix(const v1::GroupVersionResource& resource) {
  return absl::StrCat("/registry/", resource.group(), "/", resource.resource(), "/");
}

std::string EtcdPrefix() { return EtcdPrefix(BenchResource()); }

std::string EtcdKey(const v1::GroupVersionResource& resource, const v1::ObjectMeta& meta) {
  return absl::StrCat(EtcdPrefix(resource), meta.cluster(), "/", meta.namespace_(), "/",
                      meta.name());
}

std::unique_ptr<Target> MakeStoreTarget(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                        bool watch_from_now, bool batch_events,
                                        std::shared_ptr<H2Client> watch_client) {
  return std::make_unique<StoreTarget>(std::move(channels), watch_from_now, batch_events,
                                       std::move(watch_client));
}

std::unique_ptr<Target> MakeEtcdTarget(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                       std::shared_ptr<H2Client> watch_client) {
  return std::make_unique<EtcdTarget>(std::move(channels), std::move(watch_client));
}

}  // namespace shardcache::bench
