// Process-level tests of the List RPC against a real cache_server: pagination (limit and continue
// tokens), the consistent snapshot that pages share while others write, filters (shard, cluster,
// namespace and every label selector operator), and continue tokens that outlive the history
// window.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/testing/status_matchers.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

using ::testing::HasSubstr;

// "shard/cluster/namespace/name": an object's key, in the order List sorts by.
using Key = std::tuple<std::string, std::string, std::string, std::string>;

Key KeyOf(const v1::Object& o) {
  const v1::ObjectMeta& m = o.metadata();
  return {m.shard(), m.cluster(), m.namespace_(), m.name()};
}

std::string KeyString(const Key& k) {
  return absl::StrCat(std::get<0>(k), "/", std::get<1>(k), "/", std::get<2>(k), "/",
                      std::get<3>(k));
}

// What the tests compare listed objects by: key, resourceVersion and spec.n.
std::string Summary(const v1::Object& o) {
  auto n = o.spec().fields().find("n");
  return absl::StrCat(KeyString(KeyOf(o)), "@", o.metadata().resource_version(),
                      " n=", n == o.spec().fields().end() ? -1 : n->second.number_value());
}

std::vector<std::string> Summaries(const std::vector<v1::Object>& objects) {
  std::vector<std::string> out;
  for (const auto& o : objects) out.push_back(Summary(o));
  return out;
}

v1::Object Obj(const std::string& shard, const std::string& cluster, const std::string& ns,
               const std::string& name, const std::map<std::string, std::string>& labels = {},
               int n = 0) {
  v1::Object o;
  v1::ObjectMeta& m = *o.mutable_metadata();
  m.set_shard(shard);
  m.set_cluster(cluster);
  m.set_namespace_(ns);
  m.set_name(name);
  for (const auto& [k, v] : labels) (*m.mutable_labels())[k] = v;
  (*o.mutable_spec()->mutable_fields())["n"].set_number_value(n);
  return o;
}

// Sorted by key, as List returns them.
std::vector<v1::Object> Sorted(std::vector<v1::Object> objects) {
  std::sort(objects.begin(), objects.end(),
            [](const v1::Object& a, const v1::Object& b) { return KeyOf(a) < KeyOf(b); });
  return objects;
}

class ListTest : public StoreFixture {
 protected:
  const v1::GroupVersionResource widgets_ = Gvr("example.com", "v1", "widgets");

  v1::ListRequest Req(int64_t limit = 0) const {
    v1::ListRequest req;
    *req.mutable_resource() = widgets_;
    req.set_limit(limit);
    return req;
  }

  // Creates `o` and returns it as stored (with its resourceVersion), failing the test on error.
  v1::Object MustCreate(const v1::Object& o) {
    v1::Object out;
    EXPECT_TRUE(Ok(Create(widgets_, o, &out))) << "create " << KeyString(KeyOf(o));
    return out;
  }

  // Reads every page of `req`; fails the test if a page fails or they do not chain.
  // `pages` receives each page.
  std::vector<v1::Object> ListAll(v1::ListRequest req, std::vector<v1::ListResponse>* pages,
                                  const std::function<void(int)>& between_pages = nullptr) {
    std::vector<v1::Object> all;
    for (int page = 0; page < 1000; ++page) {
      v1::ListResponse resp;
      grpc::Status s = List(req, &resp);
      EXPECT_TRUE(Ok(s)) << "page " << page;
      if (!s.ok()) return all;
      pages->push_back(resp);
      all.insert(all.end(), resp.items().begin(), resp.items().end());
      if (resp.continue_token().empty()) return all;
      if (between_pages) between_pages(page);
      req.set_continue_token(resp.continue_token());
    }
    ADD_FAILURE() << "more than 1000 pages";
    return all;
  }
};

// ---- pagination ----

