// FakeCacheWriter: a CacheWriterInterface for tests of the replicator's controllers without a
// cache server. It records every write it accepts and answers it as the test says: OK by default
// (an upsert's answer carries the object with the next revision of a counter as its
// resourceVersion), or whatever status Answer's function returns for the request (UNAVAILABLE,
// a fenced error from common/error_info.h, any other). Hold() keeps the answers back until
// Release(), so that a test can act while writes are in flight.
//
// Availability follows CacheWriter: an answer UNAVAILABLE makes the writer unavailable (as a
// broken stream does), SetUnavailable() too; meanwhile Write fails at once with UNAVAILABLE.
// SetAvailable() makes it available again and runs the WhenAvailable callbacks. A fenced answer
// calls on_fenced once. After Stop(), Write fails with CANCELLED, held writes are answered
// CANCELLED, WhenAvailable callbacks are dropped, and Stopped() is true.
//
// Threads: every method may be called from any thread. Answers and WhenAvailable callbacks run
// on the fake's own thread, in order, never under its lock and never inside Write (as the real
// writer's run on gRPC's threads). Drain() waits until every answer due has been delivered.
#ifndef SHARDCACHE_SHARD_REPLICATOR_TESTING_FAKE_CACHE_WRITER_H_
#define SHARDCACHE_SHARD_REPLICATOR_TESTING_FAKE_CACHE_WRITER_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/error_info.h"
#include "shard_replicator/cache_writer.h"

namespace shardcache::testing {

class FakeCacheWriter : public CacheWriterInterface {
 public:
  using Answerer = std::function<absl::Status(const v1::WriteRequest&)>;

  explicit FakeCacheWriter(const Clock* clock = RealClock::Get()) : clock_(clock) {
    thread_ = std::thread([this] { Run(); });
  }
  ~FakeCacheWriter() override {
    Stop();
    {
      absl::MutexLock l(&mu_);
      exiting_ = true;
    }
    thread_.join();
  }
  FakeCacheWriter(const FakeCacheWriter&) = delete;
  FakeCacheWriter& operator=(const FakeCacheWriter&) = delete;

  // How writes are answered from now on (also those held now, when released).
  void Answer(Answerer answerer) {
    absl::MutexLock l(&mu_);
    answerer_ = std::move(answerer);
  }
  // Every write is answered `status` from now on.
  void AnswerAll(absl::Status status) {
    Answer([status](const v1::WriteRequest&) { return status; });
  }
  // Called once with the first fenced answer.
  void OnFenced(std::function<void(const absl::Status&)> fn) {
    absl::MutexLock l(&mu_);
    on_fenced_ = std::move(fn);
  }

  // Keeps the answers of the writes accepted from now on back until Release.
  void Hold() {
    absl::MutexLock l(&mu_);
    holding_ = true;
  }
  // Answers the held writes (with the answerer in force now) and stops holding.
  void Release() {
    absl::MutexLock l(&mu_);
    holding_ = false;
    for (Pending& p : held_) DueLocked(std::move(p));
    held_.clear();
  }
  int Held() const {
    absl::MutexLock l(&mu_);
    return static_cast<int>(held_.size());
  }

  void SetUnavailable() {
    absl::MutexLock l(&mu_);
    MarkUnavailableLocked();
  }
  // Writes can flow again: the WhenAvailable callbacks run (on the fake's thread).
  void SetAvailable() {
    absl::MutexLock l(&mu_);
    if (available_) return;
    available_ = true;
    unavailable_since_ = absl::InfinitePast();
    for (auto& fn : when_available_) due_.push_back(std::move(fn));
    when_available_.clear();
  }
  int WhenAvailableWaiting() const {
    absl::MutexLock l(&mu_);
    return static_cast<int>(when_available_.size());
  }

  void Stop() {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    when_available_.clear();
    for (Pending& p : held_) {
      Done done = std::move(p.done);
      due_.push_back([done] { done(absl::CancelledError("the writer stopped"), {}); });
    }
    held_.clear();
  }

  // Waits until every answer and callback due now has run.
  void Drain() {
    absl::MutexLock l(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return due_.empty() && !running_; };
    mu_.Await(absl::Condition(&idle));
  }

