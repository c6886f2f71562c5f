// Dispatcher: one fan-out thread. It owns an inbox of published events, the FanOut of its share
// of the watchers, and (once StartCompletionQueue is called) a gRPC completion queue on which
// its watchers' stream operations complete, and it runs the loop that ties them together:
//
//   wait (on the completion queue, running what completes there, or on a condition)
//   → take the inbox → FanOut::Dispatch each event, ResourceGone each marker → Flush
//   → Tick (sweeps, bookmarks) → catch parked watchers up (FanOut::PlanCatchUp, ReadCatchUp
//   with no lock held, ApplyCatchUp) → Flush → run the completions that are ready → uncork.
//
// Enqueue never blocks and never waits for a watcher: the inbox takes everything published.
// Should the thread itself fall more than `max_queued_events` behind (a machine starved of
// CPU), the events that do not fit are dropped from the inbox and the dispatcher skips them
// (FanOut::Skip): its watchers are parked and caught up from the store's history, which holds
// those events anyway. The inbox thus holds at most that many references to shared events.
//
// gRPC's completions on the dispatcher's thread: the writes of its watchers' streams are started
// by this thread and complete on its queue, where this thread follows them up: sending an event
// to a watcher that keeps up costs no thread hand-off. Enqueue wakes a thread waiting on the
// queue with an alarm. The writes started during one pass hold their connections corked until
// the thread waits again (SocketCork), so that the messages of one pass leave each connection
// in a few segments.
//
// Completion: a tag of an operation started on a dispatcher's completion queue (or on the
// server's queue of Watch calls): whoever takes it from the queue calls Complete.
//
// Thread-safety: Enqueue, Add, Remove, EndAll, count and the completion queue methods are
// thread-safe. The FanOut is guarded by watchers_mu_; lock order: WatchCache's registration
// lock, then watchers_mu_, then a watcher's own lock. Completions run on this thread, under none
// of its locks.
#ifndef SHARDCACHE_CACHE_SERVER_DISPATCHER_H_
#define SHARDCACHE_CACHE_SERVER_DISPATCHER_H_

#include <grpcpp/alarm.h>
#include <grpcpp/completion_queue.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_server/event_chunks.h"
#include "cache_server/fan_out.h"
#include "cache_server/store_metrics.h"
#include "cache_server/watcher.h"
#include "common/clock.h"

namespace shardcache {

class Completion {
 public:
  virtual void Complete(bool ok) = 0;
  // The tag that stands for this completion in a gRPC operation, and back. gRPC's completion
  // queue orders the start of an operation before its completion, but it is not built with
  // ThreadSanitizer, which AsTag and FromTag tell of that order.
  void* AsTag();
  static Completion* FromTag(void* tag);

 protected:
  ~Completion() = default;
};

class Dispatcher {
 public:
  struct Options {
    FanOut::Options fan_out;
    // Events that may wait in the inbox before the dispatcher skips them (see above).
    size_t max_queued_events = 1 << 16;
    // A thread waiting on its completion queue waits in real time: with a clock other than the
    // real one (a test's), it looks at that clock this often.
    absl::Duration other_clock_poll_interval = absl::Milliseconds(5);
    // While watchers are parked, the thread looks at them at least this often (a parked
    // watcher gets room when its client reads, which the fan-out is not told of).
    absl::Duration catch_up_poll_interval = absl::Milliseconds(5);
    // Lets go of `chunks`' idle chunks at each sweep (one dispatcher does it).
    EventChunks* release_idle_chunks = nullptr;
  };

  // A published event, or a marker that ends the watches of a resource.
  struct Item {
    EventFormsPtr forms;  // set for an event
    std::string gone_resource;
    std::string gone_version;
    int64_t gone_revision = 0;
    absl::Status gone_status;
    // Set (with no forms) for the events dropped from the inbox up to this revision.
    int64_t skip_to = 0;