TEST_F(ListTest, Pagination_PagesChainAndCoverEveryObjectOnceInKeyOrder) {
  StartServer({});
  // 100 objects over two clusters and two namespaces, created in a shuffled order, plus two that
  // were deleted again.
  std::vector<v1::Object> objects;
  for (int i = 0; i < 100; ++i) {
    objects.push_back(Obj("", i % 2 ? "c2" : "c1", i % 3 ? "ns1" : "ns2",
                          absl::StrFormat("o%03d", (i * 37) % 100)));
  }
  std::shuffle(objects.begin(), objects.end(), std::mt19937(42));
  std::vector<v1::Object> stored;
  for (const auto& o : objects) stored.push_back(MustCreate(o));
  for (const char* gone : {"gone-a", "gone-b"}) {
    MustCreate(Obj("", "c1", "ns1", gone));
    ASSERT_TRUE(Ok(Delete(widgets_, "c1", "ns1", gone)));
  }
  const std::vector<std::string> want = Summaries(Sorted(stored));

  std::vector<v1::ListResponse> pages;
  std::vector<v1::Object> got = ListAll(Req(7), &pages);
  EXPECT_EQ(Summaries(got), want);
  ASSERT_EQ(pages.size(), 15u);  // 14 pages of 7, then 2
  for (size_t i = 0; i < pages.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("page ", i));
    EXPECT_EQ(pages[i].items_size(), i + 1 < pages.size() ? 7 : 2);
    EXPECT_EQ(pages[i].continue_token().empty(), i + 1 == pages.size());
    EXPECT_EQ(pages[i].resource_version(), pages[0].resource_version());
  }

  // The same as one unpaginated list, at the same revision (nothing was written in between).
  v1::ListResponse whole;
  ASSERT_TRUE(Ok(List(Req(), &whole)));
  EXPECT_EQ(Summaries({whole.items().begin(), whole.items().end()}), want);
  EXPECT_TRUE(whole.continue_token().empty());
  EXPECT_EQ(whole.resource_version(), pages[0].resource_version());
  int64_t rv = 0;
  ASSERT_TRUE(absl::SimpleAtoi(whole.resource_version(), &rv));
  EXPECT_EQ(rv, FirstRevision() + 100 + 4)
      << "the store's revision: one write each, starting at 1 (2 on etcd)";
}

TEST_F(ListTest, Pagination_ExactMultipleOfTheLimit_LastFullPageHasNoContinueToken) {
  StartServer({});
  for (int i = 0; i < 21; ++i) MustCreate(Obj("", "c1", "ns1", absl::StrFormat("o%02d", i)));
  std::vector<v1::ListResponse> pages;
  EXPECT_EQ(ListAll(Req(7), &pages).size(), 21u);
  ASSERT_EQ(pages.size(), 3u);
  EXPECT_EQ(pages[2].items_size(), 7);
  EXPECT_TRUE(pages[2].continue_token().empty());
}

TEST_F(ListTest, Pagination_BadLimitOrToken_IsInvalidArgument) {
  StartServer({});
  MustCreate(Obj("", "c1", "ns1", "o1"));
  v1::ListResponse resp;
  grpc::Status s = List(Req(-1), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("limit"));
  v1::ListRequest req = Req(1);
  req.set_continue_token("not a token!");
  s = List(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("continue"));
}

// ---- consistency ----