  // The writes accepted so far, in order.
  std::vector<v1::WriteRequest> Writes() const {
    absl::MutexLock l(&mu_);
    return writes_;
  }
  int WriteCount() const {
    absl::MutexLock l(&mu_);
    return static_cast<int>(writes_.size());
  }
  // Accepted upserts / deletes of objects named `name`.
  int Upserts(const std::string& name) const {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (const v1::WriteRequest& w : writes_) {
      n += w.has_upsert() && w.upsert().object().metadata().name() == name ? 1 : 0;
    }
    return n;
  }
  int Deletes(const std::string& name) const {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (const v1::WriteRequest& w : writes_) {
      n += w.has_delete_() && w.delete_().name() == name ? 1 : 0;
    }
    return n;
  }
  // Calls of Write that failed at once (unavailable or stopped).
  int Refused() const {
    absl::MutexLock l(&mu_);
    return refused_;
  }

  // CacheWriterInterface.
  absl::Status Write(v1::WriteRequest request, Done done) override {
    absl::MutexLock l(&mu_);
    if (stopped_) {
      ++refused_;
      return absl::CancelledError("the writer stopped");
    }
    if (!available_) {
      ++refused_;
      return absl::UnavailableError("the cache cannot be reached (fake)");
    }
    writes_.push_back(request);
    Pending p{std::move(request), std::move(done)};
    if (holding_) {
      held_.push_back(std::move(p));
    } else {
      DueLocked(std::move(p));
    }
    return absl::OkStatus();
  }
  void WhenAvailable(std::function<void()> fn) override {
    {
      absl::MutexLock l(&mu_);
      if (stopped_) return;
      if (!available_) {
        when_available_.push_back(std::move(fn));
        return;
      }
    }
    fn();
  }
  bool Available() const override {
    absl::MutexLock l(&mu_);
    return available_;
  }
  absl::Time UnavailableSince() const override {
    absl::MutexLock l(&mu_);
    return unavailable_since_;
  }
  bool Stopped() const override {
    absl::MutexLock l(&mu_);
    return stopped_;
  }

 private:
  struct Pending {
    v1::WriteRequest request;
    Done done;
  };

  void MarkUnavailableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!available_ || stopped_) return;
    available_ = false;
    unavailable_since_ = clock_->Now();
  }

  // Decides `p`'s answer now and queues its delivery.
  void DueLocked(Pending p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status status = answerer_ ? answerer_(p.request) : absl::OkStatus();
    v1::WriteResponse answer;
    answer.set_id(p.request.id());
    answer.set_code(static_cast<int>(status.code()));
    answer.set_message(std::string(status.message()));
    if (status.ok() && p.request.has_upsert()) {
      *answer.mutable_object() = p.request.upsert().object();
      answer.mutable_object()->mutable_metadata()->set_resource_version(absl::StrCat(++revision_));
    }
    if (status.ok() && p.request.has_delete_()) answer.set_deleted(true);
    if (absl::IsUnavailable(status)) MarkUnavailableLocked();
    std::function<void(const absl::Status&)> fenced;
    if (IsFenced(status) && !fenced_reported_) {
      fenced_reported_ = true;
      fenced = on_fenced_;
    }
    Done done = std::move(p.done);
    due_.push_back([done, status, answer, fenced] {
      if (fenced) fenced(status);
      done(status, answer);
    });
  }

  void Run() {
    absl::MutexLock l(&mu_);
    while (true) {
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return exiting_ || !due_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (due_.empty()) return;  // exiting
      std::function<void()> fn = std::move(due_.front());
      due_.pop_front();
      running_ = true;
      mu_.Unlock();
      fn();
      mu_.Lock();
      running_ = false;
    }
  }

  const Clock* const clock_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool available_ ABSL_GUARDED_BY(mu_) = true;
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  bool fenced_reported_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time unavailable_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 100;
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
  Answerer answerer_ ABSL_GUARDED_BY(mu_);
  std::function<void(const absl::Status&)> on_fenced_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::WriteRequest> writes_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> held_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> when_available_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> due_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_SHARD_REPLICATOR_TESTING_FAKE_CACHE_WRITER_H_
