#include "cache_server/event_chunks.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/util/json_util.h>
#include <grpc/slice.h>

#include <cassert>
#include <cstring>
#include <string>
#include <utility>

namespace shardcache {

namespace {

using google::protobuf::io::CodedOutputStream;

constexpr uint8_t kElementTag = (4 << 3) | 2;  // WatchEvent.events, length-delimited

// What a WatchEvent carries of its object: the Object message itself (field 2, serialized in
// place from the shared, read-only object rather than copied into a WatchEvent; protobuf's cached
// sizes are atomic, so concurrent serializations of one object are safe), or its JSON (field 5).
class Body {
 public:
  Body(const v1::Object& object, ObjectEncoding encoding) : object_(object) {
    if (encoding == ObjectEncoding::kJson) {
      json_ = ObjectJson(object);
      field_ = 5;
      size_ = json_.size();
    } else {
      size_ = object.ByteSizeLong();
    }
  }
  size_t size() const { return size_; }
  uint8_t* Write(uint8_t* p) const {
    *p++ = static_cast<uint8_t>((field_ << 3) | 2);
    p = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(size_), p);
    if (field_ == 2) return object_.SerializeWithCachedSizesToArray(p);
    memcpy(p, json_.data(), size_);
    return p + size_;
  }

 private:
  const v1::Object& object_;
  std::string json_;
  uint32_t field_ = 2;
  size_t size_ = 0;
};

// WatchEvent{type: 1 (varint), object or object_json}, written by hand.
size_t WatchEventSize(v1::WatchEvent::Type type, const Body& body) {
  return (type != 0 ? 1 + CodedOutputStream::VarintSize32(type) : 0) + 1 +
         CodedOutputStream::VarintSize32(static_cast<uint32_t>(body.size())) + body.size();
}

void WriteWatchEvent(v1::WatchEvent::Type type, const Body& body, uint8_t* p) {
  if (type != 0) {
    *p++ = (1 << 3) | 0;
    p = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(type), p);
  }
  body.Write(p);
}

size_t ElementHeaderSize(size_t length) {
  return 1 + CodedOutputStream::VarintSize32(static_cast<uint32_t>(length));
}

uint8_t* WriteElementHeader(size_t length, uint8_t* p) {
  *p++ = kElementTag;
  return CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(length), p);
}

}  // namespace

grpc::Slice EncodeWatchEvent(v1::WatchEvent::Type type, const v1::Object& object,
                             ObjectEncoding encoding) {
  const Body body(object, encoding);
  grpc_slice slice = grpc_slice_malloc(WatchEventSize(type, body));
  WriteWatchEvent(type, body, GRPC_SLICE_START_PTR(slice));
  return grpc::Slice(slice, grpc::Slice::STEAL_REF);
}

std::string ObjectJson(const v1::Object& object) {
  std::string json;
  // A stored object always converts: validation (object_validation.h) keeps its numbers finite
  // and its timestamps in range, and it holds no Any.
  [[maybe_unused]] const auto status = google::protobuf::util::MessageToJsonString(object, &json);
  assert(status.ok());
  return json;
}

grpc::Slice BatchElementHeader(size_t length) {
  uint8_t buf[1 + 5];
  uint8_t* end = WriteElementHeader(length, buf);
  return grpc::Slice(buf, static_cast<size_t>(end - buf));
}

grpc::Slice ElementEvent(const grpc::Slice& element) {
  // The tag, then the length as a varint: its last byte is the first without the high bit.
  size_t header = 1;
  while (header < element.size() && (element.begin()[header] & 0x80) != 0) ++header;
  return element.sub(header + 1, element.size());
}

bool ExtendRun(grpc::Slice* run, const grpc::Slice& next) {
  // Addresses first: only slices of one buffer, one right after the other, are worth a look at
  // their reference counts.
  if (run->end() != next.begin() || next.size() == 0) return false;
  grpc_slice r = run->c_slice();
  grpc_slice n = next.c_slice();
  const bool same_buffer = r.refcount != nullptr && r.refcount == n.refcount;
  const size_t added = n.refcount != nullptr ? n.data.refcounted.length : 0;
  grpc_slice_unref(n);
  if (!same_buffer) {
    grpc_slice_unref(r);
    return false;
  }
  r.data.refcounted.length += added;
  *run = grpc::Slice(r, grpc::Slice::STEAL_REF);
  return true;
}

EncodedEvent EventChunks::Write(const std::string& resource, v1::WatchEvent::Type type,
                                const v1::Object& object, ObjectEncoding encoding) {
  const Body body(object, encoding);
  const size_t event_size = WatchEventSize(type, body);
  const size_t header = ElementHeaderSize(event_size);
  const size_t n = header + event_size;
  grpc::Slice buffer;  // a reference to the buffer written into
  size_t at = 0;
  if (n > kChunkBytes / 4) {
    buffer = grpc::Slice(grpc_slice_malloc(n), grpc::Slice::STEAL_REF);
  } else {
    // The space is taken under the lock and written outside it: no one else writes there, and
    // no one reads it before the slices returned here are handed over.
    absl::MutexLock l(&mu_);
    Current& c = current_[resource];
    if (c.chunk.size() == 0 || c.used + n > c.chunk.size()) {
      c.chunk = grpc::Slice(grpc_slice_malloc(kChunkBytes), grpc::Slice::STEAL_REF);
      c.used = 0;
    }
    buffer = c.chunk;
    at = c.used;
    c.used += n;
    c.written = true;
  }
  uint8_t* p = const_cast<uint8_t*>(buffer.begin()) + at;  // a gRPC-allocated, writable buffer
  WriteWatchEvent(type, body, WriteElementHeader(event_size, p));
  grpc::Slice element = buffer.sub(at, at + n);
  grpc::Slice bare = element.sub(header, n);
  return EncodedEvent{std::move(element), std::move(bare)};
}

void EventChunks::ReleaseIdle() {
  absl::MutexLock l(&mu_);
  for (auto it = current_.begin(); it != current_.end();) {
    if (!it->second.written) {
      current_.erase(it++);
    } else {
      it->second.written = false;
      ++it;
    }
  }
}

size_t EventChunks::current_chunks() const {
  absl::MutexLock l(&mu_);
  return current_.size();
}

}  // namespace shardcache
