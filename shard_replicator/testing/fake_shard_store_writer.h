// FakeShardStoreWriter: a ShardStoreWriter for tests of the CCR controller without a shard store.
// It records every Update and UpdateStatus and answers as the test says: by default it "stores"
// the request's object as given, with the next revision of a counter as its resourceVersion,
// and returns it (it keeps no objects: the caller sends the whole object in both cases);
// Answer's function may return an error instead (ABORTED, a fenced error from
// common/error_info.h, ...). OnStored hands each stored object to the test, e.g. to push it
// into a scripted informer as the store's watch would.
//
// As the store does, it refuses with ABORTED a write whose resourceVersion is not the one it
// stored last for that object (optimistic concurrency), once it has stored one. Put stores an
// object as another writer would (a user changing a CCR's spec), so that a write made from the
// version before it conflicts; Remove deletes one, so that later writes of it are NOT_FOUND.
//
// Threads: every method may be called from any thread; OnStored's function runs on the caller's
// thread, without the fake's lock.
#ifndef SHARDCACHE_SHARD_REPLICATOR_TESTING_FAKE_SHARD_STORE_WRITER_H_
#define SHARDCACHE_SHARD_REPLICATOR_TESTING_FAKE_SHARD_STORE_WRITER_H_

#include <functional>
#include <map>
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

  // Stores `object` as another client would, with the next resourceVersion; hands it to
  // OnStored's function and returns it.
  v1::Object Put(v1::Object object) {
    std::function<void(const v1::Object&)> on_stored;
    {
      absl::MutexLock l(&mu_);
      StampLocked(&object);
      on_stored = on_stored_;
    }
    if (on_stored) on_stored(object);
    return object;
  }

  // The object is deleted, as another client would delete it: later writes of it fail with
  // NOT_FOUND. (The test shows the deletion to the informers itself.)
  void Remove(const v1::Object& object) {
    absl::MutexLock l(&mu_);
    versions_[Key(object)] = kDeleted;
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
      auto last = versions_.find(Key(stored));
      if (last != versions_.end() && last->second == kDeleted) {
        return absl::NotFoundError(absl::StrCat(Key(stored), " not found"));
      }
      if (last != versions_.end() && stored.metadata().resource_version() != last->second) {
        return absl::AbortedError(
            absl::StrCat("Operation cannot be fulfilled on ", Key(stored),
                         ": the object has been modified (", "resourceVersion ",
                         stored.metadata().resource_version(), ", stored ", last->second, ")"));
      }
      StampLocked(&stored);
      on_stored = on_stored_;
    }
    if (on_stored) on_stored(stored);
    return stored;
  }

  static constexpr char kDeleted[] = "";
  static std::string Key(const v1::Object& o) {
    return absl::StrCat(o.metadata().cluster(), "/", o.metadata().namespace_(), "/",
                        o.metadata().name());
  }
  // Gives `object` the next resourceVersion and remembers it as the object's last.
  void StampLocked(v1::Object* object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    object->mutable_metadata()->set_resource_version(absl::StrCat(++revision_));
    versions_[Key(*object)] = object->metadata().resource_version();
  }

  mutable absl::Mutex mu_;
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1000;
  // The resourceVersion stored last, by cluster/namespace/name.
  std::map<std::string, std::string> versions_ ABSL_GUARDED_BY(mu_);
  Answerer answerer_ ABSL_GUARDED_BY(mu_);
  std::function<void(const v1::Object&)> on_stored_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_SHARD_REPLICATOR_TESTING_FAKE_SHARD_STORE_WRITER_H_
