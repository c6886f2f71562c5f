#include "cache_server/event_chunks.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardcache {
namespace {

v1::Object Widget(const std::string& name, size_t data_bytes = 200) {
  v1::Object o;
  o.mutable_metadata()->set_namespace_("ns");
  o.mutable_metadata()->set_name(name);
  (*o.mutable_spec()->mutable_fields())["data"].set_string_value(std::string(data_bytes, 'x'));
  return o;
}

std::string Bytes(const grpc::Slice& s) {
  return std::string(reinterpret_cast<const char*>(s.begin()), s.size());
}

// The names of the objects of a batch message's events, in order.
std::vector<std::string> BatchNames(const grpc::Slice& elements) {
  v1::WatchEvent batch;
  EXPECT_TRUE(batch.ParseFromString(Bytes(elements)));
  std::vector<std::string> names;
  for (const v1::WatchEvent& e : batch.events()) names.push_back(e.object().metadata().name());
  return names;
}

TEST(EventChunksTest, Write_TheElementIsTheEventAsABatchElement_TheBareIsTheEvent) {
  EventChunks chunks;
  v1::Object object = Widget("w1");
  EncodedEvent e = chunks.Write("widgets.example.com", v1::WatchEvent::MODIFIED, object);
  // The bare form is exactly what EncodeWatchEvent makes.
  EXPECT_EQ(Bytes(e.bare), Bytes(EncodeWatchEvent(v1::WatchEvent::MODIFIED, object)));
  // The element is the bare form behind its batch header, in the same buffer.
  EXPECT_EQ(Bytes(e.element), Bytes(BatchElementHeader(e.bare.size())) + Bytes(e.bare));
  EXPECT_EQ(e.element.end(), e.bare.end());
  v1::WatchEvent batch;
  ASSERT_TRUE(batch.ParseFromString(Bytes(e.element)));
  ASSERT_EQ(batch.events_size(), 1);
  EXPECT_EQ(batch.events(0).type(), v1::WatchEvent::MODIFIED);
  EXPECT_EQ(batch.events(0).object().metadata().name(), "w1");
  EXPECT_EQ(Bytes(ElementEvent(e.element)), Bytes(e.bare));
}

TEST(EventChunksTest, Json_TheObjectTravelsAsItsJsonInObjectJson) {
  EventChunks chunks;
  v1::Object object = Widget("w1", 20);
  object.mutable_metadata()->set_resource_version("42");
  (*object.mutable_status()->mutable_fields())["ready"].set_bool_value(true);
  EncodedEvent e =
      chunks.Write("widgets.example.com", v1::WatchEvent::ADDED, object, ObjectEncoding::kJson);
  EXPECT_EQ(Bytes(e.bare),
            Bytes(EncodeWatchEvent(v1::WatchEvent::ADDED, object, ObjectEncoding::kJson)));
  v1::WatchEvent bare;
  ASSERT_TRUE(bare.ParseFromString(Bytes(e.bare)));
  EXPECT_EQ(bare.type(), v1::WatchEvent::ADDED);
  EXPECT_FALSE(bare.has_object());
  EXPECT_EQ(bare.object_json(),
            R"({"metadata":{"namespace":"ns","name":"w1","resourceVersion":"42"},)"
            R"("spec":{"data":"xxxxxxxxxxxxxxxxxxxx"},"status":{"ready":true}})");
  EXPECT_EQ(bare.object_json(), ObjectJson(object));
  // Parsed back, it is the object.
  v1::Object back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(bare.object_json(), &back).ok());
  EXPECT_EQ(back.SerializeAsString(), object.SerializeAsString());
  // As a batch element, too.
  v1::WatchEvent batch;
  ASSERT_TRUE(batch.ParseFromString(Bytes(e.element)));
  ASSERT_EQ(batch.events_size(), 1);
  EXPECT_EQ(batch.events(0).object_json(), bare.object_json());
  // The same event for a proto watcher is unchanged.
  EXPECT_EQ(Bytes(chunks.Write("widgets.example.com", v1::WatchEvent::ADDED, object).bare),
            Bytes(EncodeWatchEvent(v1::WatchEvent::ADDED, object)));
}

TEST(EventChunksTest, ElementEvent_ReadsLengthsOfEveryVarintSize) {
  EventChunks chunks;
  // Events of 1-byte, 2-byte and 3-byte lengths (the last in a buffer of its own).
  for (size_t data : {size_t{10}, size_t{1000}, size_t{20000}}) {
    v1::Object object = Widget("w", data);
    EncodedEvent e = chunks.Write("widgets.example.com", v1::WatchEvent::ADDED, object);
    EXPECT_EQ(Bytes(ElementEvent(e.element)),
              Bytes(EncodeWatchEvent(v1::WatchEvent::ADDED, object)))
        << data;
  }
}

TEST(EventChunksTest, ConsecutiveEventsOfAResource_ExtendOneRun) {
  EventChunks chunks;
  std::vector<EncodedEvent> events;
  for (int i = 0; i < 5; ++i) {
    events.push_back(chunks.Write("widgets", v1::WatchEvent::ADDED, Widget(absl::StrCat("w", i))));
  }
  grpc::Slice run = events[0].element;
  for (int i = 1; i < 5; ++i) EXPECT_TRUE(ExtendRun(&run, events[i].element)) << i;
  EXPECT_EQ(BatchNames(run), (std::vector<std::string>{"w0", "w1", "w2", "w3", "w4"}));
  // The run is a slice of the chunk: its bytes are the events' own.
  EXPECT_EQ(run.begin(), events[0].element.begin());
  EXPECT_EQ(run.end(), events[4].element.end());
}

