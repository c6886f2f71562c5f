#include "bench/write_load.h"

#include <atomic>
#include <deque>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::bench {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// State that the main thread and every client share.
struct Shared {
  explicit Shared(const WriteLoadOptions& o) : options(o) {}

  // True when a write that completed at `now_ns` is measured.
  bool Measured(int64_t now_ns) const {
    return now_ns >= measure_start_ns.load() && now_ns < measure_end_ns.load();
  }
  // Claims the right to send one more write, and its index in the run; false once the run is
  // stopping or, with total_writes, every write has been claimed.
  bool ClaimWrite(int64_t* index) {
    if (stop.load()) return false;
    int64_t n = sent.fetch_add(1);
    if (options.total_writes > 0 && n >= options.total_writes) {
      sent.fetch_sub(1);
      return false;
    }
    *index = n;
    return true;
  }
  // The create for write `seq` of client `client` (write `index` of the run), stamped with the
  // current time.
  v1::CreateRequest MakeRequest(int client, int64_t seq, int64_t index) const {
    v1::CreateRequest request = options.name_by_index
                                    ? MakeCreateRequest(options.run_id, 0, index, NowNanos())
                                    : MakeCreateRequest(options.run_id, client, seq, NowNanos());
    if (!options.cluster.empty())
      request.mutable_object()->mutable_metadata()->set_cluster(options.cluster);
    if (options.object_bytes > 0 && options.operation != WriteLoadOptions::Operation::kDelete) {
      PadObject(&request, options.object_bytes);
    }
    return request;
  }
  // The same as a Write stream operation (options.operation).
  void MakeWrite(int client, int64_t seq, int64_t index, v1::WriteRequest* write) const {
    v1::CreateRequest create = MakeRequest(client, seq, index);
    switch (options.operation) {
      case WriteLoadOptions::Operation::kCreate:
        *write->mutable_create() = std::move(create);
        break;
      case WriteLoadOptions::Operation::kUpdate:
        write->mutable_update()->mutable_resource()->Swap(create.mutable_resource());
        write->mutable_update()->mutable_object()->Swap(create.mutable_object());
        break;
      case WriteLoadOptions::Operation::kDelete: {
        v1::DeleteRequest* d = write->mutable_delete_();
        const v1::ObjectMeta& m = create.object().metadata();
        *d->mutable_resource() = create.resource();
        d->set_cluster(m.cluster());
        d->set_namespace_(m.namespace_());
        d->set_name(m.name());
        break;
      }
    }
  }
  void ClientDone() {
    absl::MutexLock l(&mu);
    --running;
  }

  const WriteLoadOptions& options;
  std::atomic<int64_t> measure_start_ns{kNever};
  std::atomic<int64_t> measure_end_ns{kNever};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> measured_ok{0};
  std::atomic<int64_t> sent{0};
  std::atomic<int64_t> answered{0};  // answers of any kind, measured or not

  absl::Mutex mu;
  int running ABSL_GUARDED_BY(mu) = 0;
};

// What one client measured. Record is called from gRPC's threads; the results are read once the
// client has ended.
class ClientStats {
 public:
  explicit ClientStats(Shared* shared) : shared_(shared) {}
  virtual ~ClientStats() = default;

  void Record(int64_t index, int64_t sent_ns, int64_t now_ns, int code,
              const std::string& message) {
    if (shared_->options.on_answer) shared_->options.on_answer(index, now_ns, code);
    shared_->answered.fetch_add(1);
    if (!shared_->Measured(now_ns)) return;
    absl::MutexLock l(&mu_);
    if (code == 0) {
      samples_ns_.push_back(now_ns - sent_ns);
      shared_->measured_ok.fetch_add(1);
    } else {
      CountErrorLocked(code, message);
    }
  }

  // Counts an error whenever it happened (a stream that broke, measured or not).
  void RecordFailure(int code, const std::string& message) {
    absl::MutexLock l(&mu_);
    CountErrorLocked(code, message);
  }

  // REQUIRES: the client has ended.
  void MergeInto(std::vector<int64_t>* samples, WriteLoadResult* result) {
    absl::MutexLock l(&mu_);
    samples->insert(samples->end(), samples_ns_.begin(), samples_ns_.end());
    result->errors += errors_;
    for (const auto& [k, v] : error_samples_) result->error_samples[k] += v;
  }

 protected:
  Shared* const shared_;

 private:
  void CountErrorLocked(int code, const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++errors_;
    std::string key = absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
                                   ": ", message.substr(0, 120));
    if (error_samples_.size() < 8 || error_samples_.count(key) > 0) ++error_samples_[key];
  }

  absl::Mutex mu_;
  std::vector<int64_t> samples_ns_ ABSL_GUARDED_BY(mu_);
  int64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> error_samples_ ABSL_GUARDED_BY(mu_);
};

