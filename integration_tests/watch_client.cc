// watch_client: a Watch as a process of its own, for tests that stop and resume a watcher's whole
// client (SIGSTOP, SIGCONT) while the server goes on.
//
//   watch_client TARGET GROUP VERSION RESOURCE FROM_RESOURCE_VERSION
//
// Watches the resource from the resourceVersion on a connection of its own, with HTTP/2's BDP
// probing off (so that a stopped client holds the server's writes after about 64 KiB), and prints
// one line per event, "EVENT TYPE NAME RESOURCE_VERSION", then "END CODE MESSAGE" when the stream
// ends; each line is flushed at once. Ends by itself after 170 s.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/testing/channels.h"
#include "shardcache/v1/store.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: watch_client TARGET GROUP VERSION RESOURCE FROM\n");
    return 2;
  }
  shardcache::v1::WatchRequest req;
  req.mutable_resource()->set_group(argv[2]);
  req.mutable_resource()->set_version(argv[3]);
  req.mutable_resource()->set_resource(argv[4]);
  req.set_resource_version(argv[5]);
  auto stub = shardcache::v1::Store::NewStub(shardcache::testing::NonGrowingWindowChannel(argv[1]));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(170)));
  auto reader = stub->Watch(&ctx, req);
  shardcache::v1::WatchEvent e;
  while (reader->Read(&e)) {
    std::printf("EVENT %s %s %s\n", shardcache::v1::WatchEvent::Type_Name(e.type()).c_str(),
                e.object().metadata().name().c_str(),
                e.object().metadata().resource_version().c_str());
    std::fflush(stdout);
  }
  grpc::Status status = reader->Finish();
  std::printf("END %s %s\n",
              absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())).c_str(),
              status.error_message().c_str());
  std::fflush(stdout);
  return 0;
}
