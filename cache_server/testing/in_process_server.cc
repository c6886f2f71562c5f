#include "cache_server/testing/in_process_server.h"

#include <gtest/gtest.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/registry.h"

namespace shardcache::testing {

absl::Status GatedStorage::Commit(const CommitBatch& batch) {
  absl::MutexLock l(&mu_);
  batches_.push_back(batch);
  mu_.Await(absl::Condition(
      +[](bool* closed) { return !*closed; }, &closed_));
  ++committed_;
  return absl::OkStatus();
}

void GatedStorage::Close() {
  absl::MutexLock l(&mu_);
  closed_ = true;
}

void GatedStorage::Open() {
  absl::MutexLock l(&mu_);
  closed_ = false;
}

std::vector<CommitBatch> GatedStorage::batches() const {
  absl::MutexLock l(&mu_);
  return batches_;
}

size_t GatedStorage::commits() const {
  absl::MutexLock l(&mu_);
  return batches_.size();
}

size_t GatedStorage::committed() const {
  absl::MutexLock l(&mu_);
  return committed_;
}

bool GatedStorage::WaitForEpochCommit(const std::string& shard, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto seen = [this, &shard]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const CommitBatch& b : batches_) {
      if (b.epochs.count(shard) > 0) return true;
    }
    return false;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
}

namespace {

ObjectStore::Options WithStorage(ObjectStore::Options options, Storage* storage) {
  options.storage = storage;
  return options;
}

}  // namespace

InProcessServer::InProcessServer(Options options)
    : metrics_(std::make_shared<prometheus::Registry>()),
      watch_cache_(options.watch, &metrics_),
      store_(WithStorage(options.store, &storage_), &watch_cache_, &metrics_),
      service_(options.service, &store_, &watch_cache_, &metrics_) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  service_.AddTo(&builder);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    ADD_FAILURE() << "the in-process server did not start";
    return;
  }
  service_.AcceptWatches();
  target_ = absl::StrCat("127.0.0.1:", port);
  channel_ = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
  stub_ = v1::Store::NewStub(channel_);
}

InProcessServer::~InProcessServer() {
  storage_.Open();
  Shutdown();
}

bool InProcessServer::Shutdown(absl::Duration timeout) {
  if (shut_down_) return true;
  shut_down_ = true;
  if (server_ == nullptr) return false;
  const absl::Time deadline = absl::Now() + timeout;
  service_.Shutdown();
  size_t watches_left = watch_cache_.Shutdown(timeout);
  bool idle = service_.AwaitIdle(deadline - absl::Now());
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_->Wait();
  service_.StopWatches();
  return idle && watches_left == 0;
}

}  // namespace shardcache::testing
