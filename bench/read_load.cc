#include "bench/read_load.h"

#include <atomic>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shardcache::bench {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// State that the main thread and every client share; the clients' callbacks run on gRPC's
// threads.
class ReadRun {
 public:
  ReadRun(const ReadLoadOptions& options, Target* target) : options_(options), target_(target) {}

  void StartClients() {
    {
      absl::MutexLock l(&mu_);
      running_ = options_.clients;
    }
    for (int i = 0; i < options_.clients; ++i) Next(i);
  }
  void StartMeasuring() { measure_start_ns_.store(NowNanos()); }
  void StopMeasuring() {
    measure_end_ns_.store(NowNanos());
    stop_.store(true);
  }
  bool WaitForClients(absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  void Collect(ReadLoadResult* r) {
    absl::MutexLock l(&mu_);
    r->ok = static_cast<int64_t>(samples_.size());
    r->errors = errors_;
    r->error_samples = error_samples_;
    r->items_per_list = last_items_;
    r->latency = Summarize(&samples_);
  }

 private:
  void Next(int client) {
    if (stop_.load()) {
      absl::MutexLock l(&mu_);
      --running_;
      return;
    }
    int64_t sent = NowNanos();
    if (options_.operation == ReadLoadOptions::Operation::kGet) {
      const v1::ObjectMeta& key = options_.keys[next_key_.fetch_add(1) % options_.keys.size()];
      target_->Get(client, key, options_.rpc_timeout,
                   [this, client, sent](const grpc::Status& status, bool found) {
                     Record(sent, status,
                            status.ok() && !found ? "store_bench: the object was not found" : "",
                            -1);
                     Next(client);
                   });
    } else {
      target_->List(client, options_.rpc_timeout,
                    [this, client, sent](const grpc::Status& status, int64_t items) {
                      Record(sent, status,
                             status.ok() && items < options_.min_items
                                 ? absl::StrCat("store_bench: the list had ", items, " items, not ",
                                                options_.min_items)
                                 : "",
                             items);
                      Next(client);
                    });
    }
  }

  void Record(int64_t sent_ns, const grpc::Status& status, const std::string& wrong,
              int64_t items) {
    int64_t now = NowNanos();
    if (now < measure_start_ns_.load() || now >= measure_end_ns_.load()) return;
    absl::MutexLock l(&mu_);
    if (items >= 0) last_items_ = items;
    if (status.ok() && wrong.empty()) {
      samples_.push_back(now - sent_ns);
      return;
    }
    ++errors_;
    std::string key =
        status.ok()
            ? wrong
            : absl::StrCat(
                  absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                  ": ", status.error_message().substr(0, 120));
    if (error_samples_.size() < 8 || error_samples_.count(key) > 0) ++error_samples_[key];
  }

  const ReadLoadOptions& options_;
  Target* const target_;
  std::atomic<int64_t> measure_start_ns_{kNever};
  std::atomic<int64_t> measure_end_ns_{kNever};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_key_{0};

  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> samples_ ABSL_GUARDED_BY(mu_);
  int64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> error_samples_ ABSL_GUARDED_BY(mu_);
  int64_t last_items_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

ReadLoadResult RunReadLoad(const ReadLoadOptions& options, Target* target) {
  ReadLoadResult result;
  if (options.operation == ReadLoadOptions::Operation::kGet && options.keys.empty()) {
    result.errors = 1;
    result.error_samples["store_bench: no objects to get"] = 1;
    return result;
  }
  auto* run = new ReadRun(options, target);
  run->StartClients();
  absl::SleepFor(options.warmup);
  ProcStats server_start = ReadProcStats(options.server_pid);
  ProcStats client_start = ReadProcStats(0);
  int64_t start = NowNanos();
  run->StartMeasuring();
  absl::SleepFor(options.duration);
  run->StopMeasuring();
  int64_t end = NowNanos();
  ProcStats server_stop = ReadProcStats(options.server_pid);
  ProcStats client_stop = ReadProcStats(0);
  result.seconds = static_cast<double>(end - start) / 1e9;
  result.server_cores = CoresUsed(server_start, server_stop, result.seconds);
  result.client_cores = CoresUsed(client_start, client_stop, result.seconds);
  result.clean_exit = run->WaitForClients(2 * options.rpc_timeout + absl::Seconds(5));
  run->Collect(&result);
  result.server_end = ReadProcStats(options.server_pid);
  // Calls still running point at the run: keep it until the process exits.
  if (result.clean_exit) delete run;
  return result;
}

}  // namespace shardcache::bench
