#include "cache_server/etcd_client.h"

#include <arpa/inet.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "common/endpoints.h"
#include "common/grpc_status.h"
#include "common/tls.h"

namespace shardcache {
namespace {

// etcd's metadata that asks for a member with a leader (clientv3.WithRequireLeader).
constexpr char kRequireLeaderKey[] = "hasleader";
constexpr char kRequireLeaderValue[] = "true";
// What etcd answers a Compact of a revision that is already compacted.
constexpr char kCompactedMessage[] = "required revision has been compacted";

// ---- Errors ----

// An etcd call's failure as an absl::Status: etcd's code and "etcd: " + its message; a call that
// no member answered in time is UNAVAILABLE, as etcd's clients report it.
absl::Status EtcdError(const grpc::Status& status, absl::Duration timeout) {
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::UnavailableError(absl::StrCat("etcd: no member answered within ",
                                               absl::FormatDuration(timeout), " (",
                                               status.error_message(), ")"));
  }
  absl::Status s = FromGrpcStatus(status);
  return WithMessage(s, absl::StrCat("etcd: ", s.message()));
}

// Whether a Compact failed only because its revision was compacted already.
bool IsAlreadyCompacted(const absl::Status& status) {
  return status.code() == absl::StatusCode::kOutOfRange &&
         absl::StrContains(status.message(), kCompactedMessage);
}

// ---- Watch ----

// A watch's state. The watch is a chain: a stream; when it breaks, an alarm (the backoff); then
// the next stream; and so on until the watch ends. At most one link is alive at a time, so the
// handler's calls, made from a stream's reads, are serialized by the chain itself. `running_` is
// true until the chain has ended, which Stop waits for. The chain's gRPC callbacks hold no
// reference to this object, and touch it no more once they have cleared `running_` (EndChain).
//
// So this object, its stub and so the channel are released on the caller's thread (Stop, then
// the EtcdWatch's destructor), never on one of gRPC's callback threads: with gRPC 1.51, the last
// reference to a channel dropped on one of those crashes the process (docs/grpc-1.51.md). The
// one exception is a Stop called from the handler, a misuse that cannot wait: the chain then
// holds this object (keepalive_) until it ends.
class WatchCore : public std::enable_shared_from_this<WatchCore> {
 public:
  WatchCore(std::shared_ptr<grpc::Channel> channel, std::string key, std::string range_end,
            int64_t start_revision, EtcdClient::WatchHandler* handler)
      : stub_(etcdserverpb::Watch::NewStub(std::move(channel))),
        key_(std::move(key)),
        range_end_(std::move(range_end)),
        handler_(handler),
        revision_(start_revision - 1),
        resume_after_(start_revision - 1),
        backoff_(*Backoff::Create({.initial = absl::Milliseconds(100),
                                   .factor = 2.0,
                                   .max = absl::Seconds(2),
                                   .jitter = 0.2,
                                   .reset_after = absl::Seconds(10)},
                                  RealClock::Get())) {}

  // Opens the first stream. Call once.
  void Start() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock l(&mu_);
      running_ = true;
    }
    OpenStream();
  }

  void RequestProgress() ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t revision() const { return revision_.load(std::memory_order_acquire); }

 private:
  class Stream;

  // Opens a stream from resume_after_ + 1, or ends the chain if the watch was stopped.
  void OpenStream() ABSL_LOCKS_EXCLUDED(mu_);
  // Reactions of the current stream.
  void OnReadDone(Stream* stream, bool ok) ABSL_LOCKS_EXCLUDED(mu_);
  void OnWriteDone(Stream* stream, bool ok) ABSL_LOCKS_EXCLUDED(mu_);
  // After the stream was deleted.
  void OnStreamDone(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // The backoff's end, or its cancellation by Stop.
  void OnAlarm() ABSL_LOCKS_EXCLUDED(mu_);
  // The chain has ended: clears running_. The callbacks' last touch of this object.
  void EndChain() ABSL_LOCKS_EXCLUDED(mu_);

  // Calls `call` (a handler method) unless the watch was stopped, with handler_thread_ set so that
  // Stop knows when it is called from a handler.
  template <typename Call>
  void CallHandler(Call call) ABSL_LOCKS_EXCLUDED(mu_);

  // What the watch is and where it is, for messages.
  std::string DescribeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static constexpr int64_t kNoWatchId = INT64_MIN;

  // Constant after construction.
  const std::unique_ptr<etcdserverpb::Watch::Stub> stub_;
  const std::string key_;
  const std::string range_end_;
  EtcdClient::WatchHandler* const handler_;

  // Written before each OnEvents (by one thread at a time); read by revision() from any thread.
  std::atomic<int64_t> revision_;

  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // the chain has not ended
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Stop was called
  bool ended_ ABSL_GUARDED_BY(mu_) = false;    // OnEnd was called (or is being called)
  // The thread that runs a handler method now, if any.
  std::thread::id handler_thread_ ABSL_GUARDED_BY(mu_);
  // The revision that the next stream starts after.
  int64_t resume_after_ ABSL_GUARDED_BY(mu_);
  Backoff backoff_ ABSL_GUARDED_BY(mu_);
  // The current stream, from its start until its OnDone, and the state of its operations:
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  // No read will be started on it any more (see RequestProgress for why this matters).
  bool reads_ended_ ABSL_GUARDED_BY(mu_) = true;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;           // a write is in flight
  bool progress_wanted_ ABSL_GUARDED_BY(mu_) = false;   // a progress request waits to be written
  int64_t watch_id_ ABSL_GUARDED_BY(mu_) = kNoWatchId;  // etcd's id for it (from "created")
  // The backoff's alarm while it is set, until its callback has run.
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
  // This object, after a Stop from the handler, until the chain ends.
  std::shared_ptr<WatchCore> keepalive_ ABSL_GUARDED_BY(mu_);
};

