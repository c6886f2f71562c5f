#include "cache_server/store_service.h"

#include <deque>

#include "absl/time/clock.h"
#include "cache_server/watch_reactor.h"
#include "common/grpc_status.h"

namespace shardcache {
namespace {

// Answers that may wait to be sent before a Write stream stops reading.
constexpr size_t kMaxQueuedAnswers = 256;

std::string CodeName(const absl::Status& s) { return absl::StatusCodeToString(s.code()); }

// Finishes a unary call with `status` and records its metrics.
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, StoreMetrics* metrics,
                                 const char* method, absl::Time start, const absl::Status& status) {
  metrics->ObserveRequest(method, CodeName(status), absl::ToDoubleSeconds(absl::Now() - start));
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Copies a store result into a unary response and returns its status.
absl::Status Fill(const absl::StatusOr<ObjectPtr>& result, v1::Object* resp) {
  if (result.ok()) *resp = **result;
  return result.status();
}

// The server side of one Write stream: reads a write, applies it, queues its answer; at most one
// read and one write in flight; reading pauses while kMaxQueuedAnswers answers wait.
class WriteStreamReactor : public grpc::ServerBidiReactor<v1::WriteRequest, v1::WriteResponse> {
 public:
  explicit WriteStreamReactor(StoreService* service) : service_(service) { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client has sent its last write
      absl::MutexLock l(&mu_);
      reads_done_ = true;
      MaybeWriteOrFinishLocked();
      return;
    }
    v1::WriteResponse answer = service_->Apply(request_);
    absl::MutexLock l(&mu_);
    answers_.push_back(std::move(answer));
    if (answers_.size() < kMaxQueuedAnswers) {
      StartRead(&request_);
    } else {
      read_paused_ = true;
    }
    MaybeWriteOrFinishLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!ok) {
      if (!finished_) {
        finished_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke"));
      }
      return;
    }
    if (read_paused_ && answers_.size() < kMaxQueuedAnswers / 2) {
      read_paused_ = false;
      StartRead(&request_);
    }
    MaybeWriteOrFinishLocked();
  }

  void OnCancel() override {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    if (!writing_ && !finished_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
    }
  }

  void OnDone() override { delete this; }

 private:
  void MaybeWriteOrFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (cancelled_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
      return;
    }
    if (!answers_.empty()) {
      out_ = std::move(answers_.front());
      answers_.pop_front();
      writing_ = true;
      StartWrite(&out_);
      return;
    }
    if (reads_done_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  StoreService* const service_;
  v1::WriteRequest request_;  // only touched between StartRead and OnReadDone
  absl::Mutex mu_;
  std::deque<v1::WriteResponse> answers_ ABSL_GUARDED_BY(mu_);
  v1::WriteResponse out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

StoreService::StoreService(Options options, ObjectStore* store, WatchCache* watch_cache,
                           StoreMetrics* metrics)
    : options_(options), store_(store), watch_cache_(watch_cache), metrics_(metrics) {}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* ctx,
                                            const v1::GetRequest* req, v1::Object* resp) {
  absl::Time start = absl::Now();
  return Finish(ctx, metrics_, "Get", start, Fill(store_->Get(*req), resp));
}

grpc::ServerUnaryReactor* StoreService::List(grpc::CallbackServerContext* ctx,
                                             const v1::ListRequest* req, v1::ListResponse* resp) {
  absl::Time start = absl::Now();
  auto result = store_->List(*req);
  if (result.ok()) resp->Swap(&*result);
  return Finish(ctx, metrics_, "List", start, result.status());
}

grpc::ServerWriteReactor<v1::WatchEvent>* StoreService::Watch(grpc::CallbackServerContext*,
                                                              const v1::WatchRequest* req) {
  auto* reactor = new WatchReactor(watch_cache_, metrics_, options_.watch_queue_events);
  absl::Status started = store_->StartWatch(*req, reactor);
  if (!started.ok()) {
    reactor->Reject(ToGrpcStatus(started));
    return reactor;
  }
  reactor->Begin();
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Create(grpc::CallbackServerContext* ctx,
                                               const v1::CreateRequest* req, v1::Object* resp) {
  absl::Time start = absl::Now();
  return Finish(ctx, metrics_, "Create", start, Fill(store_->Create(*req), resp));
}

grpc::ServerUnaryReactor* StoreService::Update(grpc::CallbackServerContext* ctx,
                                               const v1::UpdateRequest* req, v1::Object* resp) {
  absl::Time start = absl::Now();
  return Finish(ctx, metrics_, "Update", start, Fill(store_->Update(*req), resp));
}

grpc::ServerUnaryReactor* StoreService::UpdateStatus(grpc::CallbackServerContext* ctx,
                                                     const v1::UpdateRequest* req,
                                                     v1::Object* resp) {
  absl::Time start = absl::Now();
  return Finish(ctx, metrics_, "UpdateStatus", start, Fill(store_->UpdateStatus(*req), resp));
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* ctx,
                                               const v1::DeleteRequest* req,
                                               v1::DeleteResponse* resp) {
  absl::Time start = absl::Now();
  auto result = store_->Delete(*req);
  if (result.ok()) {
    *resp->mutable_object() = *result->object;
    resp->set_deleted(result->deleted);
  }
  return Finish(ctx, metrics_, "Delete", start, result.status());
}

grpc::ServerBidiReactor<v1::WriteRequest, v1::WriteResponse>* StoreService::Write(
    grpc::CallbackServerContext*) {
  return new WriteStreamReactor(this);
}

v1::WriteResponse StoreService::Apply(const v1::WriteRequest& req) {
  absl::Time start = absl::Now();
  v1::WriteResponse answer;
  answer.set_id(req.id());
  absl::Status status;
  const char* method = "Write";
  auto object_result = [&](const absl::StatusOr<ObjectPtr>& r) {
    status = r.status();
    if (r.ok()) *answer.mutable_object() = **r;
  };
  switch (req.operation_case()) {
    case v1::WriteRequest::kCreate:
      method = "Write.create";
      object_result(store_->Create(req.create()));
      break;
    case v1::WriteRequest::kUpdate:
      method = "Write.update";
      object_result(store_->Update(req.update()));
      break;
    case v1::WriteRequest::kUpdateStatus:
      method = "Write.update_status";
      object_result(store_->UpdateStatus(req.update_status()));
      break;
    case v1::WriteRequest::kUpsert:
      method = "Write.upsert";
      object_result(store_->Upsert(req.upsert()));
      break;
    case v1::WriteRequest::kDelete: {
      method = "Write.delete";
      auto r = store_->Delete(req.delete_());
      status = r.status();
      if (r.ok()) {
        *answer.mutable_object() = *r->object;
        answer.set_deleted(r->deleted);
      }
      break;
    }
    case v1::WriteRequest::OPERATION_NOT_SET:
      status = absl::InvalidArgumentError(
          "operation: Required value: one of create, update, update_status, delete, upsert");
      break;
  }
  answer.set_code(static_cast<int>(status.code()));
  answer.set_message(std::string(status.message()));
  metrics_->ObserveRequest(method, CodeName(status), absl::ToDoubleSeconds(absl::Now() - start));
  return answer;
}

}  // namespace shardcache
