#include "common/testing/watch_load.h"

#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/testing/channels.h"

namespace shardcache::testing {

PacedWatch::PacedWatch(const std::string& target, const v1::WatchRequest& request, Pace pace,
                       absl::Duration lifetime)
    : pace_(pace), channel_(NonGrowingWindowChannel(target)), stub_(v1::Store::NewStub(channel_)) {
  ctx_.set_deadline(absl::ToChronoTime(absl::Now() + lifetime));
  reader_ = stub_->Watch(&ctx_, request);
  thread_ = std::thread([this] { Run(); });
}

PacedWatch::~PacedWatch() {
  ctx_.TryCancel();
  Hurry();
  thread_.join();
}

void PacedWatch::Begin() {
  if (!begun_.HasBeenNotified()) begun_.Notify();
}

void PacedWatch::Hurry() {
  absl::MutexLock l(&hurry_mu_);
  if (!hurry_.HasBeenNotified()) hurry_.Notify();
}

size_t PacedWatch::received() const {
  absl::MutexLock l(&mu_);
  return rvs_.size();
}

std::vector<int64_t> PacedWatch::rvs() const {
  absl::MutexLock l(&mu_);
  return rvs_;
}

std::optional<grpc::Status> PacedWatch::end() const {
  absl::MutexLock l(&mu_);
  return end_;
}

void PacedWatch::Run() {
  if (pace_ == Pace::kPause) {
    begun_.WaitForNotificationWithTimeout(absl::Seconds(120));
    hurry_.WaitForNotificationWithTimeout(kPause);
  }
  if (pace_ == Pace::kSilent) hurry_.WaitForNotificationWithTimeout(absl::Seconds(150));
  v1::WatchEvent e;
  while (reader_->Read(&e)) {
    if (e.type() != v1::WatchEvent::BOOKMARK) {
      int64_t rv = -1;
      if (!absl::SimpleAtoi(e.object().metadata().resource_version(), &rv)) rv = -1;
      absl::MutexLock l(&mu_);
      rvs_.push_back(rv);
    }
    if (pace_ == Pace::kCrawl) hurry_.WaitForNotificationWithTimeout(absl::Milliseconds(5));
  }
  grpc::Status status = reader_->Finish();
  absl::MutexLock l(&mu_);
  end_ = status;
}

WriteCreatesResult WriteCreates(v1::Store::Stub* stub, const v1::GroupVersionResource& gvr,
                                const std::string& prefix, int n, size_t payload_bytes, int window,
                                absl::Duration deadline) {
  WriteCreatesResult result;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  auto stream = stub->Write(&ctx);
  absl::Mutex mu;
  int answered = 0;
  bool reading_done = false;
  std::thread writer([&] {
    const std::string payload(payload_bytes, 'x');
    for (int i = 0; i < n; ++i) {
      {
        absl::MutexLock l(&mu);
        auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
          return reading_done || i - answered < window;
        };
        mu.Await(absl::Condition(&room));
        if (reading_done) break;
      }
      v1::WriteRequest w;
      w.set_id(i);
      *w.mutable_create()->mutable_resource() = gvr;
      v1::Object* o = w.mutable_create()->mutable_object();
      o->mutable_metadata()->set_cluster("c1");
      o->mutable_metadata()->set_namespace_("ns1");
      o->mutable_metadata()->set_name(absl::StrCat(prefix, i));
      (*o->mutable_spec()->mutable_fields())["data"].set_string_value(payload);
      if (!stream->Write(w)) break;
    }
    stream->WritesDone();
  });
  v1::WriteResponse r;
  int read = 0;
  while (read < n && stream->Read(&r)) {
    ++read;
    if (r.code() != 0) {
      if (result.failed++ == 0) result.first_error = r.message();
    } else {
      int64_t rv = -1;
      if (!absl::SimpleAtoi(r.object().metadata().resource_version(), &rv)) rv = -1;
      result.rvs.push_back(rv);
    }
    absl::MutexLock l(&mu);
    ++answered;
  }
  {
    absl::MutexLock l(&mu);
    reading_done = true;
  }
  writer.join();
  result.status = stream->Finish();
  return result;
}

int64_t RssKiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    int64_t kib = 0;
    if (line.rfind("VmRSS:", 0) == 0 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(
                             absl::StripTrailingAsciiWhitespace(line.substr(6)), "kB")),
                         &kib)) {
      return kib;
    }
  }
  return 0;
}

}  // namespace shardcache::testing