TEST(EventChunksTest, ExtendRun_RefusesWhatDoesNotFollowTheRun) {
  EventChunks chunks;
  EncodedEvent a0 = chunks.Write("a", v1::WatchEvent::ADDED, Widget("a0"));
  EncodedEvent b0 = chunks.Write("b", v1::WatchEvent::ADDED, Widget("b0"));
  EncodedEvent a1 = chunks.Write("a", v1::WatchEvent::ADDED, Widget("a1"));
  EncodedEvent a2 = chunks.Write("a", v1::WatchEvent::ADDED, Widget("a2"));
  grpc::Slice run = a0.element;
  EXPECT_FALSE(ExtendRun(&run, b0.element));  // another resource: another chunk
  EXPECT_FALSE(ExtendRun(&run, a2.element));  // a gap (a1 is skipped)
  EXPECT_FALSE(ExtendRun(&run, a0.element));  // not after it
  EXPECT_EQ(Bytes(run), Bytes(a0.element));   // unchanged
  // A bare event is not an element, and a copy of adjacent bytes is not the same buffer.
  grpc::Slice copy(a1.element.begin(), a1.element.size());
  EXPECT_FALSE(ExtendRun(&run, copy));
  EXPECT_TRUE(ExtendRun(&run, a1.element));
  EXPECT_EQ(BatchNames(run), (std::vector<std::string>{"a0", "a1"}));
}

TEST(EventChunksTest, AFullChunk_IsFollowedByANewOne_WhereTheRunEnds) {
  EventChunks chunks;
  std::vector<EncodedEvent> events;
  size_t written = 0;
  while (written <= EventChunks::kChunkBytes) {
    events.push_back(chunks.Write("widgets", v1::WatchEvent::ADDED,
                                  Widget(absl::StrCat("w", events.size()), 1000)));
    written += events.back().element.size();
  }
  grpc::Slice run = events[0].element;
  size_t joined = 1;
  while (joined < events.size() && ExtendRun(&run, events[joined].element)) ++joined;
  ASSERT_LT(joined, events.size()) << "every event fit in one chunk";
  EXPECT_LE(run.size(), EventChunks::kChunkBytes);
  EXPECT_GT(run.size() + events[joined].element.size(), EventChunks::kChunkBytes);
  // The next chunk starts a run of its own.
  grpc::Slice next = events[joined].element;
  for (size_t i = joined + 1; i < events.size(); ++i)
    EXPECT_TRUE(ExtendRun(&next, events[i].element));
}

TEST(EventChunksTest, ALargeEvent_GetsABufferOfItsOwn) {
  EventChunks chunks;
  EncodedEvent small1 = chunks.Write("widgets", v1::WatchEvent::ADDED, Widget("s1"));
  EncodedEvent large =
      chunks.Write("widgets", v1::WatchEvent::ADDED, Widget("l", EventChunks::kChunkBytes / 4));
  EncodedEvent small2 = chunks.Write("widgets", v1::WatchEvent::ADDED, Widget("s2"));
  grpc::Slice run = small1.element;
  EXPECT_FALSE(ExtendRun(&run, large.element));
  // The large event did not take the chunk's room: the small ones are still side by side.
  EXPECT_TRUE(ExtendRun(&run, small2.element));
  EXPECT_EQ(BatchNames(run), (std::vector<std::string>{"s1", "s2"}));
  EXPECT_EQ(BatchNames(large.element), (std::vector<std::string>{"l"}));
}

TEST(EventChunksTest, ReleaseIdle_LetsGoOfChunksNotWrittenSinceTheLastCall_SlicesStayValid) {
  EventChunks chunks;
  EncodedEvent a = chunks.Write("a", v1::WatchEvent::ADDED, Widget("a0"));
  EncodedEvent b = chunks.Write("b", v1::WatchEvent::ADDED, Widget("b0"));
  EXPECT_EQ(chunks.current_chunks(), 2u);
  chunks.ReleaseIdle();  // both were written since: kept
  EXPECT_EQ(chunks.current_chunks(), 2u);
  EncodedEvent a1 = chunks.Write("a", v1::WatchEvent::ADDED, Widget("a1"));
  chunks.ReleaseIdle();  // b was not: let go
  EXPECT_EQ(chunks.current_chunks(), 1u);
  chunks.ReleaseIdle();
  EXPECT_EQ(chunks.current_chunks(), 0u);
  // The slices keep their chunks alive (AddressSanitizer checks the reads).
  EXPECT_EQ(BatchNames(b.element), (std::vector<std::string>{"b0"}));
  grpc::Slice run = a.element;
  EXPECT_TRUE(ExtendRun(&run, a1.element));
  EXPECT_EQ(BatchNames(run), (std::vector<std::string>{"a0", "a1"}));
  // A write after the release starts a new chunk.
  EncodedEvent a2 = chunks.Write("a", v1::WatchEvent::ADDED, Widget("a2"));
  EXPECT_FALSE(ExtendRun(&run, a2.element));
}

}  // namespace
}  // namespace shardcache