// One Watch call: the reactor, with the messages it writes and reads. Its OnDone deletes it
// before telling the core (its ClientContext holds a reference to the channel: the core's stub
// holds another until the caller lets go of the watch).
class WatchCore::Stream final
    : public grpc::ClientBidiReactor<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse> {
 public:
  Stream(WatchCore* core, etcdserverpb::WatchRequest create_request)
      : create(std::move(create_request)), core_(core) {
    progress.mutable_progress_request();
    context.AddMetadata(kRequireLeaderKey, kRequireLeaderValue);
  }

  void OnReadDone(bool ok) override { core_->OnReadDone(this, ok); }
  void OnWriteDone(bool ok) override { core_->OnWriteDone(this, ok); }
  void OnDone(const grpc::Status& status) override {
    WatchCore* core = core_;
    const grpc::Status copy = status;
    delete this;
    core->OnStreamDone(copy);
  }

  // Provides its own synchronization.
  grpc::ClientContext context;
  // The messages it writes: constant (gRPC reads them while their writes are in flight).
  const etcdserverpb::WatchRequest create;
  etcdserverpb::WatchRequest progress;
  // Written by gRPC while a read is in flight; then read by the reaction.
  etcdserverpb::WatchResponse response;

 private:
  WatchCore* const core_;
};

void WatchCore::EndChain() {
  std::shared_ptr<WatchCore> keepalive;  // declared first: released after mu_
  absl::MutexLock l(&mu_);
  running_ = false;
  keepalive = std::move(keepalive_);
}

void WatchCore::OpenStream() {
  etcdserverpb::WatchRequest request;
  bool stopped = false;
  {
    absl::MutexLock l(&mu_);
    stopped = stopped_;
    etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(key_);
    create->set_range_end(range_end_);
    create->set_start_revision(resume_after_ + 1);
    create->set_progress_notify(true);
  }
  if (stopped) {
    EndChain();
    return;
  }
  auto* stream = new Stream(this, std::move(request));
  stub_->async()->Watch(&stream->context, stream);
  // Queued until StartCall.
  stream->StartWrite(&stream->create);
  stream->StartRead(&stream->response);
  bool cancel = false;
  {
    absl::MutexLock l(&mu_);
    stream_ = stream;
    reads_ended_ = false;
    writing_ = true;
    progress_wanted_ = false;
    watch_id_ = kNoWatchId;
    cancel = stopped_;
  }
  // Stopped meanwhile: the call ends at once, and its OnDone ends the chain. (Before StartCall
  // no reaction can run, so the stream is still there.)
  if (cancel) stream->context.TryCancel();
  stream->StartCall();
}

template <typename Call>
void WatchCore::CallHandler(Call call) {
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    handler_thread_ = std::this_thread::get_id();
  }
  call();
  absl::MutexLock l(&mu_);
  handler_thread_ = std::thread::id();
}

