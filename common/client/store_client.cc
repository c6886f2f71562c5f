#include "common/client/store_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/endpoints.h"
#include "common/grpc_status.h"
#include "common/resources.h"
#include "common/status_macros.h"

namespace shardcache {

// ---------------------------------------------------------------------------------------------
// StoreClient

absl::StatusOr<grpc::ChannelArguments> StoreChannelArguments(const KeepaliveOptions& keepalive) {
  if (keepalive.time < absl::Milliseconds(1) || keepalive.time > absl::Hours(24)) {
    return absl::InvalidArgumentError("keepalive.time: must be between 1ms and 24h");
  }
  if (keepalive.timeout < absl::Milliseconds(1) || keepalive.timeout > absl::Hours(24)) {
    return absl::InvalidArgumentError("keepalive.timeout: must be between 1ms and 24h");
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(keepalive.time)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(keepalive.timeout)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Keep pinging while the connection carries no data (an idle channel, a quiet watch).
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Reconnect at least every second while the server is gone. gRPC's default reconnect backoff
  // grows to 120 s, so after a long outage a client would notice the server's return late (and a
  // replicator's backlog would wait for it).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateStoreChannel(
    const std::string& target, const KeepaliveOptions& keepalive,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  absl::StatusOr<grpc::ChannelArguments> args = StoreChannelArguments(keepalive);
  if (!args.ok()) return args.status();
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  std::vector<std::string> endpoints = absl::StrSplit(target, ',');
  if (endpoints.size() == 1) return grpc::CreateCustomChannel(target, credentials, *args);
  // Replicas of one store: the channel keeps to one that answers (pick_first) and moves to
  // another when it fails; their resourceVersions are the same, so watches resume there.
  ASSIGN_OR_RETURN(ChannelTarget replicas, MakeChannelTarget(endpoints, "store endpoint"));
  if (!replicas.authority.empty()) {
    args->SetString(GRPC_ARG_DEFAULT_AUTHORITY, replicas.authority);
  }
  return grpc::CreateCustomChannel(replicas.uri, credentials, *args);
}

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Create(
    std::shared_ptr<grpc::ChannelInterface> channel, Options options) {
  if (channel == nullptr) return absl::InvalidArgumentError("StoreClient: channel is null");
  ASSIGN_OR_RETURN(
      std::unique_ptr<StoreClient> client,
      Create(std::shared_ptr<v1::Store::StubInterface>(v1::Store::NewStub(channel)), options));
  client->channel_ = std::dynamic_pointer_cast<grpc::Channel>(channel);
  return client;
}

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::Create(
    std::shared_ptr<v1::Store::StubInterface> stub, Options options) {
  if (stub == nullptr) return absl::InvalidArgumentError("StoreClient: stub is null");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("StoreClient: timeout must be positive");
  }
  if (options.attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("StoreClient: attempt_timeout must be positive");
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError("StoreClient: max_attempts must be at least 1");
  }
  if (options.list_page_size < 1) {
    return absl::InvalidArgumentError("StoreClient: list_page_size must be at least 1");
  }
  if (options.clock == nullptr) return absl::InvalidArgumentError("StoreClient: clock is null");
  absl::StatusOr<Backoff> backoff = Backoff::Create(options.backoff, options.clock);
  if (!backoff.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("StoreClient: ", backoff.status().message()));
  }
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(stub), options));
}

StoreClient::StoreClient(std::shared_ptr<v1::Store::StubInterface> stub, Options options)
    : stub_(std::move(stub)), options_(options), watches_(std::make_shared<CallSet>()) {}

StoreClient::~StoreClient() { watches_->Shutdown(); }

absl::Status StoreClient::Call(const char* method, Retry retry,
                               const std::function<grpc::Status(grpc::ClientContext*)>& attempt) {
  const Clock* clock = options_.clock;
  const absl::Time call_deadline = clock->Now() + options_.timeout;
  // Validated in Create, so this cannot fail.
  Backoff backoff = *Backoff::Create(options_.backoff, clock);
  bool maybe_applied = false;  // an earlier attempt of this write ended UNAVAILABLE
  for (int n = 1;; ++n) {
    absl::Time attempt_deadline = call_deadline;
    if (retry == Retry::kRead) {
      attempt_deadline = std::min(call_deadline, clock->Now() + options_.attempt_timeout);
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(attempt_deadline));
    absl::Status status = FromGrpcStatus(attempt(&context));
    if (status.ok()) return status;

    bool retryable = false;
    switch (retry) {
      case Retry::kRead:
        retryable = absl::IsUnavailable(status) ||
                    (absl::IsDeadlineExceeded(status) && attempt_deadline < call_deadline);
        break;
      case Retry::kWrite:
        retryable = absl::IsUnavailable(status);
        break;
      case Retry::kNever:
        break;
    }
    if (!retryable) {
      if (maybe_applied &&
          (absl::IsAlreadyExists(status) || absl::IsAborted(status) || absl::IsNotFound(status))) {
        return WithMessage(
            status,
            absl::StrCat(status.message(), " (an earlier attempt of this ", method,
                         " ended UNAVAILABLE and may have been applied: read the object again)"));
      }
      return status;
    }
    if (retry == Retry::kWrite) maybe_applied = true;
    absl::Duration delay = backoff.Next();
    if (n >= options_.max_attempts || clock->Now() + delay >= call_deadline) {
      if (n == 1) return status;
      return WithMessage(status,
                         absl::StrCat(status.message(), " (gave up after ", n, " attempts)"));
    }
    PauseBeforeRetry(delay);
  }
}

