// Parsing the Store service's requests from the bytes gRPC received, with a nesting limit of our
// own and a precise reason for bytes that do not parse.
//
// The Store's methods are registered raw (ByteBuffer in and out) because gRPC's own parser
// answers a unary request it cannot parse with UNIMPLEMENTED and an empty message, and ends a
// Write stream as though the client had sent its last write. ParseRequest parses with
// kMaxRequestNesting and, when the bytes do not parse, returns INVALID_ARGUMENT that names the
// message type, the field path (as `object.spec.a.b[2]`) and why: nested too deeply, a string
// that is not UTF-8, or bytes cut short or malformed.
//
// Thread-safety: free functions, safe from any thread.
#ifndef SHARDCACHE_CACHE_SERVER_REQUEST_PARSER_H_
#define SHARDCACHE_CACHE_SERVER_REQUEST_PARSER_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardcache {

// How deeply messages may nest in a request. A JSON level of spec or status is about three
// messages (Struct, map entry, Value), so this lets values well past the store's own limit (24
// JSON levels) through to its validation, which names the field; it also bounds the parser's
// recursion.
inline constexpr int kMaxRequestNesting = 200;

// Parses `bytes` into `message` (cleared first). On failure: INVALID_ARGUMENT saying why.
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* message);

// Why `bytes` do not parse as a `type` whose messages may nest `max_nesting` deep:
// "<field path>: <reason>", or "" when no reason is found.
std::string ExplainParseFailure(absl::string_view bytes, const google::protobuf::Descriptor& type,
                                int max_nesting);

// The id of a shardcache.v1.WriteRequest that does not parse (0 when it has none), when the
// request's own fields are well-formed, so that its answer can name it; nullopt otherwise.
std::optional<int64_t> WriteRequestId(const grpc::ByteBuffer& bytes);

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_REQUEST_PARSER_H_
