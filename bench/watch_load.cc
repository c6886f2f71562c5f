#include "bench/watch_load.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
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

// One watch of one bench resource. The read chain (OnEvent) owns the per-event state: no lock,
// no allocation and no shared write per event. The main thread reads that state only after
// OnEnded.
class WatchClient : public WatchHandler {
 public:
  // A slot of latency_us() whose create this watcher has not received.
  static constexpr int32_t kUnseen = std::numeric_limits<int32_t>::min();

  // Watches bench resource `resource` of `resources`: the creates whose seq % resources ==
  // resource, of the `planned` the writer may send.
  WatchClient(Progress* progress, const std::string& run_id, int64_t planned, int resource,
              int resources)
      : progress_(progress),
        run_id_(run_id),
        resource_(resource),
        resources_(resources),
        latency_us_(static_cast<size_t>(CreatesOf(planned, resource, resources)), kUnseen) {}

  // The creates of `planned` that go to `resource` of `resources`.
  static int64_t CreatesOf(int64_t planned, int resource, int resources) {
    return planned > resource ? (planned - resource + resources - 1) / resources : 0;
  }

  void Start(Target* target, int slot) { stream_ = target->Watch(slot, resource_, this); }

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

  void OnEvent(bool created, int64_t rv, const ObjectFacts& object, int64_t now) override {
    if (!synced_.load(std::memory_order_relaxed)) return;  // initial events of earlier runs
    if (!created || !object.bench || object.run != run_id_ || object.seq < 0 ||
        object.seq % resources_ != resource_ ||
        object.seq / resources_ >= static_cast<int64_t>(latency_us_.size())) {
      ++unexpected_;
      return;
    }
    if (rv <= last_rv_) ++out_of_order_;
    last_rv_ = std::max(last_rv_, rv);
    int32_t& slot = latency_us_[static_cast<size_t>(object.seq / resources_)];
    if (slot != kUnseen) {
      ++duplicates_;
      return;
    }
    slot = static_cast<int32_t>(
        std::clamp<int64_t>((now - object.sent_ns) / 1000, 0, std::numeric_limits<int32_t>::max()));
    last_receipt_ns_.store(now, std::memory_order_relaxed);
    received_.store(received_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  void OnEnded(const grpc::Status& status) override {
    {
      absl::MutexLock l(&mu_);
      status_ = status;
      ended_early_ = !cancelled_.load();
    }
    ended_.store(true);
    progress_->done.fetch_add(1);
  }

  int resource() const { return resource_; }
  int64_t received() const { return received_.load(std::memory_order_relaxed); }
  bool synced() const { return synced_.load(); }
  bool ended() const { return ended_.load(); }

  // REQUIRES: OnEnded has run.
  // Per create of this watcher's resource (create seq = index * resources + resource): write
  // sent -> event received, in microseconds, or kUnseen.
  const std::vector<int32_t>& latency_us() const { return latency_us_; }
  int64_t duplicates() const { return duplicates_; }
  int64_t out_of_order() const { return out_of_order_; }
  int64_t unexpected() const { return unexpected_; }
  int64_t last_receipt_ns() const { return last_receipt_ns_.load(std::memory_order_relaxed); }
  int64_t messages() const { return stream_->messages(); }
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
  const int resource_;
  const int resources_;
  std::unique_ptr<WatchStream> stream_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> synced_{false};
  std::atomic<bool> ended_{false};
  std::atomic<int64_t> received_{0};         // written by the read chain only
  std::atomic<int64_t> last_receipt_ns_{0};  // written by the read chain only

  // Owned by the read chain.
  std::vector<int32_t> latency_us_;
  int64_t duplicates_ = 0;
  int64_t out_of_order_ = 0;
  int64_t unexpected_ = 0;
  int64_t last_rv_ = 0;

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

// Sends up to `planned` Creates at `rate` a second from now, create seq to bench resource
// seq % resources, for `duration`: a create not sent by then (the writer fell behind, waiting for
// room under max_outstanding_writes) is not sent; a second of grace. Returns the time of the first
// send and sets
// `*sent`. Waits until every Create sent is answered (each has a deadline).
int64_t WritePaced(const WatchLoadOptions& options, Target* target, int64_t planned, WriteLog* log,
                   int64_t* sent) {
  int64_t start_ns = NowNanos();
  // A second of grace, so that a writer on time never loses its last creates to a late wakeup.
  int64_t end_ns = start_ns + absl::ToInt64Nanoseconds(options.duration + absl::Seconds(1));
  double period_ns = 1e9 / options.write_rate;
  int64_t seq = 0;
  for (; seq < planned; ++seq) {
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
    if (sent_ns > end_ns) break;
    target->Create(0,
                   MakeCreateRequest(options.run_id, 0, seq, sent_ns,
                                     static_cast<int>(seq % options.resources)),
                   options.rpc_timeout, [log, seq, sent_ns](const grpc::Status& status) {
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
  *sent = seq;
  absl::MutexLock l(&log->mu);
  auto all_answered = [log, seq]()
                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(log->mu) { return log->answered == seq; };
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

// Records whether every stream ended; streams still running point at their watchers, which are
// then kept until the process exits.
template <typename Watchers>
void KeepUnendedStreams(bool all_done, Watchers* watchers, WatchLoadResult* r) {
  r->streams_ended = all_done;
  if (all_done) return;
  for (auto& w : *watchers) {
    w->Abandon();
    (void)w.release();
  }
}

}  // namespace

WatchLoadResult RunWatchLoad(const WatchLoadOptions& options,
                             const std::vector<std::shared_ptr<grpc::Channel>>& watch_channels,
                             const std::shared_ptr<grpc::Channel>& write_channel,
                             std::shared_ptr<H2Client> watch_client) {
  // Streams that did not end in time point at the targets' stubs: keep them until the exit.
  auto* watch_target = MakeStoreTarget(watch_channels, /*watch_from_now=*/false,
                                       options.batch_events, std::move(watch_client))
                           .release();
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
  int64_t open_ns = NowNanos();
  for (int i = 0; i < options.watchers; ++i) {
    // No deadline: the tool ends its watchers itself, after the drain.
    watchers.push_back(std::make_unique<WatchClient>(&progress, options.run_id, r.writes_planned,
                                                     i % options.resources, options.resources));
    watchers.back()->Start(watch_target, i);
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
    int64_t sent = 0;
    int64_t first_send_ns = WritePaced(options, write_target, r.writes_planned, &log, &sent);
    r.writes_sent = sent;
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
    // The creates answered OK of each resource.
    std::vector<int64_t> ok_of(static_cast<size_t>(options.resources), 0);
    for (int64_t seq = 0; seq < r.writes_planned; ++seq) {
      if (log.ok[seq]) ++ok_of[static_cast<size_t>(seq % options.resources)];
    }

    // Wait until every live watcher has every event of its resource, then end the watchers.
    PollUntil(
        [&] {
          for (const auto& w : watchers) {
            // A watcher that ended will receive nothing more.
            if (w->received() < ok_of[w->resource()] && !w->ended()) return false;
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
    const int64_t late_us = absl::ToInt64Microseconds(options.late_after);
    for (auto& w : watchers) {
      grpc::Status s;
      if (w->ended_early(&s)) {
        ++r.watchers_ended_early;
        ++r.early_end_reasons[StatusKey(s.error_code(), s.error_message())];
      }
      r.events_expected += ok_of[w->resource()];
      if (!all_done) continue;  // the reactors may still be reading
      int64_t missing = 0;
      bool late = false;
      const std::vector<int32_t>& latency_us = w->latency_us();
      for (size_t i = 0; i < latency_us.size(); ++i) {
        int64_t seq = static_cast<int64_t>(i) * options.resources + w->resource();
        bool seen = latency_us[i] != WatchClient::kUnseen;
        if (!log.ok[seq]) {
          if (seen) ++r.failed_writes_seen;
          continue;
        }
        if (!seen) {
          ++missing;
          continue;
        }
        late = late || latency_us[i] > late_us;
        ++r.events_received;
        int64_t latency_ns = int64_t{latency_us[i]} * 1000;
        send_to_receipt.push_back(latency_ns);
        ack_to_receipt.push_back(latency_ns - log.ack_ns[seq]);
      }
      if (missing == 0) ++r.watchers_complete;
      if (late) ++r.watchers_late;
      r.messages_received += w->messages();
      r.duplicates += w->duplicates();
      r.out_of_order += w->out_of_order();
      r.unexpected += w->unexpected();
    }
    if (r.events_received > 0) {
      r.client_us_per_event = (client_cpu_end.cpu_seconds - client_cpu_start.cpu_seconds) * 1e6 /
                              static_cast<double>(r.events_received);
    }
    r.send_to_receipt = Summarize(&send_to_receipt);
    r.ack_to_receipt = Summarize(&ack_to_receipt);
    std::vector<int64_t> acks;
    for (int64_t seq = 0; seq < r.writes_planned; ++seq) {
      if (log.ok[seq]) acks.push_back(log.ack_ns[seq]);
    }
    r.write_ack = Summarize(&acks);
    if (r.writes_planned > 0 && log.ok[0]) {
      r.first_write_ack_ms = static_cast<double>(log.ack_ns[0]) / 1e6;
    }
    KeepUnendedStreams(all_done, &watchers, &r);
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
  KeepUnendedStreams(all_done, &watchers, &r);
  return r;
}

}  // namespace shardcache::bench