void WatchCore::OnReadDone(Stream* stream, bool ok) {
  if (!ok) {  // the stream is over; OnDone follows
    absl::MutexLock l(&mu_);
    reads_ended_ = true;
    return;
  }
  etcdserverpb::WatchResponse& r = stream->response;
  const int64_t header_revision = r.header().revision();

  if (r.canceled()) {
    absl::Status status;
    {
      absl::MutexLock l(&mu_);
      if (r.compact_revision() > 0) {
        status = absl::OutOfRangeError(
            absl::StrCat("etcd: watch of ", DescribeLocked(), ": revision ", resume_after_ + 1,
                         " has been compacted (compacted revision ", r.compact_revision(), ")"));
      } else {
        const std::string& reason = r.cancel_reason();
        absl::StatusCode code = absl::StatusCode::kUnknown;
        if (absl::StrContains(reason, "permission denied")) {
          code = absl::StatusCode::kPermissionDenied;
        } else if (absl::StrContains(reason, "auth") || absl::StrContains(reason, "user name")) {
          code = absl::StatusCode::kUnauthenticated;
        }
        status = absl::Status(code, absl::StrCat("etcd: watch of ", DescribeLocked(), " canceled: ",
                                                 reason.empty() ? "no reason given" : reason));
      }
      ended_ = true;
      reads_ended_ = true;  // no more reads: the call is cancelled below
    }
    CallHandler([&] { handler_->OnEnd(status); });
    stream->context.TryCancel();
    return;
  }

  std::vector<mvccpb::Event> events(std::make_move_iterator(r.mutable_events()->begin()),
                                    std::make_move_iterator(r.mutable_events()->end()));
  bool deliver = true;
  int64_t revision = 0;
  {
    absl::MutexLock l(&mu_);
    if (r.created()) {
      watch_id_ = r.watch_id();
      backoff_.Succeeded();
      // Its header names the store's revision when the watch was made, not what was delivered.
      deliver = !events.empty();
    }
    if (!events.empty()) {
      const int64_t last = events.back().kv().mod_revision();
      resume_after_ = std::max(resume_after_, last);
      revision = std::max(revision_.load(std::memory_order_relaxed), last);
    } else if (deliver) {
      // A progress notification: etcd's own (this watch's id) is ordered with the events; the
      // answer to a progress request (id -1) may not be (see the header).
      if (r.watch_id() == watch_id_) resume_after_ = std::max(resume_after_, header_revision);
      revision = std::max(revision_.load(std::memory_order_relaxed), header_revision);
    }
  }
  if (deliver) {
    revision_.store(revision, std::memory_order_release);
    CallHandler([&] { handler_->OnEvents(events, revision); });
  }
  {
    absl::MutexLock l(&mu_);
    if (stopped_) {
      reads_ended_ = true;  // Stop has cancelled the call
      return;
    }
  }
  stream->StartRead(&stream->response);
}

void WatchCore::OnWriteDone(Stream* stream, bool ok) {
  {
    absl::MutexLock l(&mu_);
    // A failed write: the stream is broken, and its reads fail too.
    if (!ok || !progress_wanted_ || reads_ended_ || stopped_) {
      writing_ = false;
      return;
    }
    progress_wanted_ = false;  // writing_ stays true
  }
  stream->StartWrite(&stream->progress);
}

void WatchCore::RequestProgress() {
  Stream* stream = nullptr;
  {
    absl::MutexLock l(&mu_);
    if (stopped_ || ended_ || stream_ == nullptr || reads_ended_) return;
    if (writing_) {
      progress_wanted_ = true;
      return;
    }
    writing_ = true;
    stream = stream_;
    // A hold, so that the call cannot end (and the stream be deleted) before StartWrite below.
    // Taken while a read is in flight, or while its reaction runs and will start another
    // (!reads_ended_), so the call cannot have ended yet.
    stream->AddHold();
  }
  stream->StartWrite(&stream->progress);
  stream->RemoveHold();
}

void WatchCore::OnStreamDone(const grpc::Status& status) {
  bool refused = false;
  {
    absl::MutexLock l(&mu_);
    stream_ = nullptr;
    reads_ended_ = true;
    writing_ = false;
    if (!stopped_ && !ended_) {
      switch (status.error_code()) {
        case grpc::StatusCode::PERMISSION_DENIED:
        case grpc::StatusCode::UNAUTHENTICATED:
        case grpc::StatusCode::INVALID_ARGUMENT:
        case grpc::StatusCode::UNIMPLEMENTED:
          // etcd refuses the watch: trying again would get the same answer.
          refused = true;
          ended_ = true;
          break;
        default: {
          const absl::Duration delay = backoff_.Next();
          spdlog::info("etcd watch of {}: the stream ended ({}: {}); reopening in {}",
                       DescribeLocked(),
                       absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                       status.error_message(), absl::FormatDuration(delay));
          // The callback runs on gRPC's executor, never inside Set or Cancel, so both may be
          // called under mu_. Stop waits for it (running_ stays true).
          alarm_ = std::make_unique<grpc::Alarm>();
          alarm_->Set(absl::ToChronoTime(absl::Now() + delay), [this](bool) { OnAlarm(); });
          return;
        }
      }
    }
  }
  if (refused) CallHandler([&] { handler_->OnEnd(EtcdError(status, absl::ZeroDuration())); });
  EndChain();
}