// One create in flight at a time; the next is sent from the previous one's callback.
class UnaryClient : public ClientStats {
 public:
  UnaryClient(Shared* shared, Target* target, int index)
      : ClientStats(shared), target_(target), index_(index) {}

  void Start() { Next(); }

 private:
  void Next() {
    int64_t index = 0;
    if (!shared_->ClaimWrite(&index)) {
      shared_->ClientDone();
      return;
    }
    v1::CreateRequest request = shared_->MakeRequest(index_, seq_++, index);
    int64_t sent_ns = NowNanos();
    target_->Create(index_, std::move(request), shared_->options.rpc_timeout,
                    [this, index, sent_ns](const grpc::Status& status) {
                      Record(index, sent_ns, NowNanos(), status.error_code(),
                             status.error_message());
                      Next();
                    });
  }

  Target* const target_;
  const int index_;
  int64_t seq_ = 0;  // only touched by the one call chain
};

// One Write stream with up to `window` writes unanswered. Answers come in order, so the send
// times wait in a FIFO. One write and one read are in flight at most, as gRPC requires.
class StreamClient : public ClientStats,
                     public grpc::ClientBidiReactor<v1::WriteRequest, v1::WriteResponse> {
 public:
  StreamClient(Shared* shared, v1::Store::Stub* stub, int index)
      : ClientStats(shared), stub_(stub), index_(index) {}

  void Start(absl::Time deadline) {
    ctx_.set_deadline(absl::ToChronoTime(deadline));
    stub_->async()->Write(&ctx_, this);
    StartRead(&response_);
    Act(Decide());
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock l(&stream_mu_);
      writing_ = false;
      if (!ok) broken_ = true;
    }
    Act(Decide());
  }

  void OnReadDone(bool ok) override {
    int64_t now = NowNanos();
    if (!ok) {
      absl::MutexLock l(&stream_mu_);
      broken_ = true;
      return;
    }
    int64_t sent = 0, id = -1;
    {
      absl::MutexLock l(&stream_mu_);
      if (!sent_ns_.empty()) {
        std::tie(id, sent) = sent_ns_.front();
        sent_ns_.pop_front();
      }
    }
    if (response_.id() != id) {
      // The stream promises one answer per write, in order.
      RecordFailure(grpc::StatusCode::INTERNAL,
                    absl::StrCat("store_bench: answer ", response_.id(), " came for write ", id));
    } else {
      Record(id, sent, now, response_.code(), response_.message());
    }
    StartRead(&response_);
    Act(Decide());
  }

  void OnDone(const grpc::Status& status) override {
    if (!status.ok()) RecordFailure(status.error_code(), status.error_message());
    {
      // Writes that will never be answered: let a run that waits for every answer end.
      absl::MutexLock l(&stream_mu_);
      shared_->answered.fetch_add(static_cast<int64_t>(sent_ns_.size()));
      sent_ns_.clear();
    }
    shared_->ClientDone();
  }

 private:
  enum class Action { kNone, kWrite, kWritesDone };

  Action Decide() {
    absl::MutexLock l(&stream_mu_);
    if (writing_ || writes_done_ || broken_) return Action::kNone;
    if (!sending_done_ && static_cast<int>(sent_ns_.size()) >= shared_->options.window) {
      return Action::kNone;
    }
    int64_t index = 0;
    if (sending_done_ || !shared_->ClaimWrite(&index)) {
      sending_done_ = true;
      if (!sent_ns_.empty()) return Action::kNone;  // the last answers are on their way
      writes_done_ = true;
      return Action::kWritesDone;
    }
    request_.Clear();
    request_.set_id(index);
    shared_->MakeWrite(index_, seq_, index, &request_);
    sent_ns_.emplace_back(index, NowNanos());
    ++seq_;
    writing_ = true;
    return Action::kWrite;
  }

  void Act(Action action) {
    if (action == Action::kWrite) StartWrite(&request_);
    if (action == Action::kWritesDone) StartWritesDone();
  }

  v1::Store::Stub* const stub_;
  const int index_;
  grpc::ClientContext ctx_;
  v1::WriteResponse response_;  // only touched by the one read in flight

  absl::Mutex stream_mu_;
  v1::WriteRequest request_;  // written under stream_mu_, then read by gRPC while writing_
  // (id = index in the run, send time) of each write sent and not yet answered, oldest first.
  std::deque<std::pair<int64_t, int64_t>> sent_ns_ ABSL_GUARDED_BY(stream_mu_);
  int64_t seq_ ABSL_GUARDED_BY(stream_mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(stream_mu_) = false;
  bool sending_done_ ABSL_GUARDED_BY(stream_mu_) = false;  // no more writes will be sent
  bool writes_done_ ABSL_GUARDED_BY(stream_mu_) = false;
  bool broken_ ABSL_GUARDED_BY(stream_mu_) = false;
};

}  // namespace

