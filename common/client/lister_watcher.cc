#include "common/client/lister_watcher.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/label_selector.h"
#include "common/validation.h"

namespace shardcache {

// The client contexts of the calls in flight, so that Shutdown can cancel them all.
class StoreListerWatcher::Calls {
 public:
  // False once Shutdown has begun: the caller must not start its call.
  bool Register(grpc::ClientContext* ctx) {
    absl::MutexLock l(&mu_);
    if (shut_down_) return false;
    active_.insert(ctx);
    return true;
  }
  void Unregister(grpc::ClientContext* ctx) {
    absl::MutexLock l(&mu_);
    active_.erase(ctx);
  }
  void Shutdown() {
    absl::MutexLock l(&mu_);
    shut_down_ = true;
    for (grpc::ClientContext* ctx : active_) ctx->TryCancel();  // thread-safe, never blocks
  }

 private:
  absl::Mutex mu_;
  std::set<grpc::ClientContext*> active_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

namespace {

// The response header of a Watch that names the store (see the Store service's Watch).
constexpr char kStoreIdHeader[] = "shardcache-store-id";

absl::Status WithContext(const std::string& what, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// A Watch call that starts at the first Next(), so that Cancel() works from the moment the
// stream exists (the blocking call set-up included).
class StoreWatchEventStream : public WatchEventStream {
 public:
  StoreWatchEventStream(std::shared_ptr<v1::Store::StubInterface> stub,
                        std::shared_ptr<StoreListerWatcher::Calls> calls, v1::WatchRequest request,
                        absl::Duration timeout, std::string description)
      : stub_(std::move(stub)),
        calls_(std::move(calls)),
        request_(std::move(request)),
        description_(std::move(description)) {
    if (timeout > absl::ZeroDuration()) {
      absl::BitGen rng;
      ctx_.set_deadline(absl::ToChronoTime(absl::Now() + timeout * absl::Uniform(rng, 1.0, 2.0)));
    }
  }

  ~StoreWatchEventStream() override {
    if (reader_ != nullptr && !finished_) {
      ctx_.TryCancel();
      v1::WatchEvent ignored;
      while (!done_ && reader_->Read(&ignored)) {
      }
      (void)reader_->Finish();
    }
    if (registered_) calls_->Unregister(&ctx_);
  }

  bool Next(v1::WatchEvent* event) override {
    if (!Open()) return false;
    if (reader_->Read(event)) return true;
    done_ = true;
    return false;
  }

  std::string StoreId() override {
    if (headers_read_ || !Open()) return store_id_;
    headers_read_ = true;
    reader_->WaitForInitialMetadata();
    const std::multimap<grpc::string_ref, grpc::string_ref>& headers =
        ctx_.GetServerInitialMetadata();
    auto it = headers.find(kStoreIdHeader);
    if (it != headers.end()) store_id_ = std::string(it->second.data(), it->second.size());
    return store_id_;
  }

  void Cancel() override { ctx_.TryCancel(); }

  // Starts the call on first use. False when the stream has ended or cannot start.
  bool Open() {
    if (done_) return false;
    if (reader_ == nullptr) {
      if (!calls_->Register(&ctx_)) {
        done_ = true;
        status_ = absl::CancelledError(
            absl::StrCat("watch ", description_, ": the ListerWatcher was shut down"));
        return false;
      }
      registered_ = true;
      reader_ = stub_->Watch(&ctx_, request_);
    }
    return true;
  }

  absl::Status Finish() override {
    if (finished_ || reader_ == nullptr) return status_;
    finished_ = true;
    status_ = WithContext(
        absl::StrCat("watch ", description_, " from resourceVersion ", request_.resource_version()),
        FromGrpcStatus(reader_->Finish()));
    return status_;
  }

 private:
  const std::shared_ptr<v1::Store::StubInterface> stub_;
  const std::shared_ptr<StoreListerWatcher::Calls> calls_;
  const v1::WatchRequest request_;
  const std::string description_;
  grpc::ClientContext ctx_;  // TryCancel is thread-safe; the rest is the reader's
  std::unique_ptr<grpc::ClientReaderInterface<v1::WatchEvent>> reader_;
  bool registered_ = false;
  bool headers_read_ = false;
  std::string store_id_;
  bool done_ = false;
  bool finished_ = false;
  absl::Status status_ = absl::OkStatus();
};

}  // namespace

std::string ListWatchFilters::ToString() const {
  std::vector<std::string> parts;
  if (!shard.empty()) parts.push_back(absl::StrCat("shard=", shard));
  if (!cluster.empty()) parts.push_back(absl::StrCat("cluster=", cluster));
  if (!namespace_.empty()) parts.push_back(absl::StrCat("namespace=", namespace_));
  if (!label_selector.empty()) parts.push_back(absl::StrCat("labelSelector=", label_selector));
  return absl::StrJoin(parts, " ");
}

std::string StoreListerWatcher::ResourceName(const v1::GroupVersionResource& gvr) {
  if (gvr.group().empty()) return absl::StrCat(gvr.resource(), "/", gvr.version());
  return absl::StrCat(gvr.resource(), ".", gvr.group(), "/", gvr.version());
}

absl::StatusOr<std::unique_ptr<StoreListerWatcher>> StoreListerWatcher::Create(
    std::shared_ptr<v1::Store::StubInterface> stub, v1::GroupVersionResource resource,
    ListWatchFilters filters, Options options) {
  if (stub == nullptr) return absl::InvalidArgumentError("stub: Required value");
  if (absl::Status s = ValidateGroupVersionResource("resource", resource); !s.ok()) return s;
  if (absl::StatusOr<LabelSelector> sel = LabelSelector::Parse(filters.label_selector); !sel.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("labelSelector: ", sel.status().message()));
  }
  if (options.list_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("options.list_timeout: must be positive");
  }
  if (options.watch_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("options.watch_timeout: must not be negative");
  }
  return std::unique_ptr<StoreListerWatcher>(
      new StoreListerWatcher(std::move(stub), std::move(resource), std::move(filters), options));
}

StoreListerWatcher::StoreListerWatcher(std::shared_ptr<v1::Store::StubInterface> stub,
                                       v1::GroupVersionResource resource, ListWatchFilters filters,
                                       Options options)
    : stub_(std::move(stub)),
      resource_(std::move(resource)),
      filters_(std::move(filters)),
      options_(options),
      calls_(std::make_shared<Calls>()) {}

StoreListerWatcher::~StoreListerWatcher() { Shutdown(); }

absl::StatusOr<v1::ListResponse> StoreListerWatcher::List(int64_t limit,
                                                          const std::string& continue_token) {
  v1::ListRequest req;
  *req.mutable_resource() = resource_;
  req.set_shard(filters_.shard);
  req.set_cluster(filters_.cluster);
  req.set_namespace_(filters_.namespace_);
  req.set_label_selector(filters_.label_selector);
  req.set_limit(limit);
  req.set_continue_token(continue_token);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.list_timeout));
  if (!calls_->Register(&ctx)) {
    return absl::CancelledError(
        absl::StrCat("list ", Describe(), ": the ListerWatcher was shut down"));
  }
  v1::ListResponse resp;
  grpc::Status status = stub_->List(&ctx, req, &resp);
  calls_->Unregister(&ctx);
  if (!status.ok()) {
    return WithContext(absl::StrCat("list ", Describe()), FromGrpcStatus(status));
  }
  return resp;
}

std::unique_ptr<WatchEventStream> StoreListerWatcher::Watch(const std::string& resource_version) {
  v1::WatchRequest req;
  *req.mutable_resource() = resource_;
  req.set_shard(filters_.shard);
  req.set_cluster(filters_.cluster);
  req.set_namespace_(filters_.namespace_);
  req.set_label_selector(filters_.label_selector);
  req.set_resource_version(resource_version);
  return std::make_unique<StoreWatchEventStream>(stub_, calls_, std::move(req),
                                                 options_.watch_timeout, Describe());
}

void StoreListerWatcher::Shutdown() { calls_->Shutdown(); }

std::string StoreListerWatcher::Describe() const {
  std::string filters = filters_.ToString();
  return filters.empty() ? ResourceName(resource_)
                         : absl::StrCat(ResourceName(resource_), " ", filters);
}

}  // namespace shardcache
