// Template definitions for store_fixture.h.
#ifndef SHARDCACHE_INTEGRATION_TESTS_STORE_FIXTURE_INL_H_
#define SHARDCACHE_INTEGRATION_TESTS_STORE_FIXTURE_INL_H_

#include <google/protobuf/util/json_util.h>

namespace shardcache::testing {

template <typename M>
M FromJson(absl::string_view json) {
  M m;
  auto status = google::protobuf::util::JsonStringToMessage(std::string(json), &m);
  EXPECT_TRUE(status.ok()) << "bad JSON in test: " << status.ToString() << ": " << json;
  return m;
}

}  // namespace shardcache::testing

#endif  // SHARDCACHE_INTEGRATION_TESTS_STORE_FIXTURE_INL_H_
