#include "common/http_server.h"

#include <gtest/gtest.h>

#include "prometheus/registry.h"

namespace shardcache {
namespace {

// A process told to stop right after it started (a SIGTERM during start-up) must stop: Stop()
// returns even when it comes before the serving thread has begun to listen. Each round leaves
// that race to the scheduler; a Stop() that waits for a listen loop it never ended hangs, and the
// test's time limit fails it.
TEST(HttpServerTest, StopRightAfterStart_Returns) {
  auto registry = std::make_shared<prometheus::Registry>();
  for (int i = 0; i < 300; ++i) {
    HttpServer server(registry, nullptr);
    absl::StatusOr<int> port = server.Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    server.Stop();
  }
}

TEST(HttpServerTest, StopTwice_IsHarmless) {
  HttpServer server(std::make_shared<prometheus::Registry>(), nullptr);
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  server.Stop();
  server.Stop();
}

}  // namespace
}  // namespace shardcache
