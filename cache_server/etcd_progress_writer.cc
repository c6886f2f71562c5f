#include "cache_server/etcd_progress_writer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace shardcache {

EtcdProgressWriter::EtcdProgressWriter(EtcdClient* etcd, std::string key,
                                       std::function<void(const absl::Status&)> on_failure,
                                       std::function<void()> on_write)
    : etcd_(etcd),
      key_(std::move(key)),
      on_failure_(std::move(on_failure)),
      on_write_(std::move(on_write)) {}

EtcdProgressWriter::~EtcdProgressWriter() { Stop(); }

void EtcdProgressWriter::Request() {
  {
    absl::MutexLock l(&mu_);
    ++asked_;
    // The write on its way started before this ask: it serves it only if it was made after, so
    // it makes one more when it is done.
    if (writing_ || stopping_) return;
    writing_ = true;
  }
  Write();
}

void EtcdProgressWriter::Write() {
  {
    absl::MutexLock l(&mu_);
    served_ = asked_;
    ++writes_;
  }
  if (on_write_) on_write_();
  etcdserverpb::TxnRequest progress;
  progress.add_success()->mutable_request_put()->set_key(key_);
  etcd_->TxnAsync(std::move(progress), [this](absl::StatusOr<etcdserverpb::TxnResponse> answer) {
    if (!answer.ok()) {
      spdlog::warn("writing etcd's progress key {} failed: {}", key_, answer.status().ToString());
      on_failure_(absl::UnavailableError(absl::StrCat(
          "this replica cannot learn etcd's latest changes: ", answer.status().message())));
    }
    bool again;
    {
      absl::MutexLock l(&mu_);
      // After a failure the asks it served are not retried; later ones get a write of their own.
      again = asked_ > served_ && !stopping_;
      writing_ = again;
    }
    if (again) Write();
  });
}

void EtcdProgressWriter::Stop() {
  absl::MutexLock l(&mu_);
  stopping_ = true;
  mu_.Await(absl::Condition(
      +[](bool* writing) { return !*writing; }, &writing_));
}

int64_t EtcdProgressWriter::writes() const {
  absl::MutexLock l(&mu_);
  return writes_;
}

}  // namespace shardcache
