// The one conversion between an object's free-form JSON (google.protobuf.Struct) and the typed
// messages that shardcache reads from it (proto/shardcache/types/v1/types.proto): lease specs,
// CCR specs, label selectors.
//
// Fields are named by their JSON name (lowerCamelCase, as protobuf's JSON mapping). Reading:
//   - an absent key, or JSON null, leaves the field unset (a map value or list element that is
//     null is an error);
//   - strings, booleans, numbers (double), integers, objects (messages and maps) and lists must
//     have that JSON type; an integer field takes a whole JSON number within its range or a
//     string of decimal digits (so int64 values above 2^53 are exact when written as strings);
//   - unknown keys are an error, unless StructCodecOptions says otherwise;
//   - a field of type google.protobuf.Struct, Value or ListValue takes the JSON as it is (an
//     object, anything, a list).
// Every error is INVALID_ARGUMENT from common/validation.h's helpers, naming the field's path
// under `path` ("spec.labelSelector.matchExpressions[0].key: Invalid value: 5: must be a
// string"; "spec.x: Forbidden: unknown field; the known fields are ..."); the first error in
// declaration order (map keys sorted) is reported.
//
// Writing sets every field that is present (proto3 `optional` and message fields when set;
// other scalars when not zero; maps and lists when not empty). An int64 or uint64 whose magnitude
// is at most 2^53 is written as a JSON number (the form stored data has always had), a larger one
// as a decimal string: nothing is rounded, and what was written reads back equal.
//
// Thread-safe: pure functions.
#ifndef SHARDCACHE_COMMON_STRUCT_CODEC_H_
#define SHARDCACHE_COMMON_STRUCT_CODEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "google/protobuf/struct.pb.h"

namespace shardcache {

struct StructCodecOptions {
  // Unknown keys are skipped instead of rejected (for specs that others may extend)...
  bool ignore_unknown_fields = false;
  // ...but in objects of these message types (e.g. a label selector, where a misspelt
  // "matchLabel" must not silently select everything).
  std::vector<const google::protobuf::Descriptor*> strict_messages;
};

// Reads `in` into `out` (cleared first). `path` names `in` in error messages ("spec").
absl::Status StructToMessage(const google::protobuf::Struct& in, absl::string_view path,
                             google::protobuf::Message* out,
                             const StructCodecOptions& options = {});

// `in` as JSON (see above).
google::protobuf::Struct MessageToStruct(const google::protobuf::Message& in);

// A JSON value as error messages show it: strings quoted (QuoteForMessage), numbers as numbers,
// containers abbreviated ({...}, [...]), null.
std::string RenderJsonValue(const google::protobuf::Value& value);

// The INVALID_ARGUMENT "path: Invalid value: <value>: must be <expected>".
absl::Status WrongJsonType(absl::string_view path, const google::protobuf::Value& value,
                           absl::string_view expected);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_STRUCT_CODEC_H_