// Another thread creates, updates and deletes objects while the pages are read; every page must
// still show the store as it was at the first page's revision.
TEST_F(ListTest, Consistency_ConcurrentWrites_PagesShowTheFirstPageRevision) {
  StartServer({});
  // The state at the first page's revision: nothing is written between these and page one.
  std::map<Key, std::string> at_first_page;  // key -> summary
  std::vector<std::string> names;
  for (int i = 0; i < 100; ++i) {
    names.push_back(absl::StrFormat("o%03d", i));
    v1::Object o = MustCreate(Obj("", "c1", "ns1", names.back()));
    at_first_page[KeyOf(o)] = Summary(o);
  }

  v1::ListResponse first;
  ASSERT_TRUE(Ok(List(Req(7), &first)));
  ASSERT_FALSE(first.continue_token().empty());

  // The writer: a bounded mix of updates, deletes and creates (new names sort among the old
  // ones), with its own model of the final state.
  const int kOps = 180;
  std::atomic<int> done{0};
  absl::Mutex model_mu;
  std::map<Key, std::string> final_state = at_first_page;
  std::thread writer([&] {
    std::mt19937 rng(7);
    for (int op = 0; op < kOps; ++op) {
      int i = static_cast<int>(rng() % 100);
      std::string name = names[i];
      grpc::Status s;
      v1::Object out;
      switch (op % 3) {
        case 0:  // create a new object between the old ones
          name = absl::StrFormat("o%03d-new%d", i, op);
          s = Create(widgets_, Obj("", "c1", "ns1", name, {}, op), &out);
          break;
        case 1:  // update (re-create if it was deleted)
          s = Update(widgets_, Obj("", "c1", "ns1", name, {}, op), &out);
          if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
            s = Create(widgets_, Obj("", "c1", "ns1", name, {}, op), &out);
          }
          break;
        case 2: {  // delete
          v1::DeleteResponse d;
          s = Delete(widgets_, "c1", "ns1", name, &d);
          if (s.error_code() == grpc::StatusCode::NOT_FOUND) s = grpc::Status::OK;
          if (s.ok()) {
            absl::MutexLock l(&model_mu);
            final_state.erase(Key{"", "c1", "ns1", name});
          }
          break;
        }
      }
      EXPECT_TRUE(Ok(s)) << "write " << op;
      if (s.ok() && op % 3 != 2) {
        absl::MutexLock l(&model_mu);
        final_state[KeyOf(out)] = Summary(out);
      }
      done.fetch_add(1);
    }
  });

  // Between pages, wait for the writer to get further, so that every page is read after writes.
  std::vector<v1::ListResponse> pages = {first};
  v1::ListRequest rest = Req(7);
  rest.set_continue_token(first.continue_token());
  std::vector<v1::Object> got(first.items().begin(), first.items().end());
  std::vector<v1::ListResponse> rest_pages;
  std::vector<v1::Object> more = ListAll(rest, &rest_pages, [&](int page) {
    int want_done = std::min(kOps, 12 * (page + 1));
    EXPECT_TRUE(Eventually([&] { return done.load() >= want_done; }, "done.load() >= want_done"));
  });
  writer.join();
  got.insert(got.end(), more.begin(), more.end());
  pages.insert(pages.end(), rest_pages.begin(), rest_pages.end());

  std::vector<std::string> want;
  for (const auto& [key, summary] : at_first_page) want.push_back(summary);
  EXPECT_EQ(Summaries(got), want);
  for (const auto& p : pages) EXPECT_EQ(p.resource_version(), first.resource_version());
  EXPECT_GE(pages.size(), 15u);

  // The writes did happen: a new list shows the writer's final state at a later revision.
  v1::ListResponse now;
  ASSERT_TRUE(Ok(List(Req(), &now)));
  std::vector<std::string> want_now;
  for (const auto& [key, summary] : final_state) want_now.push_back(summary);
  EXPECT_EQ(Summaries({now.items().begin(), now.items().end()}), want_now);
  EXPECT_NE(now.resource_version(), first.resource_version());
}

// ---- filters ----

