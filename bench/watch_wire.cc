#include "bench/watch_wire.h"

#include <google/protobuf/wire_format_lite.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace shardcache::bench {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

constexpr char kInitialEventsEnd[] = "k8s.io/initial-events-end";

// Field numbers of the messages read here (proto/shardcache/v1/store.proto,
// google/protobuf/struct.proto, etcd's etcdserverpb/rpc.proto and mvccpb/kv.proto).
constexpr int kObjectMetadata = 1;
constexpr int kObjectSpec = 2;
constexpr int kMetaResourceVersion = 6;
constexpr int kMetaAnnotations = 11;
constexpr int kMapKey = 1;
constexpr int kMapValue = 2;
constexpr int kStructFields = 1;
constexpr int kValueNumber = 2;
constexpr int kValueString = 3;
constexpr int kWatchEventType = 1;
constexpr int kWatchEventObject = 2;
constexpr int kWatchEventEvents = 4;
constexpr int kEtcdCreated = 3;
constexpr int kEtcdCanceled = 4;
constexpr int kEtcdCompactRevision = 5;
constexpr int kEtcdCancelReason = 6;
constexpr int kEtcdEvents = 11;
constexpr int kEtcdEventType = 1;
constexpr int kEtcdEventKv = 2;
constexpr int kKvModRevision = 3;
constexpr int kKvVersion = 4;
constexpr int kKvValue = 5;

bool IsLength(uint32_t tag) {
  return WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}

// Runs `body` with `in` limited to the length-delimited field that starts at its position.
template <typename Body>
bool InField(CodedInputStream* in, Body body) {
  uint32_t length = 0;
  if (!in->ReadVarint32(&length)) return false;
  CodedInputStream::Limit limit = in->PushLimit(static_cast<int>(length));
  bool ok = body() && in->BytesUntilLimit() == 0;
  in->PopLimit(limit);
  return ok;
}

// Reads a short string field into `buffer` (up to `capacity` bytes); longer ones are skipped and
// read as empty.
bool ReadShort(CodedInputStream* in, char* buffer, int capacity, absl::string_view* out) {
  uint32_t length = 0;
  if (!in->ReadVarint32(&length)) return false;
  if (length > static_cast<uint32_t>(capacity)) {
    *out = {};
    return in->Skip(static_cast<int>(length));
  }
  if (!in->ReadRaw(buffer, static_cast<int>(length))) return false;
  *out = absl::string_view(buffer, length);
  return true;
}

// Loops over the fields up to the current limit; `field(number, tag)` returns 1 if it consumed
// the field, 0 to have it skipped, -1 on a fault.
template <typename Field>
bool ForEachField(CodedInputStream* in, Field field) {
  while (true) {
    uint32_t tag = in->ReadTag();
    if (tag == 0) return in->BytesUntilLimit() <= 0 || in->ConsumedEntireMessage();
    int r = field(WireFormatLite::GetTagFieldNumber(tag), tag);
    if (r < 0) return false;
    if (r == 0 && !WireFormatLite::SkipField(in, tag)) return false;
  }
}

// An annotations map entry: sets initial_events_end for k8s.io/initial-events-end: "true".
bool ScanAnnotation(CodedInputStream* in, ObjectFacts* facts) {
  char key_buf[64], value_buf[16];
  absl::string_view key, value;
  bool ok = ForEachField(in, [&](int number, uint32_t tag) {
    if (number == kMapKey && IsLength(tag))
      return ReadShort(in, key_buf, sizeof key_buf, &key) ? 1 : -1;
    if (number == kMapValue && IsLength(tag)) {
      return ReadShort(in, value_buf, sizeof value_buf, &value) ? 1 : -1;
    }
    return 0;
  });
  if (ok && key == kInitialEventsEnd && value == "true") facts->initial_events_end = true;
  return ok;
}