void WatchCore::OnAlarm() {
  // Freed here, on the callback's thread, which the Alarm allows.
  std::unique_ptr<grpc::Alarm> fired;
  {
    absl::MutexLock l(&mu_);
    fired = std::move(alarm_);
  }
  OpenStream();  // ends the chain if stopped
}

void WatchCore::Stop() {
  Stream* stream = nullptr;
  {
    absl::MutexLock l(&mu_);
    stopped_ = true;
    if (stream_ != nullptr && !reads_ended_) {
      stream = stream_;
      stream->AddHold();  // as in RequestProgress
    }
    if (alarm_ != nullptr) alarm_->Cancel();  // its callback then ends the chain
  }
  if (stream != nullptr) {
    stream->context.TryCancel();
    stream->RemoveHold();
  }
  absl::MutexLock l(&mu_);
  if (handler_thread_ == std::this_thread::get_id()) {
    spdlog::error("etcd watch of {}: Stop called from its handler; not waiting for it to end",
                  DescribeLocked());
    if (running_) keepalive_ = shared_from_this();
    return;
  }
  mu_.Await(absl::Condition(
      +[](bool* running) { return !*running; }, &running_));
}

std::string WatchCore::DescribeLocked() const {
  return absl::StrCat("[\"", absl::CHexEscape(key_), "\", \"", absl::CHexEscape(range_end_),
                      "\") from revision ", resume_after_ + 1);
}

class EtcdWatchImpl final : public EtcdWatch {
 public:
  explicit EtcdWatchImpl(std::shared_ptr<WatchCore> core) : core_(std::move(core)) {}
  ~EtcdWatchImpl() override { Stop(); }

  void RequestProgress() override { core_->RequestProgress(); }
  void Stop() override { core_->Stop(); }
  int64_t revision() const override { return core_->revision(); }

 private:
  const std::shared_ptr<WatchCore> core_;
};

}  // namespace

// ---- EtcdClient ----

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(Options options) {
  absl::StatusOr<ChannelTarget> target = MakeChannelTarget(options.endpoints, "etcd endpoint");
  if (!target.ok()) return target.status();
  if (options.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd request timeout: must be positive");
  }
  TlsFiles files;
  files.ca_file = options.ca_file;
  files.cert_file = options.cert_file;
  files.key_file = options.key_file;
  if (files.ca_file.empty() && !files.cert_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd client certificate \"", files.cert_file,
        "\": a client certificate needs TLS, which needs the CA file of etcd's certificates"));
  }
  absl::Status checked =
      CheckTlsFiles(files, "etcd client certificate", "etcd client key", "etcd CA file");
  if (!checked.ok()) return checked;

  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("round_robin");
  if (!target->authority.empty()) args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, target->authority);
  // etcd's answers may be large (a Range of many keys, a watch catching up): as etcd's clients.
  args.SetMaxReceiveMessageSize(INT_MAX);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  // Pings go on while a quiet watch is open (by default gRPC stops after two without data).
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A member that comes back is connected to again within 2 s (gRPC's default waits up to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target->uri, MakeChannelCredentials(files), args);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(channel)));
}

EtcdClient::EtcdClient(Options options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      kv_(etcdserverpb::KV::NewStub(channel_)),
      maintenance_(etcdserverpb::Maintenance::NewStub(channel_)) {}

EtcdClient::~EtcdClient() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](int* in_flight) { return *in_flight == 0; }, &calls_in_flight_));
}

void EtcdClient::PrepareContext(grpc::ClientContext* ctx, absl::Time deadline) const {
  ctx->set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + options_.request_timeout)));
  ctx->AddMetadata(kRequireLeaderKey, kRequireLeaderValue);
}

