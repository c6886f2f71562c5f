#include "cache_server/kube_render_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace shardcache {
namespace {

ObjectRef MakeObject(const std::string& name) {
  auto o = std::make_shared<v1::Object>();
  o->mutable_metadata()->set_name(name);
  return o;
}

TEST(KubeRenderCacheTest, RendersOncePerObjectAndView) {
  KubeRenderCache cache(64);
  ObjectRef a1 = MakeObject("a");
  ObjectRef a2 = MakeObject("a");
  int renders = 0;
  auto render = [&renders] {
    ++renders;
    return std::string("rendered");
  };
  EXPECT_EQ(*cache.Get("example.com/v1 Widget", a1, render), "rendered");
  EXPECT_EQ(*cache.Get("example.com/v1 Widget", a1, render), "rendered");
  EXPECT_EQ(renders, 1);
  cache.Get("example.com/v2 Widget", a1, render);  // another view
  cache.Get("example.com/v1 Widget", a2, render);  // another version
  EXPECT_EQ(renders, 3);
}

TEST(KubeRenderCacheTest, KeepsAtMostItsCapacity) {
  KubeRenderCache cache(16);
  int renders = 0;
  auto render = [&renders] {
    ++renders;
    return std::to_string(renders);
  };
  std::vector<ObjectRef> objects;
  for (int i = 0; i < 1000; ++i) objects.push_back(MakeObject(std::to_string(i)));
  for (const ObjectRef& o : objects) cache.Get("v", o, render);
  EXPECT_EQ(renders, 1000);
  cache.Get("v", objects[0], render);  // long gone: rendered again
  EXPECT_EQ(renders, 1001);
  cache.Get("v", objects[999], render);  // among the newest
  EXPECT_EQ(renders, 1001);
}

TEST(KubeRenderCacheTest, KeepsItsObjectsAlive) {
  KubeRenderCache cache(64);
  std::weak_ptr<const v1::Object> weak;
  {
    ObjectRef o = MakeObject("a");
    weak = o;
    cache.Get("v", o, [] { return std::string("a"); });
  }
  // The entry holds the object, so its address cannot name another object while it lives.
  EXPECT_FALSE(weak.expired());
}

TEST(KubeRenderCacheTest, ConcurrentReadersSeeOneRendering) {
  KubeRenderCache cache(1024);
  std::vector<ObjectRef> objects;
  for (int i = 0; i < 200; ++i) objects.push_back(MakeObject(std::to_string(i)));
  std::vector<std::thread> threads;
  std::vector<std::string> seen(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto r = cache.Get("v", objects[i], [i] { return "object " + std::to_string(i); });
        if (i == 199) seen[t] = *r;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& s : seen) EXPECT_EQ(s, "object 199");
}

}  // namespace
}  // namespace shardcache
