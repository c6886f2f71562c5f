package main

// The client's cost to decode one watch event of each server, as grpc-go's codec does it
// (proto.Unmarshal of the whole message; with json_objects the object stays JSON bytes, and
// cache_server_json_typed also decodes it with encoding/json into a typed Go object, as a client
// that needs every field does; etcd's value is left as bytes), for a message of 1 event and of 40 (cache_server's batches when a watcher is behind; etcd puts the
// events of one revision range in one response).
//
//	GO111MODULE=off GOPATH=build-gowatch/gopath:/usr/share/gocode go test -bench=Decode -benchmem

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/golang/protobuf/jsonpb"
	"github.com/golang/protobuf/proto"
	structpb "github.com/golang/protobuf/ptypes/struct"
	timestamppb "github.com/golang/protobuf/ptypes/timestamp"
	"go.etcd.io/etcd/etcdserver/etcdserverpb"
	"go.etcd.io/etcd/mvcc/mvccpb"

	storev1 "shardcache/gen/storev1"
)

// cacheEvent is an ADDED event as cache_server sends one of watchbench's objects.
func cacheEvent(seq int64, value string) *storev1.WatchEvent {
	return &storev1.WatchEvent{
		Type: storev1.WatchEvent_ADDED,
		Object: &storev1.Object{
			Metadata: &storev1.ObjectMeta{
				Cluster: "bench-r1764928000-abcdef", Namespace: "default", Name: objectName(seq),
				Uid:               "0f8fad5b-d9cb-469f-a165-70867728950e",
				ResourceVersion:   strconv.FormatInt(1000+seq, 10),
				Generation:        1,
				CreationTimestamp: &timestamppb.Timestamp{Seconds: 1764928000, Nanos: 123456789},
			},
			Spec: &structpb.Struct{Fields: map[string]*structpb.Value{
				"seq":   {Kind: &structpb.Value_StringValue{StringValue: strconv.FormatInt(seq, 10)}},
				"sent":  {Kind: &structpb.Value_StringValue{StringValue: "12345678901234"}},
				"value": {Kind: &structpb.Value_StringValue{StringValue: value}},
			}},
		},
	}
}

// cacheJSONEvent is the same event as a watch with json_objects receives it: the object as JSON
// (the proto3 JSON mapping, as cache_server writes it).
func cacheJSONEvent(seq int64, value string) *storev1.WatchEvent {
	m := jsonpb.Marshaler{OrigName: false}
	text, err := m.MarshalToString(cacheEvent(seq, value).Object)
	if err != nil {
		panic(err)
	}
	return &storev1.WatchEvent{Type: storev1.WatchEvent_ADDED, ObjectJson: []byte(text)}
}

func etcdEvent(seq int64, value string) *mvccpb.Event {
	t := &etcdTarget{run: "r1764928000-abcdef"}
	return &mvccpb.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{
		Key:   []byte(t.prefix(0) + objectName(seq)),
		Value: etcdValue(seq, 12345678901234, value), CreateRevision: 1000 + seq, ModRevision: 1000 + seq, Version: 1,
	}}
}

// widget is a watchbench object as a typed Go client (client-go style) decodes its JSON.
type widget struct {
	Metadata struct {
		Cluster           string    `json:"cluster"`
		Namespace         string    `json:"namespace"`
		Name              string    `json:"name"`
		UID               string    `json:"uid"`
		ResourceVersion   string    `json:"resourceVersion"`
		Generation        string    `json:"generation"` // int64: a JSON string in proto3's mapping
		CreationTimestamp time.Time `json:"creationTimestamp"`
	} `json:"metadata"`
	Spec struct {
		Seq   string `json:"seq"`
		Sent  string `json:"sent"`
		Value string `json:"value"`
	} `json:"spec"`
}

// decodeObjects decodes the object_json of every event of m into a widget.
func decodeObjects(b *testing.B, m proto.Message) {
	e := m.(*storev1.WatchEvent)
	events := e.Events
	if len(events) == 0 {
		events = []*storev1.WatchEvent{e}
	}
	for _, ev := range events {
		var w widget
		if err := json.Unmarshal(ev.ObjectJson, &w); err != nil || w.Spec.Seq == "" {
			b.Fatal("object_json: ", err)
		}
	}
}

func benchDecode(b *testing.B, data []byte, fresh func() proto.Message, events int, then ...func(*testing.B, proto.Message)) {
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		m := fresh()
		if err := proto.Unmarshal(data, m); err != nil {
			b.Fatal(err)
		}
		for _, f := range then {
			f(b, m)
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/float64(events), "ns/event")
}

func BenchmarkDecode(b *testing.B) {
	value := randomASCII(1024)
	for _, n := range []int{1, 40} {
		message := func(event func(int64, string) *storev1.WatchEvent) []byte {
			m := event(1, value)
			if n > 1 {
				m = &storev1.WatchEvent{}
				for i := 0; i < n; i++ {
					m.Events = append(m.Events, event(int64(i+1), value))
				}
			}
			data, _ := proto.Marshal(m)
			return data
		}
		cacheBytes, cacheJSONBytes := message(cacheEvent), message(cacheJSONEvent)
		etcd := &etcdserverpb.WatchResponse{Header: &etcdserverpb.ResponseHeader{ClusterId: 1, MemberId: 2, Revision: 1000, RaftTerm: 2}}
		for i := 0; i < n; i++ {
			etcd.Events = append(etcd.Events, etcdEvent(int64(i+1), value))
		}
		etcdBytes, _ := proto.Marshal(etcd)
		b.Run(fmt.Sprintf("cache_server/%d", n), func(b *testing.B) {
			benchDecode(b, cacheBytes, func() proto.Message { return &storev1.WatchEvent{} }, n)
		})
		b.Run(fmt.Sprintf("cache_server_json/%d", n), func(b *testing.B) {
			benchDecode(b, cacheJSONBytes, func() proto.Message { return &storev1.WatchEvent{} }, n)
		})
		b.Run(fmt.Sprintf("cache_server_json_typed/%d", n), func(b *testing.B) {
			benchDecode(b, cacheJSONBytes, func() proto.Message { return &storev1.WatchEvent{} }, n, decodeObjects)
		})
		b.Run(fmt.Sprintf("etcd/%d", n), func(b *testing.B) {
			benchDecode(b, etcdBytes, func() proto.Message { return &etcdserverpb.WatchResponse{} }, n)
		})
	}
}
