// Client channels with particular transport settings, for tests.
//
// Thread-safe: these only build channels.
#ifndef SHARDCACHE_COMMON_TESTING_CHANNELS_H_
#define SHARDCACHE_COMMON_TESTING_CHANNELS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace shardcache::testing {

// A plaintext channel to `target` on a connection of its own, with HTTP/2's BDP probing off, so
// that the flow-control window stays at its initial size: a stream on it whose reader stops
// taking messages stops the server's writes after about 64 KiB. For tests of a client that stops
// reading.
inline std::shared_ptr<grpc::Channel> NonGrowingWindowChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace shardcache::testing

#endif  // SHARDCACHE_COMMON_TESTING_CHANNELS_H_
