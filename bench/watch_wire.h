// Watch wire reading: the few facts that store_bench's watch load needs from a watch message,
// read straight from its protobuf wire bytes, without decoding whole objects.
//
// A watcher of the load needs, per event, its type, its revision and three fields of the bench
// object's spec (run, seq, sentNanos). Decoding each event into v1::Object (labels, annotations,
// a google.protobuf.Struct spec: a map of Values) costs the client many allocations per event,
// and made the client, not the server, the bottleneck of the watch figures. These scanners walk
// the wire format with a CodedInputStream and keep only those facts: no allocation per event once
// a stream's buffers have grown.
//
// The same object scanner reads cache_server's events (WatchEvent.object) and etcd's (the
// v1::Object bytes in KeyValue.value), so both targets cost the client the same work per event.
//
// Thread-compatible: each scanner call uses only its arguments.
#ifndef SHARDCACHE_BENCH_WATCH_WIRE_H_
#define SHARDCACHE_BENCH_WATCH_WIRE_H_

#include <google/protobuf/io/coded_stream.h>

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"

namespace shardcache::bench {

// What the load needs of one v1::Object.
struct ObjectFacts {
  int64_t resource_version = -1;    // metadata.resource_version; -1 if absent or not a number
  bool initial_events_end = false;  // annotation k8s.io/initial-events-end is "true"
  bool bench = false;               // the spec had run, seq and sentNanos
  std::string run;                  // spec.run (its buffer is reused from object to object)
  int64_t seq = 0;                  // spec.seq
  int64_t sent_ns = 0;              // spec.sentNanos

  void Reset() {
    resource_version = -1;
    initial_events_end = false;
    bench = false;
    run.clear();
    seq = 0;
    sent_ns = 0;
  }
};

// Reads one serialized v1::Object: everything up to `in`'s current limit. Reads the annotations
// only with `want_annotations` (bookmarks). False if the bytes are not a well-formed message.
bool ScanObject(google::protobuf::io::CodedInputStream* in, bool want_annotations,
                ObjectFacts* facts);

// Reads one cache_server v1::WatchEvent message (a single event, or a batch in `events`) and
// calls `on_event(type, object)` for each event in order. `facts` is scratch space. False if the
// message is malformed (events before the fault have been delivered).
bool ScanStoreWatchEvent(google::protobuf::io::CodedInputStream* in, ObjectFacts* facts,
                         absl::FunctionRef<void(int type, const ObjectFacts& object)> on_event);

// What the load needs of one etcd WatchResponse besides its events.
struct EtcdResponseFacts {
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;
  std::string cancel_reason;
};

// Reads one etcd WatchResponse and calls `on_event(created, mod_revision, object)` for each
// event in order (`created`: a PUT of the key's first version; `object`: the facts of the
// v1::Object stored as the value, bench false if the value is not one). False if malformed.
bool ScanEtcdWatchResponse(
    google::protobuf::io::CodedInputStream* in, EtcdResponseFacts* response, ObjectFacts* facts,
    absl::FunctionRef<void(bool created, int64_t mod_revision, const ObjectFacts& object)>
        on_event);

}  // namespace shardcache::bench

#endif  // SHARDCACHE_BENCH_WATCH_WIRE_H_
