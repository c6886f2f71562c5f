#include "cache_server/store_service.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "cache_server/request_parser.h"
#include "cache_server/watch_call.h"
#include "cache_server/write_stream_reactor.h"
#include "common/grpc_status.h"

namespace shardcache {
namespace {

std::string CodeName(const absl::Status& s) { return absl::StatusCodeToString(s.code()); }

// A ListResponse's wire bytes from a page whose objects are shared, in one buffer of the exact
// size that gRPC sends as it is: each object serialized as it is (field `items`), then the other
// fields, which a parser merges into one message. This spares a copy of every object (List's)
// and of the whole answer.
grpc::ByteBuffer EncodeListResponse(const ObjectStore::ListPage& page) {
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  const uint32_t tag = WireFormatLite::MakeTag(v1::ListResponse::kItemsFieldNumber,
                                               WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  std::vector<uint32_t> sizes;
  sizes.reserve(page.items.size());
  size_t total = 0;
  for (const ObjectRef& obj : page.items) {
    sizes.push_back(static_cast<uint32_t>(obj->ByteSizeLong()));
    total += CodedOutputStream::VarintSize32(tag) + CodedOutputStream::VarintSize32(sizes.back()) +
             sizes.back();
  }
  const std::string header = page.header.SerializeAsString();
  total += header.size();
  auto* buffer = static_cast<uint8_t*>(std::malloc(std::max<size_t>(total, 1)));
  uint8_t* at = buffer;
  for (size_t i = 0; i < page.items.size(); ++i) {
    at = CodedOutputStream::WriteVarint32ToArray(tag, at);
    at = CodedOutputStream::WriteVarint32ToArray(sizes[i], at);
    at = page.items[i]->SerializeWithCachedSizesToArray(at);
  }
  std::memcpy(at, header.data(), header.size());
  grpc::Slice slice(buffer, total, std::free);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

// One unary call: answered once with Reply, and counted as in flight until gRPC is done with it
// (its answer sent), so that AwaitIdle does not return while an answer is on its way.
class StoreService::UnaryCall : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(StoreService* service, const char* method, grpc::ByteBuffer* response)
      : service_(service), method_(method), response_(response), start_(absl::Now()) {}

  // Serializes `response` (when `status` is OK and it is given) and finishes the call, recording
  // its metrics. Called once, from any thread.
  void Reply(absl::Status status, const google::protobuf::Message* response) {
    if (status.ok() && response != nullptr) {
      bool own = false;
      grpc::Status serialized = grpc::SerializationTraits<google::protobuf::Message>::Serialize(
          *response, response_, &own);
      if (!serialized.ok()) status = absl::InternalError(serialized.error_message());
    }
    Complete(status);
  }

  // Finishes the call with `bytes`, an encoded response, as Reply does.
  void ReplyBytes(grpc::ByteBuffer bytes) {
    response_->Swap(&bytes);
    Complete(absl::OkStatus());
  }

  // A store callback that answers the call with the object a write stored, or its error.
  ObjectStore::ObjectCallback ObjectReply() {
    return [this](absl::StatusOr<ObjectRef> r) { Reply(r.status(), r.ok() ? r->get() : nullptr); };
  }

  void OnDone() override {
    StoreService* service = service_;
    delete this;
    service->EndCall();
  }

 private:
  // Records the call's metrics and finishes it with `status`.
  void Complete(const absl::Status& status) {
    service_->metrics_->ObserveRequest(method_, CodeName(status),
                                       absl::ToDoubleSeconds(absl::Now() - start_));
    Finish(ToGrpcStatus(status));
  }

  StoreService* const service_;
  const char* const method_;
  grpc::ByteBuffer* const response_;
  const absl::Time start_;
};

StoreService::StoreService(Options options, ObjectStore* store, WatchCache* watch_cache,
                           StoreMetrics* metrics)
    : options_(options), store_(store), watch_cache_(watch_cache), metrics_(metrics) {
  for (int i = 0; i < options_.read_threads; ++i) readers_.emplace_back([this] { ReadLoop(); });
}

void StoreService::RunRead(std::function<void()> read) {
  if (readers_.empty()) {
    read();
    return;
  }
  absl::MutexLock l(&reads_mu_);
  reads_.push_back(std::move(read));
}

void StoreService::ReadLoop() {
  while (true) {
    std::function<void()> read;
    {
      absl::MutexLock l(&reads_mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reads_mu_) {
        return !reads_.empty() || reads_stopping_;
      };
      reads_mu_.Await(absl::Condition(&work));
      if (reads_.empty()) return;
      read = std::move(reads_.front());
      reads_.pop_front();
    }
    read();
  }
}

StoreService::UnaryCall* StoreService::Begin(const grpc::CallbackServerContext& ctx,
                                             const char* method, const grpc::ByteBuffer& raw,
                                             google::protobuf::Message* req,
                                             grpc::ByteBuffer* response, bool* admitted) {
  auto* call = new UnaryCall(this, method, response);
  bool draining;
  {
    absl::MutexLock l(&mu_);
    ++calls_;
    draining = shutting_down_;
  }
  // (gRPC calls OnDone only after the reactor is returned, so `call` stays valid here.)
  *admitted = false;
  if (draining) {
    call->Reply(absl::UnavailableError("server shutting down"), nullptr);
    return call;
  }
  absl::Status parsed = ParseRequest(raw, req);
  if (!parsed.ok()) {
    call->Reply(parsed, nullptr);
    return call;
  }
  if (absl::Status allowed = AuthorizeCall(options_.authorizer, ctx, method, req); !allowed.ok()) {
    call->Reply(allowed, nullptr);
    return call;
  }
  *admitted = true;
  return call;
}

void StoreService::EndCall() {
  absl::MutexLock l(&mu_);
  --calls_;
}

template <typename Request, typename Handler>
grpc::ServerUnaryReactor* StoreService::Serve(grpc::CallbackServerContext* ctx, const char* method,
                                              const grpc::ByteBuffer* raw, grpc::ByteBuffer* resp,
                                              Handler handle) {
  Request req;
  bool admitted;
  UnaryCall* call = Begin(*ctx, method, *raw, &req, resp, &admitted);
  if (admitted) handle(req, call);
  return call;
}

template <typename Request>
grpc::ServerUnaryReactor* StoreService::ServeWrite(
    grpc::CallbackServerContext* ctx, const char* method, const grpc::ByteBuffer* raw,
    grpc::ByteBuffer* resp,
    void (ObjectStore::*write)(const Request&, ObjectStore::ObjectCallback)) {
  return Serve<Request>(ctx, method, raw, resp, [this, write](const Request& req, UnaryCall* call) {
    (store_->*write)(req, call->ObjectReply());
  });
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* raw, grpc::ByteBuffer* resp) {
  ctx->AddInitialMetadata(kStoreIdMetadataKey, store_->store_id());
  return Serve<v1::GetRequest>(
      ctx, "Get", raw, resp, [this](const v1::GetRequest& req, UnaryCall* call) {
        RunRead([this, req, call] {
          auto result = store_->Get(req);
          call->Reply(result.status(), result.ok() ? result->get() : nullptr);
        });
      });
}

grpc::ServerUnaryReactor* StoreService::List(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* raw, grpc::ByteBuffer* resp) {
  return Serve<v1::ListRequest>(ctx, "List", raw, resp,
                                [this](const v1::ListRequest& req, UnaryCall* call) {
                                  RunRead([this, req, call] {
                                    auto page = store_->ListObjects(req);
                                    if (!page.ok()) {
                                      call->Reply(page.status(), nullptr);
                                      return;
                                    }
                                    call->ReplyBytes(EncodeListResponse(*page));
                                  });
                                });
}

StoreService::~StoreService() {
  {
    absl::MutexLock l(&reads_mu_);
    reads_stopping_ = true;
  }
  for (std::thread& t : readers_) t.join();
  StopWatches();
  // The last stream left (RemoveStream, on a gRPC thread) before the server was shut down; the
  // lock makes that visible here, before the members go.
  absl::MutexLock l(&mu_);
}

void StoreService::AddTo(grpc::ServerBuilder* builder) {
  builder->RegisterService(this);
  watch_calls_ = builder->AddCompletionQueue(/*is_frequently_polled=*/false);
  watch_cache_->StartCompletionQueues();
}

void StoreService::AcceptWatches() {
  AcceptWatch();
  watch_acceptor_ = std::thread([this] {
    // One call is requested at a time, and each accepted one requests the next. Once the server
    // is shut down the request in wait is given back (!ok), and no other is made: the queue then
    // holds nothing more.
    void* tag = nullptr;
    bool ok = false;
    while (watch_calls_->Next(&tag, &ok)) {
      WatchCache::Completion::FromTag(tag)->Complete(ok);
      if (!ok) return;
    }
  });
}

void StoreService::StopWatches() {
  if (watch_calls_ != nullptr) {
    // The queue is shut down only once the acceptor has left it: a request made after would
    // abort.
    if (watch_acceptor_.joinable()) watch_acceptor_.join();
    watch_calls_->Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (watch_calls_->Next(&tag, &ok)) WatchCache::Completion::FromTag(tag)->Complete(ok);
    watch_calls_.reset();
  }
  watch_cache_->ShutdownCompletionQueues();
}

void StoreService::AcceptWatch() {
  int dispatcher = watch_cache_->LeastLoadedDispatcher();
  auto* reactor = new WatchCall(watch_cache_, metrics_, options_.watch_queue_events,
                                store_->store_id(), dispatcher, [this](WatchCall* r) {
                                  AcceptWatch();
                                  StartWatch(r);
                                });
  RequestWatch(reactor->context(), reactor->request(), reactor->writer(),
               watch_cache_->completion_queue(dispatcher), watch_calls_.get(),
               reactor->accepted_tag());
}

void StoreService::StartWatch(WatchCall* reactor) {
  v1::WatchRequest req;
  absl::Status started = ParseRequest(*reactor->request(), &req);
  if (started.ok()) {
    started = AuthorizeCall(options_.authorizer, *reactor->context(), "Watch", &req);
  }
  if (started.ok()) {
    reactor->set_batch_events(req.batch_events());
    // The headers go out now, before the watcher is registered (no dispatcher sends to it yet),
    // so that a client learns the store's identity before any event.
    reactor->context()->AddInitialMetadata(kStoreIdMetadataKey, store_->store_id());
    reactor->SendInitialMetadata();
    started = store_->StartWatch(req, reactor);
  }
  if (!started.ok()) {
    reactor->Reject(ToGrpcStatus(started));
    return;
  }
  reactor->Begin();
}

grpc::ServerUnaryReactor* StoreService::Create(grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* raw,
                                               grpc::ByteBuffer* resp) {
  return ServeWrite(ctx, "Create", raw, resp, &ObjectStore::CreateAsync);
}

grpc::ServerUnaryReactor* StoreService::Update(grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* raw,
                                               grpc::ByteBuffer* resp) {
  return ServeWrite(ctx, "Update", raw, resp, &ObjectStore::UpdateAsync);
}

grpc::ServerUnaryReactor* StoreService::UpdateStatus(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* raw,
                                                     grpc::ByteBuffer* resp) {
  return ServeWrite(ctx, "UpdateStatus", raw, resp, &ObjectStore::UpdateStatusAsync);
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* raw,
                                               grpc::ByteBuffer* resp) {
  return Serve<v1::DeleteRequest>(
      ctx, "Delete", raw, resp, [this](const v1::DeleteRequest& req, UnaryCall* call) {
        store_->DeleteAsync(req, [call](absl::StatusOr<ObjectStore::DeleteResult> r) {
          v1::DeleteResponse out;
          if (r.ok()) {
            *out.mutable_object() = *r->object;
            out.set_deleted(r->deleted);
          }
          call->Reply(r.status(), &out);
        });
      });
}

grpc::ServerUnaryReactor* StoreService::ClaimEpoch(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* raw,
                                                   grpc::ByteBuffer* resp) {
  return Serve<v1::ClaimEpochRequest>(
      ctx, "ClaimEpoch", raw, resp, [this](const v1::ClaimEpochRequest& req, UnaryCall* call) {
        store_->ClaimEpochAsync(req, [call](absl::StatusOr<int64_t> r) {
          v1::ClaimEpochResponse out;
          if (r.ok()) out.set_epoch(*r);
          call->Reply(r.status(), &out);
        });
      });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StoreService::Write(
    grpc::CallbackServerContext* ctx) {
  std::optional<PeerIdentity> who;
  if (options_.authorizer != nullptr) who = options_.authorizer->Identify(*ctx);
  return new WriteStreamReactor(this, metrics_, std::move(who));
}

bool StoreService::AddStream(WriteStreamReactor* stream) {
  absl::MutexLock l(&mu_);
  if (shutting_down_) return false;
  streams_.insert(stream);
  return true;
}

void StoreService::RemoveStream(WriteStreamReactor* stream) {
  absl::MutexLock l(&mu_);
  streams_.erase(stream);
}

void StoreService::Shutdown() {
  // Drain is called under mu_: a stream's OnDone (RemoveStream) waits for it, so no stream is
  // deleted while it is being drained.
  absl::MutexLock l(&mu_);
  shutting_down_ = true;
  for (WriteStreamReactor* s : streams_) s->Drain();
}

bool StoreService::AwaitIdle(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ == 0 && streams_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void StoreService::Apply(v1::WriteRequest* request, const std::optional<PeerIdentity>& who,
                         std::function<void(v1::WriteResponse)> done) {
  const v1::WriteRequest& req = *request;
  struct Answer {
    int64_t id;
    const char* method;
    absl::Time start;
    StoreMetrics* metrics;
    std::function<void(v1::WriteResponse)> done;
    void operator()(const absl::Status& status, const ObjectRef& object, bool deleted) const {
      v1::WriteResponse answer;
      answer.set_id(id);
      SetWriteAnswerStatus(status, &answer);
      if (object != nullptr) *answer.mutable_object() = *object;
      answer.set_deleted(deleted);
      metrics->ObserveRequest(method, CodeName(status), absl::ToDoubleSeconds(absl::Now() - start));
      done(std::move(answer));
    }
  };
  Answer answer{req.id(), "Write", absl::Now(), metrics_, std::move(done)};
  auto on_object = [](Answer a) {
    return [a = std::move(a)](absl::StatusOr<ObjectRef> r) {
      a(r.status(), r.ok() ? *r : nullptr, false);
    };
  };
  if (options_.authorizer != nullptr) {
    if (absl::Status allowed = options_.authorizer->CheckWrite(who, request); !allowed.ok()) {
      answer(allowed, nullptr, false);
      return;
    }
  }
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
