#include "cache_server/store_service.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <deque>

#include "absl/time/clock.h"
#include "cache_server/watch_reactor.h"
#include "common/grpc_status.h"

namespace shardcache {
namespace {

// Writes of one Write stream that may be outstanding (applied or answered but not yet sent)
// before the stream stops reading.
constexpr size_t kMaxOutstandingWrites = 256;

std::string CodeName(const absl::Status& s) { return absl::StatusCodeToString(s.code()); }

// Finishes a unary call with `status` and records its metrics.
void Finish(grpc::ServerUnaryReactor* reactor, StoreMetrics* metrics, const char* method,
            absl::Time start, const absl::Status& status) {
  metrics->ObserveRequest(method, CodeName(status), absl::ToDoubleSeconds(absl::Now() - start));
  reactor->Finish(ToGrpcStatus(status));
}

// A store callback that fills `resp` and finishes the unary call through `reactor`.
// (CallbackServerContext::DefaultReactor constructs the reactor anew on each call: take it once.)
ObjectStore::ObjectCallback FinishWithObject(grpc::ServerUnaryReactor* reactor,
                                             StoreMetrics* metrics, const char* method,
                                             v1::Object* resp) {
  return [reactor, metrics, method, resp, start = absl::Now()](absl::StatusOr<ObjectPtr> result) {
    if (result.ok()) *resp = **result;
    Finish(reactor, metrics, method, start, result.status());
  };
}

}  // namespace

// The server side of one Write stream: reads a write, hands it to the store, and sends the
// answers in the order of the writes as they complete. At most one read and one write in flight;
// reading pauses while kMaxOutstandingWrites writes are outstanding. Finish is called only when
// no store callback is outstanding, so the reactor outlives every callback that refers to it.
class WriteStreamReactor : public grpc::ServerBidiReactor<v1::WriteRequest, v1::WriteResponse> {
 public:
  explicit WriteStreamReactor(StoreService* service) : service_(service) {
    if (!service_->AddStream(this)) {
      absl::MutexLock l(&mu_);
      draining_ = true;
      MaybeWriteOrFinishLocked();
      return;
    }
    StartRead(&request_);
  }

  // The server is shutting down: answer what was taken, then end with UNAVAILABLE.
  void Drain() {
    absl::MutexLock l(&mu_);
    draining_ = true;
    MaybeWriteOrFinishLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client has sent its last write
      absl::MutexLock l(&mu_);
      reads_done_ = true;
      MaybeWriteOrFinishLocked();
      return;
    }
    Slot* slot;
    bool draining;
    {
      absl::MutexLock l(&mu_);
      slots_.emplace_back();
      slot = &slots_.back();  // deque: stays valid while later slots are added
      ++in_store_;
      draining = draining_;
    }
    auto answer_slot = [this, slot](v1::WriteResponse answer) {
      absl::MutexLock l(&mu_);
      slot->answer = std::move(answer);
      slot->ready = true;
      --in_store_;
      MaybeWriteOrFinishLocked();
    };
    if (draining) {
      v1::WriteResponse refused;
      refused.set_id(request_.id());
      refused.set_code(static_cast<int>(grpc::StatusCode::UNAVAILABLE));
      refused.set_message("server shutting down: the write was not applied");
      answer_slot(std::move(refused));
      return;  // reads no more
    }
    service_->Apply(request_, std::move(answer_slot));
    absl::MutexLock l(&mu_);
    if (draining_) return;
    if (slots_.size() < kMaxOutstandingWrites && !cancelled_) {
      StartRead(&request_);
    } else {
      read_paused_ = true;
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;
    if (read_paused_ && !cancelled_ && !draining_ && slots_.size() < kMaxOutstandingWrites / 2) {
      read_paused_ = false;
      StartRead(&request_);
    }
    MaybeWriteOrFinishLocked();
  }

  void OnCancel() override {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    MaybeWriteOrFinishLocked();
  }

  void OnDone() override {
    service_->RemoveStream(this);
    delete this;
  }

