#include "bench/watch_load.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "shardcache/v1/store.grpc.pb.h"

namespace shardcache::bench {
namespace {

std::string StatusKey(int code, const std::string& message) {
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)), ": ",
                      message.substr(0, 160));
}

// Counts that the main thread polls.
struct Progress {
  std::atomic<int> synced{0};
  std::atomic<int> done{0};
  std::atomic<int64_t> last_sync_ns{0};
};

// One watch. The read chain (OnEvent) owns the counters and samples; the main thread reads them
// only after OnEnded.
class WatchClient : public WatchHandler {
 public:
  struct Sample {
    int32_t seq;
    int64_t latency_ns;  // write sent -> event received
  };

  WatchClient(Progress* progress, const std::string& run_id, int64_t planned)
      : progress_(progress), run_id_(run_id), seen_(static_cast<size_t>(planned), false) {
    samples_.reserve(static_cast<size_t>(planned));
  }

  void Start(Target* target, int slot, absl::Time deadline) {
    stream_ = target->Watch(slot, deadline, this);
  }

  // Ends the stream from this side; OnEnded follows.
  void Cancel() {
    cancelled_.store(true);
    stream_->Cancel();
  }

  void OnSynced() override {
    if (synced_.load()) return;
    synced_.store(true);
    progress_->last_sync_ns.store(NowNanos());
    progress_->synced.fetch_add(1);
  }

  void OnEvent(bool created, const v1::Object* object, int64_t rv) override {
    int64_t now = NowNanos();
    if (!synced_.load()) return;  // initial events of objects from earlier runs
    std::string run;
    int64_t seq = 0, sent_ns = 0;
    if (!created || object == nullptr || !ParseBenchSpec(*object, &run, &seq, &sent_ns) ||
        run != run_id_ || seq < 0 || seq >= static_cast<int64_t>(seen_.size())) {
      ++unexpected_;
      return;
    }
    if (rv <= last_rv_) ++out_of_order_;
    last_rv_ = std::max(last_rv_, rv);
    if (seen_[seq]) {
      ++duplicates_;
      return;
    }
    seen_[seq] = true;
    samples_.push_back({static_cast<int32_t>(seq), now - sent_ns});
    last_receipt_ns_ = now;
    received_.fetch_add(1);
  }

  void OnEnded(const grpc::Status& status) override {
    {
      absl::MutexLock l(&mu_);
      status_ = status;
      ended_early_ = !cancelled_.load();
    }
    progress_->done.fetch_add(1);
  }

  int64_t received() const { return received_.load(); }
  bool synced() const { return synced_.load(); }

  // REQUIRES: OnEnded has run.
  const std::vector<Sample>& samples() const { return samples_; }
  const std::vector<bool>& seen() const { return seen_; }
  int64_t duplicates() const { return duplicates_; }
  int64_t out_of_order() const { return out_of_order_; }
  int64_t unexpected() const { return unexpected_; }
  int64_t last_receipt_ns() const { return last_receipt_ns_; }
  bool ended_early(grpc::Status* status) {
    absl::MutexLock l(&mu_);
    *status = status_;
    return ended_early_;
  }
  // Gives up the stream (it is still running and points at this watcher, which must then live
  // until the process exits).
  void Abandon() { (void)stream_.release(); }

 private:
  Progress* const progress_;
  const std::string run_id_;
  std::unique_ptr<WatchStream> stream_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> synced_{false};
  std::atomic<int64_t> received_{0};

  // Owned by the read chain.
  std::vector<bool> seen_;
  std::vector<Sample> samples_;
  int64_t duplicates_ = 0;
  int64_t out_of_order_ = 0;
  int64_t unexpected_ = 0;
  int64_t last_rv_ = 0;
  int64_t last_receipt_ns_ = 0;

  absl::Mutex mu_;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool ended_early_ ABSL_GUARDED_BY(mu_) = false;
};

// The paced writer's answers. Each slot is written once, by its own call's callback.
struct WriteLog {
  explicit WriteLog(int64_t planned)
      : ok(static_cast<size_t>(planned), 0), ack_ns(static_cast<size_t>(planned), 0) {}

  std::vector<char> ok;         // 1 when answered OK
  std::vector<int64_t> ack_ns;  // write sent -> answered
  absl::Mutex mu;
  int64_t answered ABSL_GUARDED_BY(mu) = 0;
  int64_t last_answer_ns ABSL_GUARDED_BY(mu) = 0;
  std::map<std::string, int64_t> errors ABSL_GUARDED_BY(mu);
};

