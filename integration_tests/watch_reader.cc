#include "integration_tests/watch_reader.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardcache::testing {

v1::WatchRequest WatchReq(const v1::GroupVersionResource& gvr, const std::string& rv) {
  v1::WatchRequest req;
  *req.mutable_resource() = gvr;
  req.set_resource_version(rv);
  req.set_allow_bookmarks(true);
  return req;
}

v1::WatchRequest WatchReq(const v1::GroupVersionResource& gvr, int64_t rv) {
  return WatchReq(gvr, absl::StrCat(rv));
}

std::string Summary(const std::string& type, const std::string& name, int64_t rv) {
  return absl::StrCat(type, " ", name, "@", rv);
}

std::string Summary(const v1::WatchEvent& e) {
  if (e.type() == v1::WatchEvent::BOOKMARK) {
    return absl::StrCat("BOOKMARK@", e.object().metadata().resource_version());
  }
  return absl::StrCat(v1::WatchEvent::Type_Name(e.type()), " ", e.object().metadata().name(), "@",
                      e.object().metadata().resource_version());
}

WatchReader::WatchReader(v1::Store::Stub* stub, const v1::WatchRequest& request,
                         absl::Duration lifetime) {
  ctx_.set_deadline(absl::ToChronoTime(absl::Now() + lifetime));
  ctx_.set_wait_for_ready(true);  // a server that is (re)starting is waited for
  reader_ = stub->Watch(&ctx_, request);
  thread_ = std::thread([this] { Run(); });
}

WatchReader::~WatchReader() {
  ctx_.TryCancel();
  thread_.join();
}

void WatchReader::Run() {
  v1::WatchEvent e;
  while (reader_->Read(&e)) {
    absl::MutexLock l(&mu_);
    if (e.events_size() == 0) {
      events_.push_back(e);
      continue;
    }
    // A batch (WatchRequest.batch_events): its events, one by one, each with the batch's store.
    for (v1::WatchEvent& one : *e.mutable_events()) {
      one.set_store_id(e.store_id());
      events_.push_back(std::move(one));
    }
  }
  grpc::Status s = reader_->Finish();
  absl::MutexLock l(&mu_);
  status_ = s;
}

std::optional<v1::WatchEvent> WatchReader::Next(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !events_.empty() || status_.has_value();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (events_.empty()) return std::nullopt;
  v1::WatchEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

std::optional<v1::WatchEvent> WatchReader::NextObjectEvent(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    auto e = Next(deadline - absl::Now());
    if (!e.has_value() || e->type() != v1::WatchEvent::BOOKMARK) return e;
  }
}

std::vector<std::string> WatchReader::Take(size_t n, absl::Duration timeout) {
  std::vector<std::string> out;
  absl::Time deadline = absl::Now() + timeout;
  while (out.size() < n) {
    auto e = NextObjectEvent(deadline - absl::Now());
    if (!e.has_value()) break;
    out.push_back(Summary(*e));
  }
  return out;
}

bool WatchReader::ReadInitial(std::vector<v1::WatchEvent>* before, v1::WatchEvent* bookmark,
                              absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    auto e = Next(deadline - absl::Now());
    if (!e.has_value()) return false;
    if (e->type() == v1::WatchEvent::BOOKMARK) {
      if (bookmark != nullptr) *bookmark = *std::move(e);
      return true;
    }
    before->push_back(*std::move(e));
  }
}

std::vector<v1::WatchEvent> WatchReader::TakeInitial(v1::WatchEvent* bookmark,
                                                     absl::Duration timeout) {
  std::vector<v1::WatchEvent> out;
  if (!ReadInitial(&out, bookmark, timeout)) {
    ADD_FAILURE() << "no initial-events-end bookmark after " << out.size() << " events";
  }
  return out;
}

bool WatchReader::SkipInitial(absl::Duration timeout) {
  std::vector<v1::WatchEvent> ignored;
  return ReadInitial(&ignored, nullptr, timeout);
}

::testing::AssertionResult WatchReader::NothingMoreUpTo(int64_t revision, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    auto e = Next(deadline - absl::Now());
    if (!e.has_value()) {
      auto s = WaitForEnd(absl::ZeroDuration());
      return ::testing::AssertionFailure()
             << "no bookmark at or above " << revision << " came "
             << (s.has_value() ? absl::StrCat("(the stream ended: ", s->error_code(), " ",
                                              s->error_message(), ")")
                               : "in time");
    }
    if (e->type() != v1::WatchEvent::BOOKMARK) {
      return ::testing::AssertionFailure() << "an unexpected event: " << Summary(*e);
    }
    int64_t rv = 0;
    if (absl::SimpleAtoi(e->object().metadata().resource_version(), &rv) && rv >= revision) {
      return ::testing::AssertionSuccess();
    }
  }
}

std::optional<grpc::Status> WatchReader::WaitForEnd(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return status_.has_value(); };
  mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
  return status_;
}

}  // namespace shardcache::testing
