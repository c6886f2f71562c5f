// EventChunks: the serialized watch events, written side by side in shared buffers, so that a
// watcher that is behind holds and sends a run of consecutive events as one slice.
//
// The WatchCache serializes each event once per form in which watchers see it (watch_cache.h).
// EventChunks writes that encoding as one element of a batch (WatchEvent.events, field 4: its
// tag and length, then the WatchEvent) into the current chunk of the event's resource: a
// reference-counted buffer of kChunkBytes that the following encodings of that resource fill in
// turn. The element is a slice of its chunk, and the bare WatchEvent (a message of its own) a
// slice of the element: nothing is copied. The events of one resource that a watcher receives
// are therefore adjacent in one chunk most of the time, and ExtendRun lets the watcher keep them
// as one slice. What a watcher holds, and what gRPC copies into its own slice arrays for every
// message, is then one slice per run rather than two per event: with a thousand watchers behind,
// those per-event slices were most of the server's memory.
//
// What it guarantees: bytes written into a chunk never change afterwards; a chunk lives as long
// as any slice of it (gRPC's reference count). An encoding larger than kChunkBytes / 4 gets a
// buffer of its own. A resource's current chunk is let go by ReleaseIdle when nothing was written
// to it since the previous call, so that a quiet resource holds no partly filled chunk.
//
// Thread-safety: EventChunks' methods are thread-safe (one lock, taken once per encoding, never
// per delivery); the free functions may be called from any thread.
#ifndef SHARDCACHE_CACHE_SERVER_EVENT_CHUNKS_H_
#define SHARDCACHE_CACHE_SERVER_EVENT_CHUNKS_H_

#include <grpcpp/support/slice.h>

#include <cstddef>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "cache_server/event.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

// Serializes a WatchEvent of `type` carrying `object` (no store_id) into one new slice: as
// WatchEvent.object without copying the object, or for kJson as WatchEvent.object_json.
grpc::Slice EncodeWatchEvent(v1::WatchEvent::Type type, const v1::Object& object,
                             ObjectEncoding encoding = ObjectEncoding::kProto);

// The object as WatchEvent.object_json carries it (the proto3 JSON mapping, no whitespace).
std::string ObjectJson(const v1::Object& object);

// The tag and length that make an encoded WatchEvent of `length` bytes one element of
// WatchEvent.events. Small: held inline, no allocation.
grpc::Slice BatchElementHeader(size_t length);

// The WatchEvent inside one batch element (the element without its tag and length), as a slice of
// the same buffer. REQUIRES: `element` is exactly one element.
grpc::Slice ElementEvent(const grpc::Slice& element);

// If `next` starts where `run` ends, in the same buffer, extends `run` over it and returns true;
// otherwise changes nothing and returns false.
bool ExtendRun(grpc::Slice* run, const grpc::Slice& next);

// One event form, encoded.
struct EncodedEvent {
  grpc::Slice element;  // one element of WatchEvent.events: tag, length, WatchEvent
  grpc::Slice bare;     // the WatchEvent alone: a slice of `element`
};

class EventChunks {
 public:
  // The size of a chunk.
  static constexpr size_t kChunkBytes = 16 << 10;

  // Encodes WatchEvent{type, object} as a batch element at the end of `resource`'s current chunk
  // (a new chunk when it has no room).
  EncodedEvent Write(const std::string& resource, v1::WatchEvent::Type type,
                     const v1::Object& object, ObjectEncoding encoding = ObjectEncoding::kProto);

  // Lets go of the current chunk of every resource that nothing was written to since the
  // previous call. (The chunk stays alive while watchers hold slices of it.)
  void ReleaseIdle();

  // The number of resources that have a current chunk.
  size_t current_chunks() const;

 private:
  struct Current {
    grpc::Slice chunk;  // the whole buffer, kChunkBytes
    size_t used = 0;
    bool written = false;  // since the last ReleaseIdle
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Current> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcache

#endif  // SHARDCACHE_CACHE_SERVER_EVENT_CHUNKS_H_