TEST_F(ListTest, Filters_ClusterNamespaceAndEveryLabelSelectorOperator) {
  StartServer({});
  using Labels = std::map<std::string, std::string>;
  std::vector<v1::Object> objects = {
      Obj("", "c1", "ns1", "a", {{"app", "web"}, {"tier", "1"}}),
      Obj("", "c1", "ns1", "b", {{"app", "db"}, {"tier", "3"}}),
      Obj("", "c1", "ns2", "c", {{"app", "web"}, {"env", "prod"}}),
      Obj("", "c1", "ns2", "d", {}),
      Obj("", "c2", "ns1", "e", {{"app", "cache"}, {"tier", "5"}, {"env", "dev"}}),
      Obj("", "c2", "ns1", "f", {{"app", "web"}, {"tier", "10"}}),
      Obj("", "c2", "ns2", "g", {{"env", "prod"}, {"example.com/team", "x"}}),
      Obj("", "root:org", "ns1", "h", {{"app", ""}, {"tier", "2"}}),
  };
  for (const auto& o : objects) MustCreate(o);

  auto label = [](const Labels& l, const std::string& k) -> const std::string* {
    auto it = l.find(k);
    return it == l.end() ? nullptr : &it->second;
  };
  auto num = [&](const Labels& l, const std::string& k, int64_t* out) {
    const std::string* v = label(l, k);
    return v != nullptr && absl::SimpleAtoi(*v, out);
  };
  struct Case {
    std::string cluster, ns, selector;
    std::function<bool(const Labels&)> want;
  };
  auto all = [](const Labels&) { return true; };
  const std::vector<Case> cases = {
      {"", "", "", all},
      {"c1", "", "", all},
      {"", "ns2", "", all},
      {"c2", "ns1", "", all},
      {"root:org", "", "", all},
      {"", "", "app=web",
       [&](const Labels& l) {
         auto v = label(l, "app");
         return v && *v == "web";
       }},
      {"", "", "app==web",
       [&](const Labels& l) {
         auto v = label(l, "app");
         return v && *v == "web";
       }},
      {"", "", "app!=web",
       [&](const Labels& l) {
         auto v = label(l, "app");
         return !v || *v != "web";
       }},
      {"", "", "app in (db,cache)",
       [&](const Labels& l) {
         auto v = label(l, "app");
         return v && (*v == "db" || *v == "cache");
       }},
      {"", "", "app notin (web, db)",
       [&](const Labels& l) {
         auto v = label(l, "app");
         return !v || (*v != "web" && *v != "db");
       }},
      {"", "", "app", [&](const Labels& l) { return label(l, "app") != nullptr; }},
      {"", "", "!app", [&](const Labels& l) { return label(l, "app") == nullptr; }},
      {"", "", "app=",
       [&](const Labels& l) {
         auto v = label(l, "app");
         return v && v->empty();
       }},
      {"", "", "tier>2",
       [&](const Labels& l) {
         int64_t t;
         return num(l, "tier", &t) && t > 2;
       }},
      {"", "", "tier<3",
       [&](const Labels& l) {
         int64_t t;
         return num(l, "tier", &t) && t < 3;
       }},
      {"", "", "example.com/team=x",
       [&](const Labels& l) {
         auto v = label(l, "example.com/team");
         return v && *v == "x";
       }},
      {"", "", "app=web,tier",
       [&](const Labels& l) {
         auto v = label(l, "app");
         return v && *v == "web" && label(l, "tier") != nullptr;
       }},
      {"", "", " env in (prod) , !tier ",
       [&](const Labels& l) {
         auto v = label(l, "env");
         return v && *v == "prod" && label(l, "tier") == nullptr;
       }},
      {"c1", "ns1", "app!=db",
       [&](const Labels& l) {
         auto v = label(l, "app");
         return !v || *v != "db";
       }},
      {"c2", "", "tier notin (10),app",
       [&](const Labels& l) {
         auto t = label(l, "tier");
         return label(l, "app") != nullptr && (!t || *t != "10");
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(
        absl::StrCat("cluster=", c.cluster, " namespace=", c.ns, " selector=\"", c.selector, "\""));
    std::vector<v1::Object> want_objects;
    for (const auto& o : objects) {
      const v1::ObjectMeta& m = o.metadata();
      Labels l(m.labels().begin(), m.labels().end());
      if ((c.cluster.empty() || m.cluster() == c.cluster) &&
          (c.ns.empty() || m.namespace_() == c.ns) && c.want(l)) {
        want_objects.push_back(o);
      }
    }
    std::vector<std::string> want;
    for (const auto& o : Sorted(want_objects)) want.push_back(KeyString(KeyOf(o)));
    // Unpaginated and in pages of 2: the same objects.
    for (int64_t limit : {0, 2}) {
      v1::ListRequest req = Req(limit);
      req.set_cluster(c.cluster);
      req.set_namespace_(c.ns);
      req.set_label_selector(c.selector);
      std::vector<v1::ListResponse> pages;
      std::vector<std::string> got;
      for (const auto& o : ListAll(req, &pages)) got.push_back(KeyString(KeyOf(o)));
      EXPECT_EQ(got, want) << "limit " << limit;
      if (limit == 2) {
        EXPECT_EQ(pages.size(), std::max<size_t>(1, (want.size() + 1) / 2)) << "limit 2";
      }
    }
  }

  for (const char* bad : {"app in (web", "app=web,", "=web", "app>x", "tier<", "Bad Key=1",
                          "app="
                          "this-value-is-far-too-long-for-a-label-value-it-has-more-than-"
                          "sixty-three-characters"}) {
    v1::ListRequest req = Req();
    req.set_label_selector(bad);
    v1::ListResponse resp;
    grpc::Status s = List(req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << "selector \"" << bad << "\": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("label_selector")) << bad;
  }
}

TEST_F(ListTest, Filters_ShardInCacheRole) {
  StartServer({"--role=cache"});
  std::vector<v1::Object> objects;
  for (const char* shard : {"b", "a", ""}) {
    for (const char* cluster : {"root", "other"}) {
      for (const char* name : {"x", "y"}) {
        objects.push_back(MustCreate(Obj(shard, cluster, "ns1", name)));
      }
    }
  }
  auto want = [&](const std::string& shard, const std::string& cluster) {
    std::vector<v1::Object> out;
    for (const auto& o : objects) {
      if ((shard.empty() || o.metadata().shard() == shard) &&
          (cluster.empty() || o.metadata().cluster() == cluster)) {
        out.push_back(o);
      }
    }
    return Summaries(Sorted(out));
  };
  for (const std::string shard : {"a", "b", ""}) {
    for (const std::string cluster : {"root", ""}) {
      for (int64_t limit : {0, 3}) {
        SCOPED_TRACE(absl::StrCat("shard=", shard, " cluster=", cluster, " limit=", limit));
        v1::ListRequest req = Req(limit);
        req.set_shard(shard);
        req.set_cluster(cluster);
        std::vector<v1::ListResponse> pages;
        EXPECT_EQ(Summaries(ListAll(req, &pages)), want(shard, cluster));
      }
    }
  }
  // The shard is part of the key: the same name in two shards is two objects.
  v1::GetRequest get;
  *get.mutable_resource() = widgets_;
  get.set_shard("a");
  get.set_cluster("root");
  get.set_namespace_("ns1");
  get.set_name("x");
  v1::Object from_a;
  ASSERT_TRUE(Ok(stub_->Get(Context().get(), get, &from_a)));
  EXPECT_EQ(from_a.metadata().shard(), "a");
}

// ---- continue tokens and the history window ----

TEST_F(ListTest, ContinueToken_AfterCompaction_IsOutOfRange) {
  StartServer({"--history-events=20"});
  for (int i = 0; i < 30; ++i) MustCreate(Obj("", "c1", "ns1", absl::StrFormat("o%02d", i)));
  v1::ListResponse first;
  ASSERT_TRUE(Ok(List(Req(5), &first)));
  ASSERT_FALSE(first.continue_token().empty());

  // A few writes later, inside the window, the token still works, at its revision.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(
        Ok(Update(widgets_, Obj("", "c1", "ns1", absl::StrFormat("o%02d", 10 + i), {}, 1))));
  }
  v1::ListRequest next = Req(5);
  next.set_continue_token(first.continue_token());
  v1::ListResponse second;
  ASSERT_TRUE(Ok(List(next, &second)));
  EXPECT_EQ(second.resource_version(), first.resource_version());
  ASSERT_EQ(second.items_size(), 5);
  EXPECT_EQ(second.items(0).metadata().name(), "o05");

  // Many writes later the revision has left the window.
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(
        Ok(Update(widgets_, Obj("", "c1", "ns1", absl::StrFormat("o%02d", i % 30), {}, 2 + i))));
  }
  v1::ListResponse stale;
  grpc::Status s = List(next, &stale);
  EXPECT_THAT(FromGrpcStatus(s),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("too old resource version")));
  EXPECT_EQ(stale.items_size(), 0);

  // Listing again from the start works.
  std::vector<v1::ListResponse> pages;
  EXPECT_EQ(ListAll(Req(5), &pages).size(), 30u);
}

}  // namespace
}  // namespace shardcache::testing
