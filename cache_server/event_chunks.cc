#include "cache_server/event_chunks.h"

#include <google/protobuf/io/coded_stream.h>
#include <grpc/slice.h>

#include <utility>

namespace shardcache {

namespace {

using google::protobuf::io::CodedOutputStream;

constexpr uint8_t kElementTag = (4 << 3) | 2;  // WatchEvent.events, length-delimited

// WatchEvent{type: 1 (varint), object: 2 (length-delimited)}, written by hand so that the shared,
// read-only object is serialized in place rather than copied into a WatchEvent. (Protobuf's
// cached sizes are atomic: concurrent serializations of one object are safe.)
size_t WatchEventSize(v1::WatchEvent::Type type, size_t object_size) {
  return (type != 0 ? 1 + CodedOutputStream::VarintSize32(type) : 0) + 1 +
         CodedOutputStream::VarintSize32(static_cast<uint32_t>(object_size)) + object_size;
}

// Writes the WatchEvent at `p`. REQUIRES: object.ByteSizeLong() was called (it is object_size).
void WriteWatchEvent(v1::WatchEvent::Type type, const v1::Object& object, size_t object_size,
                     uint8_t* p) {
  if (type != 0) {
    *p++ = (1 << 3) | 0;
    p = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(type), p);
  }
  *p++ = (2 << 3) | 2;
  p = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(object_size), p);
  object.SerializeWithCachedSizesToArray(p);
}

size_t ElementHeaderSize(size_t length) {
  return 1 + CodedOutputStream::VarintSize32(static_cast<uint32_t>(length));
}

uint8_t* WriteElementHeader(size_t length, uint8_t* p) {
  *p++ = kElementTag;
  return CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(length), p);
}

}  // namespace

grpc::Slice EncodeWatchEvent(v1::WatchEvent::Type type, const v1::Object& object) {
  const size_t object_size = object.ByteSizeLong();
  grpc_slice slice = grpc_slice_malloc(WatchEventSize(type, object_size));
  WriteWatchEvent(type, object, object_size, GRPC_SLICE_START_PTR(slice));
  return grpc::Slice(slice, grpc::Slice::STEAL_REF);
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
                                const v1::Object& object) {
  const size_t object_size = object.ByteSizeLong();
  const size_t event_size = WatchEventSize(type, object_size);
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
  WriteWatchEvent(type, object, object_size, WriteElementHeader(event_size, p));
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
