#include "cache_server/kube_render_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace shardcache {
namespace {

TEST(KubeRenderCacheTest, RendersOncePerObjectAndView) {
  KubeRenderCache cache(64);
  int renders = 0;
  auto render = [&renders] {
    ++renders;
    return std::string("rendered");
  };
  EXPECT_EQ(*cache.Get("example.com/v1 Widget", "{\"a\":1}", render), "rendered");
  EXPECT_EQ(*cache.Get("example.com/v1 Widget", "{\"a\":1}", render), "rendered");
  EXPECT_EQ(renders, 1);
  cache.Get("example.com/v2 Widget", "{\"a\":1}", render);  // another view
  cache.Get("example.com/v1 Widget", "{\"a\":2}", render);  // another version
  EXPECT_EQ(renders, 3);
}

TEST(KubeRenderCacheTest, KeepsAtMostItsCapacity) {
  KubeRenderCache cache(16);
  int renders = 0;
  auto render = [&renders] {
    ++renders;
    return std::to_string(renders);
  };
  for (int i = 0; i < 1000; ++i) cache.Get("v", std::to_string(i), render);
  EXPECT_EQ(renders, 1000);
  cache.Get("v", "0", render);  // long gone: rendered again
  EXPECT_EQ(renders, 1001);
  cache.Get("v", "999", render);  // among the newest
  EXPECT_EQ(renders, 1001);
}

TEST(KubeRenderCacheTest, ConcurrentReadersSeeOneRendering) {
  KubeRenderCache cache(1024);
  std::vector<std::thread> threads;
  std::vector<std::string> seen(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto r = cache.Get("v", std::to_string(i), [i] { return "object " + std::to_string(i); });
        if (i == 199) seen[t] = *r;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& s : seen) EXPECT_EQ(s, "object 199");
}

}  // namespace
}  // namespace shardcache