template <typename Request, typename Response, typename Start>
void EtcdClient::CallAsync(Request request, Start start,
                           std::function<void(absl::StatusOr<Response>)> done) {
  // Everything the call uses, until its callback has run.
  struct Call {
    grpc::ClientContext context;
    Request request;
    Response response;
    std::function<void(absl::StatusOr<Response>)> done;
  };
  auto call = std::make_unique<Call>();
  call->request = std::move(request);
  call->done = std::move(done);
  PrepareContext(&call->context);
  {
    absl::MutexLock l(&mu_);
    ++calls_in_flight_;
  }
  Call* c = call.release();
  start(&c->context, &c->request, &c->response, [this, c](grpc::Status status) {
    {
      std::unique_ptr<Call> owned(c);
      if (status.ok()) {
        owned->done(std::move(owned->response));
      } else {
        owned->done(EtcdError(status, options_.request_timeout));
      }
      // The context (which holds a reference to the channel) is freed here, while this client
      // still holds its own.
    }
    absl::MutexLock l(&mu_);
    --calls_in_flight_;  // the last touch of this client
  });
}

void EtcdClient::TxnAsync(etcdserverpb::TxnRequest request, TxnCallback done) {
  CallAsync<etcdserverpb::TxnRequest, etcdserverpb::TxnResponse>(
      std::move(request),
      [this](auto* context, auto* req, auto* resp, auto on_status) {
        kv_->async()->Txn(context, req, resp, std::move(on_status));
      },
      std::move(done));
}

void EtcdClient::CompactAsync(int64_t revision, std::function<void(absl::Status)> done) {
  etcdserverpb::CompactionRequest request;
  request.set_revision(revision);
  request.set_physical(false);
  CallAsync<etcdserverpb::CompactionRequest, etcdserverpb::CompactionResponse>(
      std::move(request),
      [this](auto* context, auto* req, auto* resp, auto on_status) {
        kv_->async()->Compact(context, req, resp, std::move(on_status));
      },
      [done = std::move(done)](absl::StatusOr<etcdserverpb::CompactionResponse> answer) {
        done(answer.ok() || IsAlreadyCompacted(answer.status()) ? absl::OkStatus()
                                                                : answer.status());
      });
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const etcdserverpb::TxnRequest& request) {
  grpc::ClientContext ctx;
  PrepareContext(&ctx);
  etcdserverpb::TxnResponse response;
  grpc::Status status = kv_->Txn(&ctx, request, &response);
  if (!status.ok()) return EtcdError(status, options_.request_timeout);
  return response;
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdClient::Range(
    const etcdserverpb::RangeRequest& request, absl::Time deadline) {
  grpc::ClientContext ctx;
  PrepareContext(&ctx, deadline);
  etcdserverpb::RangeResponse response;
  grpc::Status status = kv_->Range(&ctx, request, &response);
  if (!status.ok()) return EtcdError(status, options_.request_timeout);
  return response;
}

absl::StatusOr<etcdserverpb::StatusResponse> EtcdClient::Status() {
  grpc::ClientContext ctx;
  PrepareContext(&ctx);
  etcdserverpb::StatusResponse response;
  grpc::Status status = maintenance_->Status(&ctx, etcdserverpb::StatusRequest(), &response);
  if (!status.ok()) return EtcdError(status, options_.request_timeout);
  return response;
}

absl::StatusOr<int64_t> EtcdClient::CurrentRevision(const std::string& key, absl::Time deadline) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  request.set_limit(1);
  request.set_keys_only(true);
  request.set_count_only(true);
  absl::StatusOr<etcdserverpb::RangeResponse> response = Range(request, deadline);
  if (!response.ok()) return response.status();
  return response->header().revision();
}

std::unique_ptr<EtcdWatch> EtcdClient::Watch(std::string key, std::string range_end,
                                             int64_t start_revision, WatchHandler* handler) {
  auto core = std::make_shared<WatchCore>(channel_, std::move(key), std::move(range_end),
                                          start_revision, handler);
  if (start_revision <= 0) {
    handler->OnEnd(absl::InvalidArgumentError(
        absl::StrCat("etcd watch: start revision ", start_revision, " (want > 0)")));
  } else {
    core->Start();
  }
  return std::make_unique<EtcdWatchImpl>(std::move(core));
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  for (int i = static_cast<int>(end.size()) - 1; i >= 0; --i) {
    if (static_cast<unsigned char>(end[i]) < 0xff) {
      end[i] = static_cast<char>(end[i] + 1);
      end.resize(i + 1);
      return end;
    }
  }
  return std::string(1, '\0');
}

}  // namespace shardcache