void StoreClient::PauseBeforeRetry(absl::Duration delay) {
  const absl::Time until = options_.clock->Now() + delay;
  if (channel_ == nullptr) {
    absl::SleepFor(delay);
    return;
  }
  grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
  if (state == GRPC_CHANNEL_READY) {
    // Connected, yet UNAVAILABLE: the server said so (e.g. it is shutting down). Back off.
    absl::SleepFor(delay);
    return;
  }
  // gRPC's channel keeps its own reconnect backoff (1 s growing to 2 min), during which calls
  // fail at once with the last connect error; and while no call waits on the channel, a
  // connection attempt's outcome is noticed only by gRPC's backup poller (every 5 s). So: start
  // a connection attempt now and watch the channel (which polls it) until it is ready (retry at
  // once) or the delay is over.
  grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
  while (state != GRPC_CHANNEL_READY) {
    if (!channel_->WaitForStateChange(state, absl::ToChronoTime(until))) return;
    state = channel_->GetState(/*try_to_connect=*/true);
  }
}

bool StoreClient::WaitForConnected(absl::Duration timeout) {
  if (channel_ == nullptr) return false;
  grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
  return channel_->WaitForConnected(absl::ToChronoTime(options_.clock->Now() + timeout));
}

absl::StatusOr<v1::Object> StoreClient::Get(const v1::GetRequest& request) {
  v1::Object out;
  absl::Status status = Call("Get", Retry::kRead, [&](grpc::ClientContext* context) {
    out.Clear();
    return stub_->Get(context, request, &out);
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<v1::ListResponse> StoreClient::List(const v1::ListRequest& request) {
  v1::ListResponse out;
  absl::Status status = Call("List", Retry::kRead, [&](grpc::ClientContext* context) {
    out.Clear();
    return stub_->List(context, request, &out);
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<StoreClient::ListResult> StoreClient::ListAll(const v1::ListRequest& request) {
  v1::ListRequest page_request = request;
  if (page_request.limit() == 0) page_request.set_limit(options_.list_page_size);
  ListResult result;
  bool first = true;
  while (true) {
    absl::StatusOr<v1::ListResponse> page = List(page_request);
    if (!page.ok()) return page.status();
    if (first) {
      result.resource_version = page->resource_version();
      first = false;
    } else if (page->resource_version() != result.resource_version) {
      return absl::InternalError(absl::StrCat(
          "List: the server answered a continued page at revision ", page->resource_version(),
          " for a list at revision ", result.resource_version));
    }
    if (!page->continue_token().empty() &&
        page->continue_token() == page_request.continue_token()) {
      return absl::InternalError("List: the server answered the same continue token again");
    }
    result.items.reserve(result.items.size() + page->items_size());
    for (v1::Object& item : *page->mutable_items()) result.items.push_back(std::move(item));
    if (page->continue_token().empty()) return result;
    page_request.set_continue_token(page->continue_token());
  }
}

absl::StatusOr<v1::Object> StoreClient::Create(const v1::CreateRequest& request) {
  v1::Object out;
  absl::Status status = Call("Create", Retry::kWrite, [&](grpc::ClientContext* context) {
    out.Clear();
    return stub_->Create(context, request, &out);
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<v1::Object> StoreClient::Update(const v1::UpdateRequest& request) {
  Retry retry =
      request.object().metadata().resource_version().empty() ? Retry::kNever : Retry::kWrite;
  v1::Object out;
  absl::Status status = Call("Update", retry, [&](grpc::ClientContext* context) {
    out.Clear();
    return stub_->Update(context, request, &out);
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<v1::Object> StoreClient::UpdateStatus(const v1::UpdateRequest& request) {
  Retry retry =
      request.object().metadata().resource_version().empty() ? Retry::kNever : Retry::kWrite;
  v1::Object out;
  absl::Status status = Call("UpdateStatus", retry, [&](grpc::ClientContext* context) {
    out.Clear();
    return stub_->UpdateStatus(context, request, &out);
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<v1::DeleteResponse> StoreClient::Delete(const v1::DeleteRequest& request) {
  Retry retry = request.preconditions().resource_version().empty() ? Retry::kNever : Retry::kWrite;
  v1::DeleteResponse out;
  absl::Status status = Call("Delete", retry, [&](grpc::ClientContext* context) {
    out.Clear();
    return stub_->Delete(context, request, &out);
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<v1::ClaimEpochResponse> StoreClient::ClaimEpoch(
    const v1::ClaimEpochRequest& request) {
  // Idempotent (the same claim again succeeds): as safe to retry as a read.
  v1::ClaimEpochResponse out;
  absl::Status status = Call("ClaimEpoch", Retry::kRead, [&](grpc::ClientContext* context) {
    out.Clear();
    return stub_->ClaimEpoch(context, request, &out);
  });
  if (!status.ok()) return status;
  return out;
}

std::unique_ptr<WatchStream> StoreClient::OpenWatch(const v1::WatchRequest& request,
                                                    absl::Duration timeout) {
  absl::Time deadline = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                            : options_.clock->Now() + timeout;
  WatchStream::Options options;
  options.deadline = deadline;
  options.description = GvrString(request.resource());
  options.calls = watches_;
  return std::make_unique<WatchStream>(stub_, request, std::move(options));
}

}  // namespace shardcache
