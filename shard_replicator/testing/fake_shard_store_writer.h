// FakeShardStoreWriter: a ShardStoreWriter for tests of the CCR controller without a shard store.
// It records every Update and UpdateStatus and answers as the test says: by default it "stores"
// the request's object as given, with the next revision of a counter as its resourceVersion,
// and returns it (it keeps no objects: the caller sends the whole object in both cases);
// Answer's function may return an error instead (ABORTED, a fenced error from
// common/error_info.h, ...). OnStored hands each stored object to the test, e.g. to push it
// into a scripted informer as the store's watch would.
//
// Threads: every method may be called from any thread; OnStored's function runs on the caller's
// thread, without the fake's lock.
#ifndef SHARDCACHE_SHARD_REPLICATOR_TESTING_FAKE_SHARD_STORE_WRITER_H_
#define SHARDCACHE_SHARD_REPLICATOR_TESTING_FAKE_SHARD_STORE_WRITER_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "shard_replicator/shard_store_writer.h"

namespace shardcache::testing {

class FakeShardStoreWriter : public ShardStoreWriter {
 public:
  struct Call {
    bool status = false;  // UpdateStatus (else Update)
    v1::UpdateRequest request;
  };
  // The answer to a call: OK to store it.
  using Answerer = std::function<absl::Status(const Call&)>;

  void Answer(Answerer answerer) {
    absl::MutexLock l(&mu_);
    answerer_ = std::move(answerer);
  }
  void OnStored(std::function<void(const v1::Object&)> fn) {
    absl::MutexLock l(&mu_);
    on_stored_ = std::move(fn);
  }

  std::vector<Call> Calls() const {
    absl::MutexLock l(&mu_);
    return calls_;
  }
  int StatusWrites() const {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (const Call& c : calls_) n += c.status ? 1 : 0;
    return n;
  }
  int Updates() const {
    absl::MutexLock l(&mu_);
    int n = 0;
    for (const Call& c : calls_) n += c.status ? 0 : 1;
    return n;
  }
  // The requests of the status writes / of the other updates, in order.
  std::vector<v1::UpdateRequest> StatusRequests() const {
    absl::MutexLock l(&mu_);
    std::vector<v1::UpdateRequest> out;
    for (const Call& c : calls_) {
      if (c.status) out.push_back(c.request);
    }
    return out;
  }
  std::vector<v1::UpdateRequest> UpdateRequests() const {
    absl::MutexLock l(&mu_);
    std::vector<v1::UpdateRequest> out;
    for (const Call& c : calls_) {
      if (!c.status) out.push_back(c.request);
    }
    return out;
  }

  absl::StatusOr<v1::Object> Update(const v1::UpdateRequest& request) override {
    return Store({false, request});
  }
  absl::StatusOr<v1::Object> UpdateStatus(const v1::UpdateRequest& request) override {
    return Store({true, request});
  }

 private:
  absl::StatusOr<v1::Object> Store(Call call) {
    v1::Object stored = call.request.object();
    std::function<void(const v1::Object&)> on_stored;
    {
      absl::MutexLock l(&mu_);
      calls_.push_back(call);
      absl::Status status = answerer_ ? answerer_(call) : absl::OkStatus();
      if (!status.ok()) return status;
      stored.mutable_metadata()->set_resource_version(absl::StrCat(++revision_));
      on_stored = on_stored_;
    }
    if (on_stored) on_stored(stored);
    return stored;
  }

  mutable absl::Mutex mu_;
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1000;
  Answerer answerer_ ABSL_GUARDED_BY(mu_);
  std::function<void(const v1::Object&)> on_stored_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_SHARD_REPLICATOR_TESTING_FAKE_SHARD_STORE_WRITER_H_