    static Item ForEvent(EventFormsPtr forms) {
      Item item;
      item.forms = std::move(forms);
      return item;
    }
    static Item ForResourceGone(std::string resource, std::string version, int64_t revision,
                                absl::Status status) {
      Item item;
      item.gone_resource = std::move(resource);
      item.gone_version = std::move(version);
      item.gone_revision = revision;
      item.gone_status = std::move(status);
      return item;
    }
    static Item ForSkip(int64_t revision) {
      Item item;
      item.skip_to = revision;
      return item;
    }
  };

  // `source` and `metrics` are not owned and outlive the dispatcher. Starts the thread.
  Dispatcher(Options options, FanOut::Source* source, StoreMetrics* metrics);
  // Stops the thread. REQUIRES: ShutdownCompletionQueue has completed, if the queue was started.
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Appends to the inbox. Never blocks. REQUIRES: in revision order.
  void Enqueue(const std::vector<Item>& items) ABSL_LOCKS_EXCLUDED(queue_mu_);

  void Add(Watcher* watcher) ABSL_LOCKS_EXCLUDED(watchers_mu_);
  // After it returns, no callback reaches the watcher from this dispatcher. Returns whether it
  // was here.
  bool Remove(Watcher* watcher) ABSL_LOCKS_EXCLUDED(watchers_mu_);
  void EndAll(const absl::Status& status) ABSL_LOCKS_EXCLUDED(watchers_mu_);
  // Watchers registered here (read without a lock, for load balancing and metrics).
  size_t count() const { return count_.load(); }
  // A watcher left by the fan-out's own decision (see FanOut::Options::count_changed).
  void CountChanged(int delta) { count_.fetch_add(delta); }

  // Creates the completion queue (non-polling: gRPC's own threads do the I/O) and waits on it
  // from then on. Call once, before any operation is started on it.
  void StartCompletionQueue();
  grpc::CompletionQueue* completion_queue() const { return cq_.get(); }
  // Shuts the queue down and waits until the thread has drained it; it then waits on its
  // condition again. REQUIRES: no operation will be started on the queue any more. Idempotent.
  void ShutdownCompletionQueue();

 private:
  // Where the completion queue stands.
  enum class QueueState { kNone, kOpen, kShuttingDown, kDrained };
  // Completes the alarm that wakes the thread waiting on its completion queue.
  struct WakeTag : Completion {
    Dispatcher* d = nullptr;
    void Complete(bool ok) override;
  };

  void Run();
  // Waits until the inbox has items, the clock reaches `deadline` or real time reaches
  // `real_wake`, running completions meanwhile. Returns false when the dispatcher is stopping.
  bool Wait(absl::Time deadline, absl::Time real_wake);
  grpc::CompletionQueue::NextStatus RunCompletion(std::chrono::system_clock::time_point deadline);
  void RunReadyCompletions();
  bool OnCompletionQueueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
    return cq_state_ == QueueState::kOpen || cq_state_ == QueueState::kShuttingDown;
  }
  // Catches parked watchers up; returns whether any is still parked.
  bool CatchUp() ABSL_LOCKS_EXCLUDED(watchers_mu_);

  // Constant after construction.
  const Options options_;
  FanOut::Source* const source_;

  absl::Mutex queue_mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(queue_mu_);
  size_t queued_events_ ABSL_GUARDED_BY(queue_mu_) = 0;
  // The last revision dropped from the inbox and not yet marked by a skip item (0: none).
  int64_t pending_skip_ ABSL_GUARDED_BY(queue_mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  // The completion queue (set once by StartCompletionQueue) and its state.
  std::unique_ptr<grpc::CompletionQueue> cq_;
  QueueState cq_state_ ABSL_GUARDED_BY(queue_mu_) = QueueState::kNone;
  // The thread waits on cq_ with nothing queued: Enqueue must wake it (with alarm_).
  bool sleeping_ ABSL_GUARDED_BY(queue_mu_) = false;
  bool wake_pending_ ABSL_GUARDED_BY(queue_mu_) = false;
  grpc::Alarm alarm_;
  WakeTag wake_;

  absl::Mutex watchers_mu_;
  FanOut fan_out_ ABSL_GUARDED_BY(watchers_mu_);
  std::atomic<size_t> count_{0};

  std::thread thread_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_DISPATCHER_H_