// Sends `planned` Creates at `rate` a second from now; returns the time of the first send. Waits
// until every Create is answered (each has a deadline).
int64_t WritePaced(const WatchLoadOptions& options, Target* target, int64_t planned,
                   WriteLog* log) {
  int64_t start_ns = NowNanos();
  double period_ns = 1e9 / options.write_rate;
  for (int64_t seq = 0; seq < planned; ++seq) {
    int64_t due = start_ns + static_cast<int64_t>(std::llround(period_ns * seq));
    int64_t wait = due - NowNanos();
    if (wait > 0) absl::SleepFor(absl::Nanoseconds(wait));
    {
      absl::MutexLock l(&log->mu);
      auto room = [log, seq, &options]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log->mu) {
        return seq - log->answered < options.max_outstanding_writes;
      };
      // Answers come within rpc_timeout, so this wait is bounded.
      log->mu.AwaitWithTimeout(absl::Condition(&room), options.rpc_timeout + absl::Seconds(5));
    }
    int64_t sent_ns = NowNanos();
    target->Create(0, MakeCreateRequest(options.run_id, 0, seq, sent_ns), options.rpc_timeout,
                   [log, seq, sent_ns](const grpc::Status& status) {
                     int64_t now = NowNanos();
                     log->ack_ns[seq] = now - sent_ns;
                     log->ok[seq] = status.ok() ? 1 : 0;
                     absl::MutexLock l(&log->mu);
                     ++log->answered;
                     log->last_answer_ns = std::max(log->last_answer_ns, now);
                     if (!status.ok()) {
                       ++log->errors[StatusKey(status.error_code(), status.error_message())];
                     }
                   });
  }
  absl::MutexLock l(&log->mu);
  auto all_answered = [log, planned]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log->mu) {
    return log->answered == planned;
  };
  log->mu.AwaitWithTimeout(absl::Condition(&all_answered), options.rpc_timeout + absl::Seconds(5));
  return start_ns;
}

// Polls `done` every 10 ms until it returns true or `timeout` passes; returns its last answer.
template <typename F>
bool PollUntil(F done, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

}  // namespace

WatchLoadResult RunWatchLoad(const WatchLoadOptions& options,
                             const std::vector<std::shared_ptr<grpc::Channel>>& watch_channels,
                             const std::shared_ptr<grpc::Channel>& write_channel) {
  // Streams that did not end in time point at the targets' stubs: keep them until the exit.
  auto* watch_target =
      MakeStoreTarget(watch_channels, /*watch_from_now=*/false, options.batch_events).release();
  auto* write_target = MakeStoreTarget({write_channel}).release();
  WatchLoadResult r = RunWatchLoad(options, watch_target, write_target);
  if (r.streams_ended) {
    delete watch_target;
    delete write_target;
  }
  return r;
}