bool ScanMeta(CodedInputStream* in, bool want_annotations, ObjectFacts* facts) {
  return ForEachField(in, [&](int number, uint32_t tag) {
    if (number == kMetaResourceVersion && IsLength(tag)) {
      char buf[24];
      absl::string_view rv;
      if (!ReadShort(in, buf, sizeof buf, &rv)) return -1;
      if (!absl::SimpleAtoi(rv, &facts->resource_version)) facts->resource_version = -1;
      return 1;
    }
    if (want_annotations && number == kMetaAnnotations && IsLength(tag)) {
      return InField(in, [&] { return ScanAnnotation(in, facts); }) ? 1 : -1;
    }
    return 0;
  });
}

// One google.protobuf.Value: its number or its string (into `text` if not null).
bool ScanValue(CodedInputStream* in, double* number, std::string* text) {
  return ForEachField(in, [&](int n, uint32_t tag) {
    if (n == kValueNumber &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_FIXED64) {
      uint64_t bits = 0;
      if (!in->ReadLittleEndian64(&bits)) return -1;
      std::memcpy(number, &bits, sizeof bits);
      return 1;
    }
    if (n == kValueString && IsLength(tag) && text != nullptr) {
      uint32_t length = 0;
      if (!in->ReadVarint32(&length)) return -1;
      return in->ReadString(text, static_cast<int>(length)) ? 1 : -1;
    }
    return 0;
  });
}

// The spec (a google.protobuf.Struct): its run, seq and sentNanos fields. A map entry's key comes
// before its value on the wire (every protobuf serializer writes it so); an entry written the
// other way round is not recognized, and the object is then not a bench object.
bool ScanSpec(CodedInputStream* in, ObjectFacts* facts) {
  bool has_run = false, has_seq = false, has_sent = false;
  bool ok = ForEachField(in, [&](int number, uint32_t tag) {
    if (number != kStructFields || !IsLength(tag)) return 0;
    bool entry_ok = InField(in, [&] {
      char key_buf[16];
      absl::string_view key;
      return ForEachField(in, [&](int n, uint32_t t) {
        if (n == kMapKey && IsLength(t)) {
          return ReadShort(in, key_buf, sizeof key_buf, &key) ? 1 : -1;
        }
        if (n != kMapValue || !IsLength(t)) return 0;
        double number_value = 0;
        if (key == "run") {
          has_run = true;
          return InField(in, [&] { return ScanValue(in, &number_value, &facts->run); }) ? 1 : -1;
        }
        bool is_seq = key == "seq", is_sent = key == "sentNanos";
        if (!is_seq && !is_sent) return 0;
        if (!InField(in, [&] { return ScanValue(in, &number_value, nullptr); })) return -1;
        if (is_seq) {
          has_seq = true;
          facts->seq = static_cast<int64_t>(number_value);
        } else {
          has_sent = true;
          facts->sent_ns = static_cast<int64_t>(number_value);
        }
        return 1;
      });
    });
    return entry_ok ? 1 : -1;
  });
  facts->bench = ok && has_run && has_seq && has_sent;
  return ok;
}

}  // namespace

bool ScanObject(CodedInputStream* in, bool want_annotations, ObjectFacts* facts) {
  facts->Reset();
  return ForEachField(in, [&](int number, uint32_t tag) {
    if (number == kObjectMetadata && IsLength(tag)) {
      return InField(in, [&] { return ScanMeta(in, want_annotations, facts); }) ? 1 : -1;
    }
    if (number == kObjectSpec && IsLength(tag)) {
      return InField(in, [&] { return ScanSpec(in, facts); }) ? 1 : -1;
    }
    return 0;
  });
}

