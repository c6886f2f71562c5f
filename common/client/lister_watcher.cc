#include "common/client/lister_watcher.h"

#include <grpcpp/grpcpp.h>

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

namespace {

// The same code and payloads (machine-readable details), with what was asked.
absl::Status WithContext(const std::string& what, const absl::Status& s) {
  return WithMessage(s, absl::StrCat(what, ": ", s.message()));
}

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
      calls_(std::make_shared<CallSet>()),
      watch_counters_(std::make_shared<WatchStreamCounters>()) {}

StoreListerWatcher::~StoreListerWatcher() { Shutdown(); }

absl::StatusOr<v1::ListResponse> StoreListerWatcher::List(int64_t limit,
                                                          const std::string& continue_token) {
  v1::ListRequest req;
  SetResourceAndFilters(&req);
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

std::unique_ptr<AsyncWatchEventStream> StoreListerWatcher::Watch(
    const std::string& resource_version) {
  v1::WatchRequest req;
  SetResourceAndFilters(&req);
  req.set_resource_version(resource_version);
  // Bookmarks keep an idle watch's resourceVersion recent (a resumed watch then stays inside the
  // history window) and tell the Reflector the stream is alive (its watch_idle_timeout).
  req.set_allow_bookmarks(true);
  WatchStream::Options options;
  if (options_.watch_timeout > absl::ZeroDuration()) {
    // Spread over up to twice the timeout, so that many watchers do not reconnect at once.
    absl::BitGen rng;
    options.deadline = absl::Now() + options_.watch_timeout * absl::Uniform(rng, 1.0, 2.0);
  }
  options.description = Describe();
  options.calls = calls_;
  options.counters = watch_counters_;
  return std::make_unique<AsyncWatchStream>(stub_, std::move(req), std::move(options));
}

void StoreListerWatcher::Shutdown() { calls_->Shutdown(); }

std::string StoreListerWatcher::Describe() const {
  std::string filters = filters_.ToString();
  return filters.empty() ? ResourceName(resource_)
                         : absl::StrCat(ResourceName(resource_), " ", filters);
}

}  // namespace shardcache
