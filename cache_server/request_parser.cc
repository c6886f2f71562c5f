#include "cache_server/request_parser.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/stubs/common.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <limits>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardcache {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

std::string Flatten(const grpc::ByteBuffer& bytes) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!bytes.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

CodedInputStream Reader(absl::string_view bytes) {
  return CodedInputStream(reinterpret_cast<const uint8_t*>(bytes.data()),
                          static_cast<int>(bytes.size()));
}

// Where a problem is, and what it is.
struct Problem {
  std::string path;
  std::string reason;
};

std::string Join(const std::string& path, const std::string& name) {
  return path.empty() ? name : absl::StrCat(path, ".", name);
}

// The key of a map entry, read without descending into its value ("?" when absent or not a
// string or an integer).
std::string MapKey(absl::string_view entry) {
  CodedInputStream in = Reader(entry);
  std::string key = "?";
  while (uint32_t tag = in.ReadTag()) {
    if (tag == WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
      uint32_t size;
      if (!in.ReadVarint32(&size) || !in.ReadString(&key, static_cast<int>(size))) return "?";
    } else if (tag == WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_VARINT)) {
      uint64_t v;
      if (!in.ReadVarint64(&v)) return "?";
      key = absl::StrCat(v);
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return "?";
    }
  }
  return key;
}

// Walks the wire format of one `type` message the way protobuf's parser does, and reports the
// first place where that parser would give up. `depth` is the nesting of this message (the
// request is 0).
class Walker {
 public:
  explicit Walker(int max_nesting) : max_nesting_(max_nesting) {}

  std::optional<Problem> Walk(absl::string_view bytes, const Descriptor& type, int depth,
                              const std::string& path) {
    CodedInputStream in = Reader(bytes);
    in.SetRecursionLimit(max_nesting_ - depth);  // for groups, which SkipField descends into
    std::map<int, int> counts;                   // occurrences of each repeated field
    while (in.CurrentPosition() < static_cast<int>(bytes.size())) {
      uint32_t tag = in.ReadTag();
      if (tag == 0) return Problem{path, "malformed: a field's tag cannot be read"};
      int number = WireFormatLite::GetTagFieldNumber(tag);
      const FieldDescriptor* field = type.FindFieldByNumber(number);
      bool delimited =
          WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
      if (field == nullptr || !delimited ||
          (field->type() != FieldDescriptor::TYPE_MESSAGE &&
           field->type() != FieldDescriptor::TYPE_STRING)) {
        if (!WireFormatLite::SkipField(&in, tag)) {
          std::string at = field != nullptr ? Join(path, field->name())
                                            : Join(path, absl::StrCat("<field ", number, ">"));
          return Problem{at, "malformed: the bytes are cut short or not protobuf"};
        }
        continue;
      }
      int index = counts[number]++;
      std::string at = ChildPath(type, *field, path, index);
      uint32_t size;
      int start = 0;
      if (!in.ReadVarint32(&size) || (start = in.CurrentPosition()) < 0 ||
          size > bytes.size() - static_cast<size_t>(start) || !in.Skip(static_cast<int>(size))) {
        return Problem{at, "malformed: the bytes are cut short or not protobuf"};
      }
      absl::string_view value = bytes.substr(start, size);
      if (field->type() == FieldDescriptor::TYPE_STRING) {
        if (field->file()->syntax() == FileDescriptor::SYNTAX_PROTO3 &&
            !google::protobuf::internal::IsStructurallyValidUTF8(value.data(),
                                                                 static_cast<int>(value.size()))) {
          return Problem{at, "Invalid value: not valid UTF-8 (a string must be UTF-8)"};
        }
        continue;
      }
      if (depth + 1 > max_nesting_) {
        return Problem{at, absl::StrCat("Invalid value: nested too deeply to be parsed (more than ",
                                        max_nesting_, " nested messages)")};
      }
      if (field->is_map()) at = absl::StrCat(at, MapKeySuffix(type, MapKey(value)));
      if (auto p = Walk(value, *field->message_type(), depth + 1, at)) return p;
    }
    return std::nullopt;
  }

 private:
  // google.protobuf.Struct and Value read as JSON: spec.a.b[2]; other maps as labels[app].
  static std::string MapKeySuffix(const Descriptor& parent, const std::string& key) {
    if (parent.full_name() == "google.protobuf.Struct") return absl::StrCat(".", key);
    return absl::StrCat("[", key, "]");
  }

  static std::string ChildPath(const Descriptor& parent, const FieldDescriptor& field,
                               const std::string& path, int index) {
    const std::string& p = parent.full_name();
    if (p == "google.protobuf.Value" || parent.options().map_entry()) return path;
    if (p == "google.protobuf.Struct") return path;  // the key follows (MapKeySuffix)
    if (p == "google.protobuf.ListValue") return absl::StrCat(path, "[", index, "]");
    std::string at = Join(path, field.name());
    if (field.is_repeated() && !field.is_map()) absl::StrAppend(&at, "[", index, "]");
    return at;
  }

  const int max_nesting_;
};

}  // namespace

std::string ExplainParseFailure(absl::string_view bytes, const Descriptor& type, int max_nesting) {
  std::optional<Problem> p = Walker(max_nesting).Walk(bytes, type, 0, "");
  if (!p.has_value()) return "";
  return p->path.empty() ? p->reason : absl::StrCat(p->path, ": ", p->reason);
}

absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* message) {
  grpc::ByteBuffer copy(bytes);  // shares the slices
  grpc::ProtoBufferReader reader(&copy);
  if (reader.status().ok()) {
    CodedInputStream in(&reader);
    in.SetRecursionLimit(kMaxRequestNesting);
    in.SetTotalBytesLimit(std::numeric_limits<int>::max());
    if (message->ParseFromCodedStream(&in) && in.ConsumedEntireMessage()) {
      return absl::OkStatus();
    }
  }
  std::string why =
      ExplainParseFailure(Flatten(bytes), *message->GetDescriptor(), kMaxRequestNesting);
  if (why.empty()) why = "malformed: not a protobuf encoding of this message";
  return absl::InvalidArgumentError(absl::StrCat("the request cannot be parsed as ",
                                                 message->GetDescriptor()->full_name(), ": ", why));
}

std::optional<int64_t> WriteRequestId(const grpc::ByteBuffer& bytes) {
  std::string flat = Flatten(bytes);
  CodedInputStream in = Reader(flat);
  int64_t id = 0;
  while (in.CurrentPosition() < static_cast<int>(flat.size())) {
    uint32_t tag = in.ReadTag();
    if (tag == 0) return std::nullopt;
    if (tag == WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_VARINT)) {
      uint64_t v;
      if (!in.ReadVarint64(&v)) return std::nullopt;
      id = static_cast<int64_t>(v);
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return std::nullopt;
    }
  }
  return id;
}

}  // namespace shardcache