bool ScanStoreWatchEvent(CodedInputStream* in, ObjectFacts* facts,
                         absl::FunctionRef<void(int type, const ObjectFacts& object)> on_event) {
  int type = 0;
  bool batch = false;
  facts->Reset();
  bool ok = ForEachField(in, [&](int number, uint32_t tag) {
    if (number == kWatchEventType &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
      uint32_t value = 0;
      if (!in->ReadVarint32(&value)) return -1;
      type = static_cast<int>(value);
      return 1;
    }
    if (number == kWatchEventObject && IsLength(tag)) {
      // Annotations matter only for bookmarks; the type comes first on the wire, so this reads
      // them only when the event is one (or when its type is not known yet).
      bool want = type == 0 || type == 4;
      return InField(in, [&] { return ScanObject(in, want, facts); }) ? 1 : -1;
    }
    if (number == kWatchEventEvents && IsLength(tag)) {
      batch = true;
      return InField(in, [&] { return ScanStoreWatchEvent(in, facts, on_event); }) ? 1 : -1;
    }
    return 0;
  });
  if (ok && !batch) on_event(type, *facts);
  return ok;
}

bool ScanEtcdWatchResponse(
    CodedInputStream* in, EtcdResponseFacts* response, ObjectFacts* facts,
    absl::FunctionRef<void(bool created, int64_t mod_revision, const ObjectFacts& object)>
        on_event) {
  *response = EtcdResponseFacts();
  return ForEachField(in, [&](int number, uint32_t tag) {
    auto varint = [&](uint64_t* value) { return in->ReadVarint64(value); };
    uint64_t v = 0;
    bool is_varint = WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT;
    if (number == kEtcdCreated && is_varint) {
      if (!varint(&v)) return -1;
      response->created = v != 0;
      return 1;
    }
    if (number == kEtcdCanceled && is_varint) {
      if (!varint(&v)) return -1;
      response->canceled = v != 0;
      return 1;
    }
    if (number == kEtcdCompactRevision && is_varint) {
      if (!varint(&v)) return -1;
      response->compact_revision = static_cast<int64_t>(v);
      return 1;
    }
    if (number == kEtcdCancelReason && IsLength(tag)) {
      uint32_t length = 0;
      if (!in->ReadVarint32(&length)) return -1;
      return in->ReadString(&response->cancel_reason, static_cast<int>(length)) ? 1 : -1;
    }
    if (number != kEtcdEvents || !IsLength(tag)) return 0;
    // One mvccpb.Event.
    int event_type = 0;  // PUT
    int64_t mod_revision = 0, version = 0;
    facts->Reset();
    bool event_ok = InField(in, [&] {
      return ForEachField(in, [&](int n, uint32_t t) {
        if (n == kEtcdEventType &&
            WireFormatLite::GetTagWireType(t) == WireFormatLite::WIRETYPE_VARINT) {
          uint64_t value = 0;
          if (!varint(&value)) return -1;
          event_type = static_cast<int>(value);
          return 1;
        }
        if (n != kEtcdEventKv || !IsLength(t)) return 0;
        return InField(in,
                       [&] {
                         return ForEachField(in, [&](int k, uint32_t kt) {
                           bool kv_varint = WireFormatLite::GetTagWireType(kt) ==
                                            WireFormatLite::WIRETYPE_VARINT;
                           uint64_t value = 0;
                           if (k == kKvModRevision && kv_varint) {
                             if (!varint(&value)) return -1;
                             mod_revision = static_cast<int64_t>(value);
                             return 1;
                           }
                           if (k == kKvVersion && kv_varint) {
                             if (!varint(&value)) return -1;
                             version = static_cast<int64_t>(value);
                             return 1;
                           }
                           if (k == kKvValue && IsLength(kt)) {
                             return InField(in, [&] { return ScanObject(in, false, facts); }) ? 1
                                                                                              : -1;
                           }
                           return 0;
                         });
                       })
                   ? 1
                   : -1;
      });
    });
    if (!event_ok) return -1;
    on_event(event_type == 0 && version == 1, mod_revision, *facts);
    return 1;
  });
}

}  // namespace shardcache::bench