WriteLoadResult RunWriteLoad(const WriteLoadOptions& options,
                             const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
  std::unique_ptr<Target> target = MakeStoreTarget(channels);
  WriteLoadResult result = RunWriteLoad(options, target.get());
  // Calls that did not end in time still point at the target's stubs.
  if (!result.clean_exit) target.release();
  return result;
}

WriteLoadResult RunWriteLoad(const WriteLoadOptions& options, Target* target) {
  if (options.api == WriteLoadOptions::Api::kStream && target->StoreStub(0) == nullptr) {
    WriteLoadResult r;
    r.errors = 1;
    r.error_samples[absl::StrCat("INVALID_ARGUMENT: the Write stream is cache_server's; ",
                                 target->Name(), " takes unary writes only")] = 1;
    return r;
  }
  Shared shared(options);

  std::vector<std::unique_ptr<ClientStats>> clients;
  {
    absl::MutexLock l(&shared.mu);
    shared.running = options.clients;
  }
  absl::Time start = absl::Now();
  absl::Time stream_deadline = start + options.warmup + options.duration + options.rpc_timeout;
  WriteLoadResult result;
  ProcStats server_start, client_start;
  std::map<pid_t, double> server_threads_start;
  int64_t measure_start = 0;
  auto start_measuring = [&] {
    server_start = ReadProcStats(options.server_pid);
    server_threads_start = ReadThreadCpu(options.server_pid);
    client_start = ReadProcStats(0);
    if (!options.disk_path.empty()) result.flushes_before = ReadDiskFlushes(options.disk_path);
    measure_start = NowNanos();
    shared.measure_start_ns.store(measure_start);
  };
  // Without a warm-up every write counts, the first one too.
  if (options.warmup == absl::ZeroDuration()) start_measuring();
  for (int i = 0; i < options.clients; ++i) {
    if (options.api == WriteLoadOptions::Api::kUnary) {
      auto c = std::make_unique<UnaryClient>(&shared, target, i);
      c->Start();
      clients.push_back(std::move(c));
    } else {
      auto c = std::make_unique<StreamClient>(&shared, target->StoreStub(i), i);
      c->Start(stream_deadline);
      clients.push_back(std::move(c));
    }
  }

  if (options.warmup > absl::ZeroDuration()) {
    absl::SleepFor(options.warmup);
    start_measuring();
  }
  absl::Time end = absl::Now() + options.duration;
  auto more = [&] {
    if (options.ops > 0 && shared.measured_ok.load() >= options.ops) return false;
    if (options.total_writes > 0 && shared.answered.load() >= options.total_writes) return false;
    return true;
  };
  while (absl::Now() < end && more()) {
    absl::SleepFor(std::min(absl::Milliseconds(10), end - absl::Now()));
  }
  int64_t measure_end = NowNanos();
  shared.measure_end_ns.store(measure_end);
  shared.stop.store(true);
  if (!options.disk_path.empty()) result.flushes_after = ReadDiskFlushes(options.disk_path);
  ProcStats server_stop = ReadProcStats(options.server_pid);
  std::map<pid_t, double> server_threads_stop = ReadThreadCpu(options.server_pid);
  ProcStats client_stop = ReadProcStats(0);
  result.seconds = static_cast<double>(measure_end - measure_start) / 1e9;
  result.server_cores = CoresUsed(server_start, server_stop, result.seconds);
  result.client_cores = CoresUsed(client_start, client_stop, result.seconds);
  result.server_busiest = FindBusiestThread(options.server_pid, server_threads_start,
                                            server_threads_stop, result.seconds);

  {
    absl::MutexLock l(&shared.mu);
    auto all_done = [&shared]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared.mu) { return shared.running == 0; };
    result.clean_exit = shared.mu.AwaitWithTimeout(absl::Condition(&all_done),
                                                   2 * options.rpc_timeout + absl::Seconds(5));
  }
  result.server_end = ReadProcStats(options.server_pid);
  result.ok = shared.measured_ok.load();
  result.sent = shared.sent.load();
  std::vector<int64_t> samples;
  for (auto& c : clients) c->MergeInto(&samples, &result);
  result.latency = Summarize(&samples);
  if (!result.clean_exit) {
    // Calls are still running and point at the clients: keep them alive until the process exits.
    for (auto& c : clients) c.release();
  }
  return result;
}

}  // namespace shardcache::bench
