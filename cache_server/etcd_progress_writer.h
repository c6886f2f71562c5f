// EtcdProgressWriter: writes a store's progress key on etcd (etcd_layout.h) when a replica must
// learn that its watch has brought every change up to a revision, one write at a time.
//
// A replica's watch moves with the prefix's events only (etcd 3.4's progress notifications may
// run ahead of events, etcd issue 15220). A reader that has read etcd's current revision R and
// sees no change coming asks for a write of the progress key: a write that starts after the ask
// commits above R, and its event reaches the watch after every event up to R. Asks that come
// while a write is on its way are served together by one more write after it, so that many
// readers of an idle replica cost etcd one write at a time, not one each.
//
// Guarantees: after Request() returns, a write of the key starts, unless one that started after
// the call began is already on its way, or Stop() was called; when a write fails, `on_failure`
// runs with etcd's error (UNAVAILABLE), on a gRPC thread, and the asks it served are not
// retried (their waiters learn it from `on_failure` or time out).
//
// Thread-safety: thread-safe. Stop() may not be called from `on_failure`.
#ifndef SHARDCACHE_CACHE_SERVER_ETCD_PROGRESS_WRITER_H_
#define SHARDCACHE_CACHE_SERVER_ETCD_PROGRESS_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cache_server/etcd_client.h"

namespace shardcache {

class EtcdProgressWriter {
 public:
  // `etcd` must outlive this object. `key` is the progress key's full etcd key. `on_write`, if
  // set, runs as each write starts (a metric).
  EtcdProgressWriter(EtcdClient* etcd, std::string key,
                     std::function<void(const absl::Status&)> on_failure,
                     std::function<void()> on_write = nullptr);
  ~EtcdProgressWriter();  // Stop()
  EtcdProgressWriter(const EtcdProgressWriter&) = delete;
  EtcdProgressWriter& operator=(const EtcdProgressWriter&) = delete;

  // Asks for a write of the progress key that starts after this call begins (see above).
  void Request() ABSL_LOCKS_EXCLUDED(mu_);
  // No write starts from now on; waits until the one on its way (and its on_failure) is done.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Writes started so far (for tests and metrics).
  int64_t writes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Starts a write that serves every ask so far. Called with writing_ set by this caller.
  void Write() ABSL_LOCKS_EXCLUDED(mu_);

  EtcdClient* const etcd_;
  const std::string key_;
  const std::function<void(const absl::Status&)> on_failure_;
  const std::function<void()> on_write_;

  mutable absl::Mutex mu_;
  // Asks so far, and the number of them that the write on its way (or the last) serves.
  int64_t asked_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t served_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_ETCD_PROGRESS_WRITER_H_
