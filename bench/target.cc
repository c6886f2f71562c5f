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
#include "etcd/rpc.grpc.pb.h"

namespace shardcache::bench {
namespace {

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
bool ScanBuffer(grpc::ByteBuffer* buffer, Scan scan) {
  size_t length = buffer->Length();
  grpc::ProtoBufferReader reader(buffer);
  google::protobuf::io::CodedInputStream in(&reader);
  google::protobuf::io::CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
  bool ok = scan(&in);
  in.PopLimit(limit);
  return ok;
}

// The status of a stream whose message could not be read.
grpc::Status Malformed(const char* what) {
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      absl::StrCat("store_bench could not read a ", what, " message"));
}

// One Watch of cache_server, read as raw bytes (see watch_wire.h): the call is made as the
// generated stub makes it (the same method, through gRPC's callback factory), but with
// grpc::ByteBuffer as the response type, so that gRPC hands over the message undecoded.
class StoreWatch : public WatchStream, public grpc::ClientReadReactor<grpc::ByteBuffer> {
 public:
  explicit StoreWatch(WatchHandler* handler) : handler_(handler) {}

  // `from_revision` empty: the current state first, synced at the initial-events-end bookmark;
  // else every change after that revision, synced once the server has sent its headers (it
  // sends them as it takes the watch; every change after the revision comes, from its history if
  // need be).
  void Start(grpc::Channel* channel, const grpc::internal::RpcMethod& method,
             const v1::GroupVersionResource& resource, const std::string& from_revision,
             bool batch_events) {
    *request_.mutable_resource() = resource;
    request_.set_batch_events(batch_events);
    request_.set_resource_version(from_revision);
    from_revision_ = !from_revision.empty();
    grpc::internal::ClientCallbackReaderFactory<grpc::ByteBuffer>::Create(channel, method, &ctx_,
                                                                          &request_, this);
    StartRead(&buffer_);
    StartCall();
  }
  void Cancel() override { ctx_.TryCancel(); }
  int64_t messages() const override { return messages_; }

  void OnReadInitialMetadataDone(bool ok) override {
    if (ok && from_revision_) handler_->OnSynced();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    int64_t now = NowNanos();
    ++messages_;
    bool read = ScanBuffer(&buffer_, [&](google::protobuf::io::CodedInputStream* in) {
      return ScanStoreWatchEvent(in, &facts_, [&](int type, const ObjectFacts& object) {
        if (type == v1::WatchEvent::BOOKMARK) {
          if (!synced_ && object.initial_events_end) {
            synced_ = true;
            handler_->OnSynced();
          }
        } else {
          handler_->OnEvent(type == v1::WatchEvent::ADDED, object.resource_version, object, now);
        }
      });
    });
    buffer_.Clear();
    if (!read) {
      malformed_.store(true);
      ctx_.TryCancel();
      return;
    }
    StartRead(&buffer_);
  }
  void OnDone(const grpc::Status& status) override {
    handler_->OnEnded(malformed_.load() ? Malformed("cache_server WatchEvent") : status);
  }

