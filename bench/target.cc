#include "bench/target.h"

#include <atomic>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_util.h"
#include "etcd/rpc.grpc.pb.h"

namespace shardcache::bench {
namespace {

constexpr char kInitialEventsEnd[] = "k8s.io/initial-events-end";

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

class StoreWatch : public WatchStream, public grpc::ClientReadReactor<v1::WatchEvent> {
 public:
  explicit StoreWatch(WatchHandler* handler) : handler_(handler) {}

  // `from_revision` empty: the current state first, synced at the initial-events-end bookmark;
  // else every change after that revision, synced once the server has sent its headers (it
  // sends them as it takes the watch; every change after the revision comes, from its history if
  // need be).
  void Start(v1::Store::Stub* stub, absl::Time deadline, const std::string& from_revision,
             bool batch_events) {
    *request_.mutable_resource() = BenchResource();
    request_.set_batch_events(batch_events);
    request_.set_resource_version(from_revision);
    from_revision_ = !from_revision.empty();
    ctx_.set_deadline(absl::ToChronoTime(deadline));
    stub->async()->Watch(&ctx_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  void Cancel() override { ctx_.TryCancel(); }

  void OnReadInitialMetadataDone(bool ok) override {
    if (ok && from_revision_) handler_->OnSynced();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    if (event_.events_size() > 0) {
      for (const v1::WatchEvent& e : event_.events()) Handle(e);
    } else {
      Handle(event_);
    }
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override { handler_->OnEnded(status); }

 private:
  // One event, whether it came alone or in a batch.
  void Handle(const v1::WatchEvent& event) {
    const v1::Object& object = event.object();
    if (event.type() == v1::WatchEvent::BOOKMARK) {
      auto it = object.metadata().annotations().find(kInitialEventsEnd);
      if (!synced_ && it != object.metadata().annotations().end() && it->second == "true") {
        synced_ = true;
        handler_->OnSynced();
      }
    } else {
      int64_t rv = 0;
      if (!absl::SimpleAtoi(object.metadata().resource_version(), &rv)) rv = -1;
      handler_->OnEvent(event.type() == v1::WatchEvent::ADDED, &object, rv);
    }
  }

  WatchHandler* const handler_;
  grpc::ClientContext ctx_;
  v1::WatchRequest request_;
  v1::WatchEvent event_;
  bool from_revision_ = false;
  bool synced_ = false;  // owned by the read chain
};

class StoreTarget : public Target {
 public:
  StoreTarget(std::vector<std::shared_ptr<grpc::Channel>> channels, bool watch_from_now,
              bool batch_events)
      : watch_from_now_(watch_from_now), batch_events_(batch_events) {
    for (const auto& ch : channels) stubs_.push_back(v1::Store::NewStub(ch));
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

  std::unique_ptr<WatchStream> Watch(int slot, absl::Time deadline,
                                     WatchHandler* handler) override {
    auto w = std::make_unique<StoreWatch>(handler);
    w->Start(StoreStub(slot), deadline, watch_from_now_ ? CurrentRevision() : "", batch_events_);
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

  std::vector<std::unique_ptr<v1::Store::Stub>> stubs_;
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

// One Watch stream carrying one watch (a prefix from now). The create request is the only
// write; the read chain runs until the stream ends.
class EtcdWatch
    : public WatchStream,
      public grpc::ClientBidiReactor<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse> {
 public:
  explicit EtcdWatch(WatchHandler* handler) : handler_(handler) {}

  void Start(etcdserverpb::Watch::Stub* stub, absl::Time deadline) {
    etcdserverpb::WatchCreateRequest* create = request_.mutable_create_request();
    create->set_key(EtcdPrefix());
    create->set_range_end(PrefixEnd(EtcdPrefix()));
    ctx_.set_deadline(absl::ToChronoTime(deadline));
    stub->async()->Watch(&ctx_, this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }
  void Cancel() override { ctx_.TryCancel(); }

  void OnWriteDone(bool /*ok*/) override {}

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    if (response_.created() && !synced_) {
      synced_ = true;
      handler_->OnSynced();
    }
    for (const mvccpb::Event& e : response_.events()) {
      bool parsed = object_.ParseFromString(e.kv().value());
      handler_->OnEvent(e.type() == mvccpb::Event::PUT && e.kv().version() == 1,
                        parsed ? &object_ : nullptr, e.kv().mod_revision());
    }
    if (response_.canceled()) {
      // The server ended the watch but keeps the stream: end it, and report why.
      {
        absl::MutexLock l(&mu_);
        canceled_reason_ =
            absl::StrCat("etcd canceled the watch (compact_revision ", response_.compact_revision(),
                         "): ", response_.cancel_reason());
      }
      ctx_.TryCancel();
      return;
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    std::string reason;
    {
      absl::MutexLock l(&mu_);
      reason = canceled_reason_;
    }
    if (!reason.empty()) {
      handler_->OnEnded(grpc::Status(grpc::StatusCode::ABORTED, reason));
    } else {
      handler_->OnEnded(status);
    }
  }

 private:
  WatchHandler* const handler_;
  grpc::ClientContext ctx_;
  etcdserverpb::WatchRequest request_;
  // Owned by the read chain.
  etcdserverpb::WatchResponse response_;
  v1::Object object_;
  bool synced_ = false;
  absl::Mutex mu_;
  std::string canceled_reason_ ABSL_GUARDED_BY(mu_);
};

class EtcdTarget : public Target {
 public:
  explicit EtcdTarget(std::vector<std::shared_ptr<grpc::Channel>> channels) {
    for (const auto& ch : channels) {
      kv_.push_back(etcdserverpb::KV::NewStub(ch));
      watch_.push_back(etcdserverpb::Watch::NewStub(ch));
    }
  }
  Kind kind() const override { return Kind::kEtcd; }
  int slots() const override { return static_cast<int>(kv_.size()); }

  void Create(int slot, v1::CreateRequest request, absl::Duration timeout, Done done) override {
    etcdserverpb::PutRequest put;
    put.set_key(EtcdKey(request.object().metadata()));
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
    range.set_key(EtcdKey(key));
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

  std::unique_ptr<WatchStream> Watch(int slot, absl::Time deadline,
                                     WatchHandler* handler) override {
    auto w = std::make_unique<EtcdWatch>(handler);
    w->Start(watch_[slot % watch_.size()].get(), deadline);
    return w;
  }

 private:
  etcdserverpb::KV::Stub* Kv(int slot) { return kv_[slot % kv_.size()].get(); }

  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> kv_;
  std::vector<std::unique_ptr<etcdserverpb::Watch::Stub>> watch_;
};

}  // namespace

std::string EtcdPrefix() {
  v1::GroupVersionResource r = BenchResource();
  return absl::StrCat("/registry/", r.group(), "/", r.resource(), "/");
}

std::string EtcdKey(const v1::ObjectMeta& meta) {
  return absl::StrCat(EtcdPrefix(), meta.cluster(), "/", meta.namespace_(), "/", meta.name());
}

std::unique_ptr<Target> MakeStoreTarget(std::vector<std::shared_ptr<grpc::Channel>> channels,
                                        bool watch_from_now, bool batch_events) {
  return std::make_unique<StoreTarget>(std::move(channels), watch_from_now, batch_events);
}

std::unique_ptr<Target> MakeEtcdTarget(std::vector<std::shared_ptr<grpc::Channel>> channels) {
  return std::make_unique<EtcdTarget>(std::move(channels));
}

}  // namespace shardcache::bench