 private:
  struct Slot {
    bool ready = false;
    v1::WriteResponse answer;
  };

  void MaybeWriteOrFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (cancelled_) {
      if (in_store_ > 0) return;  // finish once the last callback is in
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
      return;
    }
    if (!slots_.empty() && slots_.front().ready) {
      out_ = std::move(slots_.front().answer);
      slots_.pop_front();
      writing_ = true;
      StartWrite(&out_);
      return;
    }
    if (draining_ && slots_.empty() && in_store_ == 0) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down"));
      return;
    }
    if (reads_done_ && slots_.empty()) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  StoreService* const service_;
  v1::WriteRequest request_;  // only touched between StartRead and the end of OnReadDone
  absl::Mutex mu_;
  std::deque<Slot> slots_ ABSL_GUARDED_BY(mu_);
  int in_store_ ABSL_GUARDED_BY(mu_) = 0;
  v1::WriteResponse out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

StoreService::StoreService(Options options, ObjectStore* store, WatchCache* watch_cache,
                           StoreMetrics* metrics)
    : options_(options), store_(store), watch_cache_(watch_cache), metrics_(metrics) {}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* ctx,
                                            const v1::GetRequest* req, v1::Object* resp) {
  absl::Time start = absl::Now();
  auto result = store_->Get(*req);
  if (result.ok()) *resp = **result;
  ctx->AddInitialMetadata(kStoreIdMetadataKey, store_->store_id());
  auto* reactor = ctx->DefaultReactor();
  Finish(reactor, metrics_, "Get", start, result.status());
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::List(grpc::CallbackServerContext* ctx,
                                             const v1::ListRequest* req, v1::ListResponse* resp) {
  absl::Time start = absl::Now();
  auto result = store_->List(*req);
  if (result.ok()) resp->Swap(&*result);
  auto* reactor = ctx->DefaultReactor();
  Finish(reactor, metrics_, "List", start, result.status());
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StoreService::Watch(grpc::CallbackServerContext* ctx,
                                                                const grpc::ByteBuffer* raw) {
  auto* reactor =
      new WatchReactor(watch_cache_, metrics_, options_.watch_queue_events, store_->store_id());
  v1::WatchRequest req;
  grpc::ByteBuffer copy(*raw);
  if (!grpc::SerializationTraits<v1::WatchRequest>::Deserialize(&copy, &req).ok()) {
    reactor->Reject(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "the request is not a shardcache.v1.WatchRequest"));
    return reactor;
  }
  // The headers go out now, before the watcher is registered (nothing else touches the reactor
  // yet), so that a client learns the store's identity before any event.
  ctx->AddInitialMetadata(kStoreIdMetadataKey, store_->store_id());
  reactor->StartSendInitialMetadata();
  absl::Status started = store_->StartWatch(req, reactor);
  if (!started.ok()) {
    reactor->Reject(ToGrpcStatus(started));
    return reactor;
  }
  reactor->Begin();
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Create(grpc::CallbackServerContext* ctx,
                                               const v1::CreateRequest* req, v1::Object* resp) {
  auto* reactor = ctx->DefaultReactor();
  store_->CreateAsync(*req, FinishWithObject(reactor, metrics_, "Create", resp));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Update(grpc::CallbackServerContext* ctx,
                                               const v1::UpdateRequest* req, v1::Object* resp) {
  auto* reactor = ctx->DefaultReactor();
  store_->UpdateAsync(*req, FinishWithObject(reactor, metrics_, "Update", resp));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::UpdateStatus(grpc::CallbackServerContext* ctx,
                                                     const v1::UpdateRequest* req,
                                                     v1::Object* resp) {
  auto* reactor = ctx->DefaultReactor();
  store_->UpdateStatusAsync(*req, FinishWithObject(reactor, metrics_, "UpdateStatus", resp));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* ctx,
                                               const v1::DeleteRequest* req,
                                               v1::DeleteResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  store_->DeleteAsync(*req, [reactor, metrics = metrics_, resp,
                             start = absl::Now()](absl::StatusOr<ObjectStore::DeleteResult> r) {
    if (r.ok()) {
      *resp->mutable_object() = *r->object;
      resp->set_deleted(r->deleted);
    }
    Finish(reactor, metrics, "Delete", start, r.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::ClaimEpoch(grpc::CallbackServerContext* ctx,
                                                   const v1::ClaimEpochRequest* req,
                                                   v1::ClaimEpochResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  store_->ClaimEpochAsync(
      *req, [reactor, metrics = metrics_, resp, start = absl::Now()](absl::StatusOr<int64_t> r) {
        if (r.ok()) resp->set_epoch(*r);
        Finish(reactor, metrics, "ClaimEpoch", start, r.status());
      });
  return reactor;
}

bool StoreService::AddStream(WriteStreamReactor* stream) {
  absl::MutexLock l(&streams_mu_);
  if (shutting_down_) return false;
  streams_.insert(stream);
  return true;
}

void StoreService::RemoveStream(WriteStreamReactor* stream) {
  absl::MutexLock l(&streams_mu_);
  streams_.erase(stream);
}

void StoreService::Shutdown() {
  absl::MutexLock l(&streams_mu_);
  shutting_down_ = true;
  for (WriteStreamReactor* s : streams_) s->Drain();
}

grpc::ServerBidiReactor<v1::WriteRequest, v1::WriteResponse>* StoreService::Write(
    grpc::CallbackServerContext*) {
  return new WriteStreamReactor(this);
}

void StoreService::Apply(const v1::WriteRequest& req, std::function<void(v1::WriteResponse)> done) {
  struct Answer {
    int64_t id;
    const char* method;
    absl::Time start;
    StoreMetrics* metrics;
    std::function<void(v1::WriteResponse)> done;
    void operator()(const absl::Status& status, const ObjectPtr& object, bool deleted) const {
      v1::WriteResponse answer;
      answer.set_id(id);
      answer.set_code(static_cast<int>(status.code()));
      answer.set_message(std::string(status.message()));
      if (object != nullptr) *answer.mutable_object() = *object;
      answer.set_deleted(deleted);
      metrics->ObserveRequest(method, CodeName(status), absl::ToDoubleSeconds(absl::Now() - start));
      done(std::move(answer));
    }
  };
  Answer answer{req.id(), "Write", absl::Now(), metrics_, std::move(done)};
  auto on_object = [](Answer a) {
    return [a = std::move(a)](absl::StatusOr<ObjectPtr> r) {
      a(r.status(), r.ok() ? *r : nullptr, false);
    };
  };
  switch (req.operation_case()) {
    case v1::WriteRequest::kCreate:
      answer.method = "Write.create";
      store_->CreateAsync(req.create(), on_object(std::move(answer)));
      return;
    case v1::WriteRequest::kUpdate:
      answer.method = "Write.update";
      store_->UpdateAsync(req.update(), on_object(std::move(answer)));
      return;
    case v1::WriteRequest::kUpdateStatus:
      answer.method = "Write.update_status";
      store_->UpdateStatusAsync(req.update_status(), on_object(std::move(answer)));
      return;
    case v1::WriteRequest::kUpsert:
      answer.method = "Write.upsert";
      store_->UpsertAsync(req.upsert(), on_object(std::move(answer)));
      return;
    case v1::WriteRequest::kDelete:
      answer.method = "Write.delete";
      store_->DeleteAsync(req.delete_(),
                          [a = std::move(answer)](absl::StatusOr<ObjectStore::DeleteResult> r) {
                            a(r.status(), r.ok() ? r->object : nullptr, r.ok() && r->deleted);
                          });
      return;
    case v1::WriteRequest::OPERATION_NOT_SET:
      answer(absl::InvalidArgumentError(
                 "operation: Required value: one of create, update, update_status, delete, upsert"),
             nullptr, false);
      return;
  }
}

}  // namespace shardcache