 private:
  WatchHandler* const handler_;
  grpc::ClientContext ctx_;
  v1::WatchRequest request_;
  bool from_revision_ = false;
  std::atomic<bool> malformed_{false};
  // Owned by the read chain.
  grpc::ByteBuffer buffer_;
  int64_t messages_ = 0;
  ObjectFacts facts_;
  bool synced_ = false;
};

class StoreTarget : public Target {
 public:
  StoreTarget(std::vector<std::shared_ptr<grpc::Channel>> channels, bool watch_from_now,
              bool batch_events)
      : watch_from_now_(watch_from_now), batch_events_(batch_events) {
    for (const auto& ch : channels) {
      stubs_.push_back(v1::Store::NewStub(ch));
      watch_methods_.emplace_back("/shardcache.v1.Store/Watch",
                                  grpc::internal::RpcMethod::SERVER_STREAMING, ch);
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
    auto w = std::make_unique<StoreWatch>(handler);
    size_t i = static_cast<size_t>(slot) % channels_.size();
    w->Start(channels_[i].get(), watch_methods_[i], BenchResource(resource),
             watch_from_now_ ? CurrentRevision() : "", batch_events_);
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

// One Watch stream carrying one watch (a prefix from now), read as raw bytes (see
// watch_wire.h and StoreWatch). The create request is the only write; the read chain runs until the
// stream ends.
class EtcdWatch : public WatchStream,
                  public grpc::ClientBidiReactor<etcdserverpb::WatchRequest, grpc::ByteBuffer> {
 public:
  explicit EtcdWatch(WatchHandler* handler) : handler_(handler) {}

  void Start(grpc::Channel* channel, const grpc::internal::RpcMethod& method,
             const std::string& prefix) {
    etcdserverpb::WatchCreateRequest* create = request_.mutable_create_request();
    create->set_key(prefix);
    create->set_range_end(PrefixEnd(prefix));
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
    int64_t now = NowNanos();
    ++messages_;
    bool read = ScanBuffer(&buffer_, [&](google::protobuf::io::CodedInputStream* in) {
      return ScanEtcdWatchResponse(in, &response_, &facts_,
                                   [&](bool created, int64_t revision, const ObjectFacts& object) {
                                     handler_->OnEvent(created, revision, object, now);
                                   });
    });
    buffer_.Clear();
    if (!read) {
      SetEndReason(Malformed("etcd WatchResponse"));
      ctx_.TryCancel();
      return;
    }
    if (response_.created && !synced_) {
      // etcd sends the created response before any event of the watch.
      synced_ = true;
      handler_->OnSynced();
    }
    if (response_.canceled) {
      // The server ended the watch but keeps the stream: end it, and report why.
      SetEndReason(
          grpc::Status(grpc::StatusCode::ABORTED,
                       absl::StrCat("etcd canceled the watch (compact_revision ",
                                    response_.compact_revision, "): ", response_.cancel_reason)));
      ctx_.TryCancel();
      return;
    }
    StartRead(&buffer_);
  }

  void OnDone(const grpc::Status& status) override {
    std::optional<grpc::Status> reason;
    {
      absl::MutexLock l(&mu_);
      reason = end_reason_;
    }
    handler_->OnEnded(reason.has_value() ? *reason : status);
  }

 private:
  void SetEndReason(grpc::Status status) {
    absl::MutexLock l(&mu_);
    end_reason_ = std::move(status);
  }

  WatchHandler* const handler_;
  grpc::ClientContext ctx_;
  etcdserverpb::WatchRequest request_;
  // Owned by the read chain.
  grpc::ByteBuffer buffer_;
  int64_t messages_ = 0;
  EtcdResponseFacts response_;
  ObjectFacts facts_;
  bool synced_ = false;
  absl::Mutex mu_;
  std::optional<grpc::Status> end_reason_ ABSL_GUARDED_BY(mu_);
};

class EtcdTarget : public Target {
 public:
  explicit EtcdTarget(std::vector<std::shared_ptr<grpc::Channel>> channels) {
    for (const auto& ch : channels) {
      kv_.push_back(etcdserverpb::KV::NewStub(ch));
      watch_methods_.emplace_back("/etcdserverpb.Watch/Watch",
                                  grpc::internal::RpcMethod::BIDI_STREAMING, ch);
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
    auto w = std::make_unique<EtcdWatch>(handler);
    size_t i = static_cast<size_t>(slot) % channels_.size();
    w->Start(channels_[i].get(), watch_methods_[i], EtcdPrefix(BenchResource(resource)));
    return w;
  }

 private:
  etcdserverpb::KV::Stub* Kv(int slot) { return kv_[slot % kv_.size()].get(); }

  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> kv_;
  // The Watch method of each channel, called with a raw-bytes reader (see EtcdWatch).
  std::vector<grpc::internal::RpcMethod> watch_methods_;
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
                                        bool watch_from_now, bool batch_events) {
  return std::make_unique<StoreTarget>(std::move(channels), watch_from_now, batch_events);
}

std::unique_ptr<Target> MakeEtcdTarget(std::vector<std::shared_ptr<grpc::Channel>> channels) {
  return std::make_unique<EtcdTarget>(std::move(channels));
}

}  // namespace shardcache::bench