WatchLoadResult RunWatchLoad(const WatchLoadOptions& options, Target* watch_target,
                             Target* write_target) {
  WatchLoadResult r;
  r.watchers = options.watchers;
  r.writes_planned = std::max<int64_t>(
      1, std::llround(options.write_rate * absl::ToDoubleSeconds(options.duration)));
  r.server_before = ReadProcStats(options.server_pid);

  // Open the watchers and wait for every initial bookmark.
  Progress progress;
  std::vector<std::unique_ptr<WatchClient>> watchers;
  absl::Time watch_deadline = absl::Now() + options.setup_timeout + options.idle +
                              options.duration + options.rpc_timeout + options.drain_timeout +
                              absl::Seconds(30);
  int64_t open_ns = NowNanos();
  for (int i = 0; i < options.watchers; ++i) {
    watchers.push_back(std::make_unique<WatchClient>(&progress, options.run_id, r.writes_planned));
    watchers.back()->Start(watch_target, i, watch_deadline);
  }
  PollUntil([&] { return progress.synced.load() + progress.done.load() >= options.watchers; },
            options.setup_timeout);
  r.synced = progress.synced.load();
  if (r.synced > 0) {
    r.sync_seconds = static_cast<double>(progress.last_sync_ns.load() - open_ns) / 1e9;
  }

  if (r.synced == options.watchers && progress.done.load() == 0) {
    absl::SleepFor(options.idle);
    r.server_idle = ReadProcStats(options.server_pid);
    r.client_idle = ReadProcStats(0);

    // Sample the server's threads and RSS while the load runs.
    absl::Notification stop_sampling;
    std::thread sampler([&] {
      do {
        ProcStats s = ReadProcStats(options.server_pid);
        if (s.ok) {
          r.server_peak_threads = std::max(r.server_peak_threads, s.threads);
          r.server_peak_rss_kb = std::max(r.server_peak_rss_kb, s.rss_kb);
        }
      } while (!stop_sampling.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
    });

    ProcStats server_cpu_start = ReadProcStats(options.server_pid);
    std::map<pid_t, double> server_threads_start = ReadThreadCpu(options.server_pid);
    ProcStats client_cpu_start = ReadProcStats(0);
    WriteLog log(r.writes_planned);
    int64_t first_send_ns = WritePaced(options, write_target, r.writes_planned, &log);
    r.server_end = ReadProcStats(options.server_pid);
    r.client_end = ReadProcStats(0);
    int64_t last_answer_ns = 0;
    {
      absl::MutexLock l(&log.mu);
      r.writes_ok = std::count(log.ok.begin(), log.ok.end(), 1);
      r.writes_failed = log.answered - r.writes_ok;
      r.write_errors = log.errors;
      last_answer_ns = log.last_answer_ns;
    }
    r.write_seconds = static_cast<double>(last_answer_ns - first_send_ns) / 1e9;

    // Wait until every live watcher has every event, then end the watchers.
    PollUntil(
        [&] {
          for (const auto& w : watchers) {
            grpc::Status s;
            // A watcher that ended will receive nothing more.
            if (w->received() < r.writes_ok && !w->ended_early(&s)) return false;
          }
          return true;
        },
        options.drain_timeout);
    ProcStats server_cpu_end = ReadProcStats(options.server_pid);
    std::map<pid_t, double> server_threads_end = ReadThreadCpu(options.server_pid);
    ProcStats client_cpu_end = ReadProcStats(0);
    stop_sampling.Notify();
    sampler.join();

    int64_t last_receipt_ns = first_send_ns;
    for (const auto& w : watchers) {
      last_receipt_ns = std::max(last_receipt_ns, w->last_receipt_ns());
    }
    r.delivery_seconds = static_cast<double>(last_receipt_ns - first_send_ns) / 1e9;
    r.drain_seconds = static_cast<double>(last_receipt_ns - last_answer_ns) / 1e9;
    double cpu_seconds = static_cast<double>(NowNanos() - first_send_ns) / 1e9;
    r.server_cores = CoresUsed(server_cpu_start, server_cpu_end, cpu_seconds);
    r.server_busiest = FindBusiestThread(options.server_pid, server_threads_start,
                                         server_threads_end, cpu_seconds);
    r.client_cores = CoresUsed(client_cpu_start, client_cpu_end, cpu_seconds);

    for (auto& w : watchers) w->Cancel();
    bool all_done =
        PollUntil([&] { return progress.done.load() == options.watchers; }, absl::Seconds(30));

    std::vector<int64_t> send_to_receipt, ack_to_receipt;
    for (auto& w : watchers) {
      grpc::Status s;
      if (w->ended_early(&s)) {
        ++r.watchers_ended_early;
        ++r.early_end_reasons[StatusKey(s.error_code(), s.error_message())];
      }
      if (!all_done) continue;  // the reactors may still be reading
      int64_t missing = 0;
      for (int64_t seq = 0; seq < r.writes_planned; ++seq) {
        if (log.ok[seq] && !w->seen()[seq]) ++missing;
      }
      if (missing == 0) ++r.watchers_complete;
      for (int64_t seq = 0; seq < r.writes_planned; ++seq) {
        if (!log.ok[seq] && w->seen()[seq]) ++r.failed_writes_seen;
      }
      r.duplicates += w->duplicates();
      r.out_of_order += w->out_of_order();
      r.unexpected += w->unexpected();
      bool late = false;
      for (const WatchClient::Sample& sample : w->samples()) {
        if (!log.ok[sample.seq]) continue;
        late = late || sample.latency_ns > absl::ToInt64Nanoseconds(options.late_after);
        ++r.events_received;
        send_to_receipt.push_back(sample.latency_ns);
        ack_to_receipt.push_back(sample.latency_ns - log.ack_ns[sample.seq]);
      }
      if (late) ++r.watchers_late;
    }
    r.events_expected = r.writes_ok * options.watchers;
    r.send_to_receipt = Summarize(&send_to_receipt);
    r.ack_to_receipt = Summarize(&ack_to_receipt);
    std::vector<int64_t> acks;
    for (int64_t seq = 0; seq < r.writes_planned; ++seq) {
      if (log.ok[seq]) acks.push_back(log.ack_ns[seq]);
    }
    r.write_ack = Summarize(&acks);
    r.streams_ended = all_done;
    if (!all_done) {
      // Streams are still running and point at the watchers: keep them until the process exits.
      for (auto& w : watchers) {
        w->Abandon();
        (void)w.release();
      }
    }
    return r;
  }

  // Not every watcher opened: end them all and report what happened.
  for (auto& w : watchers) w->Cancel();
  bool all_done =
      PollUntil([&] { return progress.done.load() == options.watchers; }, absl::Seconds(30));
  for (auto& w : watchers) {
    grpc::Status s;
    if (w->ended_early(&s)) {
      ++r.watchers_ended_early;
      ++r.early_end_reasons[StatusKey(s.error_code(), s.error_message())];
    }
  }
  r.streams_ended = all_done;
  if (!all_done) {
    for (auto& w : watchers) {
      w->Abandon();
      (void)w.release();
    }
  }
  return r;
}

}  // namespace shardcache::bench
