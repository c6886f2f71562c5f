// RawWriteStream: a client of the Store's Write stream that sends bytes as they are (gRPC's
// generic API), one operation at a time, so that a test can send a write that is not a valid
// WriteRequest. Every operation waits for its completion; the stream's deadline is 30 s.
//
// Thread-compatible: use it from one thread.
#ifndef SHARDCACHE_CACHE_SERVER_TESTING_RAW_WRITE_STREAM_H_
#define SHARDCACHE_CACHE_SERVER_TESTING_RAW_WRITE_STREAM_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache::testing {

class RawWriteStream {
 public:
  explicit RawWriteStream(const std::shared_ptr<grpc::Channel>& channel) : stub_(channel) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    call_ = stub_.PrepareCall(&ctx_, "/shardcache.v1.Store/Write", &cq_);
    call_->StartCall(this);
    started_ = Await();
  }
  ~RawWriteStream() {
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }
  RawWriteStream(const RawWriteStream&) = delete;
  RawWriteStream& operator=(const RawWriteStream&) = delete;

  bool started() const { return started_; }
  // Sends `bytes` as one message; false once the stream is over.
  bool Write(const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call_->Write(buffer, this);
    return Await();
  }
  bool WritesDone() {
    call_->WritesDone(this);
    return Await();
  }
  // The next answer; nullopt once the stream is over.
  std::optional<v1::WriteResponse> Read() {
    grpc::ByteBuffer buffer;
    call_->Read(&buffer, this);
    if (!Await()) return std::nullopt;
    grpc::Slice slice;
    EXPECT_TRUE(buffer.DumpToSingleSlice(&slice).ok());
    v1::WriteResponse answer;
    EXPECT_TRUE(answer.ParseFromArray(slice.begin(), static_cast<int>(slice.size())));
    return answer;
  }
  grpc::Status Finish() {
    grpc::Status status;
    call_->Finish(&status, this);
    Await();
    return status;
  }

 private:
  bool Await() {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq_.Next(&tag, &ok));
    EXPECT_EQ(tag, this);
    return ok;
  }

  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool started_ = false;
};

}  // namespace shardcache::testing

#endif  // SHARDCACHE_CACHE_SERVER_TESTING_RAW_WRITE_STREAM_H_
